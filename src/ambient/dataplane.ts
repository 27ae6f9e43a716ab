// Ambient mode's node dataplane (issue 17): enrolls pods into the node proxy, ztunnel. After
// Istio's cni/pkg/nodeagent (meshdataplane_linux.go, net_linux.go), our code:
// - a pod is added in a fixed order: its netns held -> in-pod rules -> ztunnel told (AddWorkload
//   + the netns fd, acked) -> its IPs in the node's probe ipset -> annotated `enabled`. Rules go in
//   before ztunnel hears of the pod, so no packet of an enrolled pod bypasses it; the annotation
//   comes last, since once it says enabled the pod counts as enrolled for good;
// - removal goes the other way: probe ipset -> rules out of the netns (unless the pod is being
//   deleted) -> ztunnel told to let go (every connection) -> annotation removed;
// - start(): the node's probe rule and sets, the pods enrolled before this start found again
//   (snapshot.ts), then the ZDS socket opens and each ztunnel that connects gets the snapshot.
// The pieces: podrules.ts / hostrules.ts (rules), src/podnetns/ (netns by fd, nsenter),
// ztunnelserver.ts (ZDS), podcache.ts (the held netns), hostprobes.ts (the ipset sync).

import { lstat, rm, stat, statfs } from 'node:fs/promises';
import path from 'node:path';
import type { Settings } from '../config/settings.ts';
import { hostFlavourDetector } from '../hostnet/flavour.ts';
import { runOnHost } from '../hostnet/run.ts';
import { scope } from '../monitoring/logging.ts';
import {
  findPodNetns,
  findPodsNetns,
  hostNetnsId,
  openNetns,
  runInNetns,
  type HeldNetns,
  type NsId,
  type PodNetnsOptions,
} from '../podnetns/index.ts';
import { addProbeIP, applyHost, removeHost, removeProbeIP } from './hostrules.ts';
import { PodCache } from './podcache.ts';
import { applyInpod, podOptions, removeInpod, type Family, type Flavour, type Runner } from './podrules.ts';
import { REDIRECTION_ANNOTATION, type AmbientPodInfo } from './enablement.ts';
import { buildStartupState, type StartupPod } from './snapshot.ts';
import type { WorkloadInfo } from './zds.ts';
import { ZtunnelError, ZtunnelServer, type ZdsTimings } from './ztunnelserver.ts';

const log = scope('ambient');

export type AmbientPod = AmbientPodInfo;

export type EnrollReason = 'netns' | 'rules' | 'ztunnel' | 'ipset' | 'annotate';

/** An enrollment step that failed; the message names it (ztunnel, rules, netns...) and the pod. */
export class EnrollError extends Error {
  readonly reason: EnrollReason;
  /** Istio's split: netns and rules failures are not retried (the pod must be re-created), the rest are. */
  readonly retryable: boolean;
  constructor(reason: EnrollReason, message: string, opts?: { cause?: unknown; retryable?: boolean }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'EnrollError';
    this.reason = reason;
    this.retryable = opts?.retryable ?? (reason !== 'netns' && reason !== 'rules');
  }
}

/** A merge patch of the pod's redirection annotation on pods/status (null: removed). */
export interface PodAnnotator {
  setRedirection(
    pod: { namespace: string; name: string; uid: string },
    value: 'enabled' | 'pending' | null,
  ): Promise<void>;
}

export interface MeshDataplane {
  start(pods: readonly AmbientPod[]): Promise<void>;
  addPodToMesh(pod: AmbientPod, netnsPath: string | null): Promise<void>;
  removePodFromMesh(pod: AmbientPod, isDelete: boolean): Promise<void>;
  syncHostProbeIPs(pod: AmbientPod): Promise<void>;
  isEnrolled(uid: string): boolean;
  notReadyReasons(): string[];
  status(): DataplaneStatus;
  stop(cleanup: boolean): Promise<void>;
}

export interface DataplaneStatus {
  readonly started: boolean;
  readonly socket: string;
  readonly listening: boolean;
  /** ztunnel connections that said Hello. */
  readonly connections: number;
  /** Pods enrolled (added, or found enrolled at start-up). */
  readonly enrolledPods: number;
  /** Pods known whose netns is not held (sent to ztunnel as Keep). */
  readonly podsWithoutNetns: readonly string[];
}

/** Test seams; the agent passes only the annotator. */
export interface DataplaneDeps {
  readonly annotator: PodAnnotator;
  /** Runs a program on the node (probe ipset, MESH_POSTRT); default: directly (the agent is in the host netns). */
  readonly host?: Runner;
  /** The node's iptables flavour; default: detected once, as the plugin does. */
  readonly flavour?: () => Promise<Flavour>;
  readonly zdsTimings?: Partial<ZdsTimings>;
}

/** statfs type of a namespace file (NSFS_MAGIC). */
const NSFS_MAGIC = 0x6e736673n;
const NOT_READY = 'ambient: snapshot not built yet';
/**
 * Pods whose in-pod rules are written (or taken out) at once. After a node reboot the runtime
 * starts all of a node's pods together (110 by default), each ADD several programs per family
 * through nsenter: unbounded, they all share the CPUs and all finish late, past the plugin's
 * 5 s; bounded, the first ones finish in time and the rest follow.
 */
export const INPOD_CONCURRENCY = 8;
/** Deleted pods remembered: far more than a node's pods whose ADD can be in flight at once. */
const DELETED_KEPT = 4096;

const familiesOfIps = (ips: readonly string[]): Family[] => {
  const v4 = ips.some((ip) => ip.includes('.'));
  const v6 = ips.some((ip) => ip.includes(':'));
  return v6 ? (v4 ? [4, 6] : [6]) : [4];
};
const podName = (p: { namespace: string; name: string }) => `${p.namespace}/${p.name}`;
const workload = (p: AmbientPod): WorkloadInfo => ({
  name: p.name,
  namespace: p.namespace,
  serviceAccount: p.serviceAccount,
});
const runnerIn =
  (netns: HeldNetns): Runner =>
  (argv, opts) =>
    runInNetns(netns, argv, { input: opts?.input ?? null });

/**
 * The plugin's CNI netns path, opened under the host root: it must be a namespace file and not
 * the host's own netns (a wrong path there would program the node's rules into the node).
 */
export async function openCniNetns(hostRoot: string, netnsPath: string, host: NsId): Promise<HeldNetns> {
  if (!path.isAbsolute(netnsPath) || netnsPath.split('/').includes('..')) {
    throw new Error(`the CNI netns path "${netnsPath}" is not an absolute path without ..`);
  }
  const where = path.join(hostRoot, netnsPath);
  let ns: HeldNetns;
  try {
    ns = await openNetns(where, 0);
  } catch (e) {
    throw new Error(
      `cannot open the pod's netns ${where} (CNI netns ${netnsPath} under the host root ${hostRoot}): ` +
        `${(e as Error).message}; the host's ${path.dirname(netnsPath)} must be mounted under ${hostRoot}`,
      { cause: e },
    );
  }
  try {
    // The fd's own file system, through its /proc link: the path may have changed since the open.
    const fs = await statfs(`/proc/self/fd/${ns.fd}`, { bigint: true });
    if (fs.type !== NSFS_MAGIC) throw new Error(`${where} is not a network namespace file`);
    if (ns.dev === host.dev && ns.ino === host.ino) throw new Error(`${where} is the host's netns, not a pod's`);
    // Nor the agent's own (the node's with hostNetwork), whatever --host-netns-path says, as
    // findPodNetns refuses it: a wrong --host-netns-path must not let the node be programmed.
    const self = await stat('/proc/self/ns/net', { bigint: true });
    if (ns.dev === self.dev && ns.ino === self.ino) throw new Error(`${where} is the agent's own netns, not a pod's`);
  } catch (e) {
    ns.close();
    throw e;
  }
  return ns;
}

/** At most `n` of the functions given run at once; the others wait, in call order. */
class Limit {
  #free: number;
  readonly #waiting: (() => void)[] = [];
  constructor(n: number) {
    this.#free = n;
  }
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next();
      else this.#free++;
    }
  }
}

class Dataplane implements MeshDataplane {
  readonly #s: Settings['ambient'];
  readonly #nsOpts: PodNetnsOptions;
  readonly #annotator: PodAnnotator;
  readonly #host: Runner;
  readonly #flavour: () => Promise<Flavour>;
  readonly #timings: Partial<ZdsTimings> | undefined;
  readonly #hostFamilies: Family[];
  readonly #cache = new PodCache();
  readonly #enrolled = new Set<string>();
  /** Per pod UID, the tail of its operations: one at a time per pod, in call order. */
  readonly #tails = new Map<string, Promise<unknown>>();
  #server: ZtunnelServer | null = null;
  #started = false;
  #stopped = false;
  readonly #snapshotHolds = new Map<number, () => void>();
  /** The pods the last start() put in the cache. */
  #startupUids = new Set<string>();
  /** In-pod rule writes under way, across pods (INPOD_CONCURRENCY). */
  readonly #inpod = new Limit(INPOD_CONCURRENCY);
  /** UIDs of pods removed as deleted (newest last, at most DELETED_KEPT): never enrolled again. */
  readonly #deleted = new Set<string>();

  constructor(settings: Settings, deps: DataplaneDeps) {
    this.#s = settings.ambient;
    this.#nsOpts = { hostProcDir: settings.repair.hostProcDir, hostNetnsPath: settings.repair.hostNetnsPath };
    this.#annotator = deps.annotator;
    this.#host = deps.host ?? ((argv, opts) => runOnHost(argv, { input: opts?.input ?? null }));
    this.#flavour = deps.flavour ?? hostFlavourDetector();
    this.#timings = deps.zdsTimings;
    this.#hostFamilies = this.#s.ipv6 ? [4, 6] : [4];
  }

  /** Runs `fn` after every earlier operation on the same pod has settled. */
  #serial<T>(uid: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(uid) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.catch(() => {});
    this.#tails.set(uid, tail);
    void tail.then(() => {
      if (this.#tails.get(uid) === tail) this.#tails.delete(uid);
    });
    return run;
  }

  #podOptions(pod: AmbientPod) {
    return {
      ...podOptions(pod.annotations, this.#s.dnsCapture),
      probeSnatV4: this.#s.hostProbeSnatIp,
      probeSnatV6: this.#s.hostProbeSnatIpv6,
    };
  }

  /**
   * The families of a pod's in-pod rules: both with --ambient-ipv6, whatever its IPs (Istio's
   * EnableIPv6): an IPv4-only pod still has link-local IPv6, which reaches other pods on the same
   * L2 (a bridge CNI) around ztunnel when only IPv4 is redirected. Else the pod's own families.
   */
  #podFamilies(pod: AmbientPod): Family[] {
    return this.#s.ipv6 ? [4, 6] : familiesOfIps(pod.ips);
  }

  async #programRules(pod: AmbientPod, netns: HeldNetns): Promise<void> {
    const opts = this.#podOptions(pod);
    const flavour = await this.#flavour();
    await this.#inpod.run(() => applyInpod(runnerIn(netns), flavour, this.#podFamilies(pod), opts));
  }

  /** The pod's netns: from the CNI path, else the one held, else a /proc scan. Cached. */
  async #netnsOf(pod: AmbientPod, netnsPath: string | null): Promise<HeldNetns> {
    const info = workload(pod);
    if (netnsPath !== null && netnsPath !== '') {
      const host = await hostNetnsId(this.#nsOpts.hostNetnsPath);
      return this.#cache.upsert(pod.uid, info, await openCniNetns(this.#s.hostRoot, netnsPath, host));
    }
    const held = this.#cache.get(pod.uid)?.netns;
    if (held) return held;
    const r = await findPodNetns(pod.mirrorUid ?? pod.uid, pod.ips, this.#nsOpts);
    if (!r.ok) throw new Error(`${r.reason}: ${r.detail}`);
    return this.#cache.upsert(pod.uid, info, r.netns);
  }

  addPodToMesh(pod: AmbientPod, netnsPath: string | null): Promise<void> {
    return this.#serial(pod.uid, () => this.#add(pod, netnsPath));
  }

  async #add(pod: AmbientPod, netnsPath: string | null): Promise<void> {
    const name = podName(pod);
    log.info('adding pod to the mesh', { pod: name, uid: pod.uid });
    if (this.#deleted.has(pod.uid)) {
      // An ADD that read the pod before its delete, and reached us after the removal: enrolled
      // now, nothing would ever remove it (its netns held, ztunnel proxying it, its IP's probe entry).
      throw new EnrollError('netns', `pod ${name} (uid ${pod.uid}) was deleted: not enrolled`);
    }
    const heldBefore = this.#cache.get(pod.uid)?.netns ?? null;
    this.#cache.ensure(pod.uid, workload(pod));
    let netns: HeldNetns;
    try {
      netns = await this.#netnsOf(pod, netnsPath);
    } catch (e) {
      this.#cache.release(this.#cache.take(pod.uid));
      throw new EnrollError('netns', `cannot find the netns of pod ${name}: ${(e as Error).message}`, { cause: e });
    }
    try {
      await this.#programRules(pod, netns);
    } catch (e) {
      // Not retried, and the netns let go: rules half written (IPv4 in, IPv6 failed) would stay
      // in a pod nobody knows of, its IPv4 sent to a ztunnel that never got it. A pod that was
      // not redirected before (a netns new to the agent, no redirection annotation) goes back
      // to that; one annotated (pending/enabled) keeps what it has (fail closed; its removal
      // finds the netns again).
      let also = '';
      if (netns !== heldBefore && pod.annotations[REDIRECTION_ANNOTATION] === undefined) {
        also = await this.#rollBackRules(netns);
      }
      this.#cache.release(this.#cache.take(pod.uid));
      throw new EnrollError('rules', `cannot program the in-pod rules of pod ${name}: ${(e as Error).message}${also}`, {
        cause: e,
      });
    }
    try {
      if (this.#server === null) {
        throw new ZtunnelError(
          'no_connection',
          `no ztunnel connection: the agent's ZDS server on ${this.#s.ztunnelUdsAddress} is not listening yet`,
        );
      }
      await this.#server.podAdded(pod.uid, workload(pod), netns.fd);
    } catch (e) {
      // Rules stay: the pod must not run unredirected. `pending` tells the informer to retry.
      let also = '';
      try {
        await this.#annotator.setRedirection(pod, 'pending');
      } catch (ae) {
        also = ` (and marking it pending failed: ${(ae as Error).message})`;
      }
      log.error('ztunnel did not take the pod: it stays pending', { pod: name, error: (e as Error).message });
      const msg = (e as Error).message;
      throw new EnrollError(
        'ztunnel',
        `${/ztunnel/i.test(msg) ? msg : `ztunnel: ${msg}`}; pod ${name} is pending${also}`,
        { cause: e },
      );
    }
    try {
      for (const ip of pod.ips) await addProbeIP(this.#host, ip, pod.uid);
    } catch (e) {
      throw new EnrollError('ipset', `cannot add pod ${name} to the probe ipset: ${(e as Error).message}`, {
        cause: e,
      });
    }
    try {
      await this.#annotator.setRedirection(pod, 'enabled');
    } catch (e) {
      throw new EnrollError('annotate', `cannot annotate pod ${name} enabled: ${(e as Error).message}`, { cause: e });
    }
    this.#enrolled.add(pod.uid);
  }

  /** Best effort, each family on its own: '' or what could not be taken out. */
  async #rollBackRules(netns: HeldNetns): Promise<string> {
    const failed: string[] = [];
    let flavour: Flavour;
    try {
      flavour = await this.#flavour();
    } catch (e) {
      return ` (and its rules could not be taken out again: ${(e as Error).message})`;
    }
    for (const f of [4, 6] as const) {
      try {
        await this.#inpod.run(() => removeInpod(runnerIn(netns), flavour, [f]));
      } catch (e) {
        failed.push(`IPv${f}: ${(e as Error).message}`);
      }
    }
    return failed.length === 0 ? '' : ` (and its rules could not all be taken out again: ${failed.join('; ')})`;
  }

  removePodFromMesh(pod: AmbientPod, isDelete: boolean): Promise<void> {
    return this.#serial(pod.uid, () => this.#remove(pod, isDelete));
  }

  async #remove(pod: AmbientPod, isDelete: boolean): Promise<void> {
    const name = podName(pod);
    log.info('removing pod from the mesh', { pod: name, uid: pod.uid, deleted: isDelete });
    if (isDelete) {
      // A UID is never reused: refusing its later adds is all this remembers.
      this.#deleted.delete(pod.uid);
      this.#deleted.add(pod.uid);
      for (const uid of this.#deleted) {
        if (this.#deleted.size <= DELETED_KEPT) break;
        this.#deleted.delete(uid);
      }
    }
    try {
      for (const ip of pod.ips) {
        const r = await removeProbeIP(this.#host, ip, pod.uid);
        if (!r.removed && r.owner !== null) {
          log.warn('probe ipset entry kept: the IP is now another pod', { pod: name, ip, owner: r.owner });
        }
      }
    } catch (e) {
      throw new EnrollError('ipset', `cannot remove pod ${name} from the probe ipset: ${(e as Error).message}`, {
        cause: e,
      });
    }
    const cached = this.#cache.get(pod.uid);
    const held = this.#cache.take(pod.uid);
    // A running pod whose netns is not held (not found at start-up, or let go after a failed
    // add) may still have its rules: found now, or they would send its traffic to a ztunnel
    // that is about to let it go (Istio leaves them).
    const found = !isDelete && held === null ? await this.#findForRemoval(pod) : null;
    const netns = held ?? found;
    if (!isDelete && netns !== null) {
      try {
        const flavour = await this.#flavour();
        await this.#inpod.run(() => removeInpod(runnerIn(netns), flavour, this.#podFamilies(pod)));
      } catch (e) {
        // Back in the cache: the retry needs the netns to take the rules out (Istio drops it
        // here, and a retry then leaves the rules in a pod ztunnel no longer serves).
        if (held !== null) this.#cache.upsert(pod.uid, cached!.info, held);
        else {
          found?.close(); // never handed out; the retry finds it again
          if (cached) this.#cache.ensure(pod.uid, cached.info);
        }
        throw new EnrollError('rules', `cannot remove the in-pod rules of pod ${name}: ${(e as Error).message}`, {
          cause: e,
          retryable: true,
        });
      }
    }
    if (found !== null) found.close();
    else this.#cache.release(held);
    this.#enrolled.delete(pod.uid);
    try {
      await this.#server?.podDeleted(pod.uid);
    } catch (e) {
      throw new EnrollError('ztunnel', `ztunnel did not let pod ${name} go: ${(e as Error).message}`, { cause: e });
    }
    try {
      await this.#annotator.setRedirection(pod, null);
    } catch (e) {
      if (!isDelete) {
        throw new EnrollError('annotate', `cannot remove the annotation of pod ${name}: ${(e as Error).message}`, {
          cause: e,
        });
      }
      log.debug('annotation of a deleted pod not removed', { pod: name, error: (e as Error).message });
    }
  }

  /** The netns of a running pod being removed that the agent does not hold; null: not found (logged). */
  async #findForRemoval(pod: AmbientPod): Promise<HeldNetns | null> {
    const name = podName(pod);
    try {
      const r = await findPodNetns(pod.mirrorUid ?? pod.uid, pod.ips, this.#nsOpts);
      if (r.ok) return r.netns;
      log.warn("the pod's netns is not held and not found: its in-pod rules are not removed", {
        pod: name,
        reason: r.reason,
        detail: r.detail,
      });
    } catch (e) {
      log.warn("the pod's netns is not held and cannot be looked for: its in-pod rules are not removed", {
        pod: name,
        error: (e as Error).message,
      });
    }
    return null;
  }

  syncHostProbeIPs(pod: AmbientPod): Promise<void> {
    return this.#serial(pod.uid, async () => {
      try {
        for (const ip of pod.ips) await addProbeIP(this.#host, ip, pod.uid);
      } catch (e) {
        throw new EnrollError('ipset', `cannot add pod ${podName(pod)} to the probe ipset: ${(e as Error).message}`, {
          cause: e,
        });
      }
      await this.#findKept(pod);
    });
  }

  /**
   * A pod known without its netns (read without IPs at start-up, after a kubelet restart) whose
   * IPs are now known: found, its rules reconciled as at start-up, and handed to ztunnel. Else
   * every snapshot names it Keep, and a ztunnel that restarts (an upgrade) never gets it: its
   * rules send its traffic to a proxy that does not exist. Failures are logged; it stays Keep.
   */
  async #findKept(pod: AmbientPod): Promise<void> {
    const cached = this.#cache.get(pod.uid);
    if (cached === undefined || cached.netns !== null || pod.ips.length === 0 || !this.#enrolled.has(pod.uid)) return;
    const name = podName(pod);
    const r = await findPodNetns(pod.mirrorUid ?? pod.uid, pod.ips, this.#nsOpts).catch((e: Error) => ({
      ok: false as const,
      reason: 'no_netns',
      detail: e.message,
    }));
    if (!r.ok) {
      log.warn('the netns of an enrolled pod is still not found; ztunnel is told to keep what it has', {
        pod: name,
        reason: r.reason,
        detail: r.detail,
      });
      return;
    }
    const netns = this.#cache.upsert(pod.uid, workload(pod), r.netns);
    try {
      if (this.#s.reconcilePodRulesOnStartup) await this.#programRules(pod, netns);
      await this.#server?.podAdded(pod.uid, workload(pod), netns.fd);
      log.info("an enrolled pod's netns was found once its IPs were known", { pod: name });
    } catch (e) {
      log.error("an enrolled pod's netns was found, but it could not be handed to ztunnel again", {
        pod: name,
        error: (e as Error).message,
      });
    }
  }

  isEnrolled(uid: string): boolean {
    return this.#enrolled.has(uid);
  }

  notReadyReasons(): string[] {
    if (this.#stopped) return ['ambient: stopped'];
    return this.#started ? [] : [NOT_READY];
  }

  status(): DataplaneStatus {
    return {
      started: this.#started,
      socket: this.#s.ztunnelUdsAddress,
      listening: this.#server !== null,
      connections: this.#server?.connections ?? 0,
      enrolledPods: this.#enrolled.size,
      podsWithoutNetns: this.#cache.withoutNetns(),
    };
  }

  async start(pods: readonly AmbientPod[]): Promise<void> {
    if (this.#started || this.#server !== null) throw new Error('the ambient dataplane was started already');
    // A start that failed is retried with the pods enrolled now: those of the failed attempt that
    // are no longer among them must not reach ztunnel's snapshot.
    const now = new Set(pods.map((p) => p.uid));
    for (const uid of this.#startupUids) if (!now.has(uid)) this.#cache.release(this.#cache.take(uid));
    this.#startupUids = now;
    const flavour = await this.#flavour();
    const snat = { v4: this.#s.hostProbeSnatIp, v6: this.#s.hostProbeSnatIpv6 };
    try {
      await applyHost(this.#host, flavour, this.#hostFamilies, snat);
    } catch (e) {
      throw new Error(`cannot set up ambient's host probe rules (${flavour}): ${(e as Error).message}`, { cause: e });
    }
    const startup: StartupPod[] = pods.map((p) => ({
      uid: p.uid,
      namespace: p.namespace,
      name: p.name,
      ips: p.ips,
      info: workload(p),
      ...(p.mirrorUid ? { cgroupUid: p.mirrorUid } : {}),
    }));
    const byUid = new Map(pods.map((p) => [p.uid, p]));
    const r = await buildStartupState(startup, {
      cache: this.#cache,
      host: this.#host,
      hostFamilies: this.#hostFamilies,
      findMany: (list) => findPodsNetns(list, this.#nsOpts),
      reconcile: this.#s.reconcilePodRulesOnStartup ? (p, netns) => this.#programRules(byUid.get(p.uid)!, netns) : null,
    });
    this.#server = await this.#listen();
    for (const p of pods) this.#enrolled.add(p.uid);
    this.#started = true;
    log.info('ambient dataplane started', {
      pods: pods.length,
      withNetns: r.withNetns,
      withoutNetns: r.withoutNetns.size,
      rulesReconciled: r.reconciled,
      rulesFailed: r.reconcileFailed.size,
      probeIPs: r.probes.added,
      probePruned: r.probes.pruned,
      socket: this.#s.ztunnelUdsAddress,
    });
  }

  async #listen(): Promise<ZtunnelServer> {
    const sock = this.#s.ztunnelUdsAddress;
    const dir = path.dirname(sock);
    let st;
    try {
      st = await stat(dir);
      if (!st.isDirectory()) throw new Error('not a directory');
    } catch (e) {
      throw new Error(
        `cannot listen for ztunnel on ${sock} (--ztunnel-uds-address): its directory ${dir} is not there ` +
          `(${(e as Error).message}); mount ztunnel's socket directory there`,
        { cause: e },
      );
    }
    // Whoever can write the dir can put a socket of theirs in ours' place: ztunnel would then talk
    // to them, or they to ztunnel, and every Add hands over a pod's netns. Only root's dir, written
    // by root alone (the hostPath makes it 0755 root's), is listened in.
    if (st.uid !== 0 || (st.mode & 0o022) !== 0) {
      throw new Error(
        `cannot listen for ztunnel on ${sock} (--ztunnel-uds-address): its directory ${dir} is ` +
          `${st.uid !== 0 ? `not root's (owner uid ${st.uid})` : 'writable by a user other than root'} ` +
          `(mode 0${(st.mode & 0o7777).toString(8)}); make it root's and writable by root only (0755)`,
      );
    }
    // A socket left by an agent that did not stop cleanly: ours to replace (Istio unlinks it too).
    // Anything else at that path is not ours: refused.
    try {
      const st = await lstat(sock);
      if (!st.isSocket()) {
        throw new Error(`cannot listen for ztunnel on ${sock}: something other than a socket is there; remove it`);
      }
      await rm(sock, { force: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    const server = new ZtunnelServer({
      path: sock,
      snapshot: () => this.#cache.snapshot(),
      ...(this.#timings ? { timings: this.#timings } : {}),
    });
    // The fds of a snapshot stay open until that connection's snapshot is sent or the connection is gone.
    server.on('connected', (id) => this.#snapshotHolds.set(id, this.#cache.hold()));
    const done = (id: number) => {
      this.#snapshotHolds.get(id)?.();
      this.#snapshotHolds.delete(id);
    };
    server.on('snapshot', (id) => done(id));
    server.on('disconnected', (id) => done(id));
    return server;
  }

  async stop(cleanup: boolean): Promise<void> {
    this.#stopped = true;
    const server = this.#server;
    this.#server = null;
    await server?.close();
    for (const release of this.#snapshotHolds.values()) release();
    this.#snapshotHolds.clear();
    if (cleanup) {
      // Uninstall: the node's probe rule and sets go. Running pods keep their in-pod rules (as
      // Istio: unlabel first, README), so their traffic never leaves ztunnel's path unasked.
      await removeHost(this.#host, await this.#flavour(), this.#hostFamilies);
    }
    this.#cache.clear();
  }
}

export function createDataplane(settings: Settings, deps: DataplaneDeps): MeshDataplane {
  return new Dataplane(settings, deps);
}

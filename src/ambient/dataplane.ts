// Ambient mode's node dataplane (docs/ambient.md): enrolls pods into the node proxy, ztunnel. After
// Istio's cni/pkg/nodeagent (meshdataplane_linux.go, net_linux.go), our code:
// - a pod is added in a fixed order: its netns held -> in-pod rules -> ztunnel told (AddWorkload
//   + the netns fd, acked) -> its IPs in the node's probe ipset -> annotated `enabled`. Rules go in
//   before ztunnel hears of the pod, so no packet of an enrolled pod bypasses it;
// - what counts as enrolled is the agent's own record (#record): the pods it wrote rules for and
//   handed to ztunnel, and the IPs it put in the probe ipset for each. The annotation is only
//   what it tells others: the pod's owner can write it too (docs/ambient.md "What the agent counts as
//   enrolled");
// - removal goes the other way: probe ipset -> rules out of the netns (unless the pod is being
//   deleted) -> ztunnel told to let go (every connection) -> annotation removed;
// - start(): the node's probe rule and sets, every running pod that should be ambient found and
//   its rules made so (snapshot.ts), then the ZDS socket opens and each ztunnel that connects
//   gets the snapshot.
// The pieces: podbackend.ts (the in-pod rules, iptables or nftables) and hostbackend.ts (the node's
// probe path: hostrules.ts or hostnft.ts), as --native-nftables decided; src/podnetns/ (netns by
// fd, nsenter), ztunnelserver.ts (ZDS), podcache.ts (the held netns), hostprobes.ts (the sync).

import { lstat, rm, stat, statfs } from 'node:fs/promises';
import path from 'node:path';
import { untrustedDirChain } from '../../cni-plugin/shared/trustedpath.ts';
import type { AmbientArgs } from './args.ts';
import { hostFlavourDetector } from '../hostnet/flavour.ts';
import { KeyedSerial, Limit } from '../concurrency.ts';
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
import { copyEntries, type HostProbes } from './hostbackend.ts';
import { HostHealer, type HealOptions } from './hostheal.ts';
import { NftHostProbes } from './hostnft.ts';
import { canonicalIP, IptablesHostProbes } from './hostrules.ts';
import { chooseKubeletUid, DEFAULT_KUBELET_UID } from './kubeletuid.ts';
import { PodCache } from './podcache.ts';
import { iptablesInpod, nftInpod, type InpodBackend } from './podbackend.ts';
import { podOptions, type Family, type Flavour, type Runner } from './podrules.ts';
import { REDIRECTION_ANNOTATION, type AmbientPodInfo, type Redirection } from './enablement.ts';
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
  /**
   * `pods`: every running pod that should be ambient now, enrolled (rules, ztunnel's snapshot,
   * probe ipset); `leftovers`: others that carry the redirection annotation, recorded pending so
   * that the informer takes out whatever of ours they may have.
   */
  start(pods: readonly AmbientPod[], leftovers?: readonly AmbientPod[]): Promise<void>;
  addPodToMesh(pod: AmbientPod, netnsPath: string | null): Promise<void>;
  removePodFromMesh(pod: AmbientPod, isDelete: boolean): Promise<void>;
  syncHostProbeIPs(pod: AmbientPod): Promise<void>;
  isEnrolled(uid: string): boolean;
  /** The agent's own record of the pod: enabled, pending (some of ours may be in), or nothing. */
  enrollment(uid: string): Redirection | undefined;
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
  /** Pods enrolled (added, or enrolled at start-up). */
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
  /** The host probe path's healer (hostheal.ts): its clock and timings. */
  readonly hostHeal?: HealOptions;
  /** kubelet's uid for the nftables probe rule; default: --kubelet-uid, else confirmed at start (kubeletuid.ts). */
  readonly kubeletUid?: () => Promise<number>;
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
/** An IP as the probe set spells it; as given when it is no IP (hostrules refuses it then). */
const probeKey = (ip: string): string => {
  try {
    return canonicalIP(ip).text;
  } catch {
    return ip;
  }
};
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

/**
 * The agent's own record of a pod: what it did to it, never what the pod says (docs/ambient.md "What the
 * agent counts as enrolled").
 */
interface Enrollment {
  /** enabled: its rules are in and ztunnel took it; pending: some of ours may be in (rules, not ztunnel). */
  state: Redirection;
  /**
   * The IPs this agent put in the probe ipset for it and has not taken out (the probe set's
   * spelling): its removal takes these out, whatever the pod's status says by then (a pod deleted
   * before the kubelet wrote its IPs has none there).
   */
  probeIPs: string[];
}

class Dataplane implements MeshDataplane {
  readonly #s: AmbientArgs;
  readonly #nsOpts: PodNetnsOptions;
  readonly #annotator: PodAnnotator;
  readonly #host: Runner;
  readonly #flavour: () => Promise<Flavour>;
  readonly #timings: Partial<ZdsTimings> | undefined;
  readonly #hostFamilies: Family[];
  readonly #cache = new PodCache();
  /** Pod UID -> what this agent did to it (Enrollment); the only record of enrollment it reads. */
  readonly #record = new Map<string, Enrollment>();
  /** Per pod UID: its operations one at a time, in call order. */
  readonly #perPod = new KeyedSerial<string>();
  #server: ZtunnelServer | null = null;
  #started = false;
  #stopped = false;
  readonly #healOpts: HealOptions | undefined;
  /** The in-pod rules' backend (podbackend.ts), as the agent chose. */
  readonly #inpodRules: InpodBackend;
  readonly #kubeletUid: () => Promise<number>;
  /** The node's probe path in the chosen backend; made at start (nftables needs kubelet's uid). */
  #hostProbes: HostProbes | null = null;
  /** Puts the node's probe rule and sets back when another writer takes them (from start to stop). */
  #heal: HostHealer | null = null;
  readonly #snapshotHolds = new Map<number, () => void>();
  /** The pods the last start() put in the cache. */
  #startupUids = new Set<string>();
  /** In-pod rule writes under way, across pods (INPOD_CONCURRENCY). */
  readonly #inpod = new Limit(INPOD_CONCURRENCY);
  /** UIDs of pods removed as deleted (newest last, at most DELETED_KEPT): never enrolled again. */
  readonly #deleted = new Set<string>();

  constructor(args: AmbientArgs, deps: DataplaneDeps) {
    this.#s = args;
    this.#nsOpts = { hostProcDir: args.hostProcDir, hostNetnsPath: args.hostNetnsPath };
    this.#annotator = deps.annotator;
    this.#host = deps.host ?? ((argv, opts) => runOnHost(argv, { input: opts?.input ?? null }));
    this.#flavour = deps.flavour ?? hostFlavourDetector();
    this.#timings = deps.zdsTimings;
    this.#healOpts = deps.hostHeal;
    this.#hostFamilies = this.#s.ipv6 ? [4, 6] : [4];
    this.#inpodRules = args.nativeNftables === true ? nftInpod(this.#flavour) : iptablesInpod(this.#flavour);
    this.#kubeletUid = deps.kubeletUid ?? (() => kubeletUidAtStart(args));
  }

  #snat() {
    return { v4: this.#s.hostProbeSnatIp, v6: this.#s.hostProbeSnatIpv6 };
  }

  /** Our nftables probe table, only to remove it: the rule it would write does not matter. */
  #nftToRemove(): NftHostProbes {
    return new NftHostProbes(this.#host, { families: this.#hostFamilies, kubeletUid: DEFAULT_KUBELET_UID });
  }

  #iptablesHost(): IptablesHostProbes {
    return new IptablesHostProbes(this.#host, this.#flavour, this.#hostFamilies, this.#snat());
  }

  /** The node's probe path in the chosen backend, and the other one (to move from), made once. */
  async #hostBackends(): Promise<{ chosen: HostProbes; other: HostProbes }> {
    const nft = async () =>
      new NftHostProbes(this.#host, {
        families: this.#hostFamilies,
        kubeletUid: await this.#kubeletUid(),
        snat: this.#snat(),
      });
    if (this.#s.nativeNftables) {
      this.#hostProbes ??= await nft();
      return { chosen: this.#hostProbes, other: this.#iptablesHost() };
    }
    this.#hostProbes ??= this.#iptablesHost();
    return { chosen: this.#hostProbes, other: this.#nftToRemove() };
  }

  /** The probe path, once start() made it. */
  #probes(): HostProbes {
    if (this.#hostProbes === null) throw new Error('the host probe path is not set up yet (ambient is starting)');
    return this.#hostProbes;
  }

  /** Runs `fn` after every earlier operation on the same pod has settled. */
  #serial<T>(uid: string, fn: () => Promise<T>): Promise<T> {
    return this.#perPod.run(uid, fn);
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
    await this.#inpod.run(() => this.#inpodRules.apply(runnerIn(netns), this.#podFamilies(pod), opts));
  }

  /**
   * The rules of a running pod the agent is about to hand to ztunnel without an ADD (at start-up).
   * After a restart it has no memory of what it wrote, and the pod's annotation is no record: with --ambient-reconcile-pod-rules-on-startup they are reconciled; without it,
   * rules of ours that are there stay as they are, and a pod without them gets them (never
   * handed to ztunnel unredirected).
   */
  async #rulesAtStart(pod: AmbientPod, netns: HeldNetns): Promise<void> {
    if (this.#s.reconcilePodRulesOnStartup) return this.#programRules(pod, netns);
    const families = this.#podFamilies(pod);
    if (await this.#inpod.run(() => this.#inpodRules.redirects(runnerIn(netns), families))) return;
    await this.#programRules(pod, netns);
  }

  /**
   * The pod's probe entries become `ips`: each added (and recorded as it goes in), then those
   * this agent added for it before that it no longer has taken out (a new sandbox's IPs). An
   * entry left for an IP the pod no longer has would give the next pod with that IP the node's
   * traffic from the probe address.
   */
  async #probeIPsNow(pod: AmbientPod, ips: readonly string[]): Promise<void> {
    const rec = this.#record.get(pod.uid);
    const now = new Set<string>();
    for (const ip of ips) {
      await this.#probes().addProbeIP(ip, pod.uid);
      now.add(probeKey(ip));
      if (rec && !rec.probeIPs.includes(probeKey(ip))) rec.probeIPs.push(probeKey(ip));
    }
    if (!rec) return;
    for (const ip of rec.probeIPs.filter((x) => !now.has(x))) {
      await this.#removeProbeIP(pod, ip);
      rec.probeIPs = rec.probeIPs.filter((x) => x !== ip);
    }
  }

  /** Out of the probe set if the entry is still this pod's (a reused IP keeps its new owner). */
  async #removeProbeIP(pod: AmbientPod, ip: string): Promise<void> {
    const r = await this.#probes().removeProbeIP(ip, pod.uid);
    if (!r.removed && r.owner !== null) {
      log.warn('probe ipset entry kept: the IP is now another pod', { pod: podName(pod), ip, owner: r.owner });
    }
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
    const before = this.#record.get(pod.uid);
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
      // not redirected before (a netns new to the agent, none of ours on record) goes back to
      // that; one on record (pending/enabled) keeps what it has (fail closed; its removal finds
      // the netns again). The pod's annotation is its owner's to write: never asked.
      let also = '';
      if (netns !== heldBefore && before === undefined) {
        also = await this.#rollBackRules(netns);
      }
      this.#cache.release(this.#cache.take(pod.uid));
      throw new EnrollError('rules', `cannot program the in-pod rules of pod ${name}: ${(e as Error).message}${also}`, {
        cause: e,
      });
    }
    // Rules of ours are in from here on: on record (pending until ztunnel has the pod), so that
    // whatever fails next, the informer removes them if the pod is no longer wanted.
    const rec: Enrollment = before ?? { state: 'pending', probeIPs: [] };
    rec.state = 'pending';
    this.#record.set(pod.uid, rec);
    try {
      if (this.#server === null) {
        throw new ZtunnelError(
          'no_connection',
          `no ztunnel connection: the agent's ZDS server on ${this.#s.ztunnelUdsAddress} is not listening yet`,
        );
      }
      await this.#server.podAdded(pod.uid, workload(pod), netns.fd);
    } catch (e) {
      // Rules stay: the pod must not run unredirected. Pending on record: the informer retries
      // (the annotation only tells others).
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
      await this.#probeIPsNow(pod, pod.ips);
    } catch (e) {
      throw new EnrollError('ipset', `cannot add pod ${name} to the probe ipset: ${(e as Error).message}`, {
        cause: e,
      });
    }
    // Enrolled: the annotation after it is what others are told, not part of the record.
    rec.state = 'enabled';
    try {
      await this.#annotator.setRedirection(pod, 'enabled');
    } catch (e) {
      throw new EnrollError('annotate', `cannot annotate pod ${name} enabled: ${(e as Error).message}`, { cause: e });
    }
  }

  /** Best effort, each family on its own: '' or what could not be taken out. */
  async #rollBackRules(netns: HeldNetns): Promise<string> {
    const failed: string[] = [];
    for (const f of [4, 6] as const) {
      try {
        await this.#inpod.run(() => this.#inpodRules.remove(runnerIn(netns), [f]));
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
    // Partly ours until the end: a step that fails leaves it pending, so the informer's retry
    // (or an add, if it is wanted again) finds it.
    const rec = this.#record.get(pod.uid);
    if (rec) rec.state = 'pending';
    try {
      // The IPs we put in, and those its status names (an entry of an earlier run's); each only
      // while the entry is still this pod's.
      for (const ip of new Set([...(rec?.probeIPs ?? []), ...pod.ips.map(probeKey)])) {
        await this.#removeProbeIP(pod, ip);
        if (rec) rec.probeIPs = rec.probeIPs.filter((x) => x !== ip);
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
        await this.#inpod.run(() => this.#inpodRules.remove(runnerIn(netns), this.#podFamilies(pod)));
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
    this.#record.delete(pod.uid);
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
        await this.#probeIPsNow(pod, pod.ips);
      } catch (e) {
        throw new EnrollError('ipset', `cannot add pod ${podName(pod)} to the probe ipset: ${(e as Error).message}`, {
          cause: e,
        });
      }
    });
  }

  isEnrolled(uid: string): boolean {
    return this.#record.get(uid)?.state === 'enabled';
  }

  enrollment(uid: string): Redirection | undefined {
    return this.#record.get(uid)?.state;
  }

  notReadyReasons(): string[] {
    if (this.#stopped) return ['ambient: stopped'];
    return this.#started ? (this.#heal?.notReadyReasons() ?? []) : [NOT_READY];
  }

  status(): DataplaneStatus {
    return {
      started: this.#started,
      socket: this.#s.ztunnelUdsAddress,
      listening: this.#server !== null,
      connections: this.#server?.connections ?? 0,
      enrolledPods: [...this.#record.values()].filter((r) => r.state === 'enabled').length,
      podsWithoutNetns: this.#cache.withoutNetns(),
    };
  }

  async start(pods: readonly AmbientPod[], leftovers: readonly AmbientPod[] = []): Promise<void> {
    if (this.#started || this.#server !== null) throw new Error('the ambient dataplane was started already');
    // A start that failed is retried with the pods enrolled now: those of the failed attempt that
    // are no longer among them must not reach ztunnel's snapshot.
    const now = new Set(pods.map((p) => p.uid));
    for (const uid of this.#startupUids) if (!now.has(uid)) this.#cache.release(this.#cache.take(uid));
    this.#startupUids = now;
    const { chosen, other } = await this.#hostBackends();
    try {
      await chosen.apply();
    } catch (e) {
      throw new Error(`cannot set up ambient's host probe rules (${chosen.name}): ${(e as Error).message}`, {
        cause: e,
      });
    }
    // What the other backend held (a node that switched) first, so the sync below keeps the
    // entries of pods without an IP yet as it would have in the other.
    const copied = await copyEntries(chosen, other);
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
      host: chosen,
      findMany: (list) => findPodsNetns(list, this.#nsOpts),
      rules: (p, netns) => this.#rulesAtStart(byUid.get(p.uid)!, netns),
    });
    this.#server = await this.#listen();
    // The record from here on is what this start did: enabled only where it saw the pod's rules
    // made so. A pod whose rules failed, or whose netns was not found (rules never seen: one
    // labelled while the agent was down has none), is pending, so the informer's add finds it and
    // writes them; never enabled on a guess (Keep for ztunnel meanwhile).
    for (const p of pods) {
      const state = r.rulesFailed.has(p.uid) || r.withoutNetns.has(p.uid) ? 'pending' : 'enabled';
      const kept = r.probes.kept.get(p.uid) ?? [];
      this.#record.set(p.uid, { state, probeIPs: [...new Set([...p.ips.map(probeKey), ...kept])] });
    }
    for (const p of leftovers)
      if (!this.#record.has(p.uid)) this.#record.set(p.uid, { state: 'pending', probeIPs: [] });
    this.#started = true;
    for (const p of pods) if (p.annotations[REDIRECTION_ANNOTATION] !== 'enabled') this.#tellEnabled(p);
    await this.#leave(other, chosen, copied);
    this.#heal = new HostHealer(chosen, this.#healOpts);
    this.#heal.start();
    log.info('ambient dataplane started', {
      pods: pods.length,
      withNetns: r.withNetns,
      withoutNetns: r.withoutNetns.size,
      leftovers: leftovers.length,
      rulesChecked: r.rulesDone,
      rulesFailed: r.rulesFailed.size,
      probeIPs: r.probes.added,
      probePruned: r.probes.pruned,
      socket: this.#s.ztunnelUdsAddress,
    });
  }

  /**
   * The other backend's probe path out, once the chosen one holds every enrolled pod's entry (a
   * node whose --native-nftables choice changed). A failure is said, not fatal: the chosen one
   * SNATs first, so what is left of the other changes no probe; the next start tries again.
   */
  async #leave(other: HostProbes, chosen: HostProbes, copied: number): Promise<void> {
    try {
      const r = await other.remove();
      if (r === 'removed')
        log.info("moved the host probe path: the other backend's rule and sets are removed", {
          from: other.name,
          to: chosen.name,
          entriesCopied: copied,
        });
      if (r === 'foreign')
        log.warn('a table of our name that is not ours is on the node: left alone', { in: other.name });
    } catch (e) {
      log.warn("cannot remove the other backend's host probe path; the chosen one SNATs first, so probes work", {
        from: other.name,
        to: chosen.name,
        error: (e as Error).message,
      });
    }
  }

  /**
   * The annotation of a pod enrolled at start-up that does not say so (labelled while the agent was
   * down), in the pod's turn: only what others are told, so a failure is logged, not retried.
   */
  #tellEnabled(pod: AmbientPod): void {
    void this.#serial(pod.uid, async () => {
      if (this.#record.get(pod.uid)?.state !== 'enabled') return;
      await this.#annotator.setRedirection(pod, 'enabled');
    }).catch((e: unknown) =>
      log.warn('cannot annotate a pod enrolled at start-up enabled; it is enrolled all the same', {
        pod: podName(pod),
        error: (e as Error).message,
      }),
    );
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
    // Whoever can write the dir, or one above it, can put a socket of theirs in ours' place:
    // ztunnel would then talk to them, or they to ztunnel, and every Add hands over a pod's netns.
    // Only dirs of root's, written by root alone (the hostPath makes it 0755 root's), are walked.
    const untrusted = untrustedDirChain(dir);
    if (untrusted !== null) {
      throw new Error(
        `cannot listen for ztunnel on ${sock} (--ztunnel-uds-address): ${untrusted}; make its directory and ` +
          'every one above it root\'s and writable by root only (0755; docs/security.md "Socket paths")',
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
    // First: a heal after the uninstall's removeHost below would put the node's rule back.
    await this.#heal?.stop();
    const server = this.#server;
    this.#server = null;
    await server?.close();
    for (const release of this.#snapshotHolds.values()) release();
    this.#snapshotHolds.clear();
    if (cleanup) {
      // Uninstall: the node's probe rule and sets go. Running pods keep their in-pod rules (as
      // Istio: unlabel first; docs/uninstall.md), so their traffic never leaves ztunnel's path unasked.
      // Both backends: a node that switched keeps nothing of ours in either.
      const chosen = this.#hostProbes ?? (this.#s.nativeNftables ? this.#nftToRemove() : this.#iptablesHost());
      const other = this.#s.nativeNftables ? this.#iptablesHost() : this.#nftToRemove();
      await chosen.remove();
      await other.remove();
    }
    this.#cache.clear();
  }
}

/** kubelet's uid: --kubelet-uid, else root as the host's /proc confirms it, else root with a warning. */
async function kubeletUidAtStart(args: AmbientArgs): Promise<number> {
  const c = await chooseKubeletUid(args.kubeletUid, args.hostProcDir, args.hostNetnsPath);
  if (c.from === 'flag') log.info("kubelet's uid for the nftables probe rule, from --kubelet-uid", { uid: c.uid });
  else if (c.from === 'scan')
    log.info("kubelet's uid for the nftables probe rule", { uid: c.uid, process: c.comm, pid: c.pid });
  else
    log.warn(
      "kubelet's uid not confirmed: the nftables probe rule SNATs the connections of uid 0 (kubelet as root); " +
        'if kubelet runs as another uid here its probes of ambient pods go to ztunnel and fail: set --kubelet-uid ' +
        '(docs/ambient.md "Native nftables")',
      { uid: c.uid, why: c.why },
    );
  return c.uid;
}

export function createDataplane(args: AmbientArgs, deps: DataplaneDeps): MeshDataplane {
  return new Dataplane(args, deps);
}

// Start-up: the node's running pods that should be ambient, made whole before ztunnel may connect
// (Istio's ConstructInitialSnapshot, which takes the pods annotated enabled instead):
// 0. which pods (podsAtStart): the agent's own decision now. A restarted agent has no memory of
//    what it enrolled, and the pod's redirection annotation is no record (its owner can write
//    it): every pod that should be ambient is enrolled again, idempotently; the others that carry
//    the annotation are leftovers, whose removal the informer runs (our chains only);
// 1. the probe ipset synced to their IPs (hostprobes.ts);
// 2. every pod in the cache, and their netns found with ONE walk of the host's /proc (a node of
//    250 pods must not be walked 250 times): a pod whose netns is not found stays in the cache
//    without one, and ztunnel's snapshot names it with Keep;
// 3. their in-pod rules made so (the dataplane's rulesAtStart: reconciled, or with
//    --ambient-reconcile-pod-rules-on-startup off written only where ours are not there).
//    Idempotent: unchanged rules are not rewritten.
// A failure of one pod is logged and the others go on: the agent must come up for the rest.

import type { V1Pod } from '@kubernetes/client-node';
import { mapBounded } from '../concurrency.ts';
import { scope } from '../monitoring/logging.ts';
import type { FindResult, HeldNetns, PodToFind } from '../podnetns/index.ts';
import { isTerminal, redirectionOf } from './enablement.ts';
import type { HostProbes } from './hostbackend.ts';
import { syncProbeSets, type ProbeSync } from './hostprobes.ts';
import type { PodCache } from './podcache.ts';
import type { WorkloadInfo } from './zds.ts';

const log = scope('ambient');
/** Pods whose rules are reconciled at once at start-up. */
const RECONCILE_CONCURRENCY = 4;

export interface PodsAtStart {
  /** Running pods that should be ambient: enrolled by the start. */
  readonly enroll: V1Pod[];
  /** Pods not to enroll that carry the redirection annotation: some of ours may be in them. */
  readonly leftover: V1Pod[];
}

/**
 * The pods a start takes, by the agent's own decision (`wanted`: isAmbientPod with the namespace
 * labels now). The annotation only marks a pod for a removal that takes out our chains, never
 * for enrollment; a sidecar or host-network pod (`never`) is neither, whatever it carries.
 */
export function podsAtStart(
  pods: readonly V1Pod[],
  wanted: (pod: V1Pod) => boolean,
  never: (pod: V1Pod) => boolean,
): PodsAtStart {
  const enroll: V1Pod[] = [];
  const leftover: V1Pod[] = [];
  for (const p of pods) {
    if (!isTerminal(p) && wanted(p)) enroll.push(p);
    else if (redirectionOf(p) !== undefined && !never(p)) leftover.push(p);
  }
  return { enroll, leftover };
}

export interface StartupPod {
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  readonly ips: readonly string[];
  readonly info: WorkloadInfo;
  /** The UID its processes' cgroups carry (a static pod's kubelet UID), if not `uid`. */
  readonly cgroupUid?: string;
}

export interface StartupDeps {
  readonly cache: PodCache;
  /** The node's probe path (iptables + ipset, or nftables). */
  readonly host: HostProbes;
  /** podnetns' findPodsNetns, bound to --host-proc-dir/--host-netns-path. */
  readonly findMany: (pods: readonly PodToFind[]) => Promise<Map<string, FindResult>>;
  /** Makes a pod's in-pod rules so (the dataplane's rulesAtStart). */
  readonly rules: (pod: StartupPod, netns: HeldNetns) => Promise<unknown>;
}

export interface StartupResult {
  readonly probes: ProbeSync;
  /** Pods whose netns was found and is held. */
  readonly withNetns: number;
  /** UIDs of the pods whose netns was not found, and why. */
  readonly withoutNetns: ReadonlyMap<string, string>;
  /** Pods whose rules were made so / failed to be (uid -> message). */
  readonly rulesDone: number;
  readonly rulesFailed: ReadonlyMap<string, string>;
}

export async function buildStartupState(pods: readonly StartupPod[], d: StartupDeps): Promise<StartupResult> {
  const probes = await syncProbeSets(d.host, pods);
  for (const p of pods) d.cache.ensure(p.uid, p.info);
  const byCgroupUid = new Map(pods.map((p) => [p.cgroupUid ?? p.uid, p]));
  const found = await d.findMany(pods.map((p) => ({ uid: p.cgroupUid ?? p.uid, ips: p.ips })));
  const withoutNetns = new Map<string, string>();
  const held: [StartupPod, HeldNetns][] = [];
  for (const [cgroupUid, r] of found) {
    const pod = byCgroupUid.get(cgroupUid)!;
    if (!r.ok) {
      withoutNetns.set(pod.uid, `${r.reason}: ${r.detail}`);
      log.warn('the netns of an enrolled pod was not found at start-up; ztunnel is told to keep what it has', {
        pod: `${pod.namespace}/${pod.name}`,
        uid: pod.uid,
        reason: r.reason,
        detail: r.detail,
      });
      continue;
    }
    held.push([pod, d.cache.upsert(pod.uid, pod.info, r.netns)]);
  }
  let rulesDone = 0;
  const rulesFailed = new Map<string, string>();
  // A few pods at a time: each is a few programs in its own netns (a node of 250 pods would
  // otherwise wait for 250 in a row); the iptables lock (-w) orders the legacy writes.
  await mapBounded(held, RECONCILE_CONCURRENCY, async ([pod, netns]) => {
    try {
      await d.rules(pod, netns);
      rulesDone++;
    } catch (e) {
      rulesFailed.set(pod.uid, (e as Error).message);
      log.error(
        "cannot program a running pod's in-pod rules at start-up; it stays pending and the informer tries again " +
          '(if that fails too, restart the pod)',
        { pod: `${pod.namespace}/${pod.name}`, uid: pod.uid, error: (e as Error).message },
      );
    }
  });
  return { probes, withNetns: held.length, withoutNetns, rulesDone, rulesFailed };
}

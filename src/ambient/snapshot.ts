// Start-up: the pods already enrolled (annotated enabled) before this agent started, made whole
// again before ztunnel may connect (Istio's ConstructInitialSnapshot):
// 1. the probe ipset synced to their IPs (hostprobes.ts);
// 2. every pod in the cache, and their netns found with ONE walk of the host's /proc (a node of
//    250 pods must not be walked 250 times): a pod whose netns is not found stays in the cache
//    without one, and ztunnel's snapshot names it with Keep;
// 3. with --ambient-reconcile-pod-rules-on-startup, their in-pod rules programmed again (a node
//    reboot loses them; an upgrade may change them). Idempotent: unchanged rules are not rewritten.
// A failure of one pod is logged and the others go on: the agent must come up for the rest.

import { scope } from '../monitoring/logging.ts';
import type { FindResult, HeldNetns, PodToFind } from '../podnetns/index.ts';
import { syncProbeSets, type ProbeSync } from './hostprobes.ts';
import type { PodCache } from './podcache.ts';
import type { Family, Runner } from './podrules.ts';
import type { WorkloadInfo } from './zds.ts';

const log = scope('ambient');
/** Pods whose rules are reconciled at once at start-up. */
const RECONCILE_CONCURRENCY = 4;

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
  /** Runs on the node (the probe ipset). */
  readonly host: Runner;
  readonly hostFamilies: readonly Family[];
  /** podnetns' findPodsNetns, bound to --host-proc-dir/--host-netns-path. */
  readonly findMany: (pods: readonly PodToFind[]) => Promise<Map<string, FindResult>>;
  /** Programs a pod's in-pod rules; null: not reconciled (the flag is off). */
  readonly reconcile: ((pod: StartupPod, netns: HeldNetns) => Promise<unknown>) | null;
}

export interface StartupResult {
  readonly probes: ProbeSync;
  /** Pods whose netns was found and is held. */
  readonly withNetns: number;
  /** UIDs of the pods whose netns was not found, and why. */
  readonly withoutNetns: ReadonlyMap<string, string>;
  /** Pods whose rules were reconciled / failed to be (uid -> message). */
  readonly reconciled: number;
  readonly reconcileFailed: ReadonlyMap<string, string>;
}

export async function buildStartupState(pods: readonly StartupPod[], d: StartupDeps): Promise<StartupResult> {
  const probes = await syncProbeSets(d.host, d.hostFamilies, pods);
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
  let reconciled = 0;
  const reconcileFailed = new Map<string, string>();
  if (d.reconcile !== null) {
    const reconcile = d.reconcile;
    // A few pods at a time: each is a few programs in its own netns (a node of 250 pods would
    // otherwise wait for 250 in a row); the iptables lock (-w) orders the legacy writes.
    const queue = [...held];
    const worker = async () => {
      for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
        const [pod, netns] = next;
        try {
          await reconcile(pod, netns);
          reconciled++;
        } catch (e) {
          reconcileFailed.set(pod.uid, (e as Error).message);
          log.error(
            "cannot reconcile a running pod's in-pod rules at start-up; restart the pod, or take it out of the mesh and back",
            { pod: `${pod.namespace}/${pod.name}`, uid: pod.uid, error: (e as Error).message },
          );
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(RECONCILE_CONCURRENCY, queue.length) }, worker));
  }
  return { probes, withNetns: held.length, withoutNetns, reconciled, reconcileFailed };
}

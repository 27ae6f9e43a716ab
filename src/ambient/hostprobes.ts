// The node side of ambient's probe path at start-up: the probe ipset brought to the enrolled
// pods' IPs (hostrules.ts builds and applies the rule and the sets; this decides what is in them).
// As Istio's syncHostAddrSets: every enrolled pod's IPs added with its UID, then whatever else is
// in the sets removed, except the entries of an enrolled pod that has no IP yet (right after a
// node or kubelet restart), found by the UID they carry; the informer syncs its IPs when they
// appear (syncHostProbeIPs). Istio removes nothing then: every stale entry stayed, each giving
// the next pod with that IP the node's traffic from the probe address.

import { scope } from '../monitoring/logging.ts';
import type { HostProbes } from './hostbackend.ts';
import { canonicalIP } from './hostrules.ts';

const log = scope('ambient');
/** What hostrules takes for a pod UID (an entry's comment). */
const UID = /^[A-Za-z0-9][A-Za-z0-9-]{0,62}$/;

export interface ProbePod {
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  readonly ips: readonly string[];
}

export interface ProbeSync {
  /** IPs added (or re-owned). */
  readonly added: number;
  /** Stale entries removed. */
  readonly pruned: number;
  /** Entries not expected, kept: their UID is an enrolled pod's that has no IP yet. */
  readonly keptWithoutIp: number;
  /**
   * Those entries by their pod's UID (the set's spelling): the pod's removal takes them out, as
   * it does the IPs it was given, or they outlive it if it goes before its IPs are known.
   */
  readonly kept: ReadonlyMap<string, readonly string[]>;
  /** Pods whose IPs could not all be added (a message each). */
  readonly failed: readonly string[];
}

/** Istio logs and goes on: this pod's probes fail, the others' work. */
function addFailed(pod: ProbePod, ip: string, e: unknown): string {
  log.error("cannot add an enrolled pod's IP to the probe ipset; its kubelet probes will fail", {
    pod: `${pod.namespace}/${pod.name}`,
    ip,
    error: (e as Error).message,
  });
  return `${pod.namespace}/${pod.name} ${ip}: ${(e as Error).message}`;
}

/** Adds every pod's IPs, then prunes the rest of the sets (but a pod without an IP's). */
export async function syncProbeSets(host: HostProbes, pods: readonly ProbePod[]): Promise<ProbeSync> {
  const expected = new Set<string>();
  const failed: string[] = [];
  const withoutIp: string[] = [];
  const entries: { pod: ProbePod; ip: string }[] = [];
  for (const pod of pods) {
    if (pod.ips.length === 0) {
      withoutIp.push(`${pod.namespace}/${pod.name}`);
      continue;
    }
    for (const ip of pod.ips) {
      try {
        if (!UID.test(pod.uid)) throw new Error(`pod UID "${pod.uid}" is not a UID (letters, digits and -)`);
        // Checked, and in the one spelling both backends read back.
        const text = canonicalIP(ip).text;
        entries.push({ pod, ip });
        // As ipset prints it (and parseProbeSet reads it): another spelling would look stale.
        expected.add(text);
      } catch (e) {
        failed.push(addFailed(pod, ip, e));
      }
    }
  }
  let added = 0;
  // One batch for all (a node of 250 pods: one process, not 250). If it fails, one add per IP
  // says which (ipset restore stops at the first bad line, an nft transaction takes none). The
  // backend records what is in for the healer (hostheal.ts).
  const batch = entries.length > 0 ? await host.addProbeIPs(entries.map((e) => [e.ip, e.pod.uid] as const)) : true;
  if (batch) {
    added = entries.length;
  } else {
    expected.clear(); // only what is known to be in: a failed IP's entry is stale
    for (const { pod, ip } of entries) {
      try {
        await host.addProbeIP(ip, pod.uid);
        expected.add(canonicalIP(ip).text);
        added++;
      } catch (e) {
        failed.push(addFailed(pod, ip, e));
      }
    }
  }
  if (withoutIp.length > 0) {
    log.info('enrolled pods without an IP yet: their probe ipset entries (by UID) are kept', {
      pods: withoutIp.join(', '),
    });
  }
  const keepOwners = new Set(pods.filter((p) => p.ips.length === 0).map((p) => p.uid));
  let pruned = 0;
  let keptWithoutIp = 0;
  const kept = new Map<string, string[]>();
  for (const [ip, owner] of await host.entries()) {
    if (expected.has(ip)) continue;
    if (keepOwners.has(owner)) {
      keptWithoutIp++;
      kept.set(owner, [...(kept.get(owner) ?? []), ip]);
      continue;
    }
    // Through removeProbeIP when the entry has an owner: serialized with every other change of
    // the sets, and only if it is still that owner's (a pod enrolled meanwhile keeps its entry).
    if (UID.test(owner)) {
      if ((await host.removeProbeIP(ip, owner)).removed) pruned++;
      continue;
    }
    await host.dropProbeIP(ip);
    pruned++;
  }
  return { added, pruned, keptWithoutIp, kept, failed };
}

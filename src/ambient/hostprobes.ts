// The node side of ambient's probe path at start-up: the probe ipset brought to the enrolled
// pods' IPs (hostrules.ts builds and applies the rule and the sets; this decides what is in them).
// As Istio's syncHostAddrSets: every enrolled pod's IPs added with its UID, then whatever else is
// in the sets removed, unless some enrolled pod has no IP yet (right after a node or kubelet
// restart): then nothing is removed, since its entry cannot be told from a stale one, and the
// informer adds its IPs when they appear (syncHostProbeIPs).

import { scope } from '../monitoring/logging.ts';
import { addProbeCommand, addProbeIP, canonicalIP, parseProbeSet, probeSet, removeProbeIP } from './hostrules.ts';
import type { Family, Runner } from './podrules.ts';

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
  /** Set when the prune was skipped: why. */
  readonly pruneSkipped: string | null;
  /** Pods whose IPs could not all be added (a message each). */
  readonly failed: readonly string[];
}

const lines = (entries: readonly { line: string }[]): string => entries.map((e) => e.line).join('\n') + '\n';

/** Istio logs and goes on: this pod's probes fail, the others' work. */
function addFailed(pod: ProbePod, ip: string, e: unknown): string {
  log.error("cannot add an enrolled pod's IP to the probe ipset; its kubelet probes will fail", {
    pod: `${pod.namespace}/${pod.name}`,
    ip,
    error: (e as Error).message,
  });
  return `${pod.namespace}/${pod.name} ${ip}: ${(e as Error).message}`;
}

/** Adds every pod's IPs, then prunes the rest of `families`' sets (unless a pod has no IP). */
export async function syncProbeSets(
  run: Runner,
  families: readonly Family[],
  pods: readonly ProbePod[],
): Promise<ProbeSync> {
  const expected = new Set<string>();
  const failed: string[] = [];
  const withoutIp: string[] = [];
  const entries: { pod: ProbePod; ip: string; line: string }[] = [];
  for (const pod of pods) {
    if (pod.ips.length === 0) {
      withoutIp.push(`${pod.namespace}/${pod.name}`);
      continue;
    }
    for (const ip of pod.ips) {
      try {
        // ['add', set, ip, 'comment', uid, '-exist'], checked and in ipset's own spelling.
        const [, set, text, , uid] = addProbeCommand(ip, pod.uid);
        entries.push({ pod, ip, line: `add ${set} ${text} comment "${uid}"` });
        // As ipset prints it (and parseProbeSet reads it): another spelling would look stale.
        expected.add(text!);
      } catch (e) {
        failed.push(addFailed(pod, ip, e));
      }
    }
  }
  let added = 0;
  // One `ipset restore` for all (a node of 250 pods: one process, not 250); nothing else writes
  // the sets yet (the ZDS socket and the plugin's socket open after start-up). If it fails, one
  // add per IP says which (ipset restore stops at the first bad line).
  const batch = entries.length > 0 ? await run(['ipset', 'restore', '-exist'], { input: lines(entries) }) : null;
  if (batch === null || (batch.error === null && batch.code === 0)) {
    added = entries.length;
  } else {
    expected.clear(); // only what is known to be in: a failed IP's entry is stale
    for (const { pod, ip } of entries) {
      try {
        await addProbeIP(run, ip, pod.uid);
        expected.add(canonicalIP(ip).text);
        added++;
      } catch (e) {
        failed.push(addFailed(pod, ip, e));
      }
    }
  }
  if (withoutIp.length > 0) {
    const why = `enrolled pods without an IP yet: ${withoutIp.join(', ')}`;
    log.warn('probe ipset not pruned at start-up', { reason: why });
    return { added, pruned: 0, pruneSkipped: why, failed };
  }
  let pruned = 0;
  for (const f of families) {
    const set = probeSet(f);
    const saved = await run(['ipset', 'save', set]);
    if (saved.error !== null || saved.code !== 0) {
      throw new Error(`ipset save ${set} failed (exit ${saved.code}): ${(saved.error ?? saved.stderr).trim()}`);
    }
    for (const [ip, owner] of parseProbeSet(saved.stdout)) {
      if (expected.has(ip)) continue;
      // Through removeProbeIP when the entry has an owner: serialized with every other change of
      // the sets, and only if it is still that owner's (a pod enrolled meanwhile keeps its entry).
      if (UID.test(owner)) {
        if ((await removeProbeIP(run, ip, owner)).removed) pruned++;
        continue;
      }
      const r = await run(['ipset', 'del', set, ip, '-exist']);
      if (r.error !== null || r.code !== 0) {
        throw new Error(`ipset del ${set} ${ip} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim()}`);
      }
      pruned++;
    }
  }
  return { added, pruned, pruneSkipped: null, failed };
}

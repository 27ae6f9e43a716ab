// findPodNetns: the running pod's netns, held by fd. The I/O around procscan.ts's pure planning
// and choosing: stat the host's netns reference, scan /proc, open each candidate netns once, look
// at its addresses, keep the chosen fd and close every other.

import fsp from 'node:fs/promises';
import path from 'node:path';
import { mapBounded } from '../concurrency.ts';
import { netnsAddresses } from './addresses.ts';
import { NSFS_MAGIC, nsKey, openNetns, sameNs, type HeldNetns, type NsId } from './held.ts';
import {
  canonicalPodIps,
  chooseNetns,
  planCandidates,
  scanPodProcesses,
  scanPodsProcesses,
  type Candidate,
  type Looked,
  type ScanResult,
} from './procscan.ts';

export interface PodNetnsOptions {
  /** --host-proc-dir: the host's /proc (default /host/proc). */
  readonly hostProcDir: string;
  /** --host-netns-path: a file of the host's netns (default `${hostProcDir}/1/ns/net`; tests: /proc/self/ns/net). */
  readonly hostNetnsPath: string;
}
export type FindFailure = 'no_netns' | 'ip_mismatch';
export type FindResult =
  | { readonly ok: true; readonly netns: HeldNetns }
  | { readonly ok: false; readonly reason: FindFailure; readonly detail: string };

/**
 * The host netns' identity. Never guessed: without it the host netns could be taken for a
 * pod's and programmed, so an unreadable or wrong reference rejects (fail closed).
 */
export async function hostNetnsId(hostNetnsPath: string): Promise<NsId> {
  const fix =
    'set --host-netns-path to a file of the host network namespace the agent can read ' +
    "(/proc/<pid>/ns/net of a process in the host's netns, under --host-proc-dir)";
  let st;
  try {
    st = await fsp.stat(hostNetnsPath, { bigint: true });
    const sfs = await fsp.statfs(hostNetnsPath, { bigint: true });
    if (sfs.type !== NSFS_MAGIC) throw new Error('not a namespace file');
  } catch (e) {
    throw new Error(
      `cannot use ${hostNetnsPath} (--host-netns-path) as the host netns: ${(e as Error).message}; ${fix}`,
      {
        cause: e,
      },
    );
  }
  return { dev: st.dev, ino: st.ino };
}

/**
 * Opens a candidate through its processes, oldest first. The fd's identity must be the one the
 * scan stat'ed: a process that exited (its pid maybe reused) or moved to another netns since is
 * passed over, never misread. null: none of them still is in it; a string: why it could not be
 * opened, when that was not the process being gone (EACCES without CAP_SYS_PTRACE...).
 */
export async function openCandidate(procDir: string, c: Candidate, host: NsId): Promise<HeldNetns | string | null> {
  let why: string | null = null;
  for (const pid of c.pids) {
    let ns: HeldNetns;
    try {
      ns = await openNetns(path.join(procDir, String(pid), 'ns', 'net'), pid);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ESRCH') why ??= (e as Error).message;
      continue; // the next process of the same netns
    }
    if (sameNs(ns, c.netns) && !sameNs(ns, host)) return ns;
    ns.close();
  }
  return why;
}

/** The netns this process runs in. */
async function agentNetnsId(): Promise<NsId> {
  const st = await fsp.stat('/proc/self/ns/net', { bigint: true });
  return { dev: st.dev, ino: st.ino };
}

const scanSummary = (procDir: string, s: ScanResult, inHost: number): string => {
  let t = ` (${s.scanned} processes under ${procDir}, ${s.processes.length} of the pod, ${inHost} of them in the host netns`;
  if (s.vanished) t += `, ${s.vanished} exited during the scan`;
  if (s.unreadable) t += `, ${s.unreadable} unreadable: ${s.firstErrors.join('; ')}`;
  return t + ')';
};

/**
 * The pod's netns: processes whose cgroup names the pod UID, not in the host netns, whose netns
 * holds one of podIPs; among several netns the one of the oldest process wins. Rejects only for
 * what no retry mends: the host netns reference or the proc dir unusable (the message names the flag).
 */
export async function findPodNetns(uid: string, podIPs: readonly string[], opts: PodNetnsOptions): Promise<FindResult> {
  const host = await hostNetnsId(opts.hostNetnsPath);
  // No IP to look for (fail closed: ip_mismatch): nothing is scanned, opened or entered.
  const none = noIpResult(uid, podIPs);
  if (none !== null) return none;
  const scan = await scanPodProcesses(opts.hostProcDir, uid.toLowerCase());
  return choosePodNetns(uid, podIPs, scan, host, opts.hostProcDir);
}

/** A pod to look for with findPodsNetns. */
export interface PodToFind {
  readonly uid: string;
  readonly ips: readonly string[];
}

/** How many pods' netns are looked into at once (each look runs `ip` in the netns). */
const LOOK_CONCURRENCY = 8;

/**
 * findPodNetns for many pods with ONE walk of /proc (the agent's start-up: hundreds of pods).
 * The result has an entry per distinct UID given; each ok netns is the caller's to close. A
 * netns already given to a pod of the list is not given to another (the first in list order keeps it).
 * Rejects as findPodNetns does, with nothing left open.
 */
export async function findPodsNetns(
  pods: readonly PodToFind[],
  opts: PodNetnsOptions,
): Promise<Map<string, FindResult>> {
  const host = await hostNetnsId(opts.hostNetnsPath);
  const out = new Map<string, FindResult>();
  const wanted = new Map<string, PodToFind>();
  for (const p of pods) {
    if (out.has(p.uid) || wanted.has(p.uid)) continue;
    const none = noIpResult(p.uid, p.ips);
    if (none !== null) out.set(p.uid, none);
    else wanted.set(p.uid, p);
  }
  if (wanted.size === 0) return out;
  const scan = await scanPodsProcesses(opts.hostProcDir, new Set([...wanted.keys()].map((u) => u.toLowerCase())));
  const results = new Map<string, FindResult>();
  try {
    // Settles after every look under way has: a failure closes all that were found.
    await mapBounded([...wanted.values()], LOOK_CONCURRENCY, async (p) => {
      const { byUid, ...rest } = scan;
      const one: ScanResult = { processes: byUid.get(p.uid.toLowerCase()) ?? [], ...rest };
      results.set(p.uid, await choosePodNetns(p.uid, p.ips, one, host, opts.hostProcDir));
    });
  } catch (e) {
    for (const r of results.values()) if (r.ok) r.netns.close();
    throw e;
  }
  const given = new Set<string>();
  for (const p of wanted.values()) {
    const r = results.get(p.uid)!;
    if (r.ok && given.has(nsKey(r.netns))) {
      r.netns.close();
      const detail = `pod ${p.uid}: its netns (inode ${r.netns.ino}) is another pod's of the same lookup`;
      out.set(p.uid, { ok: false, reason: 'no_netns', detail });
      continue;
    }
    if (r.ok) given.add(nsKey(r.netns));
    out.set(p.uid, r);
  }
  return out;
}

function noIpResult(uid: string, podIPs: readonly string[]): FindResult | null {
  const none = canonicalPodIps(podIPs).length === 0 ? chooseNetns([], new Map(), podIPs) : null;
  return none && !none.ok ? { ok: false, reason: none.reason, detail: `pod ${uid}: ${none.detail}` } : null;
}

/**
 * Netns of one pod looked into (an `ip` run each) before giving up: a pod's processes share one
 * netns, but one able to unshare(CLONE_NEWNET) can make any number of them.
 */
export const MAX_LOOKS = 16;

/**
 * The scan's processes of one pod -> its netns, oldest candidate first: each opened once, looked
 * into, closed at once unless it holds a pod IP; the first that does is the choice (chooseNetns
 * picks the oldest holding one), so at most one fd is kept and nothing younger is looked into.
 */
async function choosePodNetns(
  uid: string,
  podIPs: readonly string[],
  scan: ScanResult,
  host: NsId,
  procDir: string,
): Promise<FindResult> {
  const planned = planCandidates(scan.processes, host);
  // Nor the agent's own netns: with hostNetwork it is the node's, whatever --host-netns-path says
  // (a wrong one would let the node's netns through); without, it is the agent's pod's.
  const self = await agentNetnsId();
  const candidates = planned.candidates.filter((c) => !sameNs(c.netns, self));
  const inHost = planned.candidates.reduce((n, c) => n + (sameNs(c.netns, self) ? c.pids.length : 0), planned.inHost);
  const want = canonicalPodIps(podIPs);
  const held = new Map<string, HeldNetns>();
  try {
    const looked = new Map<string, Looked>();
    let looks = 0;
    let skipped = 0;
    for (const [i, c] of candidates.entries()) {
      if (looks === MAX_LOOKS) {
        skipped = candidates.length - i;
        break;
      }
      const ns = await openCandidate(procDir, c, host);
      if (ns === null) continue;
      looks++;
      if (typeof ns === 'string') {
        looked.set(nsKey(c.netns), { pid: c.pids[0]!, openError: ns });
        continue;
      }
      held.set(nsKey(ns), ns);
      try {
        const addresses = await netnsAddresses(ns);
        looked.set(nsKey(ns), { pid: ns.pid, addresses });
        if (addresses.some((a) => want.includes(a))) break;
      } catch (e) {
        looked.set(nsKey(ns), { pid: ns.pid, error: (e as Error).message });
      }
      held.delete(nsKey(ns));
      ns.close();
    }
    const choice = chooseNetns(candidates, looked, podIPs);
    if (!choice.ok) {
      const more =
        skipped > 0
          ? `; the ${skipped} younger of the pod's ${candidates.length} netns were not looked into (at most ${MAX_LOOKS})`
          : '';
      const detail = `pod ${uid}: ${choice.detail}${more}${scanSummary(procDir, scan, inHost)}`;
      return { ok: false, reason: choice.reason, detail };
    }
    const netns = held.get(nsKey(choice.netns))!;
    held.delete(nsKey(choice.netns));
    return { ok: true, netns };
  } finally {
    for (const ns of held.values()) ns.close();
  }
}

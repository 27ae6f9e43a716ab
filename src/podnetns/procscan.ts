// The walk of the host's /proc for a pod's processes, and the pure choice of its netns among
// theirs.
//
// What is trusted: the cgroup path only says which pod a process is accounted to, not which
// netns it is in (a process may enter another netns: a debugging tool, a CNI plugin visiting);
// so a netns counts as the pod's only when one of the pod's status IPs is on an interface in it.
// The host's netns never counts, whatever process is in it (CRI-O's conmon is accounted to the
// pod and lives in the host netns; so does any hostNetwork container).

import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { podUidFromCgroup } from './cgroup.ts';
import { fileKind } from '../filekind.ts';
import { nsKey, sameNs, type NsId } from './held.ts';
import { canonicalIp } from './addresses.ts';

/** A process of the pod, as the scan saw it. */
export interface PodProcess {
  readonly pid: number;
  /** /proc/<pid>/stat field 22: clock ticks after boot; the sandbox (pause) is the oldest. */
  readonly starttime: bigint;
  /** Its netns, from a stat of /proc/<pid>/ns/net. */
  readonly netns: NsId;
}

export interface ScanResult {
  readonly processes: PodProcess[];
  /** Numeric dirs looked at. */
  readonly scanned: number;
  /** Gone between the listing and the reads (ENOENT, ESRCH): quietly skipped. */
  readonly vanished: number;
  /** Could not be read for another reason (counted, the first few kept for the message). */
  readonly unreadable: number;
  readonly firstErrors: string[];
}

/** A cgroup file is a line per hierarchy: a few hundred bytes. More is not a cgroup file. */
const MAX_CGROUP_BYTES = 64 * 1024;
/** A stat line is a few hundred bytes (a comm of 16, numbers). */
const MAX_STAT_BYTES = 4096;
/** Processes read between two turns of the event loop (~16 us each: about 1 ms). */
const BATCH = 64;

const gone = (e: unknown) => {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ESRCH';
};

/**
 * Read-only, non-blocking (a FIFO mounted over a /proc entry must not wait for a writer: this
 * read runs on the event loop itself), never a controlling terminal.
 */
const READ_FLAGS = fs.constants.O_RDONLY | fs.constants.O_NONBLOCK | fs.constants.O_NOCTTY;

/**
 * The file's text, at most `max` bytes (more throws), into `buf` (max + 1 bytes, reused). Sync:
 * reading /proc is a few microseconds of CPU a file; through the thread pool it costs several
 * times that, and the scan yields between batches instead (scanPodProcesses). Only a regular
 * file is read (every /proc file is one), checked on the fd.
 */
function readBounded(file: string, buf: Buffer, max: number): string {
  const fd = fs.openSync(file, READ_FLAGS);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new Error(`${file} is ${fileKind(st.mode)}, not a file of /proc; not read`);
    let n = 0;
    for (;;) {
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n > max) throw new Error(`${file} is longer than ${max} bytes`);
    }
    return buf.toString('utf8', 0, n);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Pure: starttime (field 22) from a /proc/<pid>/stat text. The fields are counted after the
 * LAST ')': field 2, the command name in parentheses, may itself hold spaces and parentheses.
 */
export function parseStarttime(text: string): bigint | null {
  const close = text.lastIndexOf(')');
  if (close < 0) return null;
  const fields = text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  // fields[0] is field 3 (state), so field 22 is fields[19].
  const f = fields[19];
  return f !== undefined && /^\d+$/.test(f) ? BigInt(f) : null;
}

/**
 * Every process under `procDir` whose cgroup names pod `uid` (canonical: lower case, dashes).
 * Rejects only when `procDir` itself cannot be listed.
 */
export async function scanPodProcesses(procDir: string, uid: string): Promise<ScanResult> {
  const { byUid, ...rest } = await scanPodsProcesses(procDir, new Set([uid]));
  return { processes: byUid.get(uid) ?? [], ...rest };
}

/** One walk of /proc for many pods: their processes by UID (absent: none found). */
export interface MultiScanResult extends Omit<ScanResult, 'processes'> {
  readonly byUid: Map<string, PodProcess[]>;
}

/**
 * The processes of every pod in `uids` (canonical) with ONE walk of `procDir`: the agent's
 * start-up finds hundreds of pods, and a walk per pod would read /proc hundreds of times.
 * Rejects only when `procDir` itself cannot be listed.
 */
export async function scanPodsProcesses(procDir: string, uids: ReadonlySet<string>): Promise<MultiScanResult> {
  let names: string[];
  try {
    names = (await fsp.readdir(procDir)).filter((n) => /^[1-9]\d*$/.test(n));
  } catch (e) {
    throw new Error(
      `cannot list the host's processes in ${procDir} (--host-proc-dir): ${(e as Error).message}; ` +
        "mount the host's /proc there (read-only)",
      { cause: e },
    );
  }
  const byUid = new Map<string, PodProcess[]>();
  const firstErrors: string[] = [];
  let vanished = 0;
  let unreadable = 0;
  const buf = Buffer.alloc(MAX_CGROUP_BYTES + 1);
  const one = (name: string) => {
    const dir = path.join(procDir, name);
    try {
      const cgroup = readBounded(path.join(dir, 'cgroup'), buf, MAX_CGROUP_BYTES);
      const uid = podUidFromCgroup(cgroup);
      if (uid === null || !uids.has(uid)) return;
      const starttime = parseStarttime(readBounded(path.join(dir, 'stat'), buf, MAX_STAT_BYTES));
      if (starttime === null) throw new Error(`${path.join(dir, 'stat')} has no start time (field 22)`);
      const st = fs.statSync(path.join(dir, 'ns', 'net'), { bigint: true });
      const list = byUid.get(uid) ?? [];
      list.push({ pid: Number(name), starttime, netns: { dev: st.dev, ino: st.ino } });
      byUid.set(uid, list);
    } catch (e) {
      if (gone(e)) {
        vanished++;
        return;
      }
      if (++unreadable <= 3) firstErrors.push((e as Error).message);
    }
  };
  for (let i = 0; i < names.length; i++) {
    // The agent serves the plugin's pod lookups meanwhile: never block it for a whole /proc.
    if (i > 0 && i % BATCH === 0) await new Promise((r) => setImmediate(r));
    one(names[i]!);
  }
  return { byUid, scanned: names.length, vanished, unreadable, firstErrors };
}

/** A netns some of the pod's processes are in: the place to look for the pod's IPs. */
export interface Candidate {
  readonly netns: NsId;
  /** Its processes of the pod, oldest first (the one to open it through; the next if that one exited). */
  readonly pids: readonly number[];
  readonly starttime: bigint;
}

/**
 * Pure: the pod's processes grouped by netns, the host's left out, oldest netns (by its oldest
 * process; then lower pid) first. `inHost` counts the pod's processes in the host netns.
 */
export function planCandidates(
  processes: readonly PodProcess[],
  host: NsId,
): { candidates: Candidate[]; inHost: number } {
  const byNs = new Map<string, PodProcess[]>();
  let inHost = 0;
  for (const p of processes) {
    if (sameNs(p.netns, host)) {
      inHost++;
      continue;
    }
    const k = nsKey(p.netns);
    byNs.set(k, [...(byNs.get(k) ?? []), p]);
  }
  const older = (a: { starttime: bigint; pid: number }, b: { starttime: bigint; pid: number }) =>
    a.starttime < b.starttime ? -1 : a.starttime > b.starttime ? 1 : a.pid - b.pid;
  const candidates = [...byNs.values()].map((ps): Candidate => {
    const sorted = [...ps].sort(older);
    return { netns: sorted[0]!.netns, pids: sorted.map((p) => p.pid), starttime: sorted[0]!.starttime };
  });
  candidates.sort((a, b) =>
    older({ starttime: a.starttime, pid: a.pids[0]! }, { starttime: b.starttime, pid: b.pids[0]! }),
  );
  return { candidates, inHost };
}

/**
 * What looking inside one candidate netns gave: its addresses, or why they could not be listed,
 * or why it could not be opened at all (not gone: EACCES without CAP_SYS_PTRACE...). Absent from
 * the map: gone before it could be opened.
 */
export type Looked =
  | { readonly pid: number; readonly addresses: readonly string[] }
  | { readonly pid: number; readonly error: string }
  | { readonly pid: number; readonly openError: string };

export type Choice =
  | { readonly ok: true; readonly netns: NsId; readonly pid: number }
  | { readonly ok: false; readonly reason: 'no_netns' | 'ip_mismatch'; readonly detail: string };

/** Pure: the pod's IPs as given, canonical, the ones that are no address left out. */
export const canonicalPodIps = (podIPs: readonly string[]): string[] =>
  podIPs.map(canonicalIp).filter((ip): ip is string => ip !== null);

/**
 * Pure: the pod's netns among the candidates (oldest first, as planCandidates orders them), given
 * what was found in each (keyed by nsKey): the oldest that holds one of the pod's IPs.
 */
export function chooseNetns(
  candidates: readonly Candidate[],
  looked: ReadonlyMap<string, Looked>,
  podIPs: readonly string[],
): Choice {
  const want = canonicalPodIps(podIPs);
  if (podIPs.length === 0) return { ok: false, reason: 'ip_mismatch', detail: 'the pod has no IP in its status' };
  if (want.length === 0) {
    return {
      ok: false,
      reason: 'ip_mismatch',
      detail: `the pod's status IPs (${podIPs.join(', ')}) are not IP addresses`,
    };
  }
  const seen: string[] = [];
  const unopened: string[] = [];
  for (const c of candidates) {
    const l = looked.get(nsKey(c.netns));
    if (l === undefined) continue;
    const where = `netns inode ${c.netns.ino} (pid ${l.pid})`;
    if ('openError' in l) {
      unopened.push(`${where}: ${l.openError}`);
      continue;
    }
    if ('error' in l) {
      seen.push(`${where}: ${l.error}`);
      continue;
    }
    if (l.addresses.some((a) => want.includes(a))) return { ok: true, netns: c.netns, pid: l.pid };
    seen.push(`${where} holds ${l.addresses.length ? l.addresses.join(', ') : 'no address'}`);
  }
  if (seen.length === 0 && unopened.length > 0) {
    return { ok: false, reason: 'no_netns', detail: `the pod's netns could not be opened: ${unopened.join('; ')}` };
  }
  if (seen.length === 0) {
    const detail =
      candidates.length === 0
        ? 'no process of the pod outside the host netns'
        : `the pod's ${candidates.length === 1 ? 'netns was' : `${candidates.length} netns were`} gone before they could be opened`;
    return { ok: false, reason: 'no_netns', detail };
  }
  return {
    ok: false,
    reason: 'ip_mismatch',
    detail: `no netns of the pod holds ${want.join(', ')}: ${seen.join('; ')}`,
  };
}

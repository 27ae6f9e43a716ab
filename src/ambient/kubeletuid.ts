// The uid kubelet runs as, for the native nftables probe rule (hostnft.ts matches `meta skuid`):
// found at start in the host's /proc (--host-proc-dir), as Istio's nftables mode finds it, by a
// process whose comm is `kubelet` or `kubelite` (MicroK8s) with "kubelet" in its command line, or
// `k3s` (kubelet built in, its argv naming no kubelet), in that order of preference.
//
// The host's /proc shows every process of the node, those of pods too, and a pod author can name a
// process `kubelet`: only processes in the node's own netns count (kubelet is one; a pod's
// processes are in the pod's netns), and when those still disagree on the uid, nothing is guessed:
// the caller is told why and uses the default, 0, as kubelet runs as root on nearly every node
// (docs/ambient.md "Native nftables"). The uid taken is the filesystem uid (the fourth of the
// status Uid: line), the one the kernel reads for skuid; kubelet's four are the same anyway.

import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';

/** kubelet's uid when none is found: root, as kubelet runs on nearly every node. */
export const DEFAULT_KUBELET_UID = 0;

/** The process names that host kubelet, most preferred first; `cmdline`: "kubelet" must be in argv. */
const KUBELETS: readonly { readonly comm: string; readonly cmdline: boolean }[] = [
  { comm: 'kubelet', cmdline: true },
  { comm: 'kubelite', cmdline: true },
  { comm: 'k3s', cmdline: false },
];

export type KubeletUid =
  | { readonly found: true; readonly uid: number; readonly pid: number; readonly comm: string }
  | { readonly found: false; readonly why: string };

interface Candidate {
  readonly pid: number;
  readonly comm: string;
  readonly uid: number;
}

/** The fsuid of a /proc/<pid>/status; null when unreadable or malformed. */
function fsUid(status: string): number | null {
  const m = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$/m.exec(status);
  return m ? Number(m[4]) : null;
}

/** One process, or null: not a kubelet, in another netns, or gone meanwhile. */
async function candidate(procDir: string, pid: number, hostNet: bigint | null): Promise<Candidate | null> {
  const dir = path.join(procDir, String(pid));
  try {
    const comm = (await readFile(path.join(dir, 'comm'), 'utf8')).trim();
    const kind = KUBELETS.find((k) => k.comm === comm);
    if (kind === undefined) return null;
    if (kind.cmdline) {
      const argv = (await readFile(path.join(dir, 'cmdline'), 'utf8')).split('\0');
      if (!argv.some((a) => a.toLowerCase().includes('kubelet'))) return null;
    }
    if (hostNet !== null && (await stat(path.join(dir, 'ns', 'net'), { bigint: true })).ino !== hostNet) return null;
    const uid = fsUid(await readFile(path.join(dir, 'status'), 'utf8'));
    return uid === null ? null : { pid, comm, uid };
  } catch {
    return null; // exited, or not ours to read: not a kubelet we can say anything about
  }
}

/**
 * kubelet's uid from `procDir` (the host's /proc). `hostNetns`: the node's netns file; processes
 * in another netns are not kubelet. Never throws: what was not found, or disagreed, is said.
 */
export async function findKubeletUid(procDir: string, hostNetns: string): Promise<KubeletUid> {
  let names: string[];
  try {
    names = await readdir(procDir);
  } catch (e) {
    return { found: false, why: `cannot list ${procDir}: ${(e as Error).message}` };
  }
  let hostNet: bigint;
  try {
    hostNet = (await stat(hostNetns, { bigint: true })).ino;
  } catch (e) {
    return { found: false, why: `cannot read the node's netns ${hostNetns}: ${(e as Error).message}` };
  }
  const pids = names.filter((n) => /^[1-9][0-9]*$/.test(n)).map(Number);
  const found: Candidate[] = [];
  // A node's /proc has a few thousand entries: a handful read at a time is quick enough.
  for (let i = 0; i < pids.length; i += 64) {
    const got = await Promise.all(pids.slice(i, i + 64).map((p) => candidate(procDir, p, hostNet)));
    for (const c of got) if (c !== null) found.push(c);
  }
  for (const kind of KUBELETS) {
    const of = found.filter((c) => c.comm === kind.comm).sort((a, b) => a.pid - b.pid);
    if (of.length === 0) continue;
    const uids = [...new Set(of.map((c) => c.uid))];
    if (uids.length > 1) {
      const seen = of.map((c) => `pid ${c.pid} uid ${c.uid}`).join(', ');
      return { found: false, why: `processes named ${kind.comm} in the node's netns run as different uids (${seen})` };
    }
    return { found: true, uid: uids[0]!, pid: of[0]!.pid, comm: kind.comm };
  }
  return {
    found: false,
    why: `no ${KUBELETS.map((k) => k.comm).join(', ')} process in the node's netns under ${procDir}`,
  };
}

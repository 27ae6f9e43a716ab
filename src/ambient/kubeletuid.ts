// The uid kubelet runs as, for the native nftables probe rule (hostnft.ts matches `meta skuid`):
// the connections of that uid in the node's netns reach ambient pods from the probe address, past
// ztunnel, so it must be a uid no unprivileged local user can have chosen.
//
// --kubelet-uid, when the operator gives it, is taken as given. Otherwise the host's /proc
// (--host-proc-dir) is read at start, as Istio's nftables mode finds kubelet: processes whose comm
// is `kubelet` or `kubelite` (MicroK8s) with "kubelet" in their command line, or `k3s` (kubelet
// built in, its argv naming no kubelet). A name proves nothing: any user can start a process named
// so, in the node's netns, before the agent starts or while kubelet is down. So a process is only
// believed when it runs as root, which no such user can, and root is the default anyway (kubelet
// runs as root on nearly every node): the scan can confirm 0, never choose another uid. A
// candidate that is not root, or candidates (of any name) that disagree, leave the default, 0, with
// the reason and --kubelet-uid as the fix. Failing so is safe: a non-root kubelet's probes go to
// ztunnel and its pods turn unready, which shows; no other user's connections ever pass ztunnel.
// Only processes in the node's own netns count (a pod's processes are in the pod's netns). The
// uid judged is the filesystem uid (the fourth of the status Uid: line), the one the kernel reads
// for skuid.

import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';

/** kubelet's uid when none is given: root, as kubelet runs on nearly every node, and no user can be. */
export const DEFAULT_KUBELET_UID = 0;

/** The process names that host kubelet, in the order reasons name them; `cmdline`: "kubelet" must be in argv. */
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
 * kubelet's uid as `procDir` (the host's /proc) can vouch for it: found only when every kubelet
 * process there runs as root. `hostNetns`: the node's netns file; processes in another netns are
 * not kubelet. Never throws: what was not found, not believed, or disagreed, is said.
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
  // In KUBELETS' order, then by pid: the order the reasons name them in.
  const rank = (c: Candidate) => KUBELETS.findIndex((k) => k.comm === c.comm);
  found.sort((a, b) => rank(a) - rank(b) || a.pid - b.pid);
  const first = found[0];
  if (first === undefined) {
    return {
      found: false,
      why: `no ${KUBELETS.map((k) => k.comm).join(', ')} process in the node's netns under ${procDir}`,
    };
  }
  if (found.some((c) => c.uid !== first.uid)) {
    const seen = found.map((c) => `${c.comm} pid ${c.pid} uid ${c.uid}`).join(', ');
    return {
      found: false,
      why: `processes taken for kubelet in the node's netns run as different uids (${seen}): set --kubelet-uid to kubelet's uid`,
    };
  }
  // A setuid-root program a user starts under the name kubelet is root too: it can only confirm 0.
  if (first.uid !== 0) {
    return {
      found: false,
      why:
        `${first.comm} (pid ${first.pid}) in the node's netns runs as uid ${first.uid}, not root, and its name alone ` +
        'does not make it kubelet (any local user can name a process so): if kubelet runs as uid ' +
        `${first.uid} here, set --kubelet-uid=${first.uid}`,
    };
  }
  return { found: true, uid: first.uid, pid: first.pid, comm: first.comm };
}

export type KubeletUidChoice =
  | { readonly uid: number; readonly from: 'flag' }
  | { readonly uid: number; readonly from: 'scan'; readonly pid: number; readonly comm: string }
  | { readonly uid: number; readonly from: 'default'; readonly why: string };

/**
 * The probe rule's uid: `given` (--kubelet-uid) when set, else what the scan of `procDir` vouches
 * for (root only), else the default with the reason. Never throws.
 */
export async function chooseKubeletUid(
  given: number | undefined,
  procDir: string,
  hostNetns: string,
): Promise<KubeletUidChoice> {
  if (given !== undefined) return { uid: given, from: 'flag' };
  const r = await findKubeletUid(procDir, hostNetns);
  return r.found
    ? { uid: r.uid, from: 'scan', pid: r.pid, comm: r.comm }
    : { uid: DEFAULT_KUBELET_UID, from: 'default', why: r.why };
}

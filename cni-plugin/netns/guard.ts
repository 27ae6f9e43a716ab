// The plugin only ever changes the netns of the pod it was called for. A runtime never passes a
// host netns for a pod (host-network pods get no CNI call), so CNI_NETNS naming the netns the
// plugin itself runs in, or PID 1's, is a mistake or an attack, and without this check ADD would
// put redirect rules on the node itself and DEL would remove rules there. A netns is known by
// the device and inode of its nsfs file, whatever path (bind mount under /run/netns, /proc/<pid>
// link) reaches it. Nor is anything touched that is no namespace file at all: nsenter would wait
// in its open of a FIFO until its time limit, and a directory or a plain file cannot be entered.

import { existsSync, statfsSync, statSync, type BigIntStats } from 'node:fs';

/** Network namespaces that are never a pod's, by the /proc link that names them. */
const NOT_A_POD: readonly (readonly [string, string])[] = [
  ['/proc/self/ns/net', "the network namespace mesh-cni itself runs in (the host's, where the runtime runs plugins)"],
  ['/proc/1/ns/net', "the network namespace of PID 1 (the host's)"],
];

function nsfsId(p: string): BigIntStats | null {
  try {
    return statSync(p, { bigint: true });
  } catch {
    return null;
  }
}

/** statfs type of a namespace file (NSFS_MAGIC). */
const NSFS_MAGIC = 0x6e736673;

/**
 * What is at `netns` when it is no namespace file ("a FIFO, not a network namespace file"), null
 * when it is one or nothing is there. By path, never opened: opening a FIFO waits for a writer.
 */
export function notANamespaceFile(netns: string): string | null {
  const st = nsfsId(netns);
  if (st === null) return null;
  let kind: string | null = null;
  if (st.isFIFO()) kind = 'a FIFO';
  else if (st.isDirectory()) kind = 'a directory';
  else if (st.isCharacterDevice() || st.isBlockDevice()) kind = 'a device';
  else if (st.isSocket()) kind = 'a socket';
  else {
    try {
      if (statfsSync(netns).type !== NSFS_MAGIC) kind = 'a regular file outside nsfs';
    } catch {
      return null;
    }
  }
  return kind === null ? null : `${kind}, not a network namespace file`;
}

/** The netns path is there (a DEL after the runtime removed it finds nothing to do). Here, not in
 * iptables.ts, so the short calls answer without loading the iptables code (docs/design.md
 * "Start-up time"). */
export function netnsExists(netns: string): boolean {
  return netns !== '' && existsSync(netns);
}

/** Why the netns at `netns` must not be touched, or null when it may be a pod's. */
export function notAPodNetns(netns: string): string | null {
  const target = nsfsId(netns);
  if (target === null) return null;
  const notNs = notANamespaceFile(netns);
  if (notNs !== null) return notNs;
  for (const [link, what] of NOT_A_POD) {
    const s = nsfsId(link);
    if (s !== null && s.dev === target.dev && s.ino === target.ino) return what;
  }
  return null;
}

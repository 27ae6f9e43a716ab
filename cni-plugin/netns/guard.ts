// The plugin only ever changes the netns of the pod it was called for. A runtime never passes a
// host netns for a pod (host-network pods get no CNI call), so CNI_NETNS naming the netns the
// plugin itself runs in, or PID 1's, is a mistake or an attack, and without this check ADD would
// put redirect rules on the node itself and DEL would remove rules there. A netns is known by
// the device and inode of its nsfs file, whatever path (bind mount under /run/netns, /proc/<pid>
// link) reaches it.

import { existsSync, statSync, type BigIntStats } from 'node:fs';

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

/** The netns path is there (a DEL after the runtime removed it finds nothing to do). Here, not in
 * iptables.ts, so the short calls answer without loading the iptables code (issue 20). */
export function netnsExists(netns: string): boolean {
  return netns !== '' && existsSync(netns);
}

/** Why the netns at `netns` must not be touched, or null when it may be a pod's. */
export function notAPodNetns(netns: string): string | null {
  const target = nsfsId(netns);
  if (target === null) return null;
  for (const [link, what] of NOT_A_POD) {
    const s = nsfsId(link);
    if (s !== null && s.dev === target.dev && s.ino === target.ino) return what;
  }
  return null;
}

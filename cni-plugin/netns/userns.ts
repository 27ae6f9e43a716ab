// A pod with `hostUsers: false` (Kubernetes user namespaces) lives in a netns its own user
// namespace owns. The kernel takes an `-m owner --uid-owner` rule into such a netns only from a
// process in that user namespace (from the host's, legacy iptables and the nft shim both get
// EINVAL), and reads the uid as that namespace sees it: the proxy's 1337 inside the pod. So the
// plugin asks the kernel which user namespace owns CNI_NETNS (ioctl NS_GET_USERNS on the netns
// file) and, when it is not the host's, runs iptables through `nsenter --user=<it> --net=<netns>`
// (docs/plugin.md "User-namespaced pods").
//
// Under Bun the ioctl is libc's, through bun:ffi. Node has no ioctl: there the plugin can only
// tell whether a user namespace owns the netns (the owner of its sysctl files, read from inside
// it), not enter it, and fails such a pod closed rather than write its rules from the host's.

import { closeSync, constants, fstatSync, openSync, statSync } from 'node:fs';
import { exec } from './exec.ts';

/** The user namespace owning a pod's netns, held open while the plugin runs iptables in it. */
export interface PodUserns {
  /** What nsenter --user= opens: this process's fd, through /proc (the fd is close-on-exec). */
  readonly path: string;
  close(): void;
}

/** The pod's netns is owned by a user namespace this plugin cannot enter (or cannot tell). */
export class UsernsError extends Error {}

/** _IO(0xb7, 0x1): an fd of the user namespace that owns the namespace the fd names. */
const NS_GET_USERNS = 0xb701;
const ENOTTY = 25;

interface LibC {
  ioctl(fd: number, request: number): number;
  __errno_location(): unknown;
}
interface BunFfi {
  dlopen(lib: string, symbols: Record<string, { args: string[]; returns: string }>): { symbols: LibC };
  read: { i32(ptr: unknown, offset?: number): number };
}

let libc: { c: LibC; errno: () => number } | undefined;

/** libc's ioctl under Bun, loaded on first use (most pods never get here); null under Node. */
function bunLibc(): { c: LibC; errno: () => number } | null {
  if ((globalThis as { Bun?: unknown }).Bun === undefined) return null;
  if (libc) return libc;
  const ffi = process.getBuiltinModule('bun:ffi' as 'fs') as unknown as BunFfi;
  const { symbols } = ffi.dlopen('libc.so.6', {
    ioctl: { args: ['i32', 'u64'], returns: 'i32' },
    __errno_location: { args: [], returns: 'ptr' },
  });
  libc = { c: symbols, errno: () => ffi.read.i32(symbols.__errno_location()) };
  return libc;
}

/** The host's user namespace: the one this process runs in. */
function sameAsOurs(fd: number): boolean {
  const ours = statSync('/proc/self/ns/user', { bigint: true });
  const owner = fstatSync(fd, { bigint: true });
  return ours.dev === owner.dev && ours.ino === owner.ino;
}

function byIoctl(lib: { c: LibC; errno: () => number }, netns: string): PodUserns | null {
  let netFd: number;
  try {
    // Nonblocking: a FIFO put there since the guard looked must not hang the open.
    netFd = openSync(netns, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw new UsernsError(`cannot open ${netns} to find its user namespace: ${(e as Error).message}`);
  }
  let owner: number;
  try {
    owner = lib.c.ioctl(netFd, NS_GET_USERNS);
    if (owner < 0) {
      const errno = lib.errno();
      // No such ioctl (before Linux 4.9): a kernel that old runs no user-namespaced pods.
      if (errno === ENOTTY) return null;
      throw new UsernsError(`ioctl NS_GET_USERNS on ${netns} failed (errno ${errno}); not touching that netns`);
    }
  } finally {
    closeSync(netFd);
  }
  try {
    if (sameAsOurs(owner)) {
      closeSync(owner);
      return null;
    }
  } catch (e) {
    closeSync(owner);
    throw new UsernsError(`cannot compare the user namespace owning ${netns} with ours: ${(e as Error).message}`);
  }
  let open = true;
  return {
    path: `/proc/${process.pid}/fd/${owner}`,
    close: () => {
      if (open) closeSync(owner);
      open = false;
    },
  };
}

/**
 * Per-netns sysctl files belong to the root of the netns's owning user namespace (as the host sees
 * that uid): 0 for a netns the host's user namespace owns, the pod's mapped root otherwise.
 */
const NETNS_SYSCTL = '/proc/sys/net/core/somaxconn';

async function refuseForeign(netns: string): Promise<null> {
  const r = await exec('nsenter', [`--net=${netns}`, '--', 'stat', '-L', '-c', '%u', NETNS_SYSCTL], {
    timeoutMs: 5000,
  });
  const uid = r.stdout.trim();
  if (r.code !== 0 || !/^\d+$/.test(uid)) {
    const why = r.error ?? (r.stderr.trim() || `exit ${r.code}`);
    throw new UsernsError(`cannot tell which user namespace owns ${netns}: ${why}`);
  }
  if (uid !== '0') {
    throw new UsernsError(
      `${netns} is owned by a user namespace (a hostUsers: false pod; its root is uid ${uid} on the host), ` +
        'and this mesh-cni build runs on Node, which cannot enter it; the Bun build (the default) can',
    );
  }
  return null;
}

/**
 * The user namespace owning the netns at `netns` when it is not the host's, else null. Throws
 * UsernsError when that cannot be told or, under Node, when it is another's.
 */
export async function podUserns(netns: string): Promise<PodUserns | null> {
  const lib = bunLibc();
  return lib ? byIoctl(lib, netns) : refuseForeign(netns);
}

// Which user namespace owns a held netns. A `hostUsers: false` pod's netns is owned by the pod's
// own user namespace, and the kernel takes an `-m owner --uid-owner` rule into it only from a
// process in that user namespace (from the host's: EINVAL, on legacy iptables and the nft shim
// alike). So what writes a pod's rules (runInNetns, run.ts) asks the kernel for the owner
// (ioctl NS_GET_USERNS on the netns fd) and enters it too when it is not the host's
// (docs/plugin.md "User-namespaced pods").
//
// Node has no ioctl: it is the agent's native addon's (src/ambient/native/seqpacket.c), loaded
// by addon.ts, which ambient's seqpacket sockets share.

import fs from 'node:fs';
import { constants as osConstants } from 'node:os';
import path from 'node:path';
import { ADDON_PATH, loadAddon } from './addon.ts';
import type { NsId } from './held.ts';

/** The owner of a netns cannot be told: nothing is run there as if the host's owned it. */
export class UsernsError extends Error {
  readonly code = 'ERR_NETNS_USERNS';
}

interface Addon {
  /** fd of the owning user namespace (close-on-exec) or -errno. */
  nsGetUserns(fd: number): number;
}

let addon: Addon | undefined;

/** Loaded on first use: only a write into a pod's netns needs it. */
function native(): Addon {
  if (addon) return addon;
  let loaded: Partial<Addon>;
  try {
    loaded = loadAddon();
  } catch (err) {
    throw new UsernsError(
      `cannot load the native addon ${ADDON_PATH} to ask which user namespace owns a pod's netns: ` +
        `${(err as Error).message}; npm run build compiles it from src/ambient/native/seqpacket.c`,
      { cause: err },
    );
  }
  if (typeof loaded.nsGetUserns !== 'function')
    throw new UsernsError(`the native addon ${ADDON_PATH} has no nsGetUserns: it predates it; run npm run build`);
  addon = loaded as Addon;
  return addon;
}

const ENOTTY = osConstants.errno.ENOTTY;

let host: NsId | undefined;
/** The agent's user namespace (the host's), read once: the kernel lets no threaded process leave it. */
function ours(): NsId {
  host ??= fs.statSync('/proc/self/ns/user', { bigint: true });
  return host;
}

/**
 * An fd of the user namespace owning the netns `netnsFd` names when that is not the agent's own
 * (the caller closes it), else null. `what` names the netns in errors. Throws UsernsError when
 * the kernel does not answer.
 */
export function netnsOwner(netnsFd: number, what: string): number | null {
  const rc = native().nsGetUserns(netnsFd);
  // No such ioctl (before Linux 4.9): a kernel that old runs no user-namespaced pods.
  if (rc === -ENOTTY) return null;
  if (rc < 0) throw new UsernsError(`ioctl NS_GET_USERNS on ${what} failed (errno ${-rc}); not writing there`);
  let hosts: boolean;
  try {
    const owner = fs.fstatSync(rc, { bigint: true });
    const self = ours();
    hosts = owner.dev === self.dev && owner.ino === self.ino;
  } catch (e) {
    fs.closeSync(rc);
    throw new UsernsError(`cannot compare the user namespace owning ${what} with ours: ${(e as Error).message}`, {
      cause: e,
    });
  }
  if (!hosts) return rc;
  fs.closeSync(rc);
  return null;
}

/**
 * Where the lock file is made: the dir of legacy iptables' own /run/xtables.lock, which is
 * writable wherever the agent runs legacy iptables (an emptyDir over /run in the DaemonSet, whose
 * root file system is read-only: no /tmp).
 */
const LOCK_DIR = '/run';
let lockFd: number | undefined;

/**
 * An open file no one but this process can reach, for legacy iptables run as a pod's root to lock
 * (XTABLES_LOCKFILE=/proc/self/fd/<n>). /run/xtables.lock is the host root's (0600), which the
 * pod's root may not open; the netns file it could open any node user can open and flock too (0444
 * under /run/netns), keeping every legacy write into that pod waiting out its 5 s. Made 0444 (the
 * pod's root opens it read-only through /proc/self/fd, as iptables opens its lock) in a 0700 dir,
 * unlinked at once. One for the agent's life, made on first use: its user-namespaced writers lock
 * each other out as its other writers do on /run/xtables.lock.
 */
export function privateLockFile(): number {
  if (lockFd !== undefined) return lockFd;
  let dir: string;
  try {
    dir = fs.mkdtempSync(path.join(LOCK_DIR, 'mesh-cni-xtlock-'));
  } catch (e) {
    throw new UsernsError(
      `cannot make a lock file for legacy iptables in a pod's user namespace under ${LOCK_DIR}: ` +
        `${(e as Error).message}; ${LOCK_DIR} must be writable (the DaemonSet mounts an emptyDir there)`,
      { cause: e },
    );
  }
  const file = path.join(dir, 'lock');
  try {
    lockFd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o444);
  } catch (e) {
    throw new UsernsError(`cannot make the lock file ${file}: ${(e as Error).message}`, { cause: e });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  return lockFd;
}

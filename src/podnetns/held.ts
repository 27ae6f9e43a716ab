// A network namespace held open by fd: what the scan hands out and runInNetns enters.
//
// Its identity is the fd's own (fstat after open), never a path's: the process a path went
// through may exit, and its pid be reused, between a stat and the open.
//
// The path may name anything: it comes from a request (the CNI netns path of an ADD) or from a
// pod's /proc entries. A FIFO opened the ordinary way waits for a writer, holding one of libuv's
// few workers for good (five such ADDs stalled every fs call of the agent); a device may act on
// open. So nothing but a regular file is opened (nsfs files are), without blocking, and what the
// fd is decides: a namespace file is one on nsfs (the statfs f_type of the fd's own inode, which
// the kernel sets and no file system can fake, the same for a bind mount under /run/netns and
// for /proc/<pid>/ns/net). Which kind of namespace it is (net, mnt...) is not looked at: that
// takes the NS_GET_NSTYPE ioctl, and every use of the fd is a setns(CLONE_NEWNET) (nsenter,
// ztunnel), which refuses any other kind. The calls are bounded (fscalls.ts): a path on a file
// system that hangs the kernel fails its caller in time and shows on /readyz.

import fs from 'node:fs';
import fsp from 'node:fs/promises';
import { promisify } from 'node:util';
import { fileKind } from '../filekind.ts';
import { podPathCalls, type FsCallGate } from './fscalls.ts';

/** An open netns, held by fd (O_RDONLY|O_NONBLOCK|O_CLOEXEC). close() is idempotent. */
export interface HeldNetns {
  readonly fd: number;
  readonly dev: bigint;
  readonly ino: bigint;
  /** The process it was found through (the oldest: the sandbox). */
  readonly pid: number;
  close(): void;
}

/** (dev, ino): what tells two namespaces apart. */
export interface NsId {
  readonly dev: bigint;
  readonly ino: bigint;
}
export const nsKey = (id: NsId): string => `${id.dev}:${id.ino}`;
export const sameNs = (a: NsId, b: NsId): boolean => a.dev === b.dev && a.ino === b.ino;

const open = promisify(fs.open);
const fstat = promisify(fs.fstat);

/**
 * Read-only; O_NONBLOCK: a FIFO's open returns at once (the fd check then refuses it) instead of
 * waiting for a writer; O_NOCTTY: a terminal is never made the agent's controlling one (its
 * hangup would SIGHUP the agent). libuv adds O_CLOEXEC to every open (Node has no constant for
 * it), so no child inherits the fd unless handed it: the podnetns tests read the flags in
 * /proc/self/fdinfo. O_NONBLOCK stays on the fd and changes nothing for setns.
 */
const FLAGS = fs.constants.O_RDONLY | fs.constants.O_NONBLOCK | fs.constants.O_NOCTTY;

/** statfs type of a namespace file (NSFS_MAGIC). */
export const NSFS_MAGIC = 0x6e736673n;

/** A path that is not a namespace file: `kind` says what it is ("a FIFO"). */
export class NotANetnsError extends Error {
  readonly code = 'ERR_NOT_NETNS';
  readonly path: string;
  readonly kind: string;
  constructor(path: string, kind: string) {
    super(`${path} is ${kind}, not a network namespace file`);
    this.name = 'NotANetnsError';
    this.path = path;
    this.kind = kind;
  }
}

class Held implements HeldNetns {
  readonly dev: bigint;
  readonly ino: bigint;
  readonly pid: number;
  #fd: number;
  constructor(fd: number, id: NsId, pid: number) {
    this.#fd = fd;
    this.dev = id.dev;
    this.ino = id.ino;
    this.pid = pid;
  }
  /** -1 once closed: the number may already name another file of this process. */
  get fd(): number {
    return this.#fd;
  }
  close(): void {
    if (this.#fd < 0) return;
    const fd = this.#fd;
    this.#fd = -1;
    fs.closeSync(fd);
  }
}

/**
 * Opens `path` and takes its identity from the fd. Rejects with NotANetnsError for anything but
 * a namespace file, FsCallTimeout when the kernel did not answer in time (`gate`), else as
 * fs.open does (ENOENT...).
 */
export function openNetns(path: string, pid: number, gate: FsCallGate = podPathCalls): Promise<HeldNetns> {
  return gate.run(
    `opening ${path} as a netns`,
    () => openChecked(path, pid),
    (late) => late.close(),
  );
}

async function openChecked(path: string, pid: number): Promise<HeldNetns> {
  // Looked at first, so that a device, FIFO or socket is not even opened (opening some devices
  // acts: a watchdog starts counting down). The fd decides below: the path may change meanwhile.
  const before = await fsp.stat(path, { bigint: true });
  if (!before.isFile()) throw new NotANetnsError(path, fileKind(before.mode));
  const fd = await open(path, FLAGS);
  try {
    const st = await fstat(fd, { bigint: true });
    if (!st.isFile()) throw new NotANetnsError(path, fileKind(st.mode));
    // The fd's own file system, through its /proc link: not the path's, which may have changed.
    const sfs = await fsp.statfs(`/proc/self/fd/${fd}`, { bigint: true });
    if (sfs.type !== NSFS_MAGIC) throw new NotANetnsError(path, 'a regular file outside nsfs');
    return new Held(fd, { dev: st.dev, ino: st.ino }, pid);
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

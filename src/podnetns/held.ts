// A network namespace held open by fd: what the scan hands out and runInNetns enters.
//
// Its identity is the fd's own (fstat after open), never a path's: the process a path went
// through may exit, and its pid be reused, between a stat and the open.

import fs from 'node:fs';
import { promisify } from 'node:util';

/** An open netns, held by fd (O_RDONLY|O_CLOEXEC). close() is idempotent. */
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
 * O_RDONLY; libuv adds O_CLOEXEC to every open (Node has no constant for it), so no child
 * inherits the fd unless handed it: the podnetns-held test reads the flag in /proc/self/fdinfo.
 */
const FLAGS = fs.constants.O_RDONLY;

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

/** Opens `path` and takes its identity from the fd. Rejects as fs.open and fs.fstat do (ENOENT...). */
export async function openNetns(path: string, pid: number): Promise<HeldNetns> {
  const fd = await open(path, FLAGS);
  try {
    const st = await fstat(fd, { bigint: true });
    return new Held(fd, { dev: st.dev, ino: st.ino }, pid);
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

// Keeps the host's CNI bin dir holding our binaries, byte for byte, mode 0755. A binary is
// replaced by an atomic rename (a running plugin keeps its old file; no ETXTBSY, never a half
// file).
//
// Only the binaries we ship are copied, by name: --cni-binaries-dir may point anywhere (/etc),
// and the bin dir is the host's. A source that is a link is refused (it could point anywhere on
// the image or, through a mount, the host), and nothing in the bin dir is followed or read
// unless it is a regular file.
//
// The plugin is a 126 MB single executable, so reading it is the cost that matters. What the
// bin dir holds is known by stat identity (dev, ino, size, mtime, ctime): a file we wrote is
// known by the identity it has after our rename, so the pass our own write triggers reads
// nothing; a file of unknown identity (an earlier run's, at start-up) is compared byte for byte
// with the source once, which reads each file once and hashes nothing (cheaper than the sha256
// of both); and a missing or different-sized file is replaced without reading it at all.
//
// At the agent's start that one comparison is the largest part of the time to ready (docs/design.md
// "Start-up time"), so the agent begins it at once (checkInstalledBinaries), while the rest of it
// starts, and the installer's first pass takes what it found (know): the pass still trusts it
// only at the stat identities it was found at, as it trusts its own writes.

import type { BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { copyFromHandleAtomic } from './atomicfile.ts';
import { PLUGIN_TYPE } from './cniconfig.ts';
import { identity, openRegular, UnsafeFileError } from './safefile.ts';

export const BINARY_MODE = 0o755;

/** What we install into the host's bin dir: the plugin single executable, nothing else. */
export const SHIPPED_BINARIES: readonly string[] = [PLUGIN_TYPE];

const CHUNK = 1024 * 1024;

/**
 * Whether two open files of `size` bytes hold the same bytes. The next chunks are read while
 * this one is compared, so the comparing overlaps the reading.
 */
async function sameBytes(a: fs.FileHandle, b: fs.FileHandle, size: bigint): Promise<boolean> {
  const end = Number(size);
  const buffers = [0, 1].map(() => [Buffer.allocUnsafe(CHUNK), Buffer.allocUnsafe(CHUNK)] as const);
  const read = (pos: number, [ba, bb]: readonly [Buffer, Buffer]) =>
    Promise.all([a.read(ba, 0, CHUNK, pos), b.read(bb, 0, CHUNK, pos)]);
  let next = read(0, buffers[0]!);
  for (let pos = 0, i = 0; pos < end; i ^= 1) {
    const [ra, rb] = await next;
    if (ra.bytesRead !== rb.bytesRead || ra.bytesRead === 0) return false;
    const at = pos + ra.bytesRead;
    const ahead = at < end ? (next = read(at, buffers[i ^ 1]!)) : null;
    const [ba, bb] = buffers[i]!;
    if (ba.compare(bb, 0, rb.bytesRead, 0, ra.bytesRead) !== 0) {
      // The read ahead finishes (or fails) before the caller closes the files.
      await ahead?.catch(() => {});
      return false;
    }
    pos = at;
  }
  return true;
}

/** An installed file known to hold its source's bytes: at stat identity `id`, those of the source at `srcId`. */
export interface KnownBinary {
  readonly id: string;
  readonly srcId: string;
}

/** What a check found, by installed path, and how many installed files it read to find it. */
export interface CheckedBinaries {
  readonly known: ReadonlyMap<string, KnownBinary>;
  readonly reads: number;
}

/**
 * Compares what `destDir` holds with the sources in `srcDir`, writing nothing, for a later
 * BinaryInstaller of the same dirs to know(). Never throws: whatever it cannot tell, the
 * installer's pass finds out (and reports) for itself.
 */
export async function checkInstalledBinaries(srcDir: string, destDir: string): Promise<CheckedBinaries> {
  const checker = new BinaryInstaller(srcDir, destDir);
  await checker.check().catch(() => {});
  return checker.checked();
}

export class BinaryInstaller {
  readonly #srcDir: string;
  readonly #destDir: string;
  /** By installed path: at identity `id` it holds the bytes of the source at identity `srcId`. */
  readonly #installed = new Map<string, KnownBinary>();
  /** How many installed files this installer read to compare them: for tests and the benchmark. */
  reads = 0;

  constructor(srcDir: string, destDir: string) {
    this.#srcDir = srcDir;
    this.#destDir = destDir;
  }

  /**
   * Takes what a check of the same dirs found (checkInstalledBinaries), trusted at its identities
   * only. Its reads are the check's, not counted here.
   */
  know(checked: CheckedBinaries): void {
    for (const [dest, known] of checked.known) this.#installed.set(dest, known);
  }

  /** What this installer knows the bin dir to hold, and how many reads that took. */
  checked(): CheckedBinaries {
    return { known: new Map(this.#installed), reads: this.reads };
  }

  /** Compares what the bin dir holds with the sources, as sync() would, writing nothing. */
  async check(): Promise<void> {
    for (const name of SHIPPED_BINARIES) {
      const { fh, stat } = await this.#openSource(name);
      try {
        await this.#holds(path.join(this.#destDir, name), fh, stat);
      } finally {
        await fh.close();
      }
    }
  }

  async #openSource(name: string): Promise<{ fh: fs.FileHandle; stat: BigIntStats }> {
    const src = path.join(this.#srcDir, name);
    try {
      return await openRegular(src, { noFollow: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT')
        throw new Error(`no binaries to install: ${src} is missing (is --cni-binaries-dir right?)`, { cause: e });
      const why = e instanceof UnsafeFileError ? e.message : `cannot read ${src}: ${(e as Error).message}`;
      throw new Error(`${why}; --cni-binaries-dir must hold the ${name} binary as a regular file`, { cause: e });
    }
  }

  /** Copies what differs; returns the names written. */
  async sync(): Promise<string[]> {
    const written: string[] = [];
    for (const name of SHIPPED_BINARIES) {
      const { fh, stat } = await this.#openSource(name);
      try {
        const dest = path.join(this.#destDir, name);
        if (await this.#holds(dest, fh, stat)) continue;
        try {
          const destStat = await copyFromHandleAtomic(fh, dest, BINARY_MODE);
          this.#installed.set(dest, { id: identity(destStat), srcId: identity(stat) });
        } catch (e) {
          throw new Error(`cannot install ${name} into ${this.#destDir}: ${(e as Error).message}`, { cause: e });
        }
        written.push(name);
      } finally {
        await fh.close();
      }
    }
    return written;
  }

  /** Whether `dest` is a regular file, mode 0755, with exactly the bytes of the open source. */
  async #holds(dest: string, src: fs.FileHandle, srcStat: BigIntStats): Promise<boolean> {
    const st = await fs.lstat(dest, { bigint: true }).catch(() => null);
    // Anything else there (missing, a link, a FIFO, another size or mode) is replaced unread.
    if (!st?.isFile() || st.size !== srcStat.size || (Number(st.mode) & 0o7777) !== BINARY_MODE) return false;
    const srcId = identity(srcStat);
    const known = this.#installed.get(dest);
    if (known?.id === identity(st) && known.srcId === srcId) return true;
    let opened;
    try {
      opened = await openRegular(dest, { noFollow: true });
    } catch {
      return false;
    }
    try {
      // Known at the identity fstat saw on the fd, so a swap after the lstat is not misread.
      this.reads++;
      if (opened.stat.size !== srcStat.size || !(await sameBytes(opened.fh, src, srcStat.size))) return false;
      this.#installed.set(dest, { id: identity(opened.stat), srcId });
      return true;
    } finally {
      await opened.fh.close();
    }
  }
}

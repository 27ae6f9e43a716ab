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

/** Whether two open files of `size` bytes hold the same bytes. */
async function sameBytes(a: fs.FileHandle, b: fs.FileHandle, size: bigint): Promise<boolean> {
  const ba = Buffer.allocUnsafe(CHUNK);
  const bb = Buffer.allocUnsafe(CHUNK);
  for (let pos = 0; pos < Number(size);) {
    const [ra, rb] = await Promise.all([a.read(ba, 0, CHUNK, pos), b.read(bb, 0, CHUNK, pos)]);
    if (ra.bytesRead !== rb.bytesRead || ra.bytesRead === 0) return false;
    if (ba.compare(bb, 0, rb.bytesRead, 0, ra.bytesRead) !== 0) return false;
    pos += ra.bytesRead;
  }
  return true;
}

export class BinaryInstaller {
  readonly #srcDir: string;
  readonly #destDir: string;
  /** By installed path: at identity `id` it holds the bytes of the source at identity `srcId`. */
  readonly #installed = new Map<string, { readonly id: string; readonly srcId: string }>();
  /** How many installed files were read to compare them: for tests and the benchmark. */
  reads = 0;

  constructor(srcDir: string, destDir: string) {
    this.#srcDir = srcDir;
    this.#destDir = destDir;
  }

  /** Copies what differs; returns the names written. */
  async sync(): Promise<string[]> {
    const written: string[] = [];
    for (const name of SHIPPED_BINARIES) {
      const src = path.join(this.#srcDir, name);
      let opened;
      try {
        opened = await openRegular(src, { noFollow: true });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ENOENT')
          throw new Error(`no binaries to install: ${src} is missing (is --cni-binaries-dir right?)`, { cause: e });
        const why = e instanceof UnsafeFileError ? e.message : `cannot read ${src}: ${(e as Error).message}`;
        throw new Error(`${why}; --cni-binaries-dir must hold the ${name} binary as a regular file`, { cause: e });
      }
      const { fh, stat } = opened;
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

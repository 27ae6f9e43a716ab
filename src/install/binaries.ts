// Keeps the host's CNI bin dir holding our binaries, byte for byte, mode 0755. A binary is
// replaced by an atomic rename (a running plugin keeps its old file; no ETXTBSY, never a half
// file).
//
// Only the binaries we ship are copied, by name: --cni-binaries-dir may point anywhere (/etc),
// and the bin dir is the host's. A source that is a link is refused (it could point anywhere on
// the image or, through a mount, the host), and nothing in the bin dir is followed or read
// unless it is a regular file.
//
// The plugin is a 126 MB single executable, so reading it is the cost that matters: the
// source is hashed once per process (it is in the image and does not change; a new stat
// identity would be hashed again), an installed file is hashed only when its stat identity is
// new, and a file we wrote ourselves is known by the identity it has after our rename, so the
// pass that our own write triggers reads nothing.

import { createHash } from 'node:crypto';
import type { BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { copyFromHandleAtomic } from './atomicfile.ts';
import { PLUGIN_TYPE } from './cniconfig.ts';
import { identity, openRegular, UnsafeFileError } from './safefile.ts';

export const BINARY_MODE = 0o755;

/** What we install into the host's bin dir: the plugin single executable, nothing else. */
export const SHIPPED_BINARIES: readonly string[] = [PLUGIN_TYPE];

/** sha256 of an open file, read in large chunks (one read of a 126 MB file is ~130 steps). */
async function hashHandle(fh: fs.FileHandle): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of fh.createReadStream({ highWaterMark: 1024 * 1024, autoClose: false, start: 0 })) h.update(chunk as Buffer);
  return h.digest('hex');
}

interface Known {
  readonly id: string;
  readonly hash: string;
}

export class BinaryInstaller {
  private readonly srcDir: string;
  private readonly destDir: string;
  /** By source path: the hash of the source at that stat identity. */
  private readonly sources = new Map<string, Known>();
  /** By installed path: the hash of what is there at that stat identity (ours after a write). */
  private readonly installed = new Map<string, Known>();
  /** How many files were read to hash them: for tests and the benchmark. */
  hashes = 0;

  constructor(srcDir: string, destDir: string) {
    this.srcDir = srcDir;
    this.destDir = destDir;
  }

  /** Copies what differs; returns the names written. */
  async sync(): Promise<string[]> {
    const written: string[] = [];
    for (const name of SHIPPED_BINARIES) {
      const src = path.join(this.srcDir, name);
      let opened;
      try {
        opened = await openRegular(src, { noFollow: true });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new Error(`no binaries to install: ${src} is missing (is --cni-binaries-dir right?)`, { cause: e });
        const why = e instanceof UnsafeFileError ? e.message : `cannot read ${src}: ${(e as Error).message}`;
        throw new Error(`${why}; --cni-binaries-dir must hold the ${name} binary as a regular file`, { cause: e });
      }
      const { fh, stat } = opened;
      try {
        const srcHash = await this.sourceHash(src, fh, stat);
        const dest = path.join(this.destDir, name);
        if (await this.holds(dest, stat.size, srcHash)) continue;
        try {
          const destStat = await copyFromHandleAtomic(fh, dest, BINARY_MODE);
          this.installed.set(dest, { id: identity(destStat), hash: srcHash });
        } catch (e) {
          throw new Error(`cannot install ${name} into ${this.destDir}: ${(e as Error).message}`, { cause: e });
        }
        written.push(name);
      } finally {
        await fh.close();
      }
    }
    return written;
  }

  private async sourceHash(src: string, fh: fs.FileHandle, stat: BigIntStats): Promise<string> {
    const id = identity(stat);
    const known = this.sources.get(src);
    if (known?.id === id) return known.hash;
    this.hashes++;
    const hash = await hashHandle(fh);
    this.sources.set(src, { id, hash });
    return hash;
  }

  /** Whether `dest` is a regular file, mode 0755, with exactly the source's bytes. */
  private async holds(dest: string, size: bigint, hash: string): Promise<boolean> {
    const st = await fs.lstat(dest, { bigint: true }).catch(() => null);
    // Anything else there (missing, a link, a FIFO, another size or mode) is replaced unread.
    if (!st?.isFile() || st.size !== size || (Number(st.mode) & 0o7777) !== BINARY_MODE) return false;
    const id = identity(st);
    const known = this.installed.get(dest);
    if (known?.id === id) return known.hash === hash;
    let opened;
    try {
      opened = await openRegular(dest, { noFollow: true });
    } catch {
      return false;
    }
    try {
      // Hashed at the identity fstat saw on the fd, so a swap after the lstat is not misread.
      this.hashes++;
      const got = await hashHandle(opened.fh);
      this.installed.set(dest, { id: identity(opened.stat), hash: got });
      return got === hash;
    } finally {
      await opened.fh.close();
    }
  }
}

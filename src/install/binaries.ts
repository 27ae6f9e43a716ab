// Keeps the host's CNI bin dir holding our binaries, byte for byte, mode 0755. A binary is
// replaced by an atomic rename (a running plugin keeps its old file; no ETXTBSY, never a half
// file). Hashes are cached by file identity so a steady-state reconcile reads no binary.

import { createHash } from 'node:crypto';
import { createReadStream, type Stats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { copyFileAtomic, removeFile } from './atomicfile.ts';

export const BINARY_MODE = 0o755;

class HashCache {
  private readonly byPath = new Map<string, { key: string; hash: string }>();

  async hash(file: string, st: Stats): Promise<string> {
    const key = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}`;
    const hit = this.byPath.get(file);
    if (hit?.key === key) return hit.hash;
    const hash = await new Promise<string>((resolve, reject) => {
      const h = createHash('sha256');
      createReadStream(file).on('error', reject).on('data', (d) => h.update(d)).on('end', () => resolve(h.digest('hex')));
    });
    this.byPath.set(file, { key, hash });
    return hash;
  }
}

export class BinaryInstaller {
  private readonly cache = new HashCache();
  private readonly srcDir: string;
  private readonly destDir: string;

  constructor(srcDir: string, destDir: string) {
    this.srcDir = srcDir;
    this.destDir = destDir;
  }

  /** The binaries to install: every regular file (or link to one) in the source dir, with its stat. */
  async sources(): Promise<[name: string, stat: Stats][]> {
    let names: string[];
    try {
      names = await fs.readdir(this.srcDir);
    } catch (e) {
      throw new Error(`cannot read the binaries to install from ${this.srcDir}: ${(e as Error).message}`, { cause: e });
    }
    const files: [string, Stats][] = [];
    for (const n of names.sort()) {
      const st = await fs.stat(path.join(this.srcDir, n)).catch(() => null);
      if (st?.isFile()) files.push([n, st]);
    }
    if (files.length === 0) throw new Error(`no binaries to install in ${this.srcDir} (is --cni-binaries-dir right?)`);
    return files;
  }

  /** Copies what differs; returns the names written. */
  async sync(): Promise<string[]> {
    const written: string[] = [];
    for (const [name, srcStat] of await this.sources()) {
      const src = path.join(this.srcDir, name);
      const dest = path.join(this.destDir, name);
      const destStat = await fs.lstat(dest).catch(() => null);
      if (
        destStat?.isFile() &&
        destStat.size === srcStat.size &&
        (destStat.mode & 0o7777) === BINARY_MODE &&
        (await this.cache.hash(dest, destStat)) === (await this.cache.hash(src, srcStat))
      ) {
        continue;
      }
      try {
        await copyFileAtomic(src, dest, BINARY_MODE);
      } catch (e) {
        throw new Error(`cannot install ${name} into ${this.destDir}: ${(e as Error).message}`, { cause: e });
      }
      written.push(name);
    }
    return written;
  }

  /** Removes the binaries we install from the host (uninstall). */
  async remove(): Promise<string[]> {
    const removed: string[] = [];
    for (const [name] of await this.sources().catch(() => [])) {
      if (await removeFile(path.join(this.destDir, name))) removed.push(name);
    }
    return removed;
  }
}

// What the net dir's config files held when last read, so a pass does not read and parse every
// one of them again (with 10,000 files that was 1.2 s a pass, and every pass took our entry out
// of each). An entry is dropped on any watch event for its file; between events it is trusted.
// Watches can miss events (a queue overflow, a dir replaced), so a verifying pass (the periodic
// one, start-up, retries) checks every entry's stat identity (dev, ino, size, mtime, ctime),
// which costs one stat per file instead of a read and a parse.
//
// Two races are closed: an event that arrives while its file is being read leaves nothing in
// the cache (a generation count per file), and an identity is only trusted once the file's
// ctime is older than the coarsest timestamp step a file system may have (a write within the
// same step and of the same size would not change the identity).

import fs from 'node:fs/promises';
import { mapBounded } from '../concurrency.ts';
import { identity, readRegularFileIfExists } from './safefile.ts';

/** Files changed this recently may change again without a new identity. */
const RACY_NS = 2_000_000_000n;

export interface CachedFile {
  readonly text: string;
  /** A value worked out from the text once per content (e.g. whether it holds our entry). */
  memo<T>(key: string, compute: (text: string) => T): T;
}

interface Entry extends CachedFile {
  readonly id: string;
  /** Whether the identity alone may vouch for the content (not changed within RACY_NS of reading). */
  readonly settled: boolean;
  /** The pass in which it was last read or checked. */
  checked: number;
}

function entry(text: string, id: string, settled: boolean, checked: number): Entry {
  const memos = new Map<string, unknown>();
  return {
    text,
    id,
    settled,
    checked,
    memo<T>(key: string, compute: (text: string) => T): T {
      if (!memos.has(key)) memos.set(key, compute(text));
      return memos.get(key) as T;
    },
  };
}

export class FileCache {
  readonly #entries = new Map<string, Entry>();
  readonly #generations = new Map<string, number>();
  #verifying = true;
  #pass = 0;
  #unsureSince = false;
  /** Reads that went to the file system: for tests and the benchmark. */
  reads = 0;

  /** A watch event for `file`: what was cached for it is no longer known. */
  changed(file: string): void {
    this.#entries.delete(file);
    this.#generations.set(file, (this.#generations.get(file) ?? 0) + 1);
  }

  /** A watch was (re)armed or failed: nothing cached can be trusted without a check. */
  unsure(): void {
    this.#unsureSince = true;
    this.#verifying = true;
  }

  /** Starts a pass: a verifying one checks every entry's stat identity before use. */
  startPass(verify: boolean): void {
    this.#pass++;
    this.#verifying = verify || this.#unsureSince;
    this.#unsureSince = false;
  }

  /**
   * The file's text, from the cache when it is known not to have changed; null when it does not
   * exist. Throws what readRegularFile throws (a FIFO, a device, a file over the cap, EACCES).
   */
  async read(file: string): Promise<CachedFile | null> {
    const hit = this.#entries.get(file);
    if (hit && (!this.#verifying || hit.checked === this.#pass)) return hit;
    if (hit?.settled) {
      const st = await fs.stat(file, { bigint: true }).catch(() => null);
      if (st && identity(st) === hit.id) {
        hit.checked = this.#pass;
        return hit;
      }
    }
    const generation = this.#generations.get(file) ?? 0;
    this.reads++;
    this.#entries.delete(file);
    const got = await readRegularFileIfExists(file);
    if (got === null) return null;
    const settled = BigInt(Date.now()) * 1_000_000n - got.stat.ctimeNs > RACY_NS;
    const e = entry(got.text, identity(got.stat), settled, this.#pass);
    // An event during the read: what was read may be from before it. Use it, do not keep it.
    if ((this.#generations.get(file) ?? 0) === generation) this.#entries.set(file, e);
    return e;
  }

  /** What is cached for `file` when it can be used without touching the file system. */
  peek(file: string): CachedFile | undefined {
    const hit = this.#entries.get(file);
    return hit && (!this.#verifying || hit.checked === this.#pass) ? hit : undefined;
  }

  /**
   * Reads (or, verifying, checks) many files ahead of their one-by-one use, `concurrency` at a
   * time: with thousands of files the stats then overlap instead of queueing one after another.
   */
  async warm(files: readonly string[], concurrency = 32): Promise<void> {
    if (!this.#verifying && files.every((f) => this.#entries.has(f))) return;
    await mapBounded(files, concurrency, (f) => this.read(f).catch(() => null));
  }

  /** Forgets files no longer in the dir (keeps the cache the size of the dir). */
  keepOnly(files: ReadonlySet<string>): void {
    for (const f of this.#entries.keys()) if (!files.has(f)) this.#entries.delete(f);
    for (const f of this.#generations.keys()) if (!files.has(f)) this.#generations.delete(f);
  }
}

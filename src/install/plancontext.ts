// What the planner (plan.ts) works with: the net dir as a read-only view, and the steps it plans.
//
// The planner reads through a NetDirView (netdirview.ts reads the real dir through safefile.ts
// and the file cache; the table tests give a listing and texts) and never writes: every write,
// removal, report and change to what the agent remembers between passes is a Step, applied in
// order by apply.ts. What the planner plans to write it then reads back as written (an overlay),
// so a later decision in the same pass sees the dir as the steps before it leave it.

import path from 'node:path';
import type { CachedFile } from './filecache.ts';
import type { Original } from './records.ts';

/** The settings the planner needs (from InstallSettings). */
export interface PlanSettings {
  /** The net dir as the agent sees it: for paths in messages and Write records. */
  readonly netDir: string;
  readonly chained: boolean;
  /** --mesh-owned-cni-config */
  readonly owned: boolean;
  /** --mesh-owned-cni-config-filename */
  readonly ownedName: string;
  /** --cni-conf-name: the primary named, or '' to find it. */
  readonly confName: string;
  readonly orchcfgName: string;
  /** Our conflist in standalone mode (--cni-conf-name, or ours by default). */
  readonly standaloneName: string;
}

export interface FileFacts {
  readonly mode: number;
  readonly uid: number;
  readonly gid: number;
}

export interface EntryFacts {
  readonly isFile: boolean;
  readonly isDirectory: boolean;
  readonly isSymbolicLink: boolean;
  readonly mode: number;
}

/**
 * The net dir, read-only, by file name. Errors are thrown as the file system gives them (ENOENT
 * and the like carry `code`), refused files as UnsafeFileError (safefile.ts).
 */
export interface NetDirView {
  /** The dir's names; throws when it cannot be listed. */
  list(): Promise<string[]>;
  /** A regular file's text, null when it does not exist; anything else is refused. */
  read(name: string): Promise<string | null>;
  /** A record's text (records.ts), never through a link; null when missing or unreadable. */
  readRecord(name: string): Promise<string | null>;
  /** Through the file cache (filecache.ts): trusted between watch events. */
  readCached(name: string): Promise<CachedFile | null>;
  /** What the cache knows without touching the file system. */
  peekCached(name: string): CachedFile | undefined;
  /** Reads (or checks) many files ahead of their one-by-one use. */
  warmCached(names: readonly string[]): Promise<void>;
  /** The dir's names now: the cache forgets the others. */
  keepCached(names: readonly string[]): void;
  /** Follows a link; throws when the file is missing. */
  stat(name: string): Promise<FileFacts>;
  /** Null when nothing has that name. */
  lstat(name: string): Promise<EntryFacts | null>;
  readlink(name: string): Promise<string>;
  /** A directory's entries (the plugin dir a conflist's name names); throws as readdir does. */
  listDir(name: string): Promise<{ readonly name: string; readonly isDirectory: boolean }[]>;
  /** The file a name reads, links followed to the end; null when none. Absent: no links (the table tests). */
  realpath?(name: string): Promise<string | null>;
}

export type ErrorReason =
  | 'net_dir_missing'
  | 'primary_malformed'
  | 'template_invalid'
  | 'token_missing'
  | 'ca_missing'
  | 'api_host_missing'
  | 'binaries_failed'
  | 'write_failed'
  | 'file_refused'
  | 'primary_unsupported'
  | 'config_shadowed';

export interface Skipped {
  readonly file: string;
  /** What is wrong with it; never its contents. */
  readonly reason: string;
}

export type WriteKind = 'binary' | 'orchconfig' | 'cni_config';

/** One planned change or report; apply.ts runs them in order. Names are in the net dir. */
export type Step =
  | {
      readonly kind: 'write';
      readonly name: string;
      readonly text: string;
      readonly mode: number;
      readonly uid?: number;
      readonly gid?: number;
      /**
       * The text just read at `name`: written through a symbolic link there (apply.ts
       * writeThrough), only to a regular file holding this. Absent: `name` itself, replaced.
       */
      readonly through?: string;
      /** Only while `guard.name` still holds `guard.text` just before the rename. */
      readonly guard?: { readonly name: string; readonly text: string };
      /** When the guard stops it: said so, and the steps after it are not run (but `evenIfChanged` ones). */
      readonly ifChanged?: { readonly notReady?: string; readonly debug?: string; readonly primary: string | null };
      /** Counted in the outcome's writes (as the file written through a link with `reportTarget`). */
      readonly report?: WriteKind;
      readonly reportTarget?: boolean;
    }
  | { readonly kind: 'symlink'; readonly name: string; readonly to: string; readonly report?: WriteKind }
  /** Counted in the writes when it removed a file, or always with `reportEvenIfGone`. */
  | { readonly kind: 'remove'; readonly name: string; readonly report?: WriteKind; readonly reportEvenIfGone?: boolean }
  | { readonly kind: 'fail'; readonly reason: ErrorReason; readonly message: string }
  | { readonly kind: 'notReady'; readonly message: string }
  | { readonly kind: 'note'; readonly message: string; readonly evenIfChanged?: boolean }
  | { readonly kind: 'remember'; readonly name: string; readonly original: Original | null }
  | { readonly kind: 'ownedFrom'; readonly from: string | null }
  | { readonly kind: 'goneSince'; readonly at: number | null }
  /** Cleanup: the steps after it, up to the next group, stand or fall together. */
  | { readonly kind: 'group'; readonly what: string }
  | { readonly kind: 'groupFailed'; readonly what: string; readonly message: string };

/** What the agent remembers between passes (the planner gets it, steps change it). */
export interface Memory {
  /** By conflist name: what we replaced there (records.ts). */
  readonly originals: ReadonlyMap<string, Original>;
  /** The primary our owned file was last made from. */
  readonly ownedFrom: string | null;
  /** When that primary was first seen gone (planmodes.ts holdOwned). */
  readonly ownedFromGoneSince: number | null;
}

export const emptyMemory = (): Memory => ({ originals: new Map(), ownedFrom: null, ownedFromGoneSince: null });

/**
 * One plan in the making: the view with what the steps so far wrote laid over it, the steps,
 * and a draft of the memory they leave.
 */
export class PlanContext {
  readonly s: PlanSettings;
  readonly steps: Step[] = [];
  readonly skipped: Skipped[] = [];
  readonly originals: Map<string, Original>;
  ownedFrom: string | null;
  ownedFromGoneSince: number | null;
  /** Owned files of ours under an earlier --mesh-owned-cni-config-filename (plantakeout.ts), this pass. */
  earlierOwned: ReadonlySet<string> = new Set();
  /** The time the plan is made at. */
  readonly now: number;
  readonly #view: NetDirView;
  readonly #written = new Map<string, string>();
  readonly #removed = new Set<string>();

  constructor(s: PlanSettings, view: NetDirView, memory: Memory, now: number) {
    this.s = s;
    this.#view = view;
    this.originals = new Map(memory.originals);
    this.ownedFrom = memory.ownedFrom;
    this.ownedFromGoneSince = memory.ownedFromGoneSince;
    this.now = now;
  }

  get netDir(): string {
    return this.s.netDir;
  }

  /** A name's path as the agent sees it, for messages. */
  path(name: string): string {
    return path.join(this.s.netDir, name);
  }

  /** Names in the net dir that are ours and never a primary config. */
  ownFiles(): ReadonlySet<string> {
    // Our owned file in every mode: a copy of the primary, never one; so are ours under an
    // earlier --mesh-owned-cni-config-filename.
    const standalone = this.s.chained ? STANDALONE_CONF_NAME : this.s.standaloneName;
    return new Set([this.s.orchcfgName, standalone, this.s.ownedName, ...this.earlierOwned]);
  }

  fail(reason: ErrorReason, message: string): void {
    this.steps.push({ kind: 'fail', reason, message });
  }

  notReady(message: string): void {
    this.steps.push({ kind: 'notReady', message });
  }

  write(step: Omit<Step & { kind: 'write' }, 'kind'>): void {
    this.steps.push({ kind: 'write', ...step });
    this.#written.set(step.name, step.text);
    this.#removed.delete(step.name);
  }

  symlink(name: string, to: string, report?: WriteKind): void {
    this.steps.push({ kind: 'symlink', name, to, ...(report ? { report } : {}) });
    // Read back as what it points to: not known here; as gone from our overlay's view.
    this.#written.delete(name);
  }

  remove(name: string, report?: WriteKind, reportEvenIfGone = false): void {
    this.steps.push({
      kind: 'remove',
      name,
      ...(report ? { report } : {}),
      ...(reportEvenIfGone ? { reportEvenIfGone } : {}),
    });
    this.#written.delete(name);
    this.#removed.add(name);
  }

  remember(name: string, original: Original | null): void {
    if (original === null) this.originals.delete(name);
    else this.originals.set(name, original);
    this.steps.push({ kind: 'remember', name, original });
  }

  setOwnedFrom(from: string | null): void {
    this.ownedFrom = from;
    this.steps.push({ kind: 'ownedFrom', from });
  }

  setGoneSince(at: number | null): void {
    if (at === this.ownedFromGoneSince) return;
    this.ownedFromGoneSince = at;
    this.steps.push({ kind: 'goneSince', at });
  }

  // Reads, with what the steps so far wrote laid over the view.

  async list(): Promise<string[]> {
    const names = (await this.#view.list()).filter((n) => !this.#removed.has(n));
    for (const n of this.#written.keys()) if (!names.includes(n)) names.push(n);
    return names;
  }

  async read(name: string): Promise<string | null> {
    if (this.#removed.has(name)) return null;
    return this.#written.get(name) ?? this.#view.read(name);
  }

  /** read(), null for any error. */
  readOrNull(name: string): Promise<string | null> {
    return this.read(name).catch(() => null);
  }

  async readRecord(name: string): Promise<string | null> {
    if (this.#removed.has(name)) return null;
    return this.#written.get(name) ?? this.#view.readRecord(name);
  }

  async readCached(name: string): Promise<CachedFile | null> {
    if (this.#removed.has(name)) return null;
    const text = this.#written.get(name);
    return text !== undefined ? plainFile(text) : this.#view.readCached(name);
  }

  peekCached(name: string): CachedFile | undefined {
    if (this.#removed.has(name) || this.#written.has(name)) return undefined;
    return this.#view.peekCached(name);
  }

  warmCached(names: readonly string[]): Promise<void> {
    return this.#view.warmCached(names.filter((n) => !this.#removed.has(n) && !this.#written.has(n)));
  }

  keepCached(names: readonly string[]): void {
    this.#view.keepCached(names);
  }

  async stat(name: string): Promise<FileFacts> {
    if (this.#removed.has(name)) throw Object.assign(new Error(`${this.path(name)} is gone`), { code: 'ENOENT' });
    return this.#view.stat(name);
  }

  statOrNull(name: string): Promise<FileFacts | null> {
    return this.stat(name).catch(() => null);
  }

  async lstat(name: string): Promise<EntryFacts | null> {
    return this.#removed.has(name) ? null : this.#view.lstat(name).catch(() => null);
  }

  readlink(name: string): Promise<string> {
    return this.#view.readlink(name);
  }

  listDir(name: string): Promise<{ readonly name: string; readonly isDirectory: boolean }[]> {
    return this.#view.listDir(name);
  }

  async realpath(name: string): Promise<string | null> {
    if (this.#removed.has(name) || this.#view.realpath === undefined) return null;
    return this.#view.realpath(name);
  }
}

/** Our conflist in standalone mode, unless --cni-conf-name names another. */
export const STANDALONE_CONF_NAME = 'YY-mesh-cni.conflist';

/** A text as a CachedFile, for a file the plan itself wrote. */
export function plainFile(text: string): CachedFile {
  const memos = new Map<string, unknown>();
  return {
    text,
    memo<T>(key: string, compute: (t: string) => T): T {
      if (!memos.has(key)) memos.set(key, compute(text));
      return memos.get(key) as T;
    },
  };
}

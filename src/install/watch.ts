// Watches the directories whose content the installer keeps in place (net dir, bin dir, the
// service-account dir whose token rotates by a `..data` symlink swap, the CA and template
// files' dirs, and the directory a symlinked primary config points into, where the primary CNI
// rewrites it) and calls back on any change. Watches are a speed-up, not the source of truth:
// the periodic reconcile catches anything they miss, and `refresh` re-arms a watch whose
// directory was deleted and recreated.
//
// One inotify watch per directory (node:fs watch) reports every child's create, write, rename
// and delete. chokidar was tried first and dropped here: it watches each file by inode, and a
// file replaced by rename (our own atomic write) loses its watch until chokidar re-arms it, so
// a primary CNI rewriting its file right after us went unseen until the periodic pass.

import { statSync, watch, type FSWatcher } from 'node:fs';
import path from 'node:path';

export type Trigger = 'net_dir' | 'bin_dir' | 'token' | 'ca' | 'template' | 'periodic' | 'startup' | 'retry';

interface Watched {
  readonly dir: string;
  readonly trigger: Trigger;
  identity: string;
  watcher: FSWatcher | null;
}

function identity(dir: string): string {
  try {
    const st = statSync(dir);
    return `${st.dev}:${st.ino}`;
  } catch {
    return 'missing';
  }
}

export class DirWatcher {
  readonly #watched: Watched[];
  /** A directory watched while the reconcile says so (a symlinked primary's target's); null: none. */
  #extra: Watched | null = null;
  /** `file` is null when the event names none (inotify's queue overflowed, the dir itself changed). */
  readonly #onChange: (trigger: Trigger, file: string | null) => void;
  readonly #onError: (dir: string, e: Error) => void;

  constructor(
    dirs: readonly { dir: string; trigger: Trigger }[],
    onChange: (trigger: Trigger, file: string | null) => void,
    onError: (dir: string, e: Error) => void,
  ) {
    // One watch per directory even when several triggers share it (net dir holds the template).
    const seen = new Map<string, Watched>();
    for (const d of dirs)
      if (!seen.has(d.dir)) seen.set(d.dir, { dir: d.dir, trigger: d.trigger, identity: 'none', watcher: null });
    this.#watched = [...seen.values()];
    this.#onChange = onChange;
    this.#onError = onError;
  }

  /**
   * Watches `dir` as well, for `trigger`, until another one (or null: none) is given; one such
   * directory at a time. A directory watched anyway is not watched twice. Returns whether the
   * set changed; a new one is armed by the next refresh().
   */
  follow(dir: string | null, trigger: Trigger): boolean {
    const wanted = dir !== null && !this.#watched.some((w) => w.dir === dir) ? dir : null;
    if ((this.#extra?.dir ?? null) === wanted) return false;
    this.#extra?.watcher?.close();
    this.#extra = wanted === null ? null : { dir: wanted, trigger, identity: 'none', watcher: null };
    return true;
  }

  /** (Re)arms the watch of every directory that appeared or was replaced since last time. */
  refresh(): boolean {
    let changed = false;
    for (const w of this.#extra ? [...this.#watched, this.#extra] : this.#watched) {
      const id = identity(w.dir);
      if (id === w.identity) continue;
      changed = true;
      w.identity = id;
      w.watcher?.close();
      w.watcher = null;
      if (id === 'missing') continue;
      try {
        const watcher = watch(w.dir, { persistent: true }, (_event, name) =>
          this.#onChange(w.trigger, name ? path.join(w.dir, name) : null),
        );
        watcher.on('error', (e) => {
          // The directory went away: forget it so the next refresh re-arms the new one.
          watcher.close();
          // Also when `w` is an extra directory dropped meanwhile: then nothing refers to it.
          if (w.watcher === watcher) {
            w.watcher = null;
            w.identity = 'none';
          }
          this.#onError(w.dir, e);
        });
        w.watcher = watcher;
      } catch (e) {
        w.identity = 'none';
        this.#onError(w.dir, e as Error);
      }
    }
    return changed;
  }

  close(): void {
    this.#extra?.watcher?.close();
    this.#extra = null;
    for (const w of this.#watched) {
      w.watcher?.close();
      w.watcher = null;
      w.identity = 'none';
    }
  }
}

// Whole-file writes that a reader (the container runtime, a running plugin) never sees half done,
// and that leave only whole files when the process is killed at any moment: write a temp file in
// the same directory, set the mode, fsync, rename over the target. The directory is not fsynced:
// a node that crashes before it is flushed comes back with the old file, whole, and the next
// reconcile writes it again; skipping it halves the cost of restoring our entry.
// Temp names start with a dot and end in `.mesh-tmp-*`, which no runtime reads as a CNI config.

import { randomBytes } from 'node:crypto';
import { constants, lstatSync, type BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { TEMP_MARKER } from '../config/cnifiles.ts';
import { fileKind } from '../filekind.ts';
import { identity } from './safefile.ts';

export { TEMP_MARKER };

function tempPath(file: string): string {
  return path.join(
    path.dirname(file),
    `.${path.basename(file)}${TEMP_MARKER}${process.pid}-${randomBytes(4).toString('hex')}`,
  );
}

export interface WriteOptions {
  readonly mode: number;
  /** Owner to keep (the primary CNI's file may belong to someone else). */
  readonly uid?: number;
  readonly gid?: number;
  /**
   * Checked just before the rename: false leaves `file` as it is (another writer changed what
   * our text was computed from while we wrote it; its watch event brings the next pass).
   */
  readonly beforeRename?: () => Promise<boolean>;
}

/**
 * Writes `data` to `file` atomically, with `mode` from the first byte (umask does not apply);
 * false when `beforeRename` said no and nothing was replaced.
 */
export async function writeFileAtomic(file: string, data: string | Uint8Array, opts: WriteOptions): Promise<boolean> {
  const tmp = tempPath(file);
  try {
    const fh = await fs.open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600 & opts.mode);
    try {
      await fh.chmod(opts.mode);
      if (opts.uid !== undefined && opts.gid !== undefined) await fh.chown(opts.uid, opts.gid).catch(() => {});
      await fh.writeFile(data);
      await fh.sync();
      if (opts.beforeRename && !(await opts.beforeRename())) {
        await fs.rm(tmp, { force: true });
        return false;
      }
      await renameOwn(tmp, file, fh);
    } finally {
      await fh.close();
    }
    return true;
  } catch (e) {
    await fs.rm(tmp, { force: true }).catch(() => {});
    throw e;
  }
}

/**
 * Copies the open file `src` to `dest` atomically (a running copy of dest keeps its old inode:
 * no ETXTBSY). Reads from the handle, not a path, so what was checked is what is copied.
 * Returns the stat of the file now at `dest`, so its writer can know it again.
 */
export async function copyFromHandleAtomic(src: fs.FileHandle, dest: string, mode: number): Promise<BigIntStats> {
  const tmp = tempPath(dest);
  try {
    // The kernel copies (copy_file_range) from the very file the handle holds open.
    await fs.copyFile(`/proc/self/fd/${src.fd}`, tmp, constants.COPYFILE_EXCL);
    const out = await fs.open(tmp, constants.O_RDWR | constants.O_NOFOLLOW);
    try {
      await out.chmod(mode);
      await out.sync();
      return await renameOwn(tmp, dest, out);
    } finally {
      await out.close();
    }
  } catch (e) {
    await fs.rm(tmp, { force: true }).catch(() => {});
    throw e;
  }
}

/**
 * The identity (safefile.ts) each file had right after our last write of it, taken from our own
 * fd after the rename, so the watch event our own write brings can be told from another
 * writer's: while the file still has that identity, nothing changed that we do not know.
 */
const ownWrites = new Map<string, string>();
/** Files being renamed into place by us: their event may come before we know the identity. */
const renaming = new Set<string>();

/** Renames our temp file into place; returns the identity it has there, from our fd. */
async function renameOwn(tmp: string, file: string, fh: fs.FileHandle): Promise<BigIntStats> {
  renaming.add(file);
  try {
    await fs.rename(tmp, file);
    // After the rename (which changes ctime): the identity our file has now.
    const st = await fh.stat({ bigint: true });
    ownWrites.set(file, identity(st));
    return st;
  } finally {
    renaming.delete(file);
  }
}

/** Whether `file` is still exactly as our last write of it left it (a stat, synchronous). */
export function isOwnWrite(file: string): boolean {
  if (renaming.has(file)) return true;
  const mine = ownWrites.get(file);
  if (mine === undefined) return false;
  const st = lstatSync(file, { bigint: true, throwIfNoEntry: false });
  if (st?.isFile() && identity(st) === mine) return true;
  ownWrites.delete(file);
  return false;
}

/** Removes `file` if present; false when it was not there. */
export async function removeFile(file: string): Promise<boolean> {
  try {
    await fs.unlink(file);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw e;
  }
}

export interface StaleTemps {
  /** Names removed: files (or links, the link itself) left by a process killed mid-write. */
  readonly removed: string[];
  /** Names under a temp-style name that we never make (a directory, a FIFO...): left, with why. */
  readonly skipped: { name: string; why: string }[];
}

/**
 * Removes temp files of ours left behind by a process killed mid-write. We only ever make
 * regular files under these names, so anything else planted under one (a directory, a link's
 * target) is not ours: it is left as it is, never followed or recursed into, and a name that
 * cannot be removed does not stop the others or the agent's start.
 */
export async function removeStaleTemps(dir: string): Promise<StaleTemps> {
  const out: StaleTemps = { removed: [], skipped: [] };
  let names: string[];
  try {
    names = await fs.readdir(dir);
  } catch {
    return out;
  }
  const stale = names.filter((n) => n.startsWith('.') && n.includes(TEMP_MARKER));
  await Promise.all(
    stale.map(async (n) => {
      const file = path.join(dir, n);
      try {
        const st = await fs.lstat(file);
        if (!st.isFile() && !st.isSymbolicLink()) {
          out.skipped.push({ name: n, why: `${fileKind(st.mode)}, not a file of ours` });
          return;
        }
        // unlink removes a link itself and fails on a directory swapped in meanwhile (EISDIR).
        await fs.unlink(file);
        out.removed.push(n);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
        out.skipped.push({ name: n, why: `not removed: ${(e as Error).message}` });
      }
    }),
  );
  return out;
}

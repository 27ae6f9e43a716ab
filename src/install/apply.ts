// The applier: carries out a plan's steps (plancontext.ts) in order, in the net dir. Whole-file
// writes are atomic (atomicfile.ts); a config that is a symbolic link is written through it only
// into a directory held open by fd (writeThrough). A step that throws stops the steps after it,
// as a step whose guard finds the primary changed does; in a cleanup, only those of its group.

import { constants } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { scope } from '../monitoring/logging.ts';
import { removeFile, TEMP_MARKER, writeFileAtomic, type WriteOptions } from './atomicfile.ts';
import type { ErrorReason, Memory, Step, WriteKind } from './plancontext.ts';
import type { Original } from './records.ts';
import { readRegularFileIfExists, readRegularTextIfExists } from './safefile.ts';

const log = scope('install');

export interface Write {
  readonly file: string;
  readonly kind: WriteKind;
  readonly action: 'write' | 'remove';
}

export interface Problem {
  readonly reason: ErrorReason;
  readonly message: string;
}

/** What applying the steps gave: the outcome's lists, and what the agent now remembers. */
export interface Applied {
  readonly writes: Write[];
  readonly problems: Problem[];
  readonly notReady: string[];
  readonly notes: string[];
  /** A guard stopped the steps: the primary to report instead of the plan's. */
  stoppedWith?: { readonly primary: string | null };
  /** Cleanup: `what: why` for each group that failed. */
  readonly groupErrors: string[];
}

/** Memory as apply.ts changes it (the InstallPass keeps it between passes). */
export interface MutableMemory extends Memory {
  readonly originals: Map<string, Original>;
  ownedFrom: string | null;
  ownedFromGoneSince: number | null;
}

/**
 * Runs `steps` in `netDir`, adding to `out`. Throws what a step throws (not in a group): the steps
 * before it are done, those after it are not.
 */
export async function applySteps(
  steps: readonly Step[],
  netDir: string,
  memory: MutableMemory,
  out: Applied,
): Promise<void> {
  let changed = false;
  let group: string | null = null;
  let groupDown = false;
  for (const step of steps) {
    if (step.kind === 'group') {
      group = step.what;
      groupDown = false;
      continue;
    }
    if (step.kind === 'groupFailed') {
      // Planning stopped after the group's steps: unless one of them failed first, as it then would have.
      if (!groupDown) out.groupErrors.push(`${step.what}: ${step.message}`);
      continue;
    }
    if (groupDown || (changed && !(step.kind === 'note' && step.evenIfChanged))) continue;
    try {
      if (!(await applyOne(step, netDir, memory, out))) changed = true;
    } catch (e) {
      if (group === null) throw e;
      out.groupErrors.push(`${group}: ${(e as Error).message}`);
      groupDown = true;
    }
  }
}

/** One step; false when its guard found the primary changed. */
async function applyOne(step: Step, netDir: string, memory: MutableMemory, out: Applied): Promise<boolean> {
  const file = (name: string) => path.join(netDir, name);
  switch (step.kind) {
    case 'write': {
      const guard = step.guard;
      const unchanged = guard
        ? async () => (await readRegularTextIfExists(file(guard.name)).catch(() => null)) === guard.text
        : undefined;
      const opts: WriteOptions = {
        mode: step.mode,
        ...(step.uid !== undefined ? { uid: step.uid, gid: step.gid } : {}),
        ...(unchanged ? { beforeRename: unchanged } : {}),
      };
      const { written, target } =
        step.through !== undefined
          ? await writeThrough(file(step.name), step.through, netDir, step.text, opts)
          : { written: await writeFileAtomic(file(step.name), step.text, opts), target: file(step.name) };
      if (!written) {
        if (step.ifChanged?.notReady) out.notReady.push(step.ifChanged.notReady);
        if (step.ifChanged?.debug) log.debug(step.ifChanged.debug);
        out.stoppedWith = { primary: step.ifChanged?.primary ?? null };
        return false;
      }
      if (step.report)
        out.writes.push({ file: step.reportTarget ? target : file(step.name), kind: step.report, action: 'write' });
      return true;
    }
    case 'symlink':
      await symlinkAtomic(step.to, file(step.name));
      if (step.report) out.writes.push({ file: file(step.name), kind: step.report, action: 'write' });
      return true;
    case 'remove': {
      const removed = await removeFile(file(step.name));
      if (step.report && (removed || step.reportEvenIfGone))
        out.writes.push({ file: file(step.name), kind: step.report, action: 'remove' });
      return true;
    }
    case 'fail':
      out.problems.push({ reason: step.reason, message: step.message });
      out.notReady.push(step.message);
      return true;
    case 'notReady':
      out.notReady.push(step.message);
      return true;
    case 'note':
      out.notes.push(step.message);
      return true;
    case 'remember':
      if (step.original === null) memory.originals.delete(step.name);
      else memory.originals.set(step.name, step.original);
      return true;
    case 'ownedFrom':
      memory.ownedFrom = step.from;
      return true;
    case 'goneSince':
      memory.ownedFromGoneSince = step.at;
      return true;
    default:
      return true;
  }
}

/**
 * Writes the config `file` (whose text was just read as `expected`). For a symbolic link (a
 * primary CNI that keeps its config elsewhere and links it here) the file it points to is
 * written (followed to the end), so the link stays and the primary CNI's later writes through it
 * still count; the temp file is made beside that target, so the rename is atomic there. Else
 * `file` itself. Returns whether it was written (beforeRename) and the path written.
 *
 * The net dir is writable by others, and the root agent writing through a link they control
 * could overwrite any file (a CNI binary). So a link is followed only into the net dir itself or
 * into a directory outside it that only root may write (no net-dir writer can swap it), that
 * directory is held open by fd from the check to the rename (a path walked again could lead
 * elsewhere), and only to a regular file there that holds `expected` now. A directory made
 * inside the net dir is refused: it can be swapped for a link (renameat2 RENAME_EXCHANGE) between
 * any check and the write. Never for a name taken from a record (those are written in the net dir).
 */
async function writeThrough(
  file: string,
  expected: string,
  netDir: string,
  data: string,
  opts: WriteOptions,
): Promise<{ written: boolean; target: string }> {
  const st = await fs.lstat(file).catch(() => null);
  if (!st?.isSymbolicLink()) return { written: await writeFileAtomic(file, data, opts), target: file };
  const target = await fs.realpath(file);
  const dir = path.dirname(target);
  const net = await fs.realpath(netDir);
  const refuse = (why: string) =>
    new Error(
      `${file} is a symbolic link to ${target}, ${why}; not writing through ` +
        `the link. Link it to a file in ${netDir} itself or in a directory outside it that only root may write`,
    );
  const rel = path.relative(net, dir);
  if (dir !== net && !rel.startsWith('..') && !path.isAbsolute(rel))
    throw refuse('in a directory inside the net ' + 'dir, which any writer there could swap for a link while we write');
  const dh = await fs.open(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  try {
    const pinned = `/proc/self/fd/${dh.fd}`;
    if ((await fs.realpath(pinned)) !== dir) throw refuse('whose directory moved while it was opened');
    const dst = await dh.stat();
    if (dir !== net && (dst.uid !== 0 || (dst.mode & 0o022) !== 0))
      throw refuse(
        'in a directory not owned by root ' + 'or writable by group or others, which someone else could swap',
      );
    const at = path.join(pinned, path.basename(target));
    const now = await readRegularFileIfExists(at, { noFollow: true }).catch(() => null);
    if (now?.text !== expected)
      throw refuse('which is not the regular file holding the CNI config just read through ' + 'it');
    return { written: await writeFileAtomic(at, data, opts), target };
  } finally {
    await dh.close();
  }
}

/** Makes `file` a symbolic link to `to`, atomically (a temp link renamed over it). */
async function symlinkAtomic(to: string, file: string): Promise<void> {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}${TEMP_MARKER}${process.pid}-link`);
  await fs.rm(tmp, { force: true });
  await fs.symlink(to, tmp);
  await fs.rename(tmp, file);
}

// Planning, part one: which config is the primary, found as the runtime finds it, and the files
// around it that would make the runtime read something else than the file with our entry.

import path from 'node:path';
import {
  byteOrder,
  isConfigFile,
  isOurs,
  libcniVerdict,
  otherForm,
  primaryCandidates,
  withoutOurEntry,
  type JsonObject,
} from './cniconfig.ts';
import { ownedText, sortsBefore } from './owned.ts';
import type { PlanContext } from './plancontext.ts';
import { UnsafeFileError } from './safefile.ts';

/** Configs after a suspected copy of ours compared with it (failCopyOfOurs). */
const COPY_LOOKUP_MAX = 8;

export interface Found {
  readonly name: string;
  /** Null: a file we will not read (said through fail), or it vanished. */
  readonly text: string | null;
  /** What is wrong with it was said already. */
  readonly said?: boolean;
}

/** Whether a config's text holds an entry of ours; a file that does not parse holds none. */
export function textHoldsOurEntry(text: string, name: string): boolean {
  try {
    return withoutOurEntry(text, name) !== null;
  } catch {
    return false;
  }
}

/**
 * The primary config and its text, found as the runtime finds it: the first candidate libcni
 * would load; those it would not are passed over into `ctx.skipped`. A file we will not read (not
 * a regular file, too big) or one whose plugins list goes on in a directory is not passed
 * over: the runtime may well load it, and our entry in a later file would then be ignored.
 */
export async function findPrimary(ctx: PlanContext, names: readonly string[]): Promise<Found | null> {
  const explicit = ctx.s.confName !== '';
  // The named file, else its other form (primaryCandidates); else every config file in order.
  const present = new Set(names);
  const candidates = explicit
    ? [ctx.s.confName, otherForm(ctx.s.confName)].filter((n): n is string => n !== null && present.has(n))
    : primaryCandidates(names, { confName: '', ownFiles: ctx.ownFiles() });
  for (const name of candidates) {
    // libcni's ConfFiles leaves directories out whatever their name (lstat: a link to one is
    // still a candidate, refused below as not a regular file): no runtime reads them. Asked
    // only of the candidates tried, in order: one lstat a pass, not one per file in the dir.
    if ((await ctx.lstat(name))?.isDirectory === true) continue;
    let text: string | null;
    try {
      text = await ctx.read(name);
    } catch (e) {
      if (!(e instanceof UnsafeFileError)) throw e;
      ctx.fail('file_refused', `primary CNI config ${e.message}; leaving it untouched until it changes`);
      return { name, text: null, said: true };
    }
    if (text === null) return { name, text: null };
    const verdict = libcniVerdict(text, name);
    if (!verdict.ok) {
      // A named primary is taken as it is; what is wrong with it is said when it is parsed.
      if (explicit) return { name, text };
      ctx.skipped.push({ file: name, reason: verdict.reason });
      continue;
    }
    if (verdict.pluginDir !== undefined) {
      let listing: readonly { name: string; isDirectory: boolean }[];
      try {
        listing = await ctx.listDir(verdict.pluginDir);
      } catch (e) {
        // As libcni: a missing dir adds no plugins, any other error fails the load. A path
        // error (not a directory, a link loop, too long) fails it for every reader, so that
        // file is passed over as the runtime does; another error (EACCES, EIO) may be ours
        // alone, and the runtime may load the file: stop here.
        const code = (e as NodeJS.ErrnoException).code ?? '';
        const everyReader = ['ENOTDIR', 'ELOOP', 'ENAMETOOLONG'].includes(code);
        if (code === 'ENOENT') listing = [];
        else if (everyReader && !explicit) {
          ctx.skipped.push({
            file: name,
            reason:
              `the directory its "name" names, where libcni looks for more of its ` +
              `plugins, cannot be listed by any reader (${code}), so it fails to load`,
          });
          continue;
        } else {
          ctx.fail(
            everyReader ? 'primary_unsupported' : 'file_refused',
            `${name} in ${ctx.netDir}: cannot read the ` +
              `directory its "name" names, where libcni looks for more of its plugins ` +
              `(${code || (e as Error).message}); not installing until it can be read`,
          );
          return { name, text: null, said: true };
        }
      }
      const more = listing.filter((d) => !d.isDirectory && path.extname(d.name) === '.conf');
      if (more.length > 0) {
        ctx.fail(
          'primary_unsupported',
          `${name} in ${ctx.netDir} takes ${more.length} more plugin config(s) from ` +
            `the directory its "name" names after its own list, so an entry of ours there would not run last; not ` +
            `installing. Move them into its "plugins" list`,
        );
        return { name, text: null, said: true };
      }
      if (!verdict.listed) {
        if (explicit) return { name, text };
        ctx.skipped.push({
          file: name,
          reason: 'no "plugins" list, and no plugin .conf files in the directory its ' + '"name" names',
        });
        continue;
      }
    }
    return { name, text };
  }
  return null;
}

/** `; passed over, as the runtime would: ...` for the configs findPrimary passed over, or ''. */
export function passedOver(ctx: PlanContext): string {
  return ctx.skipped.length > 0
    ? `; passed over, as the runtime would: ` + `${ctx.skipped.map((k) => `${k.file}: ${k.reason}`).join('; ')}`
    : '';
}

/**
 * Whether `name`, taken for the primary, is an owned file of ours under another name (an
 * earlier --mesh-owned-cni-config-filename): exactly what we would make from a config after
 * it, with its entry of ours. The runtime reads it, and a change of that config would never
 * reach pods: config_shadowed, left for the operator to remove (we cannot be sure we wrote
 * it). Looked for only in a file of ours' mode (no group or other bits) holding our entry, so
 * a pass with a primary of 0644 reads nothing more. Found only while that config is as it was.
 */
export async function failCopyOfOurs(
  ctx: PlanContext,
  name: string,
  text: string,
  names: readonly string[],
): Promise<boolean> {
  const st = await ctx.statOrNull(name);
  if (st === null || (st.mode & 0o077) !== 0 || path.extname(name) !== '.conflist' || !textHoldsOurEntry(text, name))
    return false;
  let entry: JsonObject | undefined;
  try {
    entry = (JSON.parse(text) as { plugins: JsonObject[] }).plugins.findLast((p) => isOurs(p));
  } catch {
    return false;
  }
  if (entry === undefined) return false;
  const later = primaryCandidates(names, { confName: ctx.s.confName, ownFiles: ctx.ownFiles() })
    .filter((n) => sortsBefore(name, n))
    .slice(0, COPY_LOOKUP_MAX);
  for (const other of later) {
    const otherText = await ctx.readOrNull(other);
    if (otherText === null || textHoldsOurEntry(otherText, other)) continue;
    let made: string;
    try {
      made = ownedText(otherText, other, entry);
    } catch {
      continue;
    }
    if (made !== text) continue;
    ctx.fail(
      'config_shadowed',
      `${name} in ${ctx.netDir} is a copy of ${other} with our entry, as our owned config ` +
        `file under another name (an earlier --mesh-owned-cni-config-filename) would be; the runtime reads it, so a ` +
        `change of ${other} would never reach pods. It is not known as ours, so it is left as it is: remove it`,
    );
    return true;
  }
  return false;
}

/** Configs the runtime would load that sort before ours, but the named primary (--cni-conf-name). */
export async function validBefore(
  ctx: PlanContext,
  names: readonly string[],
  ownedName: string,
  primary: string,
): Promise<string[]> {
  const out: string[] = [];
  for (const name of [...names].sort(byteOrder)) {
    if (!sortsBefore(name, ownedName) || !isConfigFile(name) || name === primary || ctx.ownFiles().has(name)) continue;
    const text = await ctx.readOrNull(name);
    if (text !== null && libcniVerdict(text, name).ok) out.push(name);
  }
  return out;
}

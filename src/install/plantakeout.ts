// Planning, part two: our entry out of every config but the one the runtime reads (the primary
// given back byte for byte where it is still as we wrote it), and our own files that must go:
// the owned file of a mode switched off, ours under earlier names, copies of ours a rollback
// left at our names, with the records beside them (records.ts).

import path from 'node:path';
import { byteOrder, isConfigFile, libcniVerdict, withoutOurEntry, type JsonObject } from './cniconfig.ts';
import type { CachedFile } from './filecache.ts';
import { ownedText, ownNameShadows, sortsBefore } from './owned.ts';
import type { PlanContext } from './plancontext.ts';
import { textHoldsOurEntry } from './planprimary.ts';
import {
  originalRecord,
  ownedFromRecord,
  ownedOfRecord,
  parseOriginal,
  parseOwnedFrom,
  RECORD_FILE_MODE,
  sha256,
  formatOwnedFrom,
} from './records.ts';
import { UnsafeFileError } from './safefile.ts';

/** Whether a config holds an entry of ours, worked out once per content. */
function holdsOurEntry(file: CachedFile, name: string): boolean {
  // Files that do not parse are not ours to touch.
  return file.memo('ours', (t) => textHoldsOurEntry(t, name));
}

/** A refused file (a FIFO, a device, an oversized file) never held an entry of ours: null. */
const refusedAsNull = (e: unknown): null => {
  if (e instanceof UnsafeFileError) return null;
  throw e;
};

/** Our entry out of every config file in `names` but those in `keep`. */
export async function takeOutAllBut(
  ctx: PlanContext,
  names: readonly string[],
  keep: ReadonlySet<string | null>,
): Promise<void> {
  ctx.keepCached(names);
  const others = names.filter((n) => !keep.has(n) && isConfigFile(n));
  await ctx.warmCached(others);
  let kept: Promise<Set<string>> | undefined;
  const taken = new Set<string>();
  for (const name of others) {
    // Known to hold no entry of ours: no await, no I/O (thousands of files, pass after pass).
    const known = ctx.peekCached(name);
    if (known && !holdsOurEntry(known, name)) continue;
    // The very file a kept one reads (a primary linked to another config here, two links to one
    // file): our entry out of it would be out of the file the runtime reads. A file read under
    // two names is taken out of once: the plan cannot read back through the second name.
    kept ??= Promise.all([...keep].map((n) => (n === null ? null : ctx.realpath(n)))).then(
      (all) => new Set(all.filter((p): p is string => p !== null)),
    );
    const real = await ctx.realpath(name);
    if (real !== null && ((await kept).has(real) || taken.has(real))) continue;
    if (real !== null) taken.add(real);
    await takeOut(ctx, name);
  }
}

/**
 * Takes our entry out of one config file: back to the primary CNI's exact bytes (and a .conf
 * back from the .conflist we made) when the file is still as we wrote it, else by splicing.
 * Files that do not parse are not ours to touch.
 */
export async function takeOut(ctx: PlanContext, name: string): Promise<void> {
  // Most files hold no entry of ours, pass after pass: that is known from the cache.
  const cached = await ctx.readCached(name).catch(refusedAsNull);
  if (cached === null || !holdsOurEntry(cached, name)) return;
  // About to write: from what is there now, not from the cache.
  const text = await ctx.read(name).catch(refusedAsNull);
  if (text === null) return;
  let without: string | null;
  try {
    without = withoutOurEntry(text, name);
  } catch {
    return;
  }
  if (without === null) return;
  const st = await ctx.stat(name);
  const original = ctx.originals.get(name) ?? parseOriginal(await ctx.readRecord(originalRecord(name)), name, st);
  ctx.remember(name, null);
  ctx.remove(originalRecord(name));
  if (original && original.written === sha256(text)) {
    const back = original.name;
    const owner = { mode: original.mode, uid: original.uid, gid: original.gid };
    if (original.link !== undefined && original.name !== name) ctx.symlink(back, original.link, 'cni_config');
    // The .conf we made this conflist from: written in the net dir itself (a link found there
    // now is replaced, not followed). Only the file itself, edited in place, may be a link.
    else if (original.name !== name) ctx.write({ name: back, text: original.text, ...owner, report: 'cni_config' });
    else ctx.write({ name: back, text: original.text, through: text, ...owner, report: 'cni_config' });
    if (original.name !== name) ctx.remove(name, 'cni_config', true);
    return;
  }
  const rest = (JSON.parse(without) as { plugins: unknown[] }).plugins;
  // Nothing but our entry: a conflist of ours, not the primary CNI's.
  if (rest.length === 0) ctx.remove(name, 'cni_config', true);
  else
    ctx.write({
      name,
      text: without,
      through: text,
      mode: st.mode & 0o7777,
      uid: st.uid,
      gid: st.gid,
      report: 'cni_config',
    });
}

/**
 * Our owned file gone (a run without --mesh-owned-cni-config, uninstall). Only a file that
 * holds an entry of ours: a file of that name we never wrote is not ours to remove.
 */
export async function removeOwned(ctx: PlanContext): Promise<void> {
  const name = ctx.s.ownedName;
  const text = await ctx.readOrNull(name);
  if (text === null) return;
  let ours: boolean;
  try {
    ours = withoutOurEntry(text, name) !== null;
  } catch {
    return;
  }
  if (!ours) return;
  ctx.remove(name, 'cni_config');
  ctx.setOwnedFrom(null);
  ctx.remove(ownedFromRecord(name));
}

/** The primary the owned file of ours named `owned` was made from, as its record says (records.ts). */
export async function recordedFrom(ctx: PlanContext, owned: string): Promise<string | null> {
  return parseOwnedFrom(await ctx.readRecord(ownedFromRecord(owned)), owned);
}

/** Records that our owned file was made from `from`, for a restarted agent. */
export function rememberOwnedFrom(ctx: PlanContext, from: string): void {
  if (from === ctx.ownedFrom) return;
  ctx.setOwnedFrom(from);
  ctx.write({ name: ownedFromRecord(ctx.s.ownedName), text: formatOwnedFrom(from), mode: RECORD_FILE_MODE });
}

/**
 * Owned files of ours under another name (an earlier --mesh-owned-cni-config-filename): a
 * .conflist with the hidden record we keep beside ours, holding an entry of ours, a regular
 * file in our file's mode (no group or other bits). Known for good, whatever the primary does
 * since: never taken for the primary, removed once the entry is in place.
 */
export async function findEarlierOwned(ctx: PlanContext, names: readonly string[]): Promise<Set<string>> {
  const out = new Set<string>();
  const present = new Set(names);
  for (const record of names) {
    const name = ownedOfRecord(record);
    if (name === null || name === ctx.s.ownedName || path.extname(name) !== '.conflist' || !present.has(name)) continue;
    const st = await ctx.lstat(name);
    if (!st?.isFile || (st.mode & 0o077) !== 0) continue;
    const text = await ctx.readOrNull(name);
    if (text !== null && textHoldsOurEntry(text, name)) out.add(name);
  }
  return out;
}

/** Our owned files under earlier names gone, with their records: only once the entry is in the file the runtime reads. */
export function removeEarlierOwned(ctx: PlanContext): void {
  for (const name of ctx.earlierOwned) {
    ctx.remove(name, 'cni_config');
    ctx.remove(ownedFromRecord(name));
  }
  ctx.earlierOwned = new Set();
}

/**
 * A file at one of our own names sorting before `target` (the file holding our entry) that
 * the runtime loads, with no entry of ours (owned.ts ownNameShadows): config_shadowed. Left
 * out as a primary, so nothing else would say that the runtime reads it instead of ours.
 */
export async function failOwnNamesShadowing(
  ctx: PlanContext,
  names: readonly string[],
  target: string,
  entry: JsonObject,
): Promise<void> {
  const own = ctx.ownFiles();
  for (const name of [...names].sort(byteOrder)) {
    if (name === target || !own.has(name) || !isConfigFile(name) || !sortsBefore(name, target)) continue;
    // Gone since the listing (our own removeOwned), or not a regular file: nothing the runtime loads.
    const text = await ctx.readOrNull(name);
    if (text === null || !libcniVerdict(text, name).ok || textHoldsOurEntry(text, name)) continue;
    // A byte-exact copy of a config still there (a rollback copy of ours): removing it loses
    // nothing, and `target` holds our entry, so the runtime then reads that.
    if (await copyOfConfig(ctx, name, text, target, entry)) {
      ctx.remove(name, 'cni_config');
      ctx.remove(ownedFromRecord(name));
      continue;
    }
    ctx.fail('config_shadowed', ownNameShadows(name, target, ctx.netDir, await recordedFrom(ctx, name)));
  }
}

/**
 * Whether `text`, at our name `name` with no entry of ours, is a byte-exact copy of a config
 * still in the dir: the one its hidden record names (ours was made from it, then a version
 * without the owned file took our entry out), else `fallback`; as that config is, without our
 * entry, or as ours made from it without our entry. Removing or overwriting it loses nothing.
 */
export async function copyOfConfig(
  ctx: PlanContext,
  name: string,
  text: string,
  fallback: string | null,
  entry: JsonObject,
): Promise<boolean> {
  const from = [await recordedFrom(ctx, name), fallback].filter((n): n is string => n !== null && n !== name);
  for (const other of new Set(from)) {
    const otherText = await ctx.readOrNull(other);
    if (otherText === null) continue;
    const forms: (() => string | null)[] = [
      () => otherText,
      () => withoutOurEntry(otherText, other),
      () => withoutOurEntry(ownedText(withoutOurEntry(otherText, other) ?? otherText, other, entry), name),
    ];
    for (const form of forms) {
      try {
        if (form() === text) return true;
      } catch {
        // Not a config we can read that way: not a copy in that form.
      }
    }
  }
  return false;
}

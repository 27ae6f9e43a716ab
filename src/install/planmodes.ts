// Planning, part three: our entry where the runtime reads it, in each of the three modes:
// spliced into the primary (chained), our own file made from the primary (owned, owned.ts), or
// our own conflist alone (standalone, --chained-cni-plugin=false). Each returns the file the
// runtime reads with our entry, or null.

import { CniConfigError, otherForm, standaloneConfig, withOurEntry, type JsonObject } from './cniconfig.ts';
import { foreignOwned, planOwned, PRIMARY_GONE_GRACE_MS, shadowedBy, sortsBefore, type OwnedPlan } from './owned.ts';
import type { PlanContext } from './plancontext.ts';
import { failCopyOfOurs, findPrimary, passedOver, textHoldsOurEntry, validBefore } from './planprimary.ts';
import {
  copyOfConfig,
  failOwnNamesShadowing,
  recordedFrom,
  rememberOwnedFrom,
  removeEarlierOwned,
  removeOwned,
  takeOutAllBut,
} from './plantakeout.ts';
import { formatOriginal, originalFor, originalRecord, parseOriginal, RECORD_FILE_MODE } from './records.ts';
import { UnsafeFileError } from './safefile.ts';

/** Our conflist's mode in standalone mode. */
const CONFIG_MODE = 0o644;

/** Our entry spliced into the primary CNI's config (the default). */
export async function planChained(ctx: PlanContext, entry: JsonObject): Promise<string | null> {
  const names = await ctx.list();
  const found = await findPrimary(ctx, names);
  const primary = found?.name ?? null;
  if (found && found.text !== null && !found.said) await failCopyOfOurs(ctx, found.name, found.text, names);
  let primaryAfter: string | null = null;
  const confName = ctx.s.confName;
  if (found === null && ctx.skipped.length > 0) {
    // Maybe a file caught half-written: an error, retried on the backoff, said if it stays.
    ctx.fail(
      'primary_malformed',
      `waiting for a primary CNI config the runtime can load in ` + `${ctx.netDir}${passedOver(ctx)}`,
    );
  } else if (found === null) {
    ctx.notReady(
      confName
        ? `waiting for the primary CNI config ${confName}${otherForm(confName) ? ` (or ${otherForm(confName)})` : ''} ` +
            `in ${ctx.netDir}`
        : `waiting for a primary CNI config (.conf, .conflist or .json) in ${ctx.netDir}${passedOver(ctx)}`,
    );
  } else if (found.said) {
    // Said through fail(); the other files are still looked at below.
  } else if (found.text === null) {
    ctx.notReady(`primary CNI config ${ctx.path(found.name)} vanished while being read; retrying`);
  } else {
    try {
      primaryAfter = await spliceInto(ctx, found.name, found.text, entry);
    } catch (e) {
      if (!(e instanceof CniConfigError)) throw e;
      ctx.fail('primary_malformed', `${e.message} (in ${ctx.netDir}); leaving it untouched until it changes`);
    }
  }
  // Our entry belongs only in the file the runtime reads: take it out of every other one (the
  // old primary when a new file took first place).
  await takeOutAllBut(ctx, names, new Set([primary, primaryAfter, ...ctx.ownFiles()]));
  // Switched from --mesh-owned-cni-config: our file goes only now that the entry is in the
  // primary, so the runtime never reads a config without it.
  if (primaryAfter !== null && !ctx.s.owned) await removeOwned(ctx);
  if (primaryAfter !== null) removeEarlierOwned(ctx);
  if (primaryAfter !== null) await failOwnNamesShadowing(ctx, names, primaryAfter, entry);
  return primaryAfter;
}

/** Our entry into the primary `name` (text `text`); returns the file that then holds it. Throws CniConfigError. */
async function spliceInto(ctx: PlanContext, name: string, text: string, entry: JsonObject): Promise<string> {
  const rewrite = withOurEntry(text, name, entry);
  const after = rewrite?.fileName ?? name;
  if (!rewrite) return after;
  const st = await ctx.stat(name);
  const link = (await ctx.lstat(name))?.isSymbolicLink ? await ctx.readlink(name) : undefined;
  // A .conf made a .conflist is a new file; else the primary is edited where it is. The primary
  // CNI may rewrite its file while ours is being written: then what we computed is stale, and
  // putting it in place would undo their change.
  ctx.write({
    name: rewrite.fileName,
    text: rewrite.text,
    mode: st.mode & 0o7777,
    uid: st.uid,
    gid: st.gid,
    ...(rewrite.replaces ? {} : { through: text }),
    guard: { name, text },
    ifChanged: {
      notReady: `primary CNI config ${ctx.path(name)} changed while our entry was being added; doing it ` + `again`,
      primary: after,
    },
    report: 'cni_config',
    reportTarget: true,
  });
  const prior = ctx.originals.get(name) ?? parseOriginal(await ctx.readRecord(originalRecord(name)), name, st);
  const original = {
    ...originalFor(prior, name, text, st, rewrite.text),
    ...(rewrite.replaces && link !== undefined ? { link } : {}),
  };
  ctx.remember(rewrite.fileName, original);
  // A .conf given back from the .conflist we made needs its record on disk, kept up to date
  // with what we wrote (every restart with another entry rewrites the conflist).
  if (original.name !== rewrite.fileName) {
    ctx.write({ name: originalRecord(rewrite.fileName), text: formatOriginal(original), mode: RECORD_FILE_MODE });
  }
  // Recorded before the .conf goes, so no kill in between loses its bytes. The runtime reads
  // the .conf first while both exist: the conflist, then the removal.
  if (rewrite.replaces) ctx.remove(name, 'cni_config', true);
  return after;
}

/** Our own conflist alone (--chained-cni-plugin=false). */
export async function planStandalone(ctx: PlanContext, entry: JsonObject): Promise<string> {
  const name = ctx.s.standaloneName;
  const text = standaloneConfig(entry, name);
  if ((await ctx.readOrNull(name)) !== text) ctx.write({ name, text, mode: CONFIG_MODE, report: 'cni_config' });
  // ownFiles() holds our conflist in standalone mode.
  await takeOutAllBut(ctx, await ctx.list(), ctx.ownFiles());
  if (name !== ctx.s.ownedName) await removeOwned(ctx);
  removeEarlierOwned(ctx);
  return name;
}

/**
 * --mesh-owned-cni-config (owned.ts): our own file, the primary's network with our entry
 * last, sorting before the primary, which is never edited. The runtime reads ours; a primary
 * rewritten meanwhile leaves ours as it was, with our entry, until it is made again from the
 * new text.
 */
export async function planOwnedMode(ctx: PlanContext, entry: JsonObject): Promise<string | null> {
  const ownedName = ctx.s.ownedName;
  const netDir = ctx.netDir;
  const names = await ctx.list();
  const found = await findPrimary(ctx, names);
  let current: string | null;
  try {
    current = await ctx.read(ownedName);
  } catch (e) {
    if (!(e instanceof UnsafeFileError)) throw e;
    ctx.fail('file_refused', foreignOwned(ownedName, netDir, `is not a file we write (${e.message})`));
    return null;
  }
  // A rollback copy at our name (ours with our entry taken out by a version without this
  // mode): a byte-exact copy of a config still there, so overwriting it loses nothing.
  if (
    current !== null &&
    !textHoldsOurEntry(current, ownedName) &&
    (await copyOfConfig(ctx, ownedName, current, found?.name ?? null, entry))
  )
    current = null;
  const kept = current !== null ? ownedName : null;
  // A restarted agent: which primary ours was made from, as the run before recorded it.
  if (ctx.ownedFrom === null && current !== null) ctx.setOwnedFrom(await recordedFrom(ctx, ownedName));
  if (found?.said) return kept;
  if (found && found.text !== null && (await failCopyOfOurs(ctx, found.name, found.text, names))) return kept;
  if (found && sortsBefore(found.name, ownedName)) {
    // The runtime reads that file, not ours: fail closed, our entry goes into it as without
    // this mode; ours stays (with our entry) for when that file is gone. Ready once it is
    // in (the runtime reads our entry), with a note; whatever stops it is said by planChained.
    const plan = planOwned(
      { ownedName, primary: { name: found.name, text: '', mode: 0 }, current: null },
      entry,
      netDir,
    );
    ctx.skipped.length = 0;
    const into = await planChained(ctx, entry);
    if (plan.action === 'shadowed') ctx.steps.push({ kind: 'note', message: plan.note, evenIfChanged: true });
    return into;
  }
  // A file at our name that we did not write (no entry of ours: another program's, the
  // primary's own when the names are equal): never overwritten; uninstall leaves it too.
  if (current !== null && !textHoldsOurEntry(current, ownedName)) {
    ctx.fail('file_refused', foreignOwned(ownedName, netDir, undefined, await recordedFrom(ctx, ownedName)));
    return null;
  }
  if (holdOwned(ctx, found?.name ?? null, names, current !== null)) return ownedName;
  const primaryFile = found ? ctx.path(found.name) : '';
  const st = found && found.text !== null ? await ctx.statOrNull(found.name) : null;
  if (found && (found.text === null || st === null)) {
    ctx.notReady(`primary CNI config ${primaryFile} vanished while being read; retrying`);
    return kept;
  }
  // With --cni-conf-name, a config the runtime loads may sort before ours: not a primary, but
  // what the runtime reads instead of ours.
  const shadowed =
    found && ctx.s.confName !== ''
      ? shadowedBy(await validBefore(ctx, names, ownedName, found.name), ownedName, netDir)
      : null;
  if (shadowed) ctx.fail('config_shadowed', shadowed);
  const curMode = current !== null ? ((await ctx.statOrNull(ownedName))?.mode ?? 0) : 0;
  let plan: OwnedPlan;
  try {
    plan = planOwned(
      {
        ownedName,
        primary: found && st ? { name: found.name, text: found.text!, mode: st.mode } : null,
        current: current !== null ? { text: current, mode: curMode } : null,
        madeFrom: ctx.ownedFrom,
      },
      entry,
      netDir,
    );
  } catch (e) {
    if (!(e instanceof CniConfigError)) throw e;
    ctx.fail(
      'primary_malformed',
      `${e.message} (in ${netDir}); leaving it untouched until it ` +
        `changes${kept ? `, and our ${ownedName} as it is` : ''}`,
    );
    return kept;
  }
  for (const m of plan.notReady) ctx.notReady(m);
  // No primary: maybe one caught half-written (an error, retried on the backoff).
  if (found === null && ctx.skipped.length > 0)
    ctx.fail(
      'primary_malformed',
      `waiting for a primary CNI config the ` +
        `runtime can load in ${netDir}${passedOver(ctx)}${kept ? `; keeping our ${ownedName} as it is` : ''}`,
    );
  if (plan.action === 'wait' || plan.action === 'shadowed') {
    if (ctx.skipped.length === 0)
      ctx.notReady(
        `waiting for a primary CNI config (.conf, .conflist or .json) in ` + `${netDir} to make our ${ownedName} from`,
      );
    return null;
  }
  if (plan.action === 'write') {
    // The primary rewritten while ours was being made: ours would be stale; the runtime keeps
    // reading our previous version (with our entry) and the change's event runs again.
    const again =
      `primary CNI config ${primaryFile} changed while our ${ownedName} was being made from it; doing it ` + `again`;
    // Ours already holds our entry (a file at our name without one is refused above), so the
    // runtime still reads a network with mesh-cni: no reason to be not ready. The change's own
    // watch event brings the pass that makes ours again (a storm of rewrites made /readyz flap
    // otherwise). Without a file of ours yet, the runtime reads the primary.
    ctx.write({
      name: ownedName,
      text: plan.text,
      mode: plan.mode,
      guard: { name: found!.name, text: found!.text! },
      ifChanged: { ...(kept === null ? { notReady: again } : { debug: again }), primary: kept },
      report: 'cni_config',
    });
  }
  if (plan.from !== null) rememberOwnedFrom(ctx, plan.from);
  removeEarlierOwned(ctx);
  // Ours is in place with our entry: an entry anywhere else (the primary's, from a run without
  // this mode) goes, the primary given back byte for byte.
  await takeOutAllBut(ctx, await ctx.list(), ctx.ownFiles());
  await failOwnNamesShadowing(ctx, names, ownedName, entry);
  return ownedName;
}

/**
 * Whether to keep ours as it is (not ready) rather than make it from `found`, a file sorting
 * after the primary ours was made from: that one still exists but does not load now (caught
 * half-written), or has just vanished (a primary CNI that deletes, then writes). Following
 * the next file would give pods another network, and report ready. A file sorting before it
 * is what the runtime reads, so it is followed; one gone for PRIMARY_GONE_GRACE_MS is too.
 */
function holdOwned(ctx: PlanContext, found: string | null, names: readonly string[], haveOurs: boolean): boolean {
  const from = ctx.ownedFrom;
  const ownedName = ctx.s.ownedName;
  if (from !== null && !names.includes(from)) ctx.setGoneSince(ctx.ownedFromGoneSince ?? ctx.now);
  else ctx.setGoneSince(null);
  if (from === null || found === null || !haveOurs || found === from || sortsBefore(found, from)) return false;
  const bad = ctx.skipped.find((k) => k.file === from);
  if (bad) {
    // As a half-written primary without --mesh-owned-cni-config: an error said if it stays, retried.
    ctx.fail(
      'primary_malformed',
      `the primary CNI config ${from} our ${ownedName} was made from cannot be loaded ` +
        `now (${bad.reason}); keeping ours as it is, not following ${found}, which sorts after it, until ${from} loads ` +
        `again or is gone`,
    );
    return true;
  }
  if (names.includes(from)) return false;
  const left = PRIMARY_GONE_GRACE_MS - (ctx.now - (ctx.ownedFromGoneSince ?? ctx.now));
  if (left <= 0) return false;
  ctx.notReady(
    `the primary CNI config ${from} our ${ownedName} was made from is gone from ${ctx.netDir}; keeping ` +
      `ours as it is, and following ${found}, which sorts after it, only if ${from} is not back within ` +
      `${PRIMARY_GONE_GRACE_MS} ms`,
  );
  return true;
}

// The planner: given the net dir (a listing and file texts, through a NetDirView), our plugin
// entry and what the agent remembers from earlier passes, which files to write and remove and
// what to report, as a list of steps (plancontext.ts) that apply.ts carries out in order. It
// writes nothing: table-tested (test/node/install-plan.test.ts) with listings and texts alone.
//
//   planPrelude   at a pass's start: our owned files under earlier names
//   planConfig    our entry where the runtime reads it (planmodes.ts), and out of every other file
//   planCleanup   uninstall: our entry out of every config, our files gone
//
// Level-triggered: each pass plans from what is there now, so a missed event costs one period.

import { isConfigFile, type JsonObject } from './cniconfig.ts';
import type { PlanContext, Skipped, Step } from './plancontext.ts';
import { planChained, planOwnedMode, planStandalone } from './planmodes.ts';
import { findEarlierOwned, removeEarlierOwned, removeOwned, takeOut } from './plantakeout.ts';
import { isOriginalRecord } from './records.ts';

export interface Plan {
  readonly steps: readonly Step[];
  /** The file the runtime reads with our entry once the steps are done; null if none. */
  readonly primary: string | null;
  /** Config files passed over for the primary because the runtime would not load them either. */
  readonly skipped: readonly Skipped[];
  /** Planning stopped on this (a read that failed): the steps before it still run, then it is said. */
  readonly error?: Error;
}

/**
 * At a pass's start: finds our owned files under earlier names (ctx.earlierOwned). The
 * orchconfig's name is not weighed against the primary's: the runtime reads only names ending
 * .conf, .conflist or .json (libcni's ConfFiles, as containerd and CRI-O call it), which the
 * orchconfig's may not (settings.ts), so it is never taken for a config wherever it sorts.
 */
export async function planPrelude(ctx: PlanContext): Promise<void> {
  const names = await ctx.list().catch(() => null);
  ctx.earlierOwned = await findEarlierOwned(ctx, names ?? []);
}

/** Our entry in the file the runtime reads, in the mode the settings say, and out of the others. */
export async function planConfig(ctx: PlanContext, entry: JsonObject): Promise<Plan> {
  try {
    const primary = !ctx.s.chained
      ? await planStandalone(ctx, entry)
      : ctx.s.owned
        ? await planOwnedMode(ctx, entry)
        : await planChained(ctx, entry);
    return { steps: ctx.steps, primary, skipped: ctx.skipped };
  } catch (e) {
    return { steps: ctx.steps, primary: null, skipped: ctx.skipped, error: e as Error };
  }
}

/**
 * Uninstall: our entry out of every config, our conflist and orchconfig gone. Each group of
 * steps stands alone: one that fails (a directory planted at a record's name, a file we may not
 * write) must not leave the rest of the uninstall undone.
 */
export async function planCleanup(ctx: PlanContext): Promise<Plan> {
  const s = ctx.s;
  const group = async (what: string, plan: () => Promise<void> | void) => {
    ctx.steps.push({ kind: 'group', what });
    try {
      await plan();
    } catch (e) {
      ctx.steps.push({ kind: 'groupFailed', what, message: (e as Error).message });
    }
  };
  const names = await ctx.list().catch(() => [] as string[]);
  // Our owned file first: taking the entry out of it would leave a copy of the primary. So are
  // ours under earlier names, known by their records.
  const ownedApart = s.chained || s.standaloneName !== s.ownedName;
  if (ownedApart) await group(`removing our ${s.ownedName}`, () => removeOwned(ctx));
  await group('removing ours under earlier names', async () => {
    ctx.earlierOwned = await findEarlierOwned(ctx, names);
    removeEarlierOwned(ctx);
  });
  // A file read under two names (links to it) is taken out of once: the plan cannot read back
  // through the second name what the first one's step will have written.
  const taken = new Set<string>();
  for (const name of names) {
    if (!isConfigFile(name)) continue;
    if (name === s.ownedName && (s.chained || s.standaloneName !== name)) continue;
    if (!s.chained && name === s.standaloneName) await group(`removing ${name}`, () => ctx.remove(name, 'cni_config'));
    else {
      await group(`taking our entry out of ${name}`, async () => {
        const real = await ctx.realpath(name);
        if (real !== null && taken.has(real)) return;
        if (real !== null) taken.add(real);
        await takeOut(ctx, name);
      });
    }
  }
  // Records of files no longer as we wrote them are no use to anyone now.
  for (const name of names) if (isOriginalRecord(name)) await group(`removing ${name}`, () => ctx.remove(name));
  await group(`removing ${s.orchcfgName}`, () => ctx.remove(s.orchcfgName, 'orchconfig'));
  return { steps: ctx.steps, primary: null, skipped: ctx.skipped };
}

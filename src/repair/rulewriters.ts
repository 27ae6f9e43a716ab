// In-place repair's writing of one pod's rules (docs/repair.md "Repair in place"), with the
// backend the node uses, as the plugin's ADD writes them (docs/nftables.md "Switching backends"):
// iptables, read first and restored only where ours differ, then our `mesh_pod` table out if an
// ADD under native nftables left one; or native nftables, the pod's plans rendered as the one
// table and written whole in one transaction only where it differs, then our iptables rules out
// if an ADD under iptables left any. The backend being switched to is written first and the old
// one removed after: a failure part way leaves the pod with one whole set of our rules (the old
// or the new, or both), never a part of one. The TPROXY policy routing is the same in both.
//
// Nothing here starts a process: the runner does (the agent's netns by fd, src/podnetns/).
//
// Ambient's in-pod redirection to ztunnel is built and written elsewhere (src/ambient/podrules.ts,
// podbackend.ts). This one writes a sidecar pod's rules (sidecarPlan, the plugin's) for repair.

import {
  ensureRules,
  ipBatch,
  removeRules,
  type Flavour,
  type NetnsRunner,
} from '../../cni-plugin/redirect/iptables.ts';
import type { Plan } from '../../cni-plugin/redirect/model.ts';
import type { Family } from '../../cni-plugin/redirect/net.ts';
import { ensureTable, NftError, removeTable } from '../../cni-plugin/redirect/nft.ts';
import { NftRenderError, POD_TABLE, renderNftBody } from '../../cni-plugin/redirect/nftrender.ts';
import { ipBatchLines } from '../../cni-plugin/redirect/restoredoc.ts';
import { buildFamilyRules, sidecarPlan } from '../../cni-plugin/redirect/rules.ts';
import type { RedirectSpec } from '../../cni-plugin/redirect/spec.ts';

/** Writing the rules failed; `final`: no later attempt can do better (a person must act). */
export class RulesFailed extends Error {
  readonly final: boolean;
  constructor(message: string, final: boolean) {
    super(message);
    this.final = final;
  }
}

/** Whether a failure of nft can pass by itself: a missing nft, one without JSON, a table not ours cannot. */
const nftFinal = (e: unknown): boolean => e instanceof NftError && e.permanent;

/** nft not on the node (the runner could not start it): no table of ours can be in any netns. */
const nftMissing = (e: unknown): boolean => nftFinal(e) && /^cannot run nft /.test((e as Error).message);

/** `what` failed because of `e`: the message says which step, and keeps whether a retry can help. */
function failedAt(what: string, e: unknown): RulesFailed {
  return new RulesFailed(`${what}: ${(e as Error).message}`, e instanceof RulesFailed ? e.final : nftFinal(e));
}

/**
 * iptables: each family's rules where they differ, in the flavour rules of ours already are in,
 * else the node's; then our nftables table, if one is there. Returns what was done, for the detail.
 */
export async function writeIptables(
  runner: NetnsRunner,
  spec: RedirectSpec,
  families: readonly Family[],
  hostFlavour: () => Promise<Flavour>,
): Promise<string[]> {
  const done: string[] = [];
  try {
    const flavour = await flavourFor(runner, families[0]!, hostFlavour);
    for (const fam of families) {
      const r = buildFamilyRules(spec, fam);
      const how = await ensureRules(runner, flavour.flavour, fam, r.restore);
      await ipBatch(runner, fam, r.ipBatch);
      done.push(`IPv${fam} ${how}`);
    }
    done.push(`${flavour.flavour} (${flavour.why})`);
  } catch (e) {
    throw failedAt('writing the iptables rules', e);
  }
  let gone: Awaited<ReturnType<typeof removeTable>>;
  try {
    gone = await removeTable(runner, POD_TABLE);
  } catch (e) {
    // Best effort, as the plugin's ADD: on a node that redirects with iptables, an nft that cannot
    // run (its version skew: docs/plugin.md "The image's nft and the node's") must not fail every
    // repair, and a table of ours left from nftables only redirects into the proxy, never around it.
    if (!nftMissing(e)) done.push(`could not check for a table of ours left from nftables (${(e as Error).message})`);
    return done;
  }
  if (gone === 'removed') done.push(`our nftables table inet ${POD_TABLE} removed (this node uses iptables)`);
  if (gone === 'foreign') done.push(`a table inet ${POD_TABLE} that is not mesh-cni's left alone`);
  return done;
}

/**
 * Native nftables: the pod's plans (every family) rendered as table inet mesh_pod, written only
 * when it differs, in one transaction (all of it or none); the policy routing; then our iptables
 * rules out, both families and flavours. A plan nft cannot say exactly is refused before anything
 * is touched, for good: the pod's annotations ask for what only iptables says.
 */
export async function writeNftables(
  runner: NetnsRunner,
  spec: RedirectSpec,
  families: readonly Family[],
): Promise<string[]> {
  let plans: Plan[];
  let body: string;
  try {
    plans = families.map((fam) => sidecarPlan(spec, fam));
    body = renderNftBody(plans);
  } catch (e) {
    if (!(e instanceof NftRenderError)) throw e;
    throw new RulesFailed(
      `this node redirects with native nftables, and the pod's rules cannot be written as an nftables ` +
        `table (${e.message}); nothing was written in its netns`,
      true,
    );
  }
  let how: string;
  try {
    how = await ensureTable(runner, POD_TABLE, body);
    for (const p of plans) await ipBatch(runner, p.family, ipBatchLines(p));
  } catch (e) {
    throw failedAt(`writing the nftables table inet ${POD_TABLE}`, e);
  }
  const done = [`nftables table inet ${POD_TABLE} ${how} (${families.map((f) => `IPv${f}`).join(', ')})`];
  try {
    done.push(...(await removeIptables(runner)));
  } catch (e) {
    throw failedAt(
      `the nftables table inet ${POD_TABLE} is written, but our iptables rules from before this ` +
        'node used nftables could not be removed',
      e,
    );
  }
  return done;
}

/** `iptables-save` of `flavour` and `fam` holds a chain of ours; false when it cannot run (no such iptables). */
async function holdsOurs(runner: NetnsRunner, flavour: Flavour, fam: Family): Promise<boolean> {
  const r = await runner.run([`${fam === 6 ? 'ip6tables' : 'iptables'}-${flavour}-save`], { stdout: true });
  return r.error === null && r.code === 0 && /^:MESH_/m.test(r.stdout);
}

/** Our iptables chains and jumps out, wherever they are (both families, both flavours). */
async function removeIptables(runner: NetnsRunner): Promise<string[]> {
  const where = (['legacy', 'nft'] as const).flatMap((flavour) => ([4, 6] as const).map((fam) => ({ flavour, fam })));
  const ours = await Promise.all(where.map((w) => holdsOurs(runner, w.flavour, w.fam)));
  const done: string[] = [];
  for (const [i, { flavour, fam }] of where.entries()) {
    if (ours[i] && (await removeRules(runner, flavour, fam)))
      done.push(`our iptables rules removed (IPv${fam}, ${flavour}; this node uses nftables)`);
  }
  return done;
}

/**
 * legacy or nft for this netns: where rules of ours already are (a partial ADD, an earlier
 * repair), that flavour, so they are replaced and not doubled by a copy in the other; else the
 * node's, as the plugin picks it, so the pod ends up as the plugin would have left it.
 */
async function flavourFor(
  runner: NetnsRunner,
  fam: Family,
  hostFlavour: () => Promise<Flavour>,
): Promise<{ flavour: Flavour; why: string }> {
  const [legacy, nft] = await Promise.all((['legacy', 'nft'] as const).map((f) => holdsOurs(runner, f, fam)));
  if (nft) return { flavour: 'nft', why: 'rules of ours are in nf_tables' };
  if (legacy) return { flavour: 'legacy', why: 'rules of ours are in legacy iptables' };
  return { flavour: await hostFlavour(), why: "the node's flavour" };
}

// Ambient's in-pod rules by backend, in one shape the dataplane calls (InpodBackend): iptables
// (podrules.ts, the default) or native nftables, where the pod's plans (inpodPlan, the one rule
// model) are rendered as one inet table of ours (cni-plugin/redirect/nftrender.ts) and written in
// one nft transaction (cni-plugin/redirect/nft.ts), then the policy routing with `ip -batch`.
// It holds the interface and both backends (iptablesInpod wraps podrules.ts's applier): the in-pod
// counterpart of hostbackend.ts, the node's.
//
// A pod netns keeps ours in one backend only (docs/ambient.md "Native nftables: the choice,
// kubelet's uid and switching"): writing the
// chosen one takes out the other's rules if they are there, after the new ones are in (while both
// are there a connection's first NAT holds and the marks they set are the same, so the pod is never
// unredirected in between); a removal takes out both, and the policy routing they share.

import { ipBatch, removeRules } from '../../cni-plugin/redirect/iptables.ts';
import { applyTable, NftError, readTable, removeTable } from '../../cni-plugin/redirect/nft.ts';
import { baseChainName, chainName, renderNftBody } from '../../cni-plugin/redirect/nftrender.ts';
import { ipBatchLines } from '../../cni-plugin/redirect/restoredoc.ts';
import {
  applyInpod,
  CHAIN_OUTPUT,
  CHAIN_PRERT,
  inpodPlan,
  loHasIPv6,
  netnsRunner,
  redirectsToZtunnel,
  type Family,
  type Flavour,
  type InpodOptions,
  type Runner,
} from './podrules.ts';

/** Ambient's table in a pod netns: not the sidecar's mesh_pod, so neither removes the other's. */
export const AMBIENT_POD_TABLE = 'mesh_ambient_pod';

const IN_POD = "in the pod's netns";

export interface InpodBackend {
  readonly kind: 'iptables' | 'nftables';
  /** The pod's redirection to ztunnel, whatever of ours is there (idempotent). */
  apply(run: Runner, families: readonly Family[], opts: InpodOptions): Promise<unknown>;
  /** Everything of ours out: both backends' rules, and the policy routing. */
  remove(run: Runner, families: readonly Family[]): Promise<void>;
  /** Whether ours in this backend redirect the pod to ztunnel in every family. */
  redirects(run: Runner, families: readonly Family[]): Promise<boolean>;
}

/** The no-nft answer of a node that has no nft: nothing of ours can be in nftables there. */
const noNft = (e: unknown): boolean => e instanceof NftError && e.permanent && /^cannot run nft /.test(e.message);

/** Our nftables table out; absent (or no nft on the node) is fine, a namesake not ours is left. */
async function removeNftTable(run: Runner): Promise<void> {
  try {
    await removeTable(netnsRunner(run, IN_POD), AMBIENT_POD_TABLE);
  } catch (e) {
    if (!noNft(e)) throw e;
  }
}

/**
 * Our iptables chains and hooks out (not the routing). `lenient`: the other backend's, where a
 * node whose iptables flavour cannot be found has none of ours; for iptables' own, that fails.
 */
async function removeIptablesRules(
  run: Runner,
  flavour: () => Promise<Flavour>,
  families: readonly Family[],
  lenient: boolean,
): Promise<void> {
  let f: Flavour;
  try {
    f = await flavour();
  } catch (e) {
    if (lenient) return;
    throw e;
  }
  for (const fam of families) await removeRules(netnsRunner(run, IN_POD), f, fam);
}

async function removeRouting(run: Runner, families: readonly Family[]): Promise<void> {
  const opts: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
  for (const f of families) await ipBatch(netnsRunner(run, IN_POD), f, ipBatchLines(inpodPlan(f, opts), 'del'), 'del');
}

async function removeBoth(
  run: Runner,
  flavour: () => Promise<Flavour>,
  families: readonly Family[],
  iptablesLenient: boolean,
): Promise<void> {
  await removeIptablesRules(run, flavour, families, iptablesLenient);
  await removeNftTable(run);
  await removeRouting(run, families);
}

/** The pod's table body for `families`; throws NftRenderError for a plan nft cannot say exactly. */
export const inpodTableBody = (families: readonly Family[], opts: InpodOptions): string =>
  renderNftBody(families.map((f) => inpodPlan(f, opts)));

export function iptablesInpod(flavour: () => Promise<Flavour>): InpodBackend {
  return {
    kind: 'iptables',
    async apply(run, families, opts) {
      const r = await applyInpod(run, await flavour(), families, opts);
      await removeNftTable(run);
      return r;
    },
    remove: (run, families) => removeBoth(run, flavour, families, false),
    async redirects(run, families) {
      return redirectsToZtunnel(run, await flavour(), families);
    },
  };
}

/** `flavour`: the node's iptables, to take out our iptables rules a pod may still have. */
export function nftInpod(flavour: () => Promise<Flavour>): InpodBackend {
  return {
    kind: 'nftables',
    async apply(run, families, opts) {
      // Rendered before anything is touched: a plan nft cannot say fails with nothing done.
      const body = inpodTableBody(families, opts);
      const runner = netnsRunner(run, IN_POD);
      const how = await applyTable(runner, AMBIENT_POD_TABLE, body);
      for (const f of families) {
        const optional = f === 4 || (await loHasIPv6(run));
        await ipBatch(runner, f, ipBatchLines(inpodPlan(f, opts), 'add', optional), 'add');
      }
      await removeIptablesRules(run, flavour, families, true);
      return how;
    },
    remove: (run, families) => removeBoth(run, flavour, families, true),
    async redirects(run, families) {
      const have = await readTable(netnsRunner(run, IN_POD), AMBIENT_POD_TABLE);
      if (have === null || have.digest === null) return false;
      const jumps = (base: string, to: string) =>
        (have.chains.get(base) ?? []).some((r) => JSON.stringify(r.expr).includes(`"target":"${to}"`));
      for (const f of families) {
        const out = chainName('nat', f, CHAIN_OUTPUT);
        if (!jumps(baseChainName('nat', 'PREROUTING'), chainName('nat', f, CHAIN_PRERT))) return false;
        if (!jumps(baseChainName('nat', 'OUTPUT'), out)) return false;
        if ((have.chains.get(out) ?? []).length === 0) return false;
      }
      return true;
    },
  };
}

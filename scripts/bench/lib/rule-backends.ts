// The rule backends the rules bench compares (scripts/bench/rules.bench.ts), one small entry
// each: how our code programs a pod's rules into its netns per mode, the floor (the backend's own
// loader alone), and what in the plugin's config picks the backend for a whole ADD. A mode a
// backend cannot do is absent from its entry; the bench prints "-" there.
//
// The floor's input is what `program` itself fed the loader (the bench records every loader call
// once per mode, backend and families, in a scratch netns): "the same document" by construction,
// whichever renderer or reconcile wrote it, for iptables (one restore per family) and native nft
// (one transaction for every family) alike. Native nft keeps a hand-written REDIRECT ruleset
// (nft-floor.ts) as a check row: what the renderer's table costs against one written by hand.

import type { V1Pod } from '@kubernetes/client-node';
import {
  applyRules,
  ipBatch,
  type Flavour,
  type NetnsRunner,
  type RunResult,
} from '../../../cni-plugin/redirect/iptables.ts';
import type { Family, Plan } from '../../../cni-plugin/redirect/model.ts';
import { applyTable } from '../../../cni-plugin/redirect/nft.ts';
import { POD_TABLE, renderNftBody } from '../../../cni-plugin/redirect/nftrender.ts';
import { ipBatchLines } from '../../../cni-plugin/redirect/restoredoc.ts';
import { buildFamilyRules, sidecarPlan } from '../../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../../cni-plugin/redirect/spec.ts';
import { iptablesInpod, nftInpod, type InpodBackend } from '../../../src/ambient/podbackend.ts';
import { podOptions } from '../../../src/ambient/podrules.ts';
import { meshPod } from '../../../test/helpers/plugin.ts';
import { SIDECAR_REDIRECT_NFT } from './nft-floor.ts';

export const MODES = ['sidecar REDIRECT', 'sidecar TPROXY', 'ambient in-pod'] as const;
export type Mode = (typeof MODES)[number];
export const SIDECAR_MODES: readonly Mode[] = ['sidecar REDIRECT', 'sidecar TPROXY'];

/** The pods of the plugin tests (test/helpers/plugin.ts meshPod), one shape per mode. */
export function podFor(mode: Mode, name: string): V1Pod {
  if (mode === 'sidecar TPROXY') return meshPod('bench', name, { 'sidecar.mesh.io/interceptionMode': 'TPROXY' });
  return meshPod('bench', name);
}

/** Runs argv (a program on PATH) inside the pod's netns; the bench measures each call. */
export type Exec = (argv: readonly string[], input?: string) => Promise<RunResult>;
/** One loader call a program made: the floor runs exactly these again, alone. */
export interface Fed {
  readonly argv: readonly string[];
  readonly input: string;
}
/**
 * `fed`: what this backend's program fed its loader for this mode and families ([] when it has
 * no program); `families`: the pod's, [4] or [4, 6].
 */
export type Step = (exec: Exec, pod: V1Pod, fed: readonly Fed[], families: readonly Family[]) => Promise<void>;

export interface Backend {
  readonly name: string;
  /** Our code programming the pod's rules into a fresh netns, as the plugin or agent does. */
  readonly program: Partial<Record<Mode, Step>>;
  /** The program calls whose input is the document (recorded for the floor). */
  readonly loader: (argv: readonly string[]) => boolean;
  /** The loader alone, on the same ruleset: what `program` cannot go below. */
  readonly floor: Partial<Record<Mode, Step>>;
  /** A second floor, for comparison only: its label and step. */
  readonly check?: { readonly mode: Mode; readonly label: string; readonly step: Step };
  /** What programming and the floor are, for the table's legend. */
  readonly legend: string;
  /** The plugin config that picks this backend for a whole ADD; absent: the plugin has no way yet. */
  readonly pluginConf?: Readonly<Record<string, unknown>>;
}

export const runnerOf = (exec: Exec): NetnsRunner => ({
  where: 'in the bench netns',
  run: (argv, o) => exec(argv, o.input ?? undefined),
});

async function ok(what: string, r: Promise<RunResult>): Promise<void> {
  const { code, stderr, error } = await r;
  if (error !== null || code !== 0) throw new Error(`${what} failed (exit ${code}): ${(error ?? stderr).trim()}`);
}

/** Every loader call the program made, again, in order, alone. */
const loaderAlone: Step = async (exec, _pod, fed) => {
  for (const f of fed) await ok(f.argv.join(' '), exec(f.argv, f.input));
};

/** Ambient's enrolment of a pod by `backend` (src/ambient/podbackend.ts), as the dataplane calls it. */
const inpod =
  (backend: InpodBackend): Step =>
  (exec, pod, _fed, families) =>
    backend
      .apply((argv, o) => exec(argv, o?.input), families, podOptions(pod.metadata?.annotations ?? {}, false))
      .then(() => undefined);

function iptables(flavour: Flavour, name: string): Backend {
  const restores = [`iptables-${flavour}-restore`, `ip6tables-${flavour}-restore`];
  // cni-plugin/plugin.ts's ADD: per family the document, then TPROXY's policy routing; two
  // families side by side, as the plugin runs them.
  const sidecar: Step = async (exec, pod, _fed, families) => {
    await Promise.all(
      families.map(async (fam) => {
        const r = buildFamilyRules(specForPod(pod), fam);
        await applyRules(runnerOf(exec), flavour, fam, r.restore);
        await ipBatch(runnerOf(exec), fam, r.ipBatch);
      }),
    );
  };
  return {
    name,
    program: {
      'sidecar REDIRECT': sidecar,
      'sidecar TPROXY': sidecar,
      // src/ambient/dataplane.ts's enrolment: the policy routing, read and restore ours, then
      // our nft table out if a native enrolment left one.
      'ambient in-pod': inpod(iptablesInpod(() => Promise.resolve(flavour))),
    },
    loader: (argv) => restores.includes(argv[0]!),
    floor: { 'sidecar REDIRECT': loaderAlone, 'sidecar TPROXY': loaderAlone, 'ambient in-pod': loaderAlone },
    legend: `ours: cni-plugin/redirect (sidecar), src/ambient/podbackend.ts iptablesInpod (ambient); floor: ip(6)tables-${flavour}-restore --noflush of each document ours restored`,
    pluginConf: { iptables_flavour: flavour },
  };
}

/**
 * Native nft, as the plugin's ADD writes it (cni-plugin/netns/nftpod.ts applyPodTable): every
 * family's plan rendered as one inet table (nftrender.ts), written in one transaction (nft.ts
 * applyTable), then each family's policy routing with `ip -batch`.
 */
async function nativeTable(exec: Exec, plans: readonly Plan[]): Promise<void> {
  const runner = runnerOf(exec);
  await applyTable(runner, POD_TABLE, renderNftBody(plans), true);
  for (const p of plans) await ipBatch(runner, p.family, ipBatchLines(p));
}

/** The plugin's native ADD, either sidecar mode (cni-plugin/plugin.ts addNative, its rules). */
const sidecarNative: Step = (exec, pod, _fed, families) =>
  nativeTable(
    exec,
    families.map((f) => sidecarPlan(specForPod(pod), f)),
  );

const native: Backend = {
  name: 'native nft',
  program: {
    'sidecar REDIRECT': sidecarNative,
    'sidecar TPROXY': sidecarNative,
    // src/ambient/podbackend.ts's enrolment: the table, the policy routing, then our iptables rules
    // out if an iptables enrolment left any (read with the node's flavour: the nft shim here).
    'ambient in-pod': inpod(nftInpod(() => Promise.resolve('nft'))),
  },
  loader: (argv) => argv[0] === 'nft' && argv.includes('-f'),
  floor: { 'sidecar REDIRECT': loaderAlone, 'sidecar TPROXY': loaderAlone, 'ambient in-pod': loaderAlone },
  check: {
    mode: 'sidecar REDIRECT',
    label: 'nft -f of a hand-written IPv4 REDIRECT ruleset, no owner set (lib/nft-floor.ts)',
    step: (exec) => ok('nft -f', exec(['nft', '-f', '-'], SIDECAR_REDIRECT_NFT)),
  },
  legend:
    'ours: nftrender.ts + nft.ts applyTable (one inet table, every family) + ip -batch per family (sidecar), src/ambient/podbackend.ts nftInpod (ambient); floor: nft -f of the transaction ours ran',
  // What the agent writes into our entry when it chose nftables (src/install/template.ts); the
  // iptables flavour stays `auto`, detected once and cached, as on a node.
  pluginConf: { native_nftables: true },
};

export const BACKENDS: readonly Backend[] = [
  iptables('legacy', 'iptables legacy'),
  iptables('nft', 'iptables nft shim'),
  native,
];

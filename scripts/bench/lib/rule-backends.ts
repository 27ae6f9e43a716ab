// The rule backends the rules bench compares (scripts/bench/rules.bench.ts), one small entry
// each: how our code programs a pod's rules into its netns per mode, the floor (the backend's own
// loader alone), and what in the plugin's config picks the backend for a whole ADD. A mode a
// backend cannot do yet is absent from its entry; the bench prints "-" there.
//
// The floor's input is what `program` itself fed the loader (the bench records it once per mode
// and backend, in a scratch netns): "the same document" by construction, whichever renderer or
// reconcile wrote it. The native floor is the exception until a native renderer exists: a
// hand-written equivalent ruleset (nft-floor.ts).

import type { V1Pod } from '@kubernetes/client-node';
import {
  applyRules,
  ipBatch,
  type Flavour,
  type NetnsRunner,
  type RunResult,
} from '../../../cni-plugin/redirect/iptables.ts';
import { applyTable } from '../../../cni-plugin/redirect/nft.ts';
import { buildFamilyRules } from '../../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../../cni-plugin/redirect/spec.ts';
import { applyInpod, podOptions } from '../../../src/ambient/podrules.ts';
import { meshPod } from '../../../test/helpers/plugin.ts';
import { NFT_FLOOR_TABLE, SIDECAR_REDIRECT_NFT, SIDECAR_REDIRECT_NFT_BODY } from './nft-floor.ts';

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
/** `fed`: what this backend's program fed its loader for this mode ('' when it has no program). */
export type Step = (exec: Exec, pod: V1Pod, fed: string) => Promise<void>;

export interface Backend {
  readonly name: string;
  /** Our code programming the pod's IPv4 rules into a fresh netns, as the plugin or agent does. */
  readonly program: Partial<Record<Mode, Step>>;
  /** The program call whose input is the document (recorded for the floor). */
  readonly loader: (argv: readonly string[]) => boolean;
  /** The loader alone, on the same (or an equivalent) ruleset: what `program` cannot go below. */
  readonly floor: Partial<Record<Mode, Step>>;
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

function iptables(flavour: Flavour, name: string): Backend {
  const restore = `iptables-${flavour}-restore`;
  const restoreAlone: Step = (exec, _pod, fed) => ok(restore, exec([restore, '--noflush', '-w', '5'], fed));
  // cni-plugin/plugin.ts's ADD for one family: the document, then TPROXY's policy routing.
  const sidecar: Step = async (exec, pod) => {
    const r = buildFamilyRules(specForPod(pod), 4);
    await applyRules(runnerOf(exec), flavour, 4, r.restore);
    await ipBatch(runnerOf(exec), 4, r.ipBatch);
  };
  return {
    name,
    program: {
      'sidecar REDIRECT': sidecar,
      'sidecar TPROXY': sidecar,
      // src/ambient/dataplane.ts's enrolment: the policy routing, then read and restore ours.
      'ambient in-pod': (exec, pod) =>
        applyInpod(
          (argv, o) => exec(argv, o?.input),
          flavour,
          [4],
          podOptions(pod.metadata?.annotations ?? {}, false),
        ).then(() => undefined),
    },
    loader: (argv) => argv[0] === restore,
    floor: { 'sidecar REDIRECT': restoreAlone, 'sidecar TPROXY': restoreAlone, 'ambient in-pod': restoreAlone },
    legend: `ours: cni-plugin/redirect (sidecar), src/ambient/podrules.ts (ambient); floor: ${restore} --noflush of the document ours restored`,
    pluginConf: { iptables_flavour: flavour },
  };
}

export const BACKENDS: readonly Backend[] = [
  iptables('legacy', 'iptables legacy'),
  iptables('nft', 'iptables nft shim'),
  {
    name: 'native nft',
    // No native renderer yet: ours is the native applier (nft.ts applyTable: owner set, body
    // checks, one transaction) on the hand-written body. When the renderer is in the tree, each
    // mode's program renders the pod's plan and applies it, and the floor becomes `nft -f` of
    // what was fed (as for iptables); once the plugin's ADD honours it, pluginConf is
    // { native_nftables: true } (the key the agent writes into our entry).
    program: {
      'sidecar REDIRECT': (exec) =>
        applyTable(runnerOf(exec), NFT_FLOOR_TABLE, SIDECAR_REDIRECT_NFT_BODY).then(() => undefined),
    },
    loader: (argv) => argv[0] === 'nft' && argv.includes('-f'),
    floor: {
      'sidecar REDIRECT': (exec) => ok('nft -f', exec(['nft', '-f', '-'], SIDECAR_REDIRECT_NFT)),
    },
    legend: `ours: nft.ts applyTable of a hand-written body (no renderer yet); floor: nft -f of that body as a plain table (lib/nft-floor.ts), REDIRECT only`,
  },
];

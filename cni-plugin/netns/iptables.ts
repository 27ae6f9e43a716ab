// iptables in a pod netns for the plugin: pick the flavour the host uses, restore a document in
// one call per family, read it back. Everything runs through `nsenter --net=<CNI_NETNS>` (the
// plugin itself stays in the host netns, where the runtime runs it). The work itself is
// redirect/iptables.ts, runner-generic, which the agent's in-place repair runs by fd instead.
//
// Flavour detection follows Kubernetes' iptables-wrapper, read-only in the host netns: kubelet's
// KUBE-IPTABLES-HINT / KUBE-KUBELET-CANARY chains decide when present, else whichever of
// `iptables-legacy-save` / `iptables-nft-save` (v4 + v6) shows more rules; a tie means nft.

import * as generic from '../redirect/iptables.ts';
import type { Detection, Flavour, NetnsRunner } from '../redirect/iptables.ts';
import type { Family } from '../redirect/net.ts';
import { exec, execNow } from './exec.ts';

export {
  diffRules,
  NetnsError,
  parseRules,
  reconcileRestore,
  type Detection,
  type Flavour,
  type RuleSet,
} from '../redirect/iptables.ts';

/** The host's own iptables (the plugin runs in the host netns); a busy node's save is a few MiB at most. */
const HOST: NetnsRunner = {
  where: 'on this host',
  run: (argv, o) =>
    exec(argv[0]!, argv.slice(1), {
      timeoutMs: 5000,
      input: o.input ?? null,
      stdout: o.stdout ?? true,
      maxOutput: 16 << 20,
    }),
};

export function detectFlavour(): Promise<Detection> {
  return generic.detectFlavour(HOST);
}

/** Runs argv in the netns at `netns` (a path); blocking: execNow (see exec.ts). */
export function byPath(netns: string): NetnsRunner {
  return {
    where: `in ${netns}`,
    run: (argv, o) => {
      const args = [`--net=${netns}`, '--', ...argv];
      const options = { input: o.input ?? null, stdout: o.stdout ?? true };
      return o.blocking ? execNow('nsenter', args, options) : exec('nsenter', args, options);
    },
  };
}

export function restore(netns: string, flavour: Flavour, family: Family, doc: string, blocking = false): Promise<void> {
  return generic.restore(byPath(netns), flavour, family, doc, blocking);
}

export function applyRules(
  netns: string,
  flavour: Flavour,
  family: Family,
  doc: string,
  blocking = false,
): Promise<'created' | 'reconciled'> {
  return generic.applyRules(byPath(netns), flavour, family, doc, blocking);
}

export function removeRules(netns: string, flavour: Flavour, family: Family): Promise<boolean> {
  return generic.removeRules(byPath(netns), flavour, family);
}

export function ipBatch(netns: string, family: Family, lines: readonly string[]): Promise<void> {
  return generic.ipBatch(byPath(netns), family, lines);
}

export function save(netns: string, flavour: Flavour, family: Family): Promise<string> {
  return generic.save(byPath(netns), flavour, family);
}

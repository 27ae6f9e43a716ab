// iptables in a pod netns for the plugin: pick the flavour the host uses, restore a document in
// one call per family, read it back. Everything runs through `nsenter --net=<CNI_NETNS>` (the
// plugin itself stays in the host netns, where the runtime runs it), with `--user=` too for a pod
// whose own user namespace owns that netns (netns/userns.ts). The work itself is
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

/**
 * Runs argv in the netns at `netns` (a path); blocking: execNow (see exec.ts). With `userns` (the
 * pod's own user namespace owns the netns: netns/userns.ts) nsenter enters it too for whatever
 * writes, and runs it as the pod's root there; legacy iptables then locks the netns file itself,
 * as /run/xtables.lock is the host root's alone. A save only reads, which the host's root may do
 * (and the pod's root may not when the netns's /proc/net files stayed the host's): it does not
 * enter (docs/plugin.md "User-namespaced pods").
 */
export function byPath(netns: string, userns: string | null = null): NetnsRunner {
  const inUserns = userns === null ? null : { enter: `--user=${userns}`, env: { XTABLES_LOCKFILE: netns } };
  return {
    where: userns === null ? `in ${netns}` : `in ${netns} (and its user namespace)`,
    run: (argv, o) => {
      const writes = inUserns !== null && !argv[0]!.endsWith('-save');
      const args = [...(writes ? [inUserns.enter] : []), `--net=${netns}`, '--', ...argv];
      const options = { input: o.input ?? null, stdout: o.stdout ?? true, env: writes ? inUserns.env : undefined };
      return o.blocking ? execNow('nsenter', args, options) : exec('nsenter', args, options);
    },
  };
}

export function restore(
  netns: string,
  flavour: Flavour,
  family: Family,
  doc: string,
  blocking = false,
  userns: string | null = null,
): Promise<void> {
  return generic.restore(byPath(netns, userns), flavour, family, doc, blocking);
}

export function applyRules(
  netns: string,
  flavour: Flavour,
  family: Family,
  doc: string,
  blocking = false,
  userns: string | null = null,
): Promise<'created' | 'reconciled'> {
  return generic.applyRules(byPath(netns, userns), flavour, family, doc, blocking);
}

export function removeRules(
  netns: string,
  flavour: Flavour,
  family: Family,
  userns: string | null = null,
): Promise<boolean> {
  return generic.removeRules(byPath(netns, userns), flavour, family);
}

export function ipBatch(
  netns: string,
  family: Family,
  lines: readonly string[],
  userns: string | null = null,
): Promise<void> {
  return generic.ipBatch(byPath(netns, userns), family, lines);
}

export function save(netns: string, flavour: Flavour, family: Family, userns: string | null = null): Promise<string> {
  return generic.save(byPath(netns, userns), flavour, family);
}

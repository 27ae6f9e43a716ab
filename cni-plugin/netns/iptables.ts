// iptables in a pod netns for the plugin: pick the flavour the host uses, restore a document in
// one call per family, read it back. Everything runs through `nsenter --net=<CNI_NETNS>` (the
// plugin itself stays in the host netns, where the runtime runs it), with `--user=` too for a pod
// whose own user namespace owns that netns (netns/userns.ts). The work itself is
// redirect/iptables.ts, runner-generic, which the agent's in-place repair runs by fd instead.
//
// Flavour detection follows Kubernetes' iptables-wrapper, read-only in the host netns: kubelet's
// KUBE-IPTABLES-HINT / KUBE-KUBELET-CANARY chains decide when present, else whichever of
// `iptables-legacy-save` / `iptables-nft-save` (v4 + v6) shows more rules; a tie means nft.

import { closeSync, constants, mkdtempSync, openSync, rmdirSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as generic from '../redirect/iptables.ts';
import type { Detection, Flavour, NetnsRunner, RunResult } from '../redirect/iptables.ts';
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
 * An open file no one else can open, for legacy iptables to lock (XTABLES_LOCKFILE=/proc/self/fd/3)
 * as the pod's root: /run/xtables.lock is the host root's alone, and any file the node's users can
 * open (the netns file is 0444) any of them could flock, keeping the pod's writes from ever
 * running. Made 0444 in a dir of ours (0700) and unlinked at once: only this fd reaches it.
 */
function privateLock(): number {
  const dir = mkdtempSync(path.join(tmpdir(), 'mesh-cni-xtlock-'));
  try {
    const file = path.join(dir, 'lock');
    const fd = openSync(file, constants.O_RDONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o444);
    unlinkSync(file);
    return fd;
  } finally {
    rmdirSync(dir);
  }
}

/**
 * Runs argv in the netns at `netns` (a path); blocking: execNow (see exec.ts). With `userns` (the
 * pod's own user namespace owns the netns: netns/userns.ts) nsenter enters it too for whatever
 * writes, and runs it as the pod's root there, legacy iptables locking a file of its own
 * (privateLock). A save only reads, which the host's root may do (and the pod's root may not when
 * the netns's /proc/net files stayed the host's): it does not enter (docs/plugin.md
 * "User-namespaced pods").
 */
export function byPath(netns: string, userns: string | null = null): NetnsRunner {
  return {
    where: userns === null ? `in ${netns}` : `in ${netns} (and its user namespace)`,
    run: (argv, o) => {
      const options = { input: o.input ?? null, stdout: o.stdout ?? true };
      if (userns === null || argv[0]!.endsWith('-save')) {
        const args = [`--net=${netns}`, '--', ...argv];
        return o.blocking ? execNow('nsenter', args, options) : exec('nsenter', args, options);
      }
      let lock: number;
      try {
        lock = privateLock();
      } catch (e) {
        const error = `cannot make a lock file for ${argv[0]!} in ${tmpdir()}: ${(e as Error).message}`;
        return { code: null, stdout: '', stderr: '', error } satisfies RunResult;
      }
      const args = [`--user=${userns}`, `--net=${netns}`, '--', ...argv];
      const inUserns = { ...options, env: { XTABLES_LOCKFILE: '/proc/self/fd/3' }, fds: [lock] };
      if (o.blocking) {
        try {
          return execNow('nsenter', args, inUserns);
        } finally {
          closeSync(lock);
        }
      }
      return exec('nsenter', args, inUserns).finally(() => closeSync(lock));
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

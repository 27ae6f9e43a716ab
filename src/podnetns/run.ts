// Runs a program inside a held netns: `nsenter --net=/proc/self/fd/3 -- argv...`, the netns fd
// handed to the child as its fd 3. The agent's own threads never setns: a thread switched into a
// pod's netns would open every socket and child it makes meanwhile there, libuv's thread pool
// would stay behind, and an exception between the two setns calls would leave the agent in the
// pod (ambient.md §3: no faster than nsenter either).
//
// A netns a `hostUsers: false` pod's own user namespace owns takes the proxy's `-m owner` rules
// only from inside that user namespace (userns.ts). There what writes rules (writesRules) runs as
// `nsenter --user=/proc/self/fd/4 --net=/proc/self/fd/3`, as the pod's root, the owner's fd handed
// as fd 4, as the plugin runs it (docs/plugin.md "User-namespaced pods"). Legacy iptables then
// locks a file of the agent's own, handed as fd 5 (XTABLES_LOCKFILE, userns.ts privateLockFile):
// /run/xtables.lock is the host root's, which the pod's root may not open. Reads stay the host
// root's: a save, `ip addr show`, the validation check.

import fs from 'node:fs';
import path from 'node:path';
import { sameNs, type HeldNetns } from './held.ts';
import { DEFAULT_TIMEOUT_MS, failed, MAX_OUTPUT, runProgram, type RunResult } from './program.ts';
import { netnsOwner, privateLockFile } from './userns.ts';

export { DEFAULT_TIMEOUT_MS, MAX_OUTPUT, type RunResult };
export interface RunOptions {
  /** Written to the child's stdin, then closed; null/absent: no stdin. */
  readonly input?: string | null;
  /** Default 5 s; then SIGKILL. */
  readonly timeoutMs?: number;
  /** Aborted: nsenter (and so the program it became) is killed at once. */
  readonly signal?: AbortSignal;
}

/**
 * The fd still names the netns it was opened on. A closed HeldNetns has fd -1; a number reused
 * by another file (someone closed the fd behind its back) would hand that file to nsenter.
 */
function stillHeld(netns: HeldNetns): string | null {
  const what = `the netns (dev ${netns.dev}, inode ${netns.ino}) found through pid ${netns.pid}`;
  if (netns.fd < 0) return `${what} is closed; find it again`;
  try {
    const st = fs.fstatSync(netns.fd, { bigint: true });
    if (sameNs(st, netns)) return null;
  } catch {
    /* EBADF: below */
  }
  return `fd ${netns.fd} no longer holds ${what}; find it again`;
}

/**
 * What writes a pod's rules: iptables but its saves (any flavour, either family), and `ip -batch`.
 * Only these enter the pod's user namespace; anything else runs as the host's root as before.
 */
export function writesRules(argv: readonly string[]): boolean {
  const prog = path.basename(argv[0] ?? '');
  return /^ip6?tables(-legacy|-nft)?(-restore)?$/.test(prog) || (prog === 'ip' && argv.includes('-batch'));
}

/**
 * `nsenter --net=/proc/self/fd/3 -- argv...`, with `--user=/proc/self/fd/4` (and the lock file as
 * fd 5) too for a writer in a netns another user namespace owns; never throws, never rejects. When that owner cannot be told,
 * a writer does not run (the result's error says why): nothing is written from the wrong one.
 */
export function runInNetns(netns: HeldNetns, argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const { input = null, timeoutMs = DEFAULT_TIMEOUT_MS, signal } = opts;
  const name = argv[0] ?? '';
  if (argv.length === 0) return Promise.resolve(failed('runInNetns: no program given'));
  const notHeld = stillHeld(netns);
  if (notHeld) return Promise.resolve(failed(`cannot run ${name}: ${notHeld}`));
  const where = `the netns of pid ${netns.pid}`;
  let owner: number | null = null;
  let lock = -1;
  if (writesRules(argv)) {
    try {
      owner = netnsOwner(netns.fd, where);
      if (owner !== null) lock = privateLockFile();
    } catch (e) {
      if (owner !== null) fs.closeSync(owner);
      return Promise.resolve(failed(`cannot run ${name}: ${(e as Error).message}`));
    }
  }
  const common = { input, timeoutMs, signal, cannotRun: `cannot run nsenter for ${name}` };
  if (owner === null)
    return runProgram('nsenter', ['--net=/proc/self/fd/3', '--', ...argv], {
      ...common,
      fds: [netns.fd],
      what: `${name} in ${where}`,
    });
  const userns = owner;
  return runProgram('nsenter', ['--user=/proc/self/fd/4', '--net=/proc/self/fd/3', '--', ...argv], {
    ...common,
    fds: [netns.fd, userns, lock],
    env: { XTABLES_LOCKFILE: '/proc/self/fd/5' },
    what: `${name} in ${where} as the root of its user namespace`,
  }).finally(() => {
    try {
      fs.closeSync(userns);
    } catch {
      /* closed behind our back (EBADF): nothing of ours is left open, and the run's result stands */
    }
  });
}

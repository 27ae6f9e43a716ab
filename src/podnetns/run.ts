// Runs a program inside a held netns: `nsenter --net=/proc/self/fd/3 -- argv...`, the netns fd
// handed to the child as its fd 3. The agent's own threads never setns: a thread switched into a
// pod's netns would open every socket and child it makes meanwhile there, libuv's thread pool
// would stay behind, and an exception between the two setns calls would leave the agent in the
// pod (ambient.md §3: no faster than nsenter either).

import fs from 'node:fs';
import { sameNs, type HeldNetns } from './held.ts';
import { DEFAULT_TIMEOUT_MS, failed, MAX_OUTPUT, runProgram, type RunResult } from './program.ts';

export { DEFAULT_TIMEOUT_MS, MAX_OUTPUT, type RunResult };
export interface RunOptions {
  /** Written to the child's stdin, then closed; null/absent: no stdin. */
  readonly input?: string | null;
  /** Default 5 s; then SIGKILL. */
  readonly timeoutMs?: number;
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

/** `nsenter --net=/proc/self/fd/3 -- argv...`; never throws, never rejects. */
export function runInNetns(netns: HeldNetns, argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const { input = null, timeoutMs = DEFAULT_TIMEOUT_MS } = opts;
  const name = argv[0] ?? '';
  if (argv.length === 0) return Promise.resolve(failed('runInNetns: no program given'));
  const notHeld = stillHeld(netns);
  if (notHeld) return Promise.resolve(failed(`cannot run ${name}: ${notHeld}`));
  return runProgram('nsenter', ['--net=/proc/self/fd/3', '--', ...argv], {
    input,
    timeoutMs,
    fds: [netns.fd],
    what: `${name} in the netns of pid ${netns.pid}`,
    cannotRun: `cannot run nsenter for ${name}`,
  });
}

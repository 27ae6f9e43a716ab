// Runs a program directly, in the agent's own network namespace: on a node that is the host's
// (the agent runs with hostNetwork). For what belongs to the node rather than to a pod: ambient's
// probe ipset and MESH_POSTRT, and the node's iptables flavour. A pod's netns is entered with
// src/podnetns/ instead; both run through the agent's one runner (src/podnetns/program.ts).

import { failed, runProgram, type RunResult } from '../podnetns/program.ts';

export type HostRunResult = RunResult;

export interface HostRunOptions {
  /** Written to stdin, then closed; absent or null: nothing. */
  readonly input?: string | null;
  /** Default 5 s, then SIGKILL. */
  readonly timeoutMs?: number;
}

/** iptables-save of a busy node is a few MiB at most. */
const MAX_OUTPUT = 16 << 20;

/** Never rejects: failures come back in the result, as runInNetns does. */
export function runOnHost(argv: readonly string[], opts: HostRunOptions = {}): Promise<HostRunResult> {
  if (argv.length === 0) return Promise.resolve(failed('runOnHost: no program given'));
  return runProgram(argv[0]!, argv.slice(1), {
    input: opts.input ?? null,
    timeoutMs: opts.timeoutMs,
    maxOutput: MAX_OUTPUT,
  });
}

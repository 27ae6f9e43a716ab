// Runs a program directly, in the agent's own network namespace: on a node that is the host's
// (the agent runs with hostNetwork). For what belongs to the node rather than to a pod: ambient's
// probe ipset and MESH_POSTRT, and the node's iptables flavour. A pod's netns is entered with
// src/podnetns/ instead. Never rejects: failures come back in the result, as runInNetns does.

import { execFile } from 'node:child_process';

/** Same shape as src/podnetns RunResult and cni-plugin/redirect/iptables.ts RunResult. */
export interface HostRunResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Set when the program could not start or was killed for its time limit or its output. */
  readonly error: string | null;
}

export interface HostRunOptions {
  /** Written to stdin, then closed; absent or null: nothing. */
  readonly input?: string | null;
  /** Default 5 s, then SIGKILL. */
  readonly timeoutMs?: number;
}

/** iptables-save of a busy node is a few MiB at most. */
const MAX_BUFFER = 16 << 20;

export function runOnHost(argv: readonly string[], opts: HostRunOptions = {}): Promise<HostRunResult> {
  if (argv.length === 0) return Promise.resolve({ code: null, stdout: '', stderr: '', error: 'no program given' });
  return new Promise((resolve) => {
    const child = execFile(
      argv[0]!,
      argv.slice(1),
      { timeout: opts.timeoutMs ?? 5000, killSignal: 'SIGKILL', maxBuffer: MAX_BUFFER },
      (err, stdout, stderr) => {
        // A number is the exit status; anything else (ENOENT, killed) means it did not run to its end.
        const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
        const error = err && typeof err.code !== 'number' ? `${argv[0]}: ${err.message}` : null;
        resolve({ code, stdout, stderr, error });
      },
    );
    child.stdin?.on('error', () => {
      /* exited before reading it all: its status says why */
    });
    child.stdin?.end(opts.input ?? undefined);
  });
}

// Runs a host binary with a time limit and optional stdin; never throws for a non-zero exit.

import type { StdioOptions } from 'node:child_process';

export interface ExecResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Set when the binary could not be started (ENOENT...) or was killed for the time limit. */
  readonly error: string | null;
}

/** The runtime's PATH may lack the sbin dirs where iptables and nsenter live. */
const PATH = [process.env.PATH ?? '', '/usr/local/sbin', '/usr/sbin', '/sbin', '/usr/local/bin', '/usr/bin', '/bin']
  .filter((p) => p !== '').join(':');

export interface ExecOptions {
  /** Written to the child's stdin, then closed; null: no stdin. */
  readonly input?: string | null;
  readonly timeoutMs?: number;
  /** Collect stdout; false saves a pipe on the pod's critical path (iptables-restore prints nothing). */
  readonly stdout?: boolean;
}

/** What exec and execNow give the child: the pipes asked for, and our PATH. */
function childSetup(input: string | null, wantStdout: boolean): { stdio: StdioOptions; env: NodeJS.ProcessEnv } {
  return { stdio: [input === null ? 'ignore' : 'pipe', wantStdout ? 'pipe' : 'ignore', 'pipe'], env: { ...process.env, PATH } };
}

const timedOut = (file: string, timeoutMs: number) => `${file} did not finish within ${timeoutMs} ms`;

export function exec(file: string, args: readonly string[], { input = null, timeoutMs = 10_000, stdout: wantStdout = true }: ExecOptions = {}): Promise<ExecResult> {
  // Loaded on first use, like node:https in the pod client (startup snapshot, skipped pods).
  const { spawn } = process.getBuiltinModule('node:child_process');
  return new Promise((resolve) => {
    const child = spawn(file, args, childSetup(input, wantStdout));
    let stdout = '';
    let stderr = '';
    let error: string | null = null;
    const timer = setTimeout(() => {
      error = timedOut(file, timeoutMs);
      child.kill('SIGKILL');
    }, timeoutMs);
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', (e) => {
      error = `cannot run ${file}: ${e.message}`;
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, error });
    });
    if (input !== null && child.stdin) {
      child.stdin.on('error', () => { /* the child died early; its exit status tells why */ });
      child.stdin.end(input);
    }
  });
}

/**
 * exec, blocking until the child is done: on a cold plugin process ~2 ms sooner than the
 * asynchronous spawn, which sets up pipe streams first. For the single call a pod's critical path
 * waits on anyway (one family's iptables-restore); nothing else may need the event loop meanwhile.
 */
export function execNow(file: string, args: readonly string[], { input = null, timeoutMs = 10_000, stdout: wantStdout = true }: ExecOptions = {}): ExecResult {
  const { spawnSync } = process.getBuiltinModule('node:child_process');
  const r = spawnSync(file, args, {
    ...childSetup(input, wantStdout),
    input: input ?? undefined,
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    encoding: 'utf8',
  });
  let error: string | null = null;
  if (r.error) {
    error = (r.error as NodeJS.ErrnoException).code === 'ETIMEDOUT' ? timedOut(file, timeoutMs) : `cannot run ${file}: ${r.error.message}`;
  }
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? '', error };
}

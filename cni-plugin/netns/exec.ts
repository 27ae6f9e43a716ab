// Runs a host binary with a time limit and optional stdin; never throws for a non-zero exit.
// Under Bun with its own Bun.spawn / Bun.spawnSync: Bun's node:child_process costs ~1 ms of CPU
// to load and its spawn more than Bun's (docs/design.md "Start-up time"); under Node with
// node:child_process. Both give the same results: test/node/plugin-runtime-io.test.ts runs each
// case on both runtimes.

import type { StdioOptions } from 'node:child_process';
import type { RunResult } from '../redirect/iptables.ts';

/** The plugin's one result type, the one its runners hand redirect/iptables.ts (a type: nothing loaded). */
export type ExecResult = RunResult;

/** The runtime's PATH may lack the sbin dirs where iptables and nsenter live. */
const PATH = [process.env.PATH ?? '', '/usr/local/sbin', '/usr/sbin', '/sbin', '/usr/local/bin', '/usr/bin', '/bin']
  .filter((p) => p !== '')
  .join(':');

export interface ExecOptions {
  /** Written to the child's stdin, then closed; null: no stdin. */
  readonly input?: string | null;
  readonly timeoutMs?: number;
  /** Collect stdout; false saves a pipe on the pod's critical path (iptables-restore prints nothing). */
  readonly stdout?: boolean;
}

/** What exec and execNow give the child: the pipes asked for, and our PATH. */
function childSetup(input: string | null, wantStdout: boolean): { stdio: StdioOptions; env: NodeJS.ProcessEnv } {
  return {
    stdio: [input === null ? 'ignore' : 'pipe', wantStdout ? 'pipe' : 'ignore', 'pipe'],
    env: { ...process.env, PATH },
  };
}

const timedOut = (file: string, timeoutMs: number) => `${file} did not finish within ${timeoutMs} ms`;

/** What execNow keeps of each of stdout and stderr (Node's spawnSync default); a child writing more is killed. */
const MAX_OUTPUT = 1024 * 1024;
const tooMuch = (file: string): ExecResult => ({
  code: null,
  stdout: '',
  stderr: '',
  error: `${file} wrote more than ${MAX_OUTPUT} bytes of output; killed`,
});

/** The part of Bun's API used here (the plugin is type-checked against Node's types). */
interface BunSpawnOptions {
  cmd: string[];
  env: NodeJS.ProcessEnv;
  stdin: 'ignore' | Uint8Array;
  stdout: 'pipe' | 'ignore';
  stderr: 'pipe';
  timeout: number | undefined;
  killSignal: 'SIGKILL';
  maxBuffer?: number;
}
interface BunRuntime {
  spawn(o: BunSpawnOptions): {
    stdout: ReadableStream | null;
    stderr: ReadableStream;
    exited: Promise<number>;
    signalCode: string | null;
    kill(signal: 'SIGKILL'): void;
  };
  spawnSync(o: BunSpawnOptions): {
    exitCode: number | null;
    stdout: Uint8Array | null;
    stderr: Uint8Array;
    exitedDueToTimeout?: boolean;
    exitedDueToMaxBuffer?: boolean;
  };
  readableStreamToText(s: ReadableStream): Promise<string>;
}
const bun = (globalThis as { Bun?: BunRuntime }).Bun;

function bunOptions(
  file: string,
  args: readonly string[],
  input: string | null,
  wantStdout: boolean,
  timeoutMs: number,
): BunSpawnOptions {
  const { env } = childSetup(input, wantStdout);
  return {
    cmd: [file, ...args],
    env,
    stdin: input === null ? 'ignore' : Buffer.from(input, 'utf8'),
    stdout: wantStdout ? 'pipe' : 'ignore',
    stderr: 'pipe',
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
  };
}

/** A binary that cannot be started; `code` as Node gives it: -errno from spawn, null from spawnSync. */
const cannotRun = (file: string, e: unknown, code: number | null): ExecResult => ({
  code,
  stdout: '',
  stderr: '',
  error: `cannot run ${file}: ${(e as Error).message}`,
});

async function execBun(
  b: BunRuntime,
  file: string,
  args: readonly string[],
  input: string | null,
  timeoutMs: number,
  wantStdout: boolean,
): Promise<ExecResult> {
  let p;
  try {
    // Our own timer, as exec does under Node: Bun's `killed` is also true for a child a signal
    // from elsewhere ended, so it cannot tell our time limit apart.
    p = b.spawn({ ...bunOptions(file, args, input, wantStdout, timeoutMs), timeout: undefined });
  } catch (e) {
    const errno = (e as NodeJS.ErrnoException).errno;
    return cannotRun(file, e, typeof errno === 'number' ? errno : null);
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const limit = new Promise<ExecResult>((resolve) => {
    timer = setTimeout(() => {
      p.kill('SIGKILL');
      resolve(timeUp(file, timeoutMs));
    }, timeoutMs);
  });
  const done = Promise.all([
    p.stdout ? b.readableStreamToText(p.stdout) : '',
    b.readableStreamToText(p.stderr),
    p.exited,
  ]).then(
    ([stdout, stderr, status]): ExecResult => {
      // As Node reports it: no exit code for a child a signal ended.
      return { code: p.signalCode ? null : status, stdout, stderr, error: null };
    },
    (e: unknown): ExecResult => {
      const error = `cannot read the output of ${file}: ${(e as Error).message}`;
      return { code: null, stdout: '', stderr: '', error };
    },
  );
  const r = await Promise.race([done, limit]);
  clearTimeout(timer);
  return r;
}

/**
 * The time limit is up: the answer now, not when the child's pipes close, which a process the
 * child started may hold open long after the child is killed (or forever).
 */
const timeUp = (file: string, timeoutMs: number): ExecResult => ({
  code: null,
  stdout: '',
  stderr: '',
  error: timedOut(file, timeoutMs),
});

export function exec(
  file: string,
  args: readonly string[],
  { input = null, timeoutMs = 10_000, stdout: wantStdout = true }: ExecOptions = {},
): Promise<ExecResult> {
  if (bun) return execBun(bun, file, args, input, timeoutMs, wantStdout);
  // Loaded on first use, like node:https in the pod client (startup snapshot, skipped pods).
  const { spawn } = process.getBuiltinModule('node:child_process');
  return new Promise((resolve) => {
    const child = spawn(file, args, childSetup(input, wantStdout));
    let stdout = '';
    let stderr = '';
    let error: string | null = null;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      for (const s of [child.stdin, child.stdout, child.stderr]) s?.destroy();
      resolve(timeUp(file, timeoutMs));
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
      child.stdin.on('error', () => {
        /* the child died early; its exit status tells why */
      });
      child.stdin.end(input);
    }
  });
}

/**
 * exec, blocking until the child is done: on a cold plugin process ~2 ms sooner than the
 * asynchronous spawn, which sets up pipe streams first. For the single call a pod's critical path
 * waits on anyway (one family's iptables-restore); nothing else may need the event loop meanwhile.
 */
export function execNow(
  file: string,
  args: readonly string[],
  { input = null, timeoutMs = 10_000, stdout: wantStdout = true }: ExecOptions = {},
): ExecResult {
  if (bun) {
    let r;
    try {
      r = bun.spawnSync({ ...bunOptions(file, args, input, wantStdout, timeoutMs), maxBuffer: MAX_OUTPUT });
    } catch (e) {
      return cannotRun(file, e, null);
    }
    if (r.exitedDueToMaxBuffer) return tooMuch(file);
    const text = (b: Uint8Array | null) =>
      b ? Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('utf8') : '';
    return {
      code: r.exitCode,
      stdout: text(r.stdout),
      stderr: text(r.stderr),
      error: r.exitedDueToTimeout ? timedOut(file, timeoutMs) : null,
    };
  }
  const { spawnSync } = process.getBuiltinModule('node:child_process');
  const r = spawnSync(file, args, {
    ...childSetup(input, wantStdout),
    input: input ?? undefined,
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    encoding: 'utf8',
    maxBuffer: MAX_OUTPUT,
  });
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOBUFS') return tooMuch(file);
  let error: string | null = null;
  if (r.error) {
    error =
      (r.error as NodeJS.ErrnoException).code === 'ETIMEDOUT'
        ? timedOut(file, timeoutMs)
        : `cannot run ${file}: ${r.error.message}`;
  }
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? '', error };
}

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
  /** Bytes kept of each of stdout and stderr; default 1 MiB. */
  readonly maxOutput?: number;
  /** Set in the child's environment on top of ours. */
  readonly env?: Readonly<Record<string, string>>;
  /** Our fds the child gets as its fds 3, 4, ... (they stay ours to close). */
  readonly fds?: readonly number[];
}

/** What exec and execNow give the child: the pipes asked for, and our PATH. */
function childSetup(
  input: string | null,
  wantStdout: boolean,
  env: Readonly<Record<string, string>> = {},
  fds: readonly number[] = [],
): { stdio: StdioOptions; env: NodeJS.ProcessEnv } {
  return {
    stdio: [input === null ? 'ignore' : 'pipe', wantStdout ? 'pipe' : 'ignore', 'pipe', ...fds],
    env: { ...process.env, ...env, PATH },
  };
}

const timedOut = (file: string, timeoutMs: number) => `${file} did not finish within ${timeoutMs} ms`;

/** What exec and execNow keep of each of stdout and stderr unless told (Node's spawnSync default); a child writing more is killed. */
const MAX_OUTPUT = 1024 * 1024;
const tooMuch = (file: string, maxOutput: number): ExecResult => ({
  code: null,
  stdout: '',
  stderr: '',
  error: `${file} wrote more than ${maxOutput} bytes of output; killed`,
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
  /** stdin, stdout, stderr as above, then fds the child gets as 3, 4, ...; set only with fds. */
  stdio?: ('ignore' | 'pipe' | Uint8Array | number)[];
}
interface BunRuntime {
  spawn(o: BunSpawnOptions): {
    stdout: ReadableStream<Uint8Array> | null;
    stderr: ReadableStream<Uint8Array>;
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
}
const bun = (globalThis as { Bun?: BunRuntime }).Bun;

/** A child's output past its cap (execBun's streams). */
class TooMuch extends Error {}

function bunOptions(
  file: string,
  args: readonly string[],
  input: string | null,
  wantStdout: boolean,
  timeoutMs: number,
  extraEnv?: Readonly<Record<string, string>>,
  fds: readonly number[] = [],
): BunSpawnOptions {
  const { env } = childSetup(input, wantStdout, extraEnv);
  const stdin = input === null ? 'ignore' : Buffer.from(input, 'utf8');
  const stdout = wantStdout ? 'pipe' : 'ignore';
  return {
    cmd: [file, ...args],
    env,
    stdin,
    stdout,
    stderr: 'pipe',
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    ...(fds.length > 0 ? { stdio: [stdin, stdout, 'pipe', ...fds] } : {}),
  };
}

/** A binary that cannot be started; `code` as Node gives it: -errno from spawn, null from spawnSync. */
const cannotRun = (file: string, e: unknown, code: number | null): ExecResult => ({
  code,
  stdout: '',
  stderr: '',
  error: `cannot run ${file}: ${(e as Error).message}`,
});

/** All of `s` as text, or null once more than `maxOutput` bytes came (the rest is not read). */
async function readCapped(s: ReadableStream<Uint8Array>, maxOutput: number): Promise<string | null> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = s.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return Buffer.concat(chunks).toString('utf8');
    size += value.byteLength;
    if (size > maxOutput) {
      void reader.cancel().catch(() => undefined);
      return null;
    }
    chunks.push(value);
  }
}

async function execBun(
  b: BunRuntime,
  file: string,
  args: readonly string[],
  input: string | null,
  timeoutMs: number,
  wantStdout: boolean,
  maxOutput: number,
  env?: Readonly<Record<string, string>>,
  fds?: readonly number[],
): Promise<ExecResult> {
  let p;
  try {
    // Our own timer, as exec does under Node: Bun's `killed` is also true for a child a signal
    // from elsewhere ended, so it cannot tell our time limit apart.
    p = b.spawn({ ...bunOptions(file, args, input, wantStdout, timeoutMs, env, fds), timeout: undefined });
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
  // Either stream past the cap ends the child at once, as under Node.
  const capped = (s: ReadableStream<Uint8Array>) =>
    readCapped(s, maxOutput).then((t) => {
      if (t === null) {
        p.kill('SIGKILL');
        throw new TooMuch();
      }
      return t;
    });
  const done = Promise.all([p.stdout ? capped(p.stdout) : '', capped(p.stderr), p.exited]).then(
    ([stdout, stderr, status]): ExecResult => {
      // As Node reports it: no exit code for a child a signal ended.
      return { code: p.signalCode ? null : status, stdout, stderr, error: null };
    },
    (e: unknown): ExecResult => {
      if (e instanceof TooMuch) return tooMuch(file, maxOutput);
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
  { input = null, timeoutMs = 10_000, stdout: wantStdout = true, maxOutput = MAX_OUTPUT, env, fds }: ExecOptions = {},
): Promise<ExecResult> {
  if (bun) return execBun(bun, file, args, input, timeoutMs, wantStdout, maxOutput, env, fds);
  // Loaded on first use, like node:https in the pod client (startup snapshot, skipped pods).
  const { spawn } = process.getBuiltinModule('node:child_process');
  return new Promise((resolve) => {
    const child = spawn(file, args, childSetup(input, wantStdout, env, fds));
    const out = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const size = { stdout: 0, stderr: 0 };
    let error: string | null = null;
    let done = false;
    // Resolved at once when the child is killed: a process it started may hold the pipes open.
    const stop = (r: ExecResult) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      for (const s of [child.stdin, child.stdout, child.stderr]) s?.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => stop(timeUp(file, timeoutMs)), timeoutMs);
    for (const which of ['stdout', 'stderr'] as const) {
      child[which]?.on('data', (d: Buffer) => {
        size[which] += d.length;
        if (size[which] > maxOutput) stop(tooMuch(file, maxOutput));
        else out[which].push(d);
      });
    }
    child.on('error', (e) => {
      error = `cannot run ${file}: ${e.message}`;
    });
    child.on('close', (code) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const text = (b: Buffer[]) => Buffer.concat(b).toString('utf8');
      resolve({ code, stdout: text(out.stdout), stderr: text(out.stderr), error });
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
  { input = null, timeoutMs = 10_000, stdout: wantStdout = true, maxOutput = MAX_OUTPUT, env, fds }: ExecOptions = {},
): ExecResult {
  if (bun) {
    let r;
    try {
      r = bun.spawnSync({ ...bunOptions(file, args, input, wantStdout, timeoutMs, env, fds), maxBuffer: maxOutput });
    } catch (e) {
      return cannotRun(file, e, null);
    }
    if (r.exitedDueToMaxBuffer) return tooMuch(file, maxOutput);
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
    ...childSetup(input, wantStdout, env, fds),
    input: input ?? undefined,
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    encoding: 'utf8',
    maxBuffer: maxOutput,
  });
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOBUFS') return tooMuch(file, maxOutput);
  let error: string | null = null;
  if (r.error) {
    error =
      (r.error as NodeJS.ErrnoException).code === 'ETIMEDOUT'
        ? timedOut(file, timeoutMs)
        : `cannot run ${file}: ${r.error.message}`;
  }
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? '', error };
}

// The agent's one way to run a program: a time limit, a cap on what is kept of its output, a
// SIGKILL when either is passed, and one result type. runInNetns (run.ts) runs nsenter through
// it; runOnHost (src/hostnet/run.ts) runs a program in the agent's own netns. It lives here, not
// in src/hostnet/, because the import zones let src/podnetns/ import only its own files.

import { spawn } from 'node:child_process';
import type { RunResult } from '../../cni-plugin/redirect/iptables.ts';

/**
 * What a run gave; never a rejection: failures to start or finish come back in `error` (nothing
 * ran: netns closed, program missing; or the child was killed for its time or output). The rule
 * applier's own type, so the agent's runners go to it as they are.
 */
export type { RunResult };

export const DEFAULT_TIMEOUT_MS = 5_000;
/** What is kept of each of stdout and stderr unless a caller says otherwise; a child writing more is killed. */
export const MAX_OUTPUT = 1024 * 1024;

/** Where nsenter, ip, ipset and iptables live; a container's PATH may lack the sbin dirs. */
export const SBIN_DIRS: readonly string[] = [
  '/usr/local/sbin',
  '/usr/sbin',
  '/sbin',
  '/usr/local/bin',
  '/usr/bin',
  '/bin',
];

/** `path` (a PATH value) with the sbin dirs it lacks after it: its own dirs are still searched first. */
export function withSbinDirs(path: string): string {
  const dirs = path.split(':').filter((d) => d !== '');
  return [...dirs, ...SBIN_DIRS.filter((d) => !dirs.includes(d))].join(':');
}

/** The agent's environment, as spawn would hand it down, with `extra` and the sbin dirs after its PATH. */
function childEnv(extra: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  // eslint-disable-next-line no-restricted-properties -- not a setting: the environment every child inherits
  const env = process.env;
  return { ...env, ...extra, PATH: withSbinDirs(env.PATH ?? '') };
}

export const failed = (error: string): RunResult => ({ code: null, stdout: '', stderr: '', error });

export interface ProgramOptions {
  /** Written to the child's stdin, then closed; null/absent: no stdin. */
  readonly input?: string | null;
  /** Default DEFAULT_TIMEOUT_MS; then SIGKILL. */
  readonly timeoutMs?: number;
  /** Bytes kept of each of stdout and stderr; default MAX_OUTPUT. */
  readonly maxOutput?: number;
  /** Open fds handed to the child as its fd 3, 4, ... */
  readonly fds?: readonly number[];
  /** The program as messages name it (default `file`): "ip in the netns of pid 42". */
  readonly what?: string;
  /** What a failure to start says first (default `cannot run <file>`). */
  readonly cannotRun?: string;
  /** Set in the child's environment on top of the agent's. */
  readonly env?: Readonly<Record<string, string>>;
  /** Aborted: the child is killed (SIGKILL) at once, or never started; the result's error says so. */
  readonly signal?: AbortSignal;
}

/** Runs `file args...` on the agent's PATH and the sbin dirs; never throws, never rejects. */
export function runProgram(file: string, args: readonly string[], opts: ProgramOptions = {}): Promise<RunResult> {
  const { input = null, timeoutMs = DEFAULT_TIMEOUT_MS, maxOutput = MAX_OUTPUT, fds = [], env = {} } = opts;
  const what = opts.what ?? file;
  const cannotRun = opts.cannotRun ?? `cannot run ${file}`;
  const { signal } = opts;
  const cut = () => {
    const why: unknown = signal?.reason;
    return `${what} was cut short (${why instanceof Error ? why.message : String(why)}); killed`;
  };
  if (signal?.aborted) return Promise.resolve(failed(cut()));
  return new Promise((resolve) => {
    let child;
    try {
      child = spawn(file, args, {
        stdio: [input === null ? 'ignore' : 'pipe', 'pipe', 'pipe', ...fds],
        env: childEnv(env),
      });
    } catch (e) {
      resolve(failed(`${cannotRun}: ${(e as Error).message}`));
      return;
    }
    const out = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const size = { stdout: 0, stderr: 0 };
    let error: string | null = null;
    let done = false;
    // Resolved at once when the child is killed: a process it started may hold the pipes open.
    const stop = (why: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      child.kill('SIGKILL');
      for (const s of [child.stdin, child.stdout, child.stderr]) s?.destroy();
      resolve(failed(why));
    };
    const timer = setTimeout(() => stop(`${what} did not finish within ${timeoutMs} ms; killed`), timeoutMs);
    // A stop of the agent does not wait out the child's own time limit (src/stopbound.ts).
    const onAbort = () => stop(cut());
    signal?.addEventListener('abort', onAbort, { once: true });
    for (const which of ['stdout', 'stderr'] as const) {
      child[which]!.on('data', (d: Buffer) => {
        size[which] += d.length;
        if (size[which] > maxOutput) {
          stop(`${what} wrote more than ${maxOutput} bytes on ${which}; killed`);
          return;
        }
        out[which].push(d);
      });
    }
    child.on('error', (e) => {
      error = `${cannotRun}: ${e.message}`;
    });
    child.on('close', (code) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      const text = (b: Buffer[]) => Buffer.concat(b).toString('utf8');
      // A child that never started has no exit status (Node's close gives -errno).
      resolve({ code: error === null ? code : null, stdout: text(out.stdout), stderr: text(out.stderr), error });
    });
    if (child.stdin) {
      child.stdin.on('error', () => {
        /* the child exited before reading it all; its exit status says why */
      });
      child.stdin.end(input);
    }
  });
}

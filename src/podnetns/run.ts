// Runs a program inside a held netns: `nsenter --net=/proc/self/fd/3 -- argv...`, the netns fd
// handed to the child as its fd 3. The agent's own threads never setns: a thread switched into a
// pod's netns would open every socket and child it makes meanwhile there, libuv's thread pool
// would stay behind, and an exception between the two setns calls would leave the agent in the
// pod (ambient.md §3: no faster than nsenter either).

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { sameNs, type HeldNetns } from './held.ts';

/** Same shape as cni-plugin/netns/exec.ts ExecResult. */
export interface RunResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Set when nothing ran (netns closed, nsenter missing) or the child was killed (time, output). */
  readonly error: string | null;
}
export interface RunOptions {
  /** Written to the child's stdin, then closed; null/absent: no stdin. */
  readonly input?: string | null;
  /** Default 5 s; then SIGKILL. */
  readonly timeoutMs?: number;
}

export const DEFAULT_TIMEOUT_MS = 5_000;
/** What is kept of each of stdout and stderr; a child writing more is killed. */
export const MAX_OUTPUT = 1024 * 1024;

/** Where nsenter, ip and iptables live; a container's PATH may lack the sbin dirs. */
const SBIN_DIRS = ['/usr/local/sbin', '/usr/sbin', '/sbin', '/usr/local/bin', '/usr/bin', '/bin'];

/**
 * The agent's environment, as spawn would hand it down, with the sbin dirs after its PATH (as
 * the plugin's exec does): a program is still looked up where the agent's PATH says first.
 */
function childEnv(): NodeJS.ProcessEnv {
  // eslint-disable-next-line no-restricted-properties -- not a setting: the environment every child inherits
  const env = process.env;
  const dirs = (env.PATH ?? '').split(':').filter((d) => d !== '');
  return { ...env, PATH: [...dirs, ...SBIN_DIRS.filter((d) => !dirs.includes(d))].join(':') };
}

const failed = (error: string): RunResult => ({ code: null, stdout: '', stderr: '', error });

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
  return new Promise((resolve) => {
    let child;
    try {
      child = spawn('nsenter', ['--net=/proc/self/fd/3', '--', ...argv], {
        stdio: [input === null ? 'ignore' : 'pipe', 'pipe', 'pipe', netns.fd],
        env: childEnv(),
      });
    } catch (e) {
      resolve(failed(`cannot run nsenter for ${name}: ${(e as Error).message}`));
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
      child.kill('SIGKILL');
      for (const s of [child.stdin, child.stdout, child.stderr]) s?.destroy();
      resolve(failed(why));
    };
    const timer = setTimeout(
      () => stop(`${name} in the netns of pid ${netns.pid} did not finish within ${timeoutMs} ms; killed`),
      timeoutMs,
    );
    for (const which of ['stdout', 'stderr'] as const) {
      child[which]!.on('data', (d: Buffer) => {
        size[which] += d.length;
        if (size[which] > MAX_OUTPUT) {
          stop(`${name} in the netns of pid ${netns.pid} wrote more than ${MAX_OUTPUT} bytes on ${which}; killed`);
          return;
        }
        out[which].push(d);
      });
    }
    child.on('error', (e) => {
      error = `cannot run nsenter for ${name}: ${e.message}`;
    });
    child.on('close', (code) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const text = (b: Buffer[]) => Buffer.concat(b).toString('utf8');
      resolve({ code, stdout: text(out.stdout), stderr: text(out.stderr), error });
    });
    if (child.stdin) {
      child.stdin.on('error', () => {
        /* the child exited before reading it all; its exit status says why */
      });
      child.stdin.end(input);
    }
  });
}

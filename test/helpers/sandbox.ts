// `npm start`'s sandbox (scripts/sandbox.ts) as the tests start it: in a temp dir of its own
// (MESH_SANDBOX_DIR), in a process group of its own as a terminal's job is (a Ctrl-C is then a
// signal to the whole group), its output kept for assertions, and the dir and the whole group
// removed after the test whether it passed or not.

import { spawn, type ChildProcessByStdio } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Readable } from 'node:stream';
import type { Defer } from './cleanup.ts';
import { ROOT } from './cli.ts';

export interface SandboxOptions {
  /** Run as this user (and group of the same id), owning the sandbox dir. */
  readonly uid?: number;
  /** What to add to this process's env, given the sandbox dir. */
  readonly env?: (dir: string) => NodeJS.ProcessEnv;
}

export interface Sandbox {
  /** The sandbox's tree (MESH_SANDBOX_DIR). */
  readonly dir: string;
  /** Its process group: the pid of `command`. */
  readonly group: number;
  readonly child: ChildProcessByStdio<null, Readable, Readable>;
  out(): string;
  err(): string;
  /** Both outputs, for a failure message. */
  context(): string;
  /** How `command` ended: its exit code, or the signal that ended it. */
  readonly exited: Promise<number | string>;
  /** Its stdout closed: the last of the group to hold the pipe (the agent) has ended. */
  readonly closed: Promise<void>;
}

/** Starts `command args...` from the repo's root with MESH_SANDBOX_DIR set to a new temp dir. */
export async function startSandbox(
  defer: Defer,
  command: string,
  args: readonly string[],
  options: SandboxOptions = {},
): Promise<Sandbox> {
  const { uid, env } = options;
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-sandbox-'));
  defer(() => fs.rm(dir, { recursive: true, force: true }));
  if (uid !== undefined) await fs.chown(dir, uid, uid);
  const child = spawn(command, args, {
    cwd: ROOT,
    detached: true,
    env: { ...process.env, MESH_SANDBOX_DIR: dir, ...env?.(dir) },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(uid === undefined ? {} : { uid, gid: uid }),
  });
  const group = child.pid!;
  defer(async () => {
    try {
      process.kill(-group, 'SIGKILL');
    } catch {
      // gone
    }
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | string>((resolve) =>
    child.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')),
  );
  const closed = new Promise<void>((resolve) => child.stdout.on('close', resolve));
  return {
    dir,
    group,
    child,
    out: () => out,
    err: () => err,
    context: () => `stdout:\n${out}\nstderr:\n${err}`,
    exited,
    closed,
  };
}

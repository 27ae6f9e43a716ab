// Running a command from a test: argv as given (no shell), so a name or address in it is never
// parsed as shell syntax.

import { spawnSync } from 'node:child_process';

export interface ShOptions {
  /** Written to the command's stdin. */
  readonly input?: string | Buffer;
  /** Killed after this long (default: no limit). */
  readonly timeoutMs?: number;
}

/** Runs argv and returns its stdout; throws with the command, its exit and its stderr when it fails. */
export function sh(argv: readonly string[], opts: ShOptions = {}): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', input: opts.input, timeout: opts.timeoutMs });
  if (r.status !== 0) {
    throw new Error(`${argv.join(' ')} failed (${r.status ?? r.signal}): ${r.stderr || r.error?.message}`);
  }
  return r.stdout;
}

/** Runs argv and returns its exit code and output (stdout, then stderr): for a command that may fail. */
export function shStatus(argv: readonly string[]): { code: number | null; out: string } {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  return { code: r.status, out: r.stdout + r.stderr };
}

// Spawn-to-exit wall time and the child's own user+sys CPU, measured by rusage-driver.py (wait4):
// Node's child_process reports no per-child rusage, and a `time` wrapper would add its own.

import { spawn, type ChildProcessByStdio } from 'node:child_process';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { createInterface, type Interface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export interface Job {
  readonly argv: readonly string[];
  readonly env: Record<string, string>;
  readonly input?: string;
}

export interface Measured {
  readonly code: number;
  readonly wallMs: number;
  readonly userMs: number;
  readonly sysMs: number;
  readonly stdout: string;
  readonly stderr: string;
}

export class RusageDriver {
  readonly #child: ChildProcessByStdio<Writable, Readable, null>;
  readonly #lines: Interface;
  readonly #waiting: ((line: string) => void)[] = [];

  constructor() {
    const script = path.join(path.dirname(fileURLToPath(import.meta.url)), 'rusage-driver.py');
    this.#child = spawn('/usr/bin/python3', [script], { stdio: ['pipe', 'pipe', 'inherit'] });
    this.#lines = createInterface({ input: this.#child.stdout });
    this.#lines.on('line', (l) => this.#waiting.shift()?.(l));
  }

  /** Starts every job at once; resolves when the last has exited. */
  async runAll(jobs: readonly Job[]): Promise<{ wallMs: number; results: Measured[] }> {
    const line = await new Promise<string>((resolve) => {
      this.#waiting.push(resolve);
      this.#child.stdin.write(
        JSON.stringify({ jobs: jobs.map((j) => ({ argv: j.argv, env: j.env, input: j.input ?? '' })) }) + '\n',
      );
    });
    const reply = JSON.parse(line) as { error?: string; wallMs: number; results: Measured[] };
    if (reply.error) throw new Error(`rusage driver: ${reply.error} (argv ${jobs[0]?.argv.join(' ')})`);
    return reply;
  }

  async run(job: Job): Promise<Measured> {
    return (await this.runAll([job])).results[0]!;
  }

  close(): void {
    this.#child.stdin.end();
    this.#lines.close();
  }
}

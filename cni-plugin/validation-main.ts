// mesh-validation: the pod's init container. Exit 0 when outbound traffic is redirected, 126
// (what the repair controller looks for, --repair-init-container-exit-code) when it is not, with
// the reason as the container's termination message. Bundled to dist/mesh-validation.cjs.

import { accessSync, constants, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { durationMs, MAX_TIMER_MS } from './shared/duration.ts';
import { PROBE_TIMEOUT_MS } from './redirect/constants.ts';
import { probe } from './validation.ts';

export const EXIT_NOT_REDIRECTED = 126;
const USAGE = `Usage: mesh-validation [--probe-timeout 5s] [--termination-log /dev/termination-log]
Checks, inside the pod network namespace, that outbound TCP is redirected by mesh-cni's rules.
Exit 0 if it is, ${EXIT_NOT_REDIRECTED} if not (the reason goes to the termination log and stderr).`;

export function parseDuration(v: string): number {
  const n = durationMs(v);
  if (n === null) throw new Error(`--probe-timeout ${JSON.stringify(v)}: expected a duration like 5s, 500ms or 1m30s`);
  if (n <= 0) throw new Error(`--probe-timeout ${JSON.stringify(v)}: must be positive`);
  // A longer timer fires at once (Node.js keeps 32 bits): the probe would fail a redirected pod.
  if (n > MAX_TIMER_MS) throw new Error(`--probe-timeout ${JSON.stringify(v)}: must be at most ${MAX_TIMER_MS}ms`);
  return n;
}

/** The kubelet mounts the termination log; we only write it when it is there and writable. */
function writeTermination(file: string, text: string): void {
  try {
    accessSync(file, constants.W_OK);
    writeFileSync(file, text);
  } catch {
    // not running under a kubelet
  }
}

async function main(): Promise<number> {
  let values: { 'probe-timeout'?: string; 'termination-log'?: string; help?: boolean };
  let timeoutMs: number;
  try {
    ({ values } = parseArgs({
      options: {
        'probe-timeout': { type: 'string' },
        'termination-log': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }));
    timeoutMs = values['probe-timeout'] === undefined ? PROBE_TIMEOUT_MS : parseDuration(values['probe-timeout']);
  } catch (e) {
    process.stderr.write(`mesh-validation: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  const terminationLog = values['termination-log'] ?? '/dev/termination-log';
  const r = await probe({ timeoutMs });
  if (r.ok) {
    process.stdout.write(`mesh-validation: redirect works: ${r.detail}\n`);
    return 0;
  }
  const msg = `mesh-validation: redirect check failed: ${r.detail}. mesh-cni did not set up this pod's redirect rules (node agent not ready when the pod started?); the pod must be recreated.`;
  writeTermination(terminationLog, msg);
  process.stderr.write(msg + '\n');
  return EXIT_NOT_REDIRECTED;
}

void main().then((code) => process.exit(code));

// The malloc settings the agent's memory figures depend on (docs/design.md "Memory"), where the
// shipped agent gets them: the DaemonSet's GLIBC_TUNABLES. glibc ignores a tunable it does not
// know without a word, so the value is checked as glibc itself reads it: the dynamic loader of
// this Node (the image carries the same glibc, scripts/image.sh) lists the tunables it took.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1DaemonSet } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { ROOT } from '../helpers/cli.ts';

/** The agent container's value of `name` in deploy/daemonset.yaml. */
async function daemonSetEnv(name: string): Promise<string | undefined> {
  const text = await readFile(path.join(ROOT, 'deploy/daemonset.yaml'), 'utf8');
  const ds = parseAllDocuments(text)
    .map((d) => d.toJS() as V1DaemonSet)
    .find((o) => o?.kind === 'DaemonSet')!;
  const agent = ds.spec!.template.spec!.containers.find((c) => c.name === 'install-cni')!;
  return agent.env?.find((e) => e.name === name)?.value;
}

/** The dynamic loader this Node runs with (mapped into this very process). */
function loader(): string {
  const m = /\s(\/\S*\/ld-linux[^/\s]*\.so[.\d]*)$/m.exec(readFileSync('/proc/self/maps', 'utf8'));
  assert.ok(m, 'no ld-linux mapped into this process: is Node linked statically?');
  return m[1]!;
}

/** The malloc tunables glibc takes from GLIBC_TUNABLES=`tunables` (none: unset), by name. */
function mallocTunables(tunables: string | undefined): Record<string, number> {
  const r = spawnSync(loader(), ['--list-tunables'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...(tunables === undefined ? {} : { GLIBC_TUNABLES: tunables }) },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  const taken: Record<string, number> = {};
  for (const m of r.stdout.matchAll(/^glibc\.malloc\.(\w+): (0x[\da-f]+|\d+) /gm)) taken[m[1]!] = Number(m[2]);
  return taken;
}

describe('the malloc settings of the shipped agent', () => {
  it("the DaemonSet's GLIBC_TUNABLES fix malloc's mmap and trim thresholds at 64 KiB, as glibc takes them", async () => {
    const tunables = await daemonSetEnv('GLIBC_TUNABLES');
    assert.ok(tunables !== undefined, 'the install-cni container sets no GLIBC_TUNABLES');
    const plain = mallocTunables(undefined);
    // 0: glibc's own default (a 128 KiB threshold that grows as large blocks are freed).
    assert.deepEqual([plain.mmap_threshold, plain.trim_threshold], [0, 0], 'plain glibc set them: proves nothing');
    const shipped = mallocTunables(tunables);
    assert.equal(
      shipped.mmap_threshold,
      64 * 1024,
      `glibc took mmap_threshold ${shipped.mmap_threshold} from ${tunables}`,
    );
    assert.equal(
      shipped.trim_threshold,
      64 * 1024,
      `glibc took trim_threshold ${shipped.trim_threshold} from ${tunables}`,
    );
  });
});

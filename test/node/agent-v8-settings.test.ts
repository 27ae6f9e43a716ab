// The V8 settings the agent's memory figures depend on (docs/design.md "Memory"), where the shipped
// agent gets them: the optimizing compilers off from the bundle's own entry (src/cmd/v8flags.ts),
// a 1 MiB young generation from the DaemonSet's NODE_OPTIONS. Each is checked in a real Node
// process, beside a control that shows the check can tell.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as esbuild from 'esbuild';
import type { V1DaemonSet } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { bundleOptions } from '../../scripts/bundle-options.ts';
import { ROOT } from '../helpers/cli.ts';

let dir = '';
before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-v8-settings-'));
});
after(() => rm(dir, { recursive: true, force: true }));

/**
 * Loaded with --import before the program: when the program exits, makes a function hot and asks
 * V8 to optimize it, and writes V8's status bits of it to OPT_OUT.
 */
const OPT_PROBE = `
import { writeFileSync } from 'node:fs';
const status = new Function('f', 'return %GetOptimizationStatus(f)');
const prepare = new Function('f', '%PrepareFunctionForOptimization(f)');
const optimize = new Function('f', '%OptimizeFunctionOnNextCall(f)');
process.on('exit', () => {
  const add = (a, b) => a + b;
  prepare(add);
  add(1, 2);
  add(3, 4);
  optimize(add);
  add(5, 6);
  writeFileSync(process.env.OPT_OUT, String(status(add)));
});
`;
/** V8's "optimized" status bit (Maglev or TurboFan code). */
const OPTIMIZED = 1 << 4;

/** V8's status bits of a function made hot at the exit of `args`. */
async function optimizationStatus(args: readonly string[]): Promise<number> {
  const probe = path.join(dir, 'opt-probe.mjs');
  const out = path.join(dir, 'opt.out');
  await writeFile(probe, OPT_PROBE);
  await writeFile(out, '');
  const r = spawnSync(process.execPath, ['--allow-natives-syntax', '--import', probe, ...args], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', OPT_OUT: out },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return Number(await readFile(out, 'utf8'));
}

/** The largest the young generation grew while `nodeOptions` churned through short-lived objects, in MiB. */
function youngGenerationMiB(nodeOptions: string): number {
  const churn = `
const v8 = require('node:v8');
let max = 0;
let keep = [];
for (let round = 0; round < 200; round++) {
  const a = [];
  for (let i = 0; i < 20000; i++) a.push({ i, s: 'x' + i });
  keep.push(a[round]);
  if (keep.length > 50) keep = keep.slice(-50);
  max = Math.max(max, v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size);
}
console.log(max / 1048576);`;
  const r = spawnSync(process.execPath, ['-e', churn], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', NODE_OPTIONS: nodeOptions },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return Number(r.stdout.trim());
}

/** The agent container's NODE_OPTIONS in deploy/daemonset.yaml. */
async function daemonSetNodeOptions(): Promise<string | undefined> {
  const text = await readFile(path.join(ROOT, 'deploy/daemonset.yaml'), 'utf8');
  const ds = parseAllDocuments(text)
    .map((d) => d.toJS() as V1DaemonSet)
    .find((o) => o?.kind === 'DaemonSet')!;
  const agent = ds.spec!.template.spec!.containers.find((c) => c.name === 'install-cni')!;
  return agent.env?.find((e) => e.name === 'NODE_OPTIONS')?.value;
}

describe('the V8 settings of the shipped agent', () => {
  it('its bundle runs with V8 not optimizing: no Maglev or TurboFan code, however hot a function', async () => {
    const bundle = path.join(dir, 'install-cni.js');
    await esbuild.build({
      ...bundleOptions('esm', { version: 'test', gitCommit: 'test', buildTime: new Date(0).toISOString() }),
      entryPoints: [path.join(ROOT, 'src/cmd/install-cni-main.ts')],
      outfile: bundle,
      absWorkingDir: ROOT,
      logLevel: 'error',
    });
    const control = await optimizationStatus(['-e', '0']);
    assert.ok(control & OPTIMIZED, `plain Node optimized it (status ${control.toString(2)}): else this proves nothing`);
    const agent = await optimizationStatus([bundle, 'version', '--short']);
    assert.equal(agent & OPTIMIZED, 0, `the agent's V8 optimized a hot function (status ${agent.toString(2)})`);
  });

  it("the DaemonSet's NODE_OPTIONS hold the young generation to a few MiB, as Node takes them", async () => {
    const options = await daemonSetNodeOptions();
    assert.ok(options !== undefined, 'the install-cni container sets no NODE_OPTIONS');
    assert.match(options, /(^| )--max-semi-space-size=1( |$)/);
    const plain = youngGenerationMiB('');
    assert.ok(plain >= 16, `plain Node's young generation grew to ${plain} MiB only: else this proves nothing`);
    // V8 sizes new space from the semi-space in steps: with 1 MiB it was seen between 3.25 and
    // 5.75 MiB here, against plain Node's 32. The bound tells the two apart, not the step.
    const shipped = youngGenerationMiB(options);
    assert.ok(shipped <= 8, `with ${options} the young generation grew to ${shipped} MiB`);
  });
});

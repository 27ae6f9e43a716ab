// The window between a primary CNI's rewrite and our next pass, and that
// --mesh-owned-cni-config closes it: the primary CNI
// rewrites its config 1,000 times (without our entry) while a reader in another thread keeps
// parsing the file the runtime would pick. With our entry spliced into the primary's file, some
// reads find it without our entry (a pod starting then would run without mesh-cni); with our
// own file sorting first, none does. Both modes run the same storm in this one test.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { rewriteStorm, type StormResult } from '../helpers/rewrite-storm.ts';
import { runtimeView } from '../helpers/runtime-view.ts';
import { installerArgs } from '../../src/partargs.ts';

const REWRITES = 1000;
// Thousands of passes: their log lines would only bury the result.
configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

/** /readyz samples taken every millisecond during the storm: how many said not ready, and why. */
interface Readiness {
  samples: number;
  notReady: number;
  reasons: Set<string>;
}

async function storm(owned: boolean, opts: { rewrites?: number; readiness?: Readiness } = {}): Promise<StormResult> {
  const rewrites = opts.rewrites ?? REWRITES;
  const tree = await makeHostTree();
  const primary = '10-bridge.conflist';
  await fs.writeFile(path.join(tree.netDir, primary), BRIDGE_CONFLIST);
  const settings = buildSettings(
    { ...tree.flags, 'reconcile-interval': '1h', 'mesh-owned-cni-config': String(owned) },
    tree.env,
  );
  const installer = new Installer(installerArgs(settings), {
    decideCleanup: async () => ({ cleanup: true, why: 'test' }),
  });
  try {
    await installer.start();
    await installer.settled();
    assert.deepEqual(installer.notReadyReasons(), []);
    const last = `"x-generation": ${rewrites - 1},`;
    const r = opts.readiness;
    const sampler = r
      ? setInterval(() => {
          const reasons = installer.notReadyReasons();
          r.samples++;
          if (reasons.length > 0) r.notReady++;
          for (const m of reasons) r.reasons.add(m.replace(/\d+/g, 'N'));
        }, 1)
      : null;
    try {
      return await rewriteStorm(tree.netDir, primary, BRIDGE_CONFLIST, {
        rewrites,
        settled: async () => {
          // Caught up: the file the runtime reads has our entry and the last generation.
          await eventually(
            () => {
              const v = runtimeView(tree.netDir);
              return v.entries === 1 && readFileSync(path.join(tree.netDir, v.file!), 'utf8').includes(last);
            },
            'the installer caught up with the last rewrite',
            10_000,
          );
          await installer.settled();
        },
      });
    } finally {
      if (sampler) clearInterval(sampler);
    }
  } finally {
    await installer.stop('SIGTERM');
    await tree.remove();
  }
}

describe('a primary CNI rewriting its config 1,000 times', () => {
  it("owned mode: no read of the runtime's file without our entry; spliced mode: some", async (t) => {
    const spliced = await storm(false);
    const owned = await storm(true);
    t.diagnostic(
      `spliced: ${spliced.missing} of ${spliced.reads} reads without our entry ${JSON.stringify(spliced.chains)}`,
    );
    t.diagnostic(`owned:   ${owned.missing} of ${owned.reads} reads without our entry`);
    // The reader ran through the storm in both modes.
    assert.ok(
      owned.reads >= REWRITES && spliced.reads >= REWRITES,
      `reads: owned ${owned.reads}, spliced ${spliced.reads}`,
    );
    assert.equal(
      owned.missing,
      0,
      `owned mode: ${owned.missing} reads found no entry of ours: ${JSON.stringify(owned.chains)}`,
    );
    assert.equal(owned.none, 0);
    // The window the owned file closes: with the splice, reads find the primary's own chain.
    assert.ok(spliced.missing > 0, 'spliced mode: expected reads without our entry while the primary is rewritten');
  });
});

describe('readiness through a rewrite storm (owned mode)', () => {
  it("stays ready while the runtime's file always has our entry: a write dropped because the primary changed under it is retried, not a reason", async (t) => {
    const readiness: Readiness = { samples: 0, notReady: 0, reasons: new Set() };
    const owned = await storm(true, { rewrites: 300, readiness });
    t.diagnostic(
      `readiness: ${readiness.notReady} of ${readiness.samples} samples not ready ${JSON.stringify([...readiness.reasons])}`,
    );
    assert.equal(owned.missing, 0);
    assert.ok(readiness.samples >= 100, `only ${readiness.samples} samples`);
    assert.equal(
      readiness.notReady,
      0,
      `not ready in ${readiness.notReady} of ${readiness.samples} samples: ${JSON.stringify([...readiness.reasons])}`,
    );
  });
});

// The agent installs a Bun-built plugin only on a CPU that can run it (docs/design.md "Start-up
// time"): Bun's x86-64 executables need SSE4.2, and on an older CPU every pod start would fail with
// SIGILL. The executables are real (a Bun build of an empty script, Debian's Go `bridge` for a
// build that is not Bun's); the CPU is a cpuinfo file given through the settings object.

import assert from 'node:assert/strict';
import { copyFileSync, existsSync, linkSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { builtByBun, cpuinfoHasFlag, elfSectionNames } from '../../src/install/cpucheck.ts';
import { Installer } from '../../src/install/installer.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { buildExecutable } from '../../scripts/plugin-runtime.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { ROOT } from '../helpers/cli.ts';
import { installerArgs } from '../../src/partargs.ts';

const quiet = buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels;
configureLogging({ asJson: true, outputLevels: quiet }, { write: () => {} });

// Two processors, as /proc/cpuinfo lists them; `old` lacks sse4_2 on one of them only.
const cpu = (flags: string) => `processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse sse2 ${flags}\n\n`;
const WITH = cpu('ssse3 sse4_1 sse4_2 popcnt') + cpu('ssse3 sse4_1 sse4_2 popcnt').replace(': 0', ': 1');
const WITHOUT = cpu('ssse3 sse4_1 sse4_2 popcnt') + cpu('ssse3 sse4_1').replace(': 0', ': 1');

const work = mkdtempSync(path.join(os.tmpdir(), 'mcni-cpucheck-'));
const bunExe = path.join(work, 'bun-empty');
const notBun = '/usr/lib/cni/bridge';
before(() => {
  const script = path.join(work, 'empty.cjs');
  writeFileSync(script, 'process.exit(0);\n');
  buildExecutable({ root: ROOT, main: script, out: bunExe, runtime: 'bun', seaMode: 'codecache' });
});
after(() => rmSync(work, { recursive: true, force: true }));

const running: { installer: Installer; tree: HostTree }[] = [];
afterEach(async () => {
  for (const { installer, tree } of running.splice(0)) {
    await installer.stop('SIGTERM').catch(() => {});
    await tree.remove();
  }
});

async function errorsMetric(reason: string): Promise<number> {
  const name = `mesh_cni_install_errors_total{reason="${reason}"} `;
  const line = (await registry.metrics()).split('\n').find((l) => l.startsWith(name));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

/** An installer whose image holds `plugin` as its mesh-cni, on a CPU described by `cpuinfo` (null: no such file). */
async function install(plugin: string, cpuinfo: string | null) {
  const tree = await makeHostTree();
  await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  const src = path.join(tree.binariesDir, 'mesh-cni');
  await fs.rm(src);
  // A link where the file system allows (the Bun build is ~100 MB), else a copy.
  try {
    linkSync(plugin, src);
  } catch {
    copyFileSync(plugin, src);
  }
  const cpuinfoPath = path.join(tree.root, 'cpuinfo');
  if (cpuinfo !== null) writeFileSync(cpuinfoPath, cpuinfo);
  const settings = buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env);
  const installer = new Installer(installerArgs({ ...settings, install: { ...settings.install, cpuinfoPath } }), {
    decideCleanup: async () => ({ cleanup: true, why: 'test' }),
  });
  running.push({ installer, tree });
  await installer.start();
  await installer.settled();
  const installed = existsSync(path.join(tree.binDir, 'mesh-cni'));
  const entry = (await fs.readFile(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')).includes('mesh-cni');
  return { installer, tree, installed, entry };
}

describe('a Bun-built plugin and the CPU', () => {
  it('no SSE4.2 on one processor: not installed, not ready naming the fix, binaries_failed counted', async () => {
    const before = await errorsMetric('binaries_failed');
    const { installer, installed, entry } = await install(bunExe, WITHOUT);
    assert.equal(installed, false, 'the Bun-built plugin was installed on a CPU without SSE4.2');
    assert.equal(entry, false, 'our entry was added though the plugin cannot run');
    const why = installer.notReadyReasons().join('\n');
    assert.match(why, /built with Bun, which needs a CPU with SSE4\.2/);
    assert.match(why, /no sse4_2 flag/);
    assert.match(why, /MESH_PLUGIN_RUNTIME=node-sea/);
    assert.ok((await errorsMetric('binaries_failed')) > before, 'no error counted');
  });

  it('a cpuinfo that cannot be read: not installed (fail closed), saying which file', async () => {
    const { installer, installed } = await install(bunExe, null);
    assert.equal(installed, false);
    assert.match(installer.notReadyReasons().join('\n'), /cpuinfo cannot be read to tell .*node-sea/);
  });

  it('SSE4.2 on every processor: installed and ready', async () => {
    const { installer, installed, entry } = await install(bunExe, WITH);
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.equal(installed, true);
    assert.equal(entry, true);
  });

  it('a plugin not built by Bun is installed whatever the CPU', async () => {
    const { installer, installed } = await install(notBun, WITHOUT);
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.equal(installed, true);
  });
});

describe('cpucheck parts', () => {
  it('tells a Bun build from another ELF and from files that are no ELF', async () => {
    const junk = path.join(work, 'junk');
    const truncated = path.join(work, 'truncated');
    writeFileSync(junk, '#!/bin/sh\necho hi\n');
    // An ELF header whose section table lies past the file's end.
    const h = Buffer.alloc(64);
    h.write('\x7fELF', 0, 'latin1');
    h[4] = 2;
    h[5] = 1;
    h.writeBigUInt64LE(1n << 40n, 0x28);
    h.writeUInt16LE(64, 0x3a);
    h.writeUInt16LE(3, 0x3c);
    h.writeUInt16LE(2, 0x3e);
    writeFileSync(truncated, h);
    const bun = async (f: string) => {
      const fh = await fs.open(f);
      try {
        return await builtByBun(fh, (await fh.stat()).size);
      } finally {
        await fh.close();
      }
    };
    assert.equal(await bun(bunExe), true);
    assert.equal(await bun(notBun), false);
    assert.equal(await bun(junk), false);
    assert.equal(await bun(truncated), false);
    const fh = await fs.open(notBun);
    try {
      assert.ok((await elfSectionNames(fh, (await fh.stat()).size))?.includes('.text'));
    } finally {
      await fh.close();
    }
  });

  it('cpuinfoHasFlag: every processor must list it', () => {
    assert.equal(cpuinfoHasFlag(WITH, 'sse4_2'), 'yes');
    assert.equal(cpuinfoHasFlag(WITHOUT, 'sse4_2'), 'no');
    assert.equal(cpuinfoHasFlag(cpu('sse4_2x'), 'sse4_2'), 'no', 'a longer flag name is not the flag');
    assert.equal(cpuinfoHasFlag('processor\t: 0\nFeatures\t: fp asimd\n', 'sse4_2'), 'unknown');
  });
});

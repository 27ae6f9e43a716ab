// The agent compares the installed plugin with the image's at its start, before the installer
// runs (binaries.ts checkInstalledBinaries), and the installer's first pass takes what it found:
// trusted only at the stat identities it was found at, so a binary changed after the check is
// compared again and put back, never taken for the one checked.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { checkInstalledBinaries } from '../../src/install/binaries.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor, type HostTree } from '../helpers/hosttree.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const defer = cleanupAfterEach();
const MB = 1024 * 1024;

/** A host tree whose bin dir already holds the plugin (as after an earlier run): `bytes` both. */
async function installedTree(bytes: Buffer): Promise<{ tree: HostTree; src: string; dest: string }> {
  const tree = await makeHostTreeFor(defer);
  const src = path.join(tree.binariesDir, 'mesh-cni');
  const dest = path.join(tree.binDir, 'mesh-cni');
  await fs.writeFile(src, bytes, { mode: 0o755 });
  await fs.writeFile(dest, bytes, { mode: 0o755 });
  await fs.chmod(dest, 0o755);
  await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  return { tree, src, dest };
}

async function firstPass(tree: HostTree, binaryCheck: ReturnType<typeof checkInstalledBinaries>): Promise<Installer> {
  const installer = new Installer(
    installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
    {
      decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      binaryCheck,
    },
  );
  defer(() => installer.stop('SIGTERM'));
  await installer.start();
  await installer.settled();
  return installer;
}

describe('the installed binaries checked at the agent start', () => {
  it('a check that found the installed binary right stands for the first pass: it reads it no more', async () => {
    const { tree, src, dest } = await installedTree(randomBytes(3 * MB + 123));
    const check = checkInstalledBinaries(tree.binariesDir, tree.binDir);
    assert.equal((await check).reads, 1, 'the check compared the installed binary');
    assert.ok((await check).known.has(dest));
    const ino = statSync(dest).ino;
    const installer = await firstPass(tree, check);
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.equal(installer.binaryCompares, 0, 'the pass read the installed binary again');
    assert.equal(statSync(dest).ino, ino, 'and it was not written again');
    assert.ok(readFileSync(dest).equals(readFileSync(src)));
  });

  it('a binary changed after the check (same size) is compared again and put back', async () => {
    const bytes = randomBytes(3 * MB);
    const { tree, src, dest } = await installedTree(bytes);
    const check = checkInstalledBinaries(tree.binariesDir, tree.binDir);
    assert.ok((await check).known.has(dest));
    const changed = Buffer.from(bytes);
    changed[2 * MB + 7] = changed[2 * MB + 7]! ^ 0xff;
    await fs.writeFile(dest, changed);
    const installer = await firstPass(tree, check);
    assert.equal(installer.binaryCompares, 1, 'the changed binary was not compared again');
    assert.ok(readFileSync(dest).equals(readFileSync(src)), 'the changed binary was left in place');
    assert.deepEqual(installer.notReadyReasons(), []);
  });

  it('finds a difference in any chunk of the comparison, the first, a boundary, the short last', async () => {
    const size = 2 * MB + 4096;
    for (const at of [0, MB - 1, MB, 2 * MB, size - 1]) {
      const bytes = randomBytes(size);
      const { tree, dest } = await installedTree(bytes);
      const changed = Buffer.from(bytes);
      changed[at] = changed[at]! ^ 0x01;
      await fs.writeFile(dest, changed);
      const checked = await checkInstalledBinaries(tree.binariesDir, tree.binDir);
      assert.equal(checked.reads, 1, `byte ${at}: not compared`);
      assert.equal(checked.known.has(dest), false, `byte ${at} differs, yet the binary was taken as installed`);
    }
  });

  it('a check of a bin dir without the binary, or without a source, knows nothing and throws nothing', async () => {
    const { tree, src, dest } = await installedTree(randomBytes(4096));
    await fs.rm(dest);
    assert.equal((await checkInstalledBinaries(tree.binariesDir, tree.binDir)).known.size, 0);
    await fs.rm(src);
    assert.equal((await checkInstalledBinaries(tree.binariesDir, tree.binDir)).known.size, 0);
  });
});

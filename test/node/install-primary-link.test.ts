// A symlinked primary is edited where its link points (the primary CNI keeps its
// config there and updates it there). That directory is watched too, as long as that primary is
// the one we follow: a rewrite of the target is seen at once, not by the periodic pass.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);
after(() => configureLogging({ asJson: false, outputLevels: buildSettings({}, {}).logging.outputLevels }));

const defer = cleanupAfterEach();

const plugins = (f: string) =>
  (JSON.parse(readFileSync(f, 'utf8')) as { plugins: { type: string }[] }).plugins.map((p) => p.type);
const hasOurs = (f: string) => {
  try {
    return plugins(f).includes('mesh-cni');
  } catch {
    return false;
  }
};

/** The primary CNI's rewrite of its own file: a temp file beside it renamed over it. */
async function rewriteByRename(file: string, text: string): Promise<void> {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.vendor-tmp`);
  await fs.writeFile(tmp, text);
  await fs.rename(tmp, file);
}

/** The installer on a tree whose primary is a link to vendor-a/10-bridge.conflist, outside the net dir. */
async function linkedPrimary(): Promise<{
  installer: Installer;
  tree: HostTree;
  link: string;
  vendor: (d: string) => string;
}> {
  const tree = await makeHostTree();
  defer(() => tree.remove());
  const vendor = (d: string) => path.join(tree.root, 'host/var/lib', d);
  for (const d of ['vendor-a', 'vendor-b']) {
    await fs.mkdir(vendor(d), { recursive: true });
    await fs.writeFile(path.join(vendor(d), '10-bridge.conflist'), BRIDGE_CONFLIST);
  }
  const link = path.join(tree.netDir, '10-bridge.conflist');
  await fs.symlink(path.join(vendor('vendor-a'), '10-bridge.conflist'), link);
  // The periodic pass is a minute away: only a watch can bring our entry back within seconds.
  const installer = new Installer(
    installerArgs(buildSettings({ ...tree.flags, 'reconcile-interval': '60s' }, tree.env)),
    {
      decideCleanup: async () => ({ cleanup: false, why: 'test' }),
    },
  );
  defer(() => installer.stop('SIGTERM'));
  await installer.start();
  await installer.settled();
  assert.deepEqual(installer.notReadyReasons(), []);
  return { installer, tree, link, vendor };
}

describe("a symlinked primary's target directory", () => {
  it('is watched: a rewrite of the target by rename gets our entry back at once', async () => {
    const { link, vendor } = await linkedPrimary();
    const target = path.join(vendor('vendor-a'), '10-bridge.conflist');
    assert.ok(hasOurs(target));
    assert.ok((await fs.lstat(link)).isSymbolicLink());
    await rewriteByRename(target, BRIDGE_CONFLIST.replace('bridge-net', 'bridge-net-2'));
    assert.ok(!hasOurs(target), "the primary CNI's rewrite took our entry out");
    await eventually(() => hasOurs(target), 'our entry back in the target', 3000);
    assert.match(readFileSync(target, 'utf8'), /bridge-net-2/);
    assert.ok((await fs.lstat(link)).isSymbolicLink(), 'still a link');
  });

  it('follows the link to its new target, and stops watching the old one', async () => {
    const { installer, link, vendor } = await linkedPrimary();
    // The primary CNI points its link at another directory (the net dir's watch sees that).
    const tmpLink = `${link}.vendor-tmp`;
    await fs.symlink(path.join(vendor('vendor-b'), '10-bridge.conflist'), tmpLink);
    await fs.rename(tmpLink, link);
    const newTarget = path.join(vendor('vendor-b'), '10-bridge.conflist');
    await eventually(() => hasOurs(newTarget), 'our entry in the new target', 3000);
    await installer.settled();
    await rewriteByRename(newTarget, BRIDGE_CONFLIST.replace('bridge-net', 'bridge-net-3'));
    await eventually(() => hasOurs(newTarget), 'our entry back in the new target', 3000);
    await installer.settled();

    // The old directory is no longer the primary's: changes there bring no pass.
    const passes = (installer.status() as { reconciles: number }).reconciles;
    for (let i = 0; i < 5; i++)
      await rewriteByRename(
        path.join(vendor('vendor-a'), '10-bridge.conflist'),
        BRIDGE_CONFLIST.replace('bridge-net', `old-${i}`),
      );
    await new Promise((r) => setTimeout(r, 300));
    await installer.settled();
    assert.equal(
      (installer.status() as { reconciles: number }).reconciles,
      passes,
      "a change in the old target's directory ran a pass",
    );

    // A primary that is a regular file again: nothing outside the net dir is watched.
    await fs.rm(link);
    await fs.writeFile(link, BRIDGE_CONFLIST);
    await eventually(() => hasOurs(link), 'our entry in the plain primary', 3000);
    await installer.settled();
    const after = (installer.status() as { reconciles: number }).reconciles;
    await rewriteByRename(newTarget, BRIDGE_CONFLIST.replace('bridge-net', 'bridge-net-4'));
    await new Promise((r) => setTimeout(r, 300));
    await installer.settled();
    assert.equal(
      (installer.status() as { reconciles: number }).reconciles,
      after,
      "a change in the former target's directory ran a pass",
    );
  });
});

// Config names that are links: a primary linked to another config in the net dir, and two names
// linked to one file. The planner reads each name, the applier writes each file: a file must
// get our entry, or lose it, once per pass and keep it pass after pass, each case against an
// InstallPass on a real temp dir.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { InstallPass } from '../../src/install/pass.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor, type HostTree } from '../helpers/hosttree.ts';
import { runtimeView } from '../helpers/runtime-view.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';

const defer = cleanupAfterEach();

const tree = (): Promise<HostTree> => makeHostTreeFor(defer);

describe('a primary that is a link to another config file in the net dir', () => {
  it('keeps our entry in the file the link reads, pass after pass (not taken out of it under its own name)', async () => {
    const t = await tree();
    // The runtime reads 01-alias.conflist (first by name), which is 10-bridge.conflist's bytes.
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await fs.symlink('10-bridge.conflist', path.join(t.netDir, '01-alias.conflist'));
    const s = buildSettings(t.flags, t.env);
    const r = new InstallPass(s.install, s.env);
    for (let pass = 1; pass <= 3; pass++) {
      const out = await r.run();
      assert.deepEqual(out.notReady, [], `pass ${pass}: ready`);
      assert.equal(out.primary, '01-alias.conflist');
      assert.deepEqual(
        runtimeView(t.netDir),
        { file: '01-alias.conflist', entries: 1, chain: ['bridge', 'mesh-cni'] },
        `pass ${pass}: the runtime reads our entry`,
      );
      assert.ok((await fs.lstat(path.join(t.netDir, '01-alias.conflist'))).isSymbolicLink(), 'the link stays');
    }
  });
});

describe('two config names linked to one file outside the net dir', () => {
  it('the one the runtime reads keeps our entry; the other is not taken out of it', async () => {
    const t = await tree();
    const real = path.join(t.root, 'primary-cni');
    await fs.mkdir(real, { mode: 0o755 });
    await fs.writeFile(path.join(real, 'net.conflist'), BRIDGE_CONFLIST);
    await fs.symlink(path.join(real, 'net.conflist'), path.join(t.netDir, '05-net.conflist'));
    await fs.symlink(path.join(real, 'net.conflist'), path.join(t.netDir, '10-net.conflist'));
    const s = buildSettings(t.flags, t.env);
    const r = new InstallPass(s.install, s.env);
    for (let pass = 1; pass <= 3; pass++) {
      const out = await r.run();
      assert.deepEqual(out.notReady, [], `pass ${pass}: ready`);
      assert.deepEqual(
        runtimeView(t.netDir),
        { file: '05-net.conflist', entries: 1, chain: ['bridge', 'mesh-cni'] },
        `pass ${pass}: the runtime reads our entry`,
      );
    }
  });
});

describe('two config names linked to one file that holds a stale entry of ours', () => {
  it('our entry comes out of it once, in one pass, with no error (the second name reads it already without)', async () => {
    const t = await tree();
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const real = path.join(t.root, 'old-cni');
    await fs.mkdir(real, { mode: 0o755 });
    const stale = JSON.parse(BRIDGE_CONFLIST) as { plugins: object[] };
    stale.plugins.push({ type: 'mesh-cni' });
    await fs.writeFile(path.join(real, 'old.conflist'), JSON.stringify(stale, null, 2));
    await fs.symlink(path.join(real, 'old.conflist'), path.join(t.netDir, '20-old.conflist'));
    await fs.symlink(path.join(real, 'old.conflist'), path.join(t.netDir, '30-old.conflist'));
    const s = buildSettings(t.flags, t.env);
    const r = new InstallPass(s.install, s.env);
    const out = await r.run();
    assert.deepEqual(out.problems, []);
    assert.deepEqual(out.notReady, []);
    assert.deepEqual(runtimeView(t.netDir), { file: '10-bridge.conflist', entries: 1, chain: ['bridge', 'mesh-cni'] });
    assert.doesNotMatch(await fs.readFile(path.join(real, 'old.conflist'), 'utf8'), /mesh-cni/);
  });

  it('uninstall: our entry out of it once, no step said undone', async () => {
    const t = await tree();
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const real = path.join(t.root, 'old-cni');
    await fs.mkdir(real, { mode: 0o755 });
    const stale = JSON.parse(BRIDGE_CONFLIST) as { plugins: object[] };
    stale.plugins.push({ type: 'mesh-cni' });
    await fs.writeFile(path.join(real, 'old.conflist'), JSON.stringify(stale, null, 2));
    await fs.symlink(path.join(real, 'old.conflist'), path.join(t.netDir, '20-old.conflist'));
    await fs.symlink(path.join(real, 'old.conflist'), path.join(t.netDir, '30-old.conflist'));
    const s = buildSettings(t.flags, t.env);
    await new InstallPass(s.install, s.env).cleanup();
    assert.doesNotMatch(await fs.readFile(path.join(real, 'old.conflist'), 'utf8'), /mesh-cni/);
    assert.ok((await fs.lstat(path.join(t.netDir, '30-old.conflist'))).isSymbolicLink(), 'the links stay');
  });
});

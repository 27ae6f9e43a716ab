// --mesh-owned-cni-config under the faults the splice's suites (install-faults, install-agent,
// install-installer) put the default mode through: our owned file deleted or edited by someone
// else, the agent SIGKILLed while it writes, the net dir deleted and recreated. Each time the
// file the runtime reads must come back to ours, with our entry, and the primary's file must
// never be edited.

import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { withoutOurEntry } from '../../src/install/cniconfig.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { runtimeView } from '../helpers/runtime-view.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);
after(() => configureLogging({ asJson: false, outputLevels: buildSettings({}, {}).logging.outputLevels }));

const OWNED = '02-mesh-cni.conflist';
const PRIMARY = '10-bridge.conflist';
const defer = cleanupAfterEach();

async function tree(): Promise<HostTree> {
  const t = await makeHostTree();
  defer(() => t.remove());
  await fs.writeFile(path.join(t.netDir, PRIMARY), BRIDGE_CONFLIST);
  return t;
}

/** An installer with watches but no periodic pass: only the events bring a change back. */
async function installer(t: HostTree): Promise<Installer> {
  const i = new Installer(
    installerArgs(buildSettings({ 'reconcile-interval': '1h', ...t.flags, 'mesh-owned-cni-config': 'true' }, t.env)),
    { decideCleanup: async () => ({ cleanup: true, why: 'test' }) },
  );
  defer(() => i.stop('SIGTERM'));
  await i.start();
  await i.settled();
  assert.deepEqual(i.notReadyReasons(), []);
  assert.deepEqual(runtimeView(t.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
  return i;
}

const oursBack = (t: HostTree, what: string) =>
  eventually(() => {
    const v = runtimeView(t.netDir);
    return v.file === OWNED && v.entries === 1;
  }, what);

describe('owned config under faults', () => {
  it('our owned file deleted by someone: made again through the watch, the primary untouched', async () => {
    const t = await tree();
    const i = await installer(t);
    const ours = readFileSync(path.join(t.netDir, OWNED), 'utf8');
    await fs.rm(path.join(t.netDir, OWNED));
    await oursBack(t, 'ours made again after it was deleted');
    await i.settled();
    assert.equal(readFileSync(path.join(t.netDir, OWNED), 'utf8'), ours);
    assert.deepEqual(i.notReadyReasons(), []);
    assert.equal(readFileSync(path.join(t.netDir, PRIMARY), 'utf8'), BRIDGE_CONFLIST);
  });

  it("our owned file edited to drop our entry (leaving the primary's network): made ours again, not refused", async () => {
    const t = await tree();
    const i = await installer(t);
    const file = path.join(t.netDir, OWNED);
    const ours = readFileSync(file, 'utf8');
    await fs.writeFile(file, withoutOurEntry(ours, OWNED)!);
    await oursBack(t, 'our entry back in ours after it was edited out');
    await i.settled();
    assert.equal(readFileSync(file, 'utf8'), ours);
    assert.deepEqual(i.notReadyReasons(), []);
    assert.equal(readFileSync(path.join(t.netDir, PRIMARY), 'utf8'), BRIDGE_CONFLIST);
  });

  it('our owned file edited keeping our entry (a plugin added), or its mode opened: made again as it should be', async () => {
    const t = await tree();
    const i = await installer(t);
    const file = path.join(t.netDir, OWNED);
    const ours = readFileSync(file, 'utf8');
    const edited = JSON.parse(ours) as { plugins: unknown[] };
    edited.plugins.splice(1, 0, { type: 'tuning' });
    await fs.writeFile(file, JSON.stringify(edited));
    await eventually(() => readFileSync(file, 'utf8') === ours, 'ours made again after an edit');
    await fs.chmod(file, 0o644);
    await eventually(() => (statSync(file).mode & 0o777) === 0o600, 'mode back through the watch', 3000);
    assert.deepEqual(i.notReadyReasons(), []);
    assert.equal(readFileSync(path.join(t.netDir, PRIMARY), 'utf8'), BRIDGE_CONFLIST);
  });

  it('the net dir deleted and recreated: ours made again, and the new watch works', async () => {
    const t = await tree();
    const i = await installer(t);
    await fs.rm(t.netDir, { recursive: true, maxRetries: 20, retryDelay: 10 });
    i.schedule('periodic');
    await i.settled();
    assert.match(i.notReadyReasons().join('\n'), /does not exist/);
    await fs.mkdir(t.netDir);
    await fs.writeFile(path.join(t.netDir, PRIMARY), BRIDGE_CONFLIST);
    i.schedule('periodic'); // a pass notices the new dir and re-arms the watch
    await eventually(() => i.notReadyReasons().length === 0, 'ready again');
    assert.deepEqual(runtimeView(t.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
    // The new watch: ours deleted again comes back without a periodic pass.
    await fs.rm(path.join(t.netDir, OWNED));
    await oursBack(t, 'ours made again through the new watch');
    assert.equal(readFileSync(path.join(t.netDir, PRIMARY), 'utf8'), BRIDGE_CONFLIST);
  });

  it('SIGKILL at any moment leaves only whole files, the primary never edited; a restart finishes the job', async () => {
    const t = await tree();
    const primary = path.join(t.netDir, PRIMARY);
    for (let round = 0; round < 6; round++) {
      const a: AgentProcess = spawnAgent(t, { 'mesh-owned-cni-config': 'true' });
      defer(() => a.stop('SIGKILL'));
      await a.waitForLog(
        (r) => r.msg === 'mesh-cni is installed and ready' || (r.msg === 'wrote' && r.kind === 'cni_config'),
        'installed',
      );
      // The primary CNI keeps rewriting its file (another network each time) while we make ours
      // from it again; the kill lands somewhere in the middle.
      const stopAt = Date.now() + 5 + round * 7;
      let n = 0;
      while (Date.now() < stopAt) {
        await fs.writeFile(`${primary}.new`, BRIDGE_CONFLIST.replace('mcni-br0', `mcni-br${n++ % 10}`));
        await fs.rename(`${primary}.new`, primary);
      }
      assert.equal(await a.stop('SIGKILL'), 'SIGKILL');
      for (const name of await fs.readdir(t.netDir)) {
        if (/\.(conf|conflist|json)$/.test(name)) {
          assert.doesNotThrow(
            () => JSON.parse(readFileSync(path.join(t.netDir, name), 'utf8')),
            `${name} is whole after SIGKILL in round ${round}`,
          );
        }
      }
      assert.doesNotMatch(readFileSync(primary, 'utf8'), /mesh-cni/, `the primary was edited in round ${round}`);
      // The record beside ours is whole too: a name, or not there yet.
      const record = await fs.readFile(path.join(t.netDir, `.${OWNED}.mesh-from`), 'utf8').catch(() => `${PRIMARY}\n`);
      assert.equal(record, `${PRIMARY}\n`, `record in round ${round}`);
      const v = runtimeView(t.netDir);
      assert.ok(
        v.file === PRIMARY || (v.file === OWNED && v.entries === 1),
        `round ${round}: the runtime reads ${JSON.stringify(v)}`,
      );
    }
    const a = spawnAgent(t, { 'mesh-owned-cni-config': 'true' });
    defer(() => a.stop('SIGKILL'));
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready after the kills');
    const last = readFileSync(primary, 'utf8');
    await eventually(() => {
      const ours = readFileSync(path.join(t.netDir, OWNED), 'utf8');
      return withoutOurEntry(ours, OWNED) === last;
    }, 'ours made from the primary as the primary CNI last wrote it');
    assert.deepEqual(
      (await fs.readdir(t.netDir)).filter((n) => n.includes('.mesh-tmp-')),
      [],
      'temp files of killed runs removed',
    );
    assert.equal(await a.stop('SIGTERM'), 0);
    assert.equal(readFileSync(primary, 'utf8'), last, 'the primary as the primary CNI last wrote it');
    assert.deepEqual(
      (await fs.readdir(t.netDir)).filter((n) => n.includes(OWNED)),
      [],
      'uninstall removed ours and its record',
    );
  });
});

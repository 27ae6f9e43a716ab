// The installer under churn: a pass brought by a watch event reads only what changed (a dir of
// many config files is not read again and again), bursts of changes are paced without losing the
// last one, and a verifying pass catches what a missed event would have hidden.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { FileCache } from '../../src/install/filecache.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const hasEntry = (file: string) => readFileSync(file, 'utf8').includes('"mesh-cni"');
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('installer under churn', () => {
  it('a pass brought by an event reads the changed file, not every config file again', async () => {
    const tree = await makeHostTree();
    // strictatime: every read of a file moves its atime.
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'strictatime,size=16m,mode=0755', 'mcni-test', tree.netDir]);
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      },
    );
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      const others = Array.from({ length: 200 }, (_, i) => path.join(tree.netDir, `50-other-${i}.conflist`));
      for (const f of others) await fs.writeFile(f, BRIDGE_CONFLIST.replace('bridge-net', path.basename(f)));
      await installer.start();
      await installer.settled();
      assert.deepEqual(installer.notReadyReasons(), []);
      await pause(20);
      const seen = others.map((f) => statSync(f, { bigint: true }).atimeNs);
      const churned = path.join(tree.netDir, '20-churn.conflist');
      for (let i = 0; i < 20; i++) {
        await fs.writeFile(churned, BRIDGE_CONFLIST.replace('bridge-net', `churn-${i}`));
        await pause(2);
      }
      await pause(50);
      await installer.settled();
      const reread = others.filter((f, i) => statSync(f, { bigint: true }).atimeNs !== seen[i]);
      assert.deepEqual(
        reread.map((f) => path.basename(f)),
        [],
        'config files read again with no change to them',
      );
      // The primary, rewritten without our entry, still has it back.
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await eventually(() => hasEntry(path.join(tree.netDir, '10-bridge.conflist')), 'our entry back');
    } finally {
      await installer.stop('SIGTERM').catch(() => {});
      execFileSync('umount', [tree.netDir], { stdio: 'pipe' });
      await tree.remove();
    }
  });

  it("the watch events of our own writes bring no pass; another writer's do", async () => {
    const tree = await makeHostTree();
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      },
    );
    try {
      const primary = path.join(tree.netDir, '10-bridge.conflist');
      await fs.writeFile(primary, BRIDGE_CONFLIST);
      await installer.start();
      await installer.settled();
      await pause(100);
      await installer.settled();
      // The start-up pass wrote the binary, the orchconfig and the primary: one pass, no more.
      assert.equal(installer.status().reconciles, 1);
      await fs.writeFile(primary, BRIDGE_CONFLIST);
      await eventually(() => hasEntry(primary), 'our entry back');
      await pause(100);
      await installer.settled();
      const after = installer.status().reconciles as number;
      assert.ok(after >= 2 && after <= 4, `passes after one foreign rewrite and our repair: ${after}`);
    } finally {
      await installer.stop('SIGTERM').catch(() => {});
      await tree.remove();
    }
  });

  it('a burst of rewrites of the primary ends with our entry in it: the last change gets a pass', async () => {
    const tree = await makeHostTree();
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      },
    );
    try {
      const primary = path.join(tree.netDir, '10-bridge.conflist');
      await fs.writeFile(primary, BRIDGE_CONFLIST);
      await installer.start();
      await installer.settled();
      for (let round = 0; round < 5; round++) {
        // As fast as the file system takes it, in place and by rename, without our entry.
        for (let i = 0; i < 300; i++) {
          if (i % 2) await fs.writeFile(primary, BRIDGE_CONFLIST);
          else {
            await fs.writeFile(`${primary}.new`, BRIDGE_CONFLIST);
            await fs.rename(`${primary}.new`, primary);
          }
        }
        await eventually(() => hasEntry(primary), `our entry back after burst ${round}`, 2000);
        await installer.settled();
        assert.ok(hasEntry(primary), `our entry stays after burst ${round}`);
      }
    } finally {
      await installer.stop('SIGTERM').catch(() => {});
      await tree.remove();
    }
  });
});

describe('FileCache', () => {
  it('trusts an entry between events, drops it on an event, and a verifying pass sees a change no event told of', async () => {
    const tree = await makeHostTree();
    try {
      const file = path.join(tree.netDir, 'a.conflist');
      await fs.writeFile(file, 'one');
      const cache = new FileCache();
      cache.startPass(false);
      assert.equal((await cache.read(file))?.text, 'one');
      const reads = cache.reads;
      await fs.writeFile(file, 'two');
      // No event told of it: a pass brought by events trusts the cache.
      cache.startPass(false);
      assert.equal((await cache.read(file))?.text, 'one');
      assert.equal(cache.reads, reads);
      // A verifying pass checks: changed within the racy window, so read again.
      cache.startPass(true);
      assert.equal((await cache.read(file))?.text, 'two');
      // An event drops the entry at once.
      await fs.writeFile(file, 'six');
      cache.changed(file);
      cache.startPass(false);
      assert.equal((await cache.read(file))?.text, 'six');
      // A watch re-armed or failed: the next pass verifies even if brought by an event.
      await fs.writeFile(file, 'ten');
      cache.unsure();
      cache.startPass(false);
      assert.equal((await cache.read(file))?.text, 'ten');
      await fs.rm(file);
      cache.changed(file);
      assert.equal(await cache.read(file), null);
    } finally {
      await tree.remove();
    }
  });

  it('keeps nothing read while an event for the file came in', async () => {
    const tree = await makeHostTree();
    try {
      const file = path.join(tree.netDir, 'b.conflist');
      await fs.writeFile(file, 'old');
      const cache = new FileCache();
      cache.startPass(false);
      const reading = cache.read(file);
      cache.changed(file);
      assert.equal((await reading)?.text, 'old');
      await fs.writeFile(file, 'new');
      assert.equal((await cache.read(file))?.text, 'new', 'what was read during the event was not kept');
    } finally {
      await tree.remove();
    }
  });
});

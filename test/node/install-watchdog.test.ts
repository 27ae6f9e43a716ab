// /readyz must never report an answer it can no longer stand behind, and stop must never wait
// forever: a pass stuck in a file system call is reported, and stopping goes on without it.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { watchdogReasons, type PassTimes } from '../../src/install/watchdog.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { installerArgs } from '../../src/partargs.ts';

const logLines: string[] = [];
configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:info' }, {}).logging.outputLevels },
  { write: (l) => void logLines.push(l) },
);

describe('watchdogReasons', () => {
  const base: PassTimes = {
    now: 100_000,
    runningSince: null,
    lastFinished: 99_000,
    started: 0,
    intervalMs: 5000,
    timeoutMs: 30_000,
  };
  const cases: [string, Partial<PassTimes>, RegExp[]][] = [
    ['a pass finished a second ago, none running', {}, []],
    ['a pass running for 10 s of a 30 s timeout', { runningSince: 90_000 }, []],
    [
      'a pass running for 31 s',
      { runningSince: 69_000 },
      [/a reconcile pass has been running for 31\.0 s, over --reconcile-timeout 30\.0 s/],
    ],
    [
      'the last pass finished 71 s ago (interval 5 s, timeout 30 s)',
      { lastFinished: 29_000 },
      [/the last reconcile pass finished 71\.0 s ago.*passes have stopped/],
    ],
    ['the last pass finished 69 s ago', { lastFinished: 31_000 }, []],
    [
      'no pass finished in 100 s since the start',
      { lastFinished: null },
      [/no reconcile pass has finished since the start 100\.0 s ago/],
    ],
    ['no pass finished yet, 50 s after the start', { lastFinished: null, now: 50_000 }, []],
    ['stuck and stale', { runningSince: 0, lastFinished: 1000 }, [/running for 100\.0 s/, /finished 99\.0 s ago/]],
  ];
  for (const [what, times, expected] of cases) {
    it(what, () => {
      const reasons = watchdogReasons({ ...base, ...times });
      assert.equal(reasons.length, expected.length, reasons.join('\n'));
      expected.forEach((re, i) => assert.match(reasons[i]!, re));
    });
  }
});

/**
 * Occupies every thread of libuv's pool with an open() of a FIFO that has no writer (4 unless
 * UV_THREADPOOL_SIZE says otherwise): every file system call of this process then waits, as it
 * would behind a hung mount. Returns the release.
 */
async function hangFileSystemCalls(dir: string): Promise<() => void> {
  const threads = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
  const fifos = Array.from({ length: threads }, (_, i) => path.join(dir, `hang-${i}`));
  for (const f of fifos) execFileSync('mkfifo', [f]);
  const opens = fifos.map((f) =>
    fs.open(f, 'r').then(
      (fh) => fh.close(),
      () => {},
    ),
  );
  return () => {
    for (const f of fifos) {
      try {
        closeSync(openSync(f, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // Its reader is gone already.
      }
    }
    void Promise.all(opens);
  };
}

describe('installer watchdog', () => {
  it('a stuck pass turns readiness false with the reason, and stop goes on without it', async () => {
    const tree = await makeHostTree();
    const hangDir = await fs.mkdtemp(path.join(tree.root, 'hang-'));
    const installer = new Installer(
      installerArgs(
        buildSettings({ 'reconcile-interval': '1h', 'reconcile-timeout': '300ms', ...tree.flags }, tree.env),
      ),
      { decideCleanup: async () => ({ cleanup: true, why: 'test' }) },
    );
    let release = () => {};
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await installer.start();
      await installer.settled();
      assert.deepEqual(installer.notReadyReasons(), []);

      release = await hangFileSystemCalls(hangDir);
      installer.schedule('net_dir');
      await eventually(
        () =>
          installer
            .notReadyReasons()
            .some((r) => /a reconcile pass has been running for .* over --reconcile-timeout 0\.3 s/.test(r)),
        'the stuck pass reported',
        5000,
      );

      const t0 = Date.now();
      await installer.stop('SIGTERM');
      const took = Date.now() - t0;
      assert.ok(took < 3000, `stop took ${took} ms`);
      assert.ok(
        logLines.some((l) => l.includes('still running') && l.includes('leaving mesh-cni installed')),
        logLines.slice(-5).join(''),
      );
    } finally {
      release();
      await installer.stop('SIGTERM').catch(() => {});
      await tree.remove();
    }
  });
});

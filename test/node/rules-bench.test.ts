// `npm run bench -- rules` in its quickest mode (QUICK=1, the plugin from its sources): its tables
// print a row per mode and backend with figures in every one, single- and dual-stack, and it
// leaves nothing behind: no netns of its own (named after its pid, test/helpers/netns.ts), no nft
// table of its floor in this netns, nothing in its temp dir. Then the same run stopped by SIGTERM
// half-way: it ends by that signal with nothing left.
// Speed itself is the bench's to print, never asserted here.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { ROOT } from '../helpers/cli.ts';
import { waitFor } from '../helpers/poll.ts';

const BENCH = path.join(ROOT, 'scripts/bench/rules.bench.ts');
const scratch = mkdtempSync(path.join(os.tmpdir(), 'mcni-rules-bench-test-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

function netnsOf(pid: number): string[] {
  const list = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout;
  return list
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter((n) => n.startsWith(`mcni-plg-${pid}-`));
}

function startBench(tmpdir: string, env: Record<string, string> = {}) {
  const child = spawn(process.execPath, [BENCH], {
    env: { ...process.env, QUICK: '1', PLUGIN: 'source', TMPDIR: tmpdir, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  return { child, out: () => out, err: () => err };
}

function assertNothingLeft(pid: number, tmpdir: string): void {
  assert.deepEqual(netnsOf(pid), [], 'every netns the bench made is gone');
  const tables = spawnSync('nft', ['list', 'tables'], { encoding: 'utf8' }).stdout;
  assert.doesNotMatch(tables, /mesh_bench/, 'the floor table never lands in this netns');
  assert.deepEqual(readdirSync(tmpdir), [], 'its temp dir is removed');
}

const MODES = ['sidecar REDIRECT', 'sidecar TPROXY', 'ambient in-pod'];
const BACKENDS = ['iptables legacy', 'iptables nft shim', 'native nft'];

/** A QUICK run's output: a row per mode and backend, figures (no dash) in every one. */
function assertFigures(out: string): void {
  assert.match(out, /the plugin's whole ADD/);
  const row = (mode: string, backend: string) => new RegExp(`^${mode} +\\| ${backend} +\\|(.*)$`, 'gm');
  const cells = (mode: string, backend: string) =>
    [...out.matchAll(row(mode, backend))].map((m) => m[1]!.split('|').map((c) => c.trim()));
  // Every backend in every mode (programming and floor), and the plugin's ADD in the sidecar modes.
  for (const backend of BACKENDS) {
    for (const mode of MODES) {
      const c = cells(mode, backend);
      assert.ok(c.length >= 1, `a row for ${mode} x ${backend}`);
      assert.ok(!c[0]!.includes('-'), `${mode} x ${backend} programmed and floored`);
      if (mode !== 'ambient in-pod') assert.ok(!c[1]!.includes('-'), `${mode} x ${backend}: the plugin's ADD`);
    }
  }
  // Native nft's check row: the hand-written floor beside the recorded one.
  assert.match(out, /check, native nft sidecar REDIRECT: .*: p50 [0-9.]+ ms, CPU [0-9.]+ ms; recorded floor/);
}

describe('npm run bench -- rules', () => {
  for (const [families, title] of [
    ['4', /rule programming, a fresh netns per pod, IPv4;/],
    ['4,6', /rule programming, a fresh netns per pod, dual-stack \(IPv4 and IPv6\);/],
  ] as const) {
    it(`QUICK=1 FAMILIES=${families} prints figures per mode and backend, and leaves no netns, nft table or temp dir`, async () => {
      const tmpdir = mkdtempSync(path.join(scratch, 'run-'));
      const b = startBench(tmpdir, { FAMILIES: families });
      const [code] = (await once(b.child, 'exit')) as [number | null];
      assert.equal(code, 0, b.err());
      assert.match(b.out(), title);
      assertFigures(b.out());
      assertNothingLeft(b.child.pid!, tmpdir);
    });
  }

  it('stopped by SIGTERM while it runs, it ends by the signal and leaves nothing behind', async () => {
    const tmpdir = mkdtempSync(path.join(scratch, 'stop-'));
    const b = startBench(tmpdir);
    // Stopped as soon as it is measuring: its netns, bridge network and temp files all exist then.
    await waitFor(
      'the bench to start measuring',
      () => {
        if (b.child.exitCode !== null) assert.fail(`ended before measuring: ${b.err()}`);
        return b.out().includes('measuring');
      },
      { timeoutMs: 60_000, context: b.err },
    );
    b.child.kill('SIGTERM');
    const [code, signal] = (await once(b.child, 'exit')) as [number | null, NodeJS.Signals | null];
    assert.ok(signal === 'SIGTERM' || code === 128 + os.constants.signals.SIGTERM, `ended by SIGTERM (${code})`);
    assertNothingLeft(b.child.pid!, tmpdir);
  });
});

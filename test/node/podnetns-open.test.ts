// openNetns (src/podnetns/held.ts) on whatever a path can name: a netns path comes from a CNI
// ADD's request or a pod's /proc, so it may be a FIFO, a directory, a regular file, a device or
// a socket; each is refused at once, by path and kind, with no fd left open. A path the kernel
// itself hangs on (a FUSE mount nobody answers) fails its caller at the deadline, shows in the
// reasons /readyz gives, and takes no more of libuv's workers than its slots (fscalls.ts). Root.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { FsCallGate, FsCallTimeout, podPathCallsPart } from '../../src/podnetns/fscalls.ts';
import { NotANetnsError, openNetns, type HeldNetns } from '../../src/podnetns/held.ts';
import { spawnAgent } from '../helpers/agent.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { makeHostTreeFor } from '../helpers/hosttree.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';
import { HungMount } from '../helpers/hungfs.ts';
import { Netns } from '../helpers/netns.ts';
import { waitFor } from '../helpers/poll.ts';

const defer = cleanupAfterEach();

function tmp(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-nsopen-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Lets a reader blocked opening `fifo` go (each cleanup round), until `done()`. */
function releaseReadersOf(fifo: string, done: () => boolean): void {
  defer(async () => {
    for (let i = 0; i < 500 && !done(); i++) {
      try {
        closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        /* no reader waiting now */
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  });
}

async function refusal(p: Promise<HeldNetns>): Promise<Error> {
  try {
    const ns = await p;
    ns.close();
  } catch (e) {
    return e as Error;
  }
  assert.fail('opened');
}

const KINDS: [kind: string, make: (file: string) => Promise<void> | void][] = [
  ['a FIFO', (f) => execFileSync('mkfifo', [f])],
  ['a directory', (f) => mkdirSync(f)],
  ['a regular file outside nsfs', (f) => writeFileSync(f, '')],
  // /dev/zero's numbers: read, it never ends.
  ['a character device', (f) => execFileSync('mknod', [f, 'c', '1', '5'])],
  [
    'a socket',
    async (f) => {
      const server = net.createServer().listen(f);
      defer(() => new Promise((r) => server.close(r)));
      await new Promise((r) => server.once('listening', r));
    },
  ],
];

describe('openNetns on a path that is not a netns', () => {
  for (const [kind, make] of KINDS) {
    it(`${kind}: refused at once, by path and kind, no fd left open`, { timeout: 10_000 }, async () => {
      const file = path.join(tmp(), 'netns');
      await make(file);
      let settled = false;
      if (kind === 'a FIFO') releaseReadersOf(file, () => settled);
      const before = fdSnapshot();
      const e = await refusal(openNetns(file, 0)).finally(() => (settled = true));
      assert.ok(e instanceof NotANetnsError, `${e.name}: ${e.message}`);
      assert.equal(e.message, `${file} is ${kind}, not a network namespace file`);
      assert.equal(e.kind, kind);
      assert.deepEqual(fdsOpenedSince(before), []);
    });
  }

  it('a netns is held non-blocking and close-on-exec, never a controlling terminal', async () => {
    const ns = new Netns('nsopen');
    defer(async () => ns.remove());
    const held = await openNetns(ns.path, 0);
    defer(async () => held.close());
    const flags = Number.parseInt(
      /^flags:\s+([0-7]+)$/m.exec(readFileSync(`/proc/self/fdinfo/${held.fd}`, 'utf8'))![1]!,
      8,
    );
    const O_CLOEXEC = 0o2000000;
    assert.equal(flags & constants.O_NONBLOCK, constants.O_NONBLOCK, 'O_NONBLOCK');
    assert.equal(flags & O_CLOEXEC, O_CLOEXEC, 'O_CLOEXEC');
    assert.equal(flags & 3, constants.O_RDONLY, 'read-only (O_ACCMODE bits)');
  });
});

describe('openNetns on a path the kernel hangs on (a FUSE mount nobody answers)', () => {
  function hung(): HungMount {
    const m = new HungMount();
    defer(async () => m.release());
    return m;
  }

  it(
    'fails its caller at the deadline naming the path; the reason stays until the kernel lets go; no fd left',
    { timeout: 20_000 },
    async () => {
      const gate = new FsCallGate({ slots: 2, deadlineMs: 300 });
      const m = hung();
      const ns = new Netns('nsopen');
      defer(async () => ns.remove());
      const before = fdSnapshot();
      const e = await refusal(openNetns(m.path('netns'), 0, gate));
      assert.ok(e instanceof FsCallTimeout, `${e.name}: ${e.message}`);
      assert.match(e.message, new RegExp(`^opening ${m.path('netns')} as a netns did not return within 300 ms`));
      // The agent's part for it: not ready, naming the call; ControlZ shows it.
      const part = podPathCallsPart(gate);
      const reasons = part.notReadyReasons();
      assert.equal(reasons.length, 1, reasons.join('\n'));
      assert.match(reasons[0]!, new RegExp(`opening ${m.path('netns')} as a netns has not returned for`));
      assert.match(reasons[0]!, /\(1 of 2 slots for calls on pod paths left\)/);
      assert.deepEqual(
        (part.status().stuck as { call: string }[]).map((c) => c.call),
        [`opening ${m.path('netns')} as a netns`],
      );
      assert.equal(gate.running, 1, 'the call still holds its slot');
      // A real netns opens meanwhile, on the slot left.
      const held = await openNetns(ns.path, 0, gate);
      held.close();
      m.release();
      await waitFor('the hung call returned', () => gate.running === 0);
      assert.deepEqual(part.notReadyReasons(), []);
      assert.deepEqual(fdsOpenedSince(before), []);
    },
  );

  it(
    'hung calls take at most their slots: a third waits, fails at its deadline, and the pool still serves the agent',
    { timeout: 20_000 },
    async () => {
      const gate = new FsCallGate({ slots: 2, deadlineMs: 300 });
      const m = hung();
      const first = await Promise.all([0, 1].map((i) => refusal(openNetns(m.path(`ns${i}`), 0, gate))));
      for (const e of first) assert.ok(e instanceof FsCallTimeout, e.message);
      assert.equal(gate.notReadyReasons().length, 2);
      const third = await refusal(openNetns(m.path('ns2'), 0, gate));
      assert.ok(third instanceof FsCallTimeout, third.message);
      assert.match(
        third.message,
        /not started within 300 ms, the 2 calls on pod paths allowed at once all still running/,
      );
      assert.match(third.message, new RegExp(`opening ${m.path('ns0')} as a netns, for`));
      assert.equal(gate.running, 2, 'the third never reached the thread pool');
      // libuv's other workers (4 by default) still serve every other fs call.
      await fsp.stat(os.tmpdir());
      m.release();
      await waitFor('the hung calls returned', () => gate.running === 0);
      assert.deepEqual(gate.notReadyReasons(), []);
    },
  );
});

describe('the agent', () => {
  it('runs the pod-path calls as one of its parts (their hung calls on /readyz, their state on ControlZ)', async () => {
    const t = await makeHostTreeFor(defer);
    const agent = spawnAgent(t);
    defer(() => agent.stop('SIGKILL'));
    const started = await agent.waitForLog((r) => r.msg === 'install-cni started', 'started');
    assert.ok((started.components as string[]).includes('pod-path-calls'), JSON.stringify(started.components));
  });
});

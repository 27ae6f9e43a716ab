// The ZDS server (src/ambient/ztunnelserver.ts) against the fake ztunnel, both on real
// SOCK_SEQPACKET sockets in a temp dir, with real network namespaces (`ip netns add`) as the fds
// handed over: the fake reads each fd's netns inode, so a test sees which pod's netns arrived.
// Timings are injected small; the tests wait for events, never for a time.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  closeSync,
  fstatSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readlinkSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it as nodeIt } from 'node:test';
import { connectSeqpacket } from '../../src/ambient/seqpacket.ts';
import { encodeWorkloadResponse, encodeZdsHello, decodeWorkloadRequest } from '../../src/ambient/zds.ts';
import {
  ZtunnelError,
  ZtunnelServer,
  ztunnelConnections,
  type SnapshotPod,
  type ZdsServerEvents,
  type ZdsTimings,
} from '../../src/ambient/ztunnelserver.ts';
import type { Clock } from '../../src/orch/limits.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { Netns } from '../helpers/netns.ts';
import { ROOT } from '../helpers/cli.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';

const defer = cleanupAfterEach();
/** A test waits for events; one that never comes fails it after 20 s instead of hanging the file. */
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 20_000 }, fn);

/** Small deadlines so a failure path ends quickly; nothing asserts on them. */
const FAST: Partial<ZdsTimings> = {
  acceptsPerSecond: 1000,
  helloTimeoutMs: 2000,
  writeTimeoutMs: 2000,
  ackTimeoutMs: 2000,
  keepaliveIntervalMs: 20,
  keepaliveReadMs: 10,
};

const INFO = { name: 'shop-7d9f', namespace: 'orders', serviceAccount: 'shop' };

function socketPath(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-zds-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'ztunnel.sock');
}

/** A real netns, held open by fd like the agent's pod cache holds one: its fd and inode. */
function heldNetns(): { fd: number; ino: bigint } {
  const ns = new Netns('zds');
  defer(async () => ns.remove());
  const fd = openSync(ns.path, 'r');
  defer(async () => closeSync(fd));
  return { fd, ino: fstatSync(fd, { bigint: true }).ino };
}

type Event = { [K in keyof ZdsServerEvents]: { type: K; args: ZdsServerEvents[K] } }[keyof ZdsServerEvents];

/** The server's events in order, and a wait for the next one that matches. */
function watch(server: ZtunnelServer) {
  const seen: Event[] = [];
  const waiters: { pred: (e: Event) => boolean; resolve: (e: Event) => void }[] = [];
  for (const type of ['connected', 'snapshot', 'disconnected', 'refused'] as const) {
    server.on(type, (...args: unknown[]) => {
      const e = { type, args } as Event;
      seen.push(e);
      for (let i = 0; i < waiters.length; i++) {
        if (waiters[i]!.pred(e)) waiters.splice(i--, 1)[0]!.resolve(e);
      }
    });
  }
  return {
    seen,
    /** The `n`th event of `type` (from 1), past or to come. */
    nth<K extends Event['type']>(type: K, n = 1): Promise<Extract<Event, { type: K }>> {
      let count = 0;
      const pred = (e: Event) => e.type === type && ++count === n;
      const past = seen.find(pred);
      if (past) return Promise.resolve(past as Extract<Event, { type: K }>);
      return new Promise((resolve) => waiters.push({ pred, resolve: resolve as (e: Event) => void }));
    },
  };
}

function startServer(
  snapshot: () => readonly SnapshotPod[] = () => [],
  timings: Partial<ZdsTimings> = {},
  clock?: Clock,
) {
  const server = new ZtunnelServer({ path: socketPath(), snapshot, timings: { ...FAST, ...timings }, clock });
  defer(() => server.close());
  return { server, events: watch(server) };
}

function startFake(
  server: ZtunnelServer,
  opts: { version?: number; reconnect?: boolean; checkOneInFlight?: boolean } = {},
): FakeZtunnel {
  const fake = new FakeZtunnel({ path: server.path, ...opts });
  defer(() => fake.stop());
  return fake;
}

async function gauge(): Promise<number> {
  return (await ztunnelConnections.get()).values[0]?.value ?? 0;
}

/** This process's open fds and what each is, so a leak names itself. */
function openFds(): string[] {
  return readdirSync('/proc/self/fd').flatMap((fd) => {
    try {
      return [`${fd} -> ${readlinkSync(`/proc/self/fd/${fd}`)}`];
    } catch {
      return []; // the fd readdir itself used
    }
  });
}

describe('ambient ZDS server: snapshot', () => {
  it('sends Add + netns fd for pods with a netns, Keep for pods without, in order, then SnapshotSent', async () => {
    const a = heldNetns();
    const b = heldNetns();
    const pods: SnapshotPod[] = [
      { uid: 'uid-a', info: { ...INFO, name: 'a' }, netnsFd: a.fd },
      { uid: 'uid-lost', info: { ...INFO, name: 'lost' }, netnsFd: null },
      { uid: 'uid-b', info: { ...INFO, name: 'b' }, netnsFd: b.fd },
    ];
    const { server, events } = startServer(() => pods);
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    const snap = await events.nth('snapshot');
    assert.deepEqual(snap.args, [1, 3]);

    const sent = fake.records.filter((r) => r.kind !== 'connected');
    assert.deepEqual(sent, [
      { kind: 'add', conn: 1, uid: 'uid-a', info: { ...INFO, name: 'a' }, netnsIno: a.ino, acked: true },
      { kind: 'keep', conn: 1, uid: 'uid-lost', acked: true },
      { kind: 'add', conn: 1, uid: 'uid-b', info: { ...INFO, name: 'b' }, netnsIno: b.ino, acked: true },
      { kind: 'snapshot_sent', conn: 1, acked: true },
    ]);
    assert.notEqual(a.ino, b.ino);
    assert.equal(server.connections, 1);
    assert.equal(await gauge(), 1);
    assert.equal(fake.openFds, 0);
  });

  it('an empty cache is an empty snapshot: SnapshotSent alone', async () => {
    const { server } = startServer();
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    assert.deepEqual(
      fake.records.map((r) => r.kind),
      ['connected', 'snapshot_sent'],
    );
  });

  it('a pod ztunnel nacks in the snapshot does not stop the snapshot', async () => {
    const a = heldNetns();
    const { server } = startServer(() => [
      { uid: 'uid-bad', info: INFO, netnsFd: a.fd },
      { uid: 'uid-ok', info: INFO, netnsFd: a.fd },
    ]);
    const fake = new FakeZtunnel({ path: server.path });
    defer(() => fake.stop());
    fake.nackUids.set('uid-bad', 'failure to start proxy: no such device');
    await fake.waitForNth('snapshot_sent', 1);
    assert.deepEqual(
      fake.of('add').map((r) => [r.uid, r.acked]),
      [
        ['uid-bad', false],
        ['uid-ok', true],
      ],
    );
    assert.equal(server.connections, 1);
  });
});

describe('ambient ZDS server: adds and deletes', () => {
  it('podAdded sends Add with the pod netns fd and resolves on the ack', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    await server.podAdded('uid-new', INFO, ns.fd);
    assert.deepEqual(fake.of('add'), [
      { kind: 'add', conn: 1, uid: 'uid-new', info: INFO, netnsIno: ns.ino, acked: true },
    ]);
    await server.podDeleted('uid-new');
    assert.deepEqual(fake.of('del'), [{ kind: 'del', conn: 1, uid: 'uid-new', acked: true }]);
  });

  it('a nack is an error naming ztunnel and the pod; the connection stays', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    fake.nackUids.set('uid-nacked', 'failure to start proxy: address in use');
    await assert.rejects(server.podAdded('uid-nacked', INFO, ns.fd), (e: unknown) => {
      assert.ok(e instanceof ZtunnelError);
      assert.equal(e.reason, 'nack');
      assert.match(e.message, /^ztunnel refused the add of pod uid-nacked: failure to start proxy: address in use$/);
      return true;
    });
    await server.podAdded('uid-fine', INFO, ns.fd);
    assert.equal(server.connections, 1);
    assert.equal(fake.connections, 1);
  });

  it('with no ztunnel connected, podAdded fails naming ztunnel (the ADD turns it into CNI error 11)', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    await assert.rejects(server.podAdded('uid-early', INFO, ns.fd), (e: unknown) => {
      assert.ok(e instanceof ZtunnelError);
      assert.equal(e.reason, 'no_connection');
      assert.match(e.message, /^no ztunnel connection on .*ztunnel\.sock: pod uid-early cannot be handed to ztunnel/);
      return true;
    });
    // A delete with nobody to tell is done: the next snapshot will not name the pod.
    await server.podDeleted('uid-early');
  });

  it('a request over the 1024 bytes ztunnel reads is refused before sending; the connection stays', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    const long = 'u'.repeat(1100);
    await assert.rejects(server.podAdded(long, INFO, ns.fd), (e: unknown) => {
      assert.ok(e instanceof ZtunnelError);
      assert.equal(e.reason, 'too_large');
      // uid: 0a cc08 + 1100 = 1103; info: 12 19 + 25 = 27; Add: 0a ea08 + 1130 = 1133 bytes.
      assert.match(
        e.message,
        /^ZDS add of pod u+ is 1133 bytes, over the 1024 ztunnel reads in one message; not sent$/,
      );
      return true;
    });
    await assert.rejects(server.podDeleted(long), { reason: 'too_large' });
    assert.deepEqual(fake.of('add'), []);
    await server.podAdded('uid-fits', INFO, ns.fd);
  });

  it('concurrent requests go one at a time: each waits for the ack of the one before', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    const fake = startFake(server);
    await fake.waitForNth('snapshot_sent', 1);
    fake.ackDelayMs = 2;
    const uids = Array.from({ length: 30 }, (_, i) => `uid-${i}`);
    await Promise.all(uids.map((uid, i) => (i % 3 === 2 ? server.podDeleted(uid) : server.podAdded(uid, INFO, ns.fd))));
    assert.deepEqual(fake.of('protocol_error'), []);
    assert.deepEqual(
      fake.records.filter((r) => r.kind === 'add' || r.kind === 'del').map((r) => (r as { uid: string }).uid),
      uids,
    );
  });

  it('two ztunnels (a rolling update): adds go to the newest only, deletes to both', async () => {
    const ns = heldNetns();
    const { server, events } = startServer(() => [{ uid: 'uid-old', info: INFO, netnsFd: ns.fd }]);
    const older = startFake(server);
    await events.nth('snapshot', 1);
    const newer = startFake(server);
    await events.nth('snapshot', 2);
    assert.equal(server.connections, 2);
    assert.equal(await gauge(), 2);
    // Both got the snapshot.
    assert.deepEqual(
      older.of('add').map((r) => r.uid),
      ['uid-old'],
    );
    assert.deepEqual(
      newer.of('add').map((r) => r.uid),
      ['uid-old'],
    );

    await server.podAdded('uid-fresh', INFO, ns.fd);
    assert.deepEqual(
      older.of('add').map((r) => r.uid),
      ['uid-old'],
    );
    assert.deepEqual(
      newer.of('add').map((r) => r.uid),
      ['uid-old', 'uid-fresh'],
    );

    await server.podDeleted('uid-old');
    assert.deepEqual(
      older.of('del').map((r) => r.uid),
      ['uid-old'],
    );
    assert.deepEqual(
      newer.of('del').map((r) => r.uid),
      ['uid-old'],
    );
  });

  it('a pod added while a new ztunnel connects reaches it, on either side of its Hello', async () => {
    // The contract the dataplane keeps (the pod in the cache before podAdded): an add before the
    // new connection counts goes to the older one, and the new one's snapshot names the pod; an
    // add from the moment it counts goes to it, after its SnapshotSent.
    const ns = heldNetns();
    const cache: SnapshotPod[] = [];
    const { server, events } = startServer(() => [...cache]);
    const older = startFake(server);
    await events.nth('snapshot', 1);
    cache.push({ uid: 'uid-before', info: INFO, netnsFd: ns.fd });
    const before = server.podAdded('uid-before', INFO, ns.fd);
    let during: Promise<void> | undefined;
    server.once('connected', () => {
      cache.push({ uid: 'uid-during', info: INFO, netnsFd: ns.fd });
      during = server.podAdded('uid-during', INFO, ns.fd);
    });
    const newer = startFake(server);
    await events.nth('snapshot', 2);
    await Promise.all([before, during]);
    assert.deepEqual(
      older.of('add').map((r) => r.uid),
      ['uid-before'],
    );
    const got = newer.records.filter((r) => r.kind === 'add' || r.kind === 'snapshot_sent');
    assert.deepEqual(
      got.map((r) => (r.kind === 'add' ? r.uid : r.kind)),
      ['uid-before', 'uid-during', 'snapshot_sent', 'uid-during'],
    );
  });

  it('a delete nacked by one of two ztunnels is an error naming ztunnel; the other still got it', async () => {
    const { server, events } = startServer();
    const older = startFake(server);
    await events.nth('snapshot', 1);
    const newer = startFake(server);
    await events.nth('snapshot', 2);
    older.nackUids.set('uid-x', 'unknown workload');
    await assert.rejects(server.podDeleted('uid-x'), /ztunnel refused the del of pod uid-x: unknown workload/);
    assert.deepEqual(
      newer.of('del').map((r) => [r.uid, r.acked]),
      [['uid-x', true]],
    );
  });
});

describe('ambient ZDS server: connections that fail', () => {
  it('a ztunnel that crashes: gauge back to 0, and the server takes the next one with a full snapshot', async () => {
    const ns = heldNetns();
    const { server, events } = startServer(() => [{ uid: 'uid-1', info: INFO, netnsFd: ns.fd }]);
    const first = startFake(server, { reconnect: false });
    await events.nth('snapshot', 1);
    assert.equal(await gauge(), 1);
    first.drop();
    const gone = await events.nth('disconnected', 1);
    assert.match(gone.args[1], /keepalive read.*closed by the peer/);
    assert.equal(server.connections, 0);
    assert.equal(await gauge(), 0);
    await assert.rejects(server.podAdded('uid-2', INFO, ns.fd), { reason: 'no_connection' });

    const second = startFake(server);
    await events.nth('snapshot', 2);
    assert.equal(await gauge(), 1);
    assert.deepEqual(
      second.of('add').map((r) => [r.uid, r.netnsIno]),
      [['uid-1', ns.ino]],
    );
    await server.podAdded('uid-2', INFO, ns.fd);
  });

  it('a ztunnel that drops the connection while a pod waits for its ack: the add fails naming ztunnel', async () => {
    const ns = heldNetns();
    const { server, events } = startServer();
    const fake = startFake(server, { reconnect: false });
    await events.nth('snapshot', 1);
    fake.ackDelayMs = 60_000;
    const add = server.podAdded('uid-slow', INFO, ns.fd);
    await fake.waitForNth('add', 1);
    fake.drop();
    await assert.rejects(add, (e: unknown) => {
      assert.ok(e instanceof ZtunnelError);
      assert.equal(e.reason, 'closed');
      assert.match(e.message, /^ztunnel did not ack the add of pod uid-slow: reading the ack .* closed by the peer/);
      return true;
    });
    await events.nth('disconnected', 1);
    assert.equal(await gauge(), 0);
  });

  it('an ack later than the ack deadline: the add fails as a timeout and the connection is dropped', async () => {
    const ns = heldNetns();
    const { server, events } = startServer(() => [], { ackTimeoutMs: 50 });
    const fake = startFake(server, { reconnect: false });
    await events.nth('snapshot', 1);
    fake.ackDelayMs = 60_000;
    await assert.rejects(server.podAdded('uid-late', INFO, ns.fd), (e: unknown) => {
      assert.ok(e instanceof ZtunnelError);
      assert.equal(e.reason, 'timeout');
      assert.match(e.message, /ztunnel did not ack the add of pod uid-late within 50 ms/);
      return true;
    });
    const gone = await events.nth('disconnected', 1);
    assert.match(gone.args[1], /within 50 ms/);
    assert.equal(await gauge(), 0);
  });

  it('a Hello of another version is refused: the connection closed, never counted', async () => {
    const { server, events } = startServer();
    const fake = startFake(server, { version: 2, reconnect: false });
    const refused = await events.nth('refused', 1);
    assert.match(refused.args[0], /^ztunnel speaks ZDS version 2, this agent only V1 \(1\)/);
    await fake.waitFor((r) => r.kind === 'disconnected');
    assert.equal(server.connections, 0);
    assert.equal(await gauge(), 0);
    assert.equal(events.seen.filter((e) => e.type === 'connected').length, 0);
    assert.deepEqual(fake.of('snapshot_sent'), []);
  });

  it('a connection that sends no Hello in time is refused', async () => {
    const { server, events } = startServer(() => [], { helloTimeoutMs: 30 });
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    const refused = await events.nth('refused', 1);
    assert.equal(refused.args[0], 'ztunnel sent no ZdsHello within 30 ms');
    await assert.rejects(conn.recv(5000), { code: 'ERR_SEQPACKET_CLOSED' });
  });

  it('a Hello that is not protobuf is refused as a protocol error', async () => {
    const { server, events } = startServer();
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(Buffer.from('08', 'hex'));
    const refused = await events.nth('refused', 1);
    assert.match(refused.args[0], /^ztunnel protocol error: cannot decode ZDS ZdsHello: truncated varint/);
  });

  it('a message ztunnel sends unasked is a protocol error that drops the connection', async () => {
    const { server, events } = startServer();
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    const snap = await conn.recv(5000);
    assert.deepEqual(decodeWorkloadRequest(snap!.data), { kind: 'snapshot_sent' });
    await conn.send(encodeWorkloadResponse({ ack: { error: '' } }));
    await events.nth('snapshot', 1);
    await conn.send(encodeWorkloadResponse({ ack: { error: '' } }));
    const gone = await events.nth('disconnected', 1);
    assert.equal(gone.args[1], 'ztunnel protocol error: a message arrived unasked');
  });

  it('an answer without an Ack is a protocol error (not taken for success)', async () => {
    const { server, events } = startServer();
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    await conn.recv(5000);
    // A WorkloadResponse holding only an unknown field (field 2, varint 1).
    await conn.send(Buffer.from('1001', 'hex'));
    const gone = await events.nth('disconnected', 1);
    assert.equal(gone.args[1], 'ztunnel protocol error: its answer to the SnapshotSent holds no Ack');
  });

  it('an answer over 1024 bytes is refused (truncated) and drops the connection', async () => {
    const { server, events } = startServer();
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    await conn.recv(5000);
    // An Ack whose error is 2000 bytes: 0a d3 0f (Ack of 2003 bytes) 0a d0 0f (error of 2000) x...: 2006 bytes.
    await conn.send(encodeWorkloadResponse({ ack: { error: 'x'.repeat(2000) } }));
    const gone = await events.nth('disconnected', 1);
    assert.match(gone.args[1], /^reading the ack of the SnapshotSent from ztunnel: .*larger than 1024 bytes/);
  });

  it('an answer carrying an fd is a protocol error; the agent closes the fd it got', async () => {
    const { server, events } = startServer();
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    await conn.recv(5000);
    const devnull = openSync('/dev/null', 'r');
    defer(async () => closeSync(devnull));
    const before = openFds();
    await conn.send(encodeWorkloadResponse({ ack: { error: '' } }), [devnull]);
    const gone = await events.nth('disconnected', 1);
    assert.equal(gone.args[1], 'ztunnel protocol error: the ack of the SnapshotSent came with 1 fds');
    // Its socket is closed too: one fewer than before.
    assert.deepEqual(
      openFds().filter((f) => f.endsWith('/dev/null')),
      before.filter((f) => f.endsWith('/dev/null')),
    );
  });

  it('a ztunnel that stops reading: the write deadline drops the connection, the add fails as a timeout', async () => {
    const ns = heldNetns();
    const { server, events } = startServer(() => [], { writeTimeoutMs: 100, keepaliveIntervalMs: 60_000 });
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    await conn.recv(5000);
    await conn.send(encodeWorkloadResponse({ ack: { error: '' } }));
    await events.nth('snapshot', 1);
    // Acks sent ahead, requests never read: the agent's datagrams pile up in this socket until the
    // kernel's buffer is full and its next send cannot be written.
    const ack = encodeWorkloadResponse({ ack: { error: '' } });
    for (let i = 0; i < 5000; i++) conn.send(ack).catch(() => {});
    let failure: unknown = null;
    for (let i = 0; i < 5000 && failure === null; i++) {
      await server.podAdded(`uid-${i}`, INFO, ns.fd).catch((e: unknown) => (failure = e));
    }
    assert.ok(failure instanceof ZtunnelError, String(failure));
    assert.equal(failure.reason, 'timeout');
    assert.match(failure.message, /^ztunnel did not ack the add of pod uid-\d+: writing the add .* took over 100 ms$/);
    const gone = await events.nth('disconnected', 1);
    assert.match(gone.args[1], /took over 100 ms/);
  });

  it('close() still closes every connection when its socket path no longer leads to a dir (ENOTDIR)', async () => {
    const { server, events } = startServer();
    const fake = startFake(server, { reconnect: false });
    await events.nth('snapshot', 1);
    // The socket's dir moved away and a file put in its place: the path cannot be ours to unlink.
    const dir = path.dirname(server.path);
    renameSync(dir, `${dir}.moved`);
    defer(async () => rmSync(`${dir}.moved`, { recursive: true, force: true }));
    writeFileSync(dir, 'not a dir');
    await server.close();
    assert.equal(server.connections, 0);
    assert.equal(await gauge(), 0);
    await fake.waitFor((r) => r.kind === 'disconnected');
  });

  it('close() fails what waits, with an error naming ztunnel, and the gauge is back to 0', async () => {
    const ns = heldNetns();
    const { server, events } = startServer();
    const fake = startFake(server, { reconnect: false });
    await events.nth('snapshot', 1);
    fake.ackDelayMs = 60_000;
    const add = server.podAdded('uid-pending', INFO, ns.fd);
    const queued = server.podAdded('uid-queued', INFO, ns.fd);
    await fake.waitForNth('add', 1);
    await server.close();
    await assert.rejects(add, /ztunnel did not ack the add of pod uid-pending/);
    await assert.rejects(
      queued,
      /ztunnel connection 1 closed \(the ZDS server was closed\) before add of pod uid-queued/,
    );
    assert.equal(await gauge(), 0);
  });
});

/** A clock that moves only when the test says: each sleep is announced, and ends on wake(). */
function manualClock() {
  let now = 0;
  const asked: { ms: number; wake: () => void }[] = [];
  const waiting: ((s: { ms: number; wake: () => void }) => void)[] = [];
  const clock: Clock = {
    now: () => now,
    sleep: (ms, signal) =>
      new Promise<void>((resolve, reject) => {
        signal?.addEventListener('abort', () => reject(signal.reason as Error));
        const s = {
          ms,
          wake: () => {
            now += ms;
            resolve();
          },
        };
        const w = waiting.shift();
        if (w) w(s);
        else asked.push(s);
      }),
  };
  const nextSleep = () =>
    new Promise<{ ms: number; wake: () => void }>((resolve) => {
      const s = asked.shift();
      if (s) resolve(s);
      else waiting.push(resolve);
    });
  return { clock, nextSleep };
}

describe('ambient ZDS server: accept rate', () => {
  it('accepts at most 5 connections a second: the next waits 200 ms of the clock after one', async () => {
    const { clock, nextSleep } = manualClock();
    const { server, events } = startServer(() => [], { acceptsPerSecond: 5 }, clock);
    startFake(server);
    await events.nth('snapshot', 1);
    const sleep = await nextSleep();
    assert.equal(sleep.ms, 200);
    const second = startFake(server);
    await second.waitFor((r) => r.kind === 'connected');
    // Connected in the backlog, Hello sent, but not accepted while the clock stands still.
    assert.equal(server.connections, 1);
    sleep.wake();
    await events.nth('snapshot', 2);
    assert.equal(server.connections, 2);
  });
});

describe('ambient ZDS server: close() while a Hello is being read', () => {
  it('a connection dropped by close() between reading its Hello and counting it is never counted', async () => {
    // The Hello is queued before the accept, so it is read at once; close() then runs in the next
    // microtasks (from the accept loop's wait for its next token), before the connection counts.
    let closing: Promise<void> | undefined;
    const ref: { server?: ZtunnelServer } = {};
    const clock: Clock = {
      now: () => 0,
      sleep: (_ms, signal) => {
        closing ??= ref.server!.close();
        return new Promise<void>((_resolve, reject) => {
          if (signal?.aborted) reject(signal.reason as Error);
          signal?.addEventListener('abort', () => reject(signal.reason as Error));
        });
      },
    };
    const started = startServer(() => [], { acceptsPerSecond: 5 }, clock);
    const server = (ref.server = started.server);
    const conn = await connectSeqpacket(server.path);
    defer(async () => conn.close());
    await conn.send(encodeZdsHello({ version: 1 }));
    await started.events.nth('refused', 1);
    await closing;
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(
      started.events.seen.map((e) => e.type),
      ['refused'],
    );
    assert.equal(server.connections, 0);
    assert.equal(await gauge(), 0);
  });

  it("close() at any point of a snapshot: 'disconnected' ends a connection's events, never 'snapshot' after it", async () => {
    // The peer sends its Hello and the SnapshotSent's ack at once, so the whole (empty) snapshot runs
    // in the microtasks after 'connected'; close() is called k microtasks after 'connected', for
    // every k, so one lands between the ack being read and the snapshot being reported.
    for (let k = 0; k < 40; k++) {
      const { server, events } = startServer();
      server.on('connected', () => {
        let p = Promise.resolve();
        for (let i = 0; i < k; i++) p = p.then(() => {});
        void p.then(() => server.close());
      });
      const conn = await connectSeqpacket(server.path);
      await conn.send(encodeZdsHello({ version: 1 }));
      await conn.send(encodeWorkloadResponse({ ack: { error: '' } }));
      await events.nth('disconnected', 1);
      await server.close();
      conn.close();
      const types = events.seen.map((e) => e.type);
      assert.equal(types.at(-1), 'disconnected', `close() ${k} microtasks after 'connected': ${types.join(', ')}`);
    }
  });
});

describe('ambient ZDS server: accept errors', () => {
  it('a failed accept (EMFILE) is not the end: ztunnel is taken once fds are free again', async () => {
    // The server in a child that uses up its fds; this process connects the fake to it.
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-zds-emfile-'));
    defer(async () => rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'ztunnel.sock');
    const script = path.join(dir, 'server.ts');
    writeFileSync(
      script,
      [
        "import { closeSync, openSync } from 'node:fs';",
        `import { ZtunnelServer } from ${JSON.stringify(path.join(ROOT, 'src/ambient/ztunnelserver.ts'))};`,
        `const server = new ZtunnelServer({ path: ${JSON.stringify(sock)}, snapshot: () => [],`,
        '  timings: { acceptsPerSecond: 50 } });',
        "server.on('connected', () => console.log('CONNECTED'));",
        "server.on('snapshot', () => { void server.close(); process.stdin.destroy(); });",
        'const held: number[] = [];',
        // stdin first: made after the fds are gone, it could not read.
        "process.stdin.once('data', () => { for (const fd of held) closeSync(fd); console.log('FREED'); });",
        'try { for (;;) held.push(openSync("/dev/null", "r")); }',
        "catch (e) { console.log('EXHAUSTED', (e as NodeJS.ErrnoException).code); }",
      ].join('\n'),
    );
    // A low fd limit, so using them up is quick.
    const child = spawn('bash', ['-c', 'ulimit -n 200 && exec "$0" "$1"', process.execPath, script], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    defer(async () => void child.kill('SIGKILL'));
    let out = '';
    const seen = (text: string) =>
      new Promise<void>((resolve) => {
        const check = () => {
          if (out.includes(text)) {
            child.stdout.off('data', check);
            resolve();
          }
        };
        child.stdout.on('data', check);
        check();
      });
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await seen('EXHAUSTED EMFILE');
    const fake = new FakeZtunnel({ path: sock });
    defer(() => fake.stop());
    await seen('cannot accept');
    assert.match(out, /cannot accept.*EMFILE/);
    child.stdin.write('go\n');
    await seen('CONNECTED');
    await fake.waitForNth('snapshot_sent', 1);
  });
});

describe('ambient ZDS server: resources', () => {
  it('1,000 adds leak no fd in the agent and every fd the fake got was closed', async () => {
    const ns = heldNetns();
    const { server } = startServer();
    // One in flight is the concurrency test's; without its check each round trip is ~30x faster.
    const fake = startFake(server, { checkOneInFlight: false });
    await fake.waitForNth('snapshot_sent', 1);
    await server.podAdded('uid-warmup', INFO, ns.fd);
    const before = fdSnapshot();
    for (let i = 0; i < 1000; i++) await server.podAdded(`uid-${i}`, INFO, ns.fd);
    assert.equal(fake.of('add').length, 1001);
    assert.ok(fake.of('add').every((r) => r.netnsIno === ns.ino && r.acked));
    assert.equal(fake.openFds, 0);
    assert.deepEqual(fdsOpenedSince(before), []);
  });
});

// The ambient pod cache (src/ambient/podcache.ts) over real netns fds (`ip netns add`), and
// podnetns' findPodsNetns over a fake /proc whose ns/net links lead to real netns: one walk of
// /proc for many pods. Root (ip netns).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fstatSync, statSync } from 'node:fs';
import fsp from 'node:fs/promises';
import { describe, it, mock } from 'node:test';
import { PodCache } from '../../src/ambient/podcache.ts';
import { findPodsNetns, openNetns, type HeldNetns } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { Netns } from '../helpers/netns.ts';
import { cgroupV1, cgroupV2, FakeProc, kubepodsPath } from '../helpers/podproc.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';

const defer = cleanupAfterEach();
const INFO = { name: 'cart-5c7d', namespace: 'shop', serviceAccount: 'cart' };
const isOpen = (fd: number) => {
  try {
    fstatSync(fd);
    return true;
  } catch {
    return false;
  }
};

function netns(tag: string, addrs: string[] = []): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  if (addrs.length > 0) {
    const ip = (...a: string[]) => assert.equal(spawnSync('ip', ['-n', n.name, ...a]).status, 0);
    ip('link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0');
    for (const a of addrs) ip('addr', 'add', `${a}/24`, 'dev', 'eth0');
  }
  return n;
}

describe('ambient pod cache', () => {
  it('the same netns keeps the held fd (the new one closed); another netns replaces it (the old one closed)', async () => {
    const a = netns('a');
    const b = netns('b');
    const cache = new PodCache();
    const first = await openNetns(a.path, 0);
    assert.equal(cache.upsert('uid-1', INFO, first), first);
    const again = await openNetns(a.path, 0);
    const againFd = again.fd;
    assert.equal(cache.upsert('uid-1', { ...INFO, name: 'renamed' }, again), first, 'the held fd is reused');
    assert.equal(isOpen(againFd), false, 'the duplicate fd is closed');
    assert.equal(cache.get('uid-1')?.info.name, 'renamed');
    const other = await openNetns(b.path, 0);
    const firstFd = first.fd;
    assert.equal(cache.upsert('uid-1', INFO, other), other);
    assert.equal(first.fd, -1, 'the replaced netns is closed');
    assert.equal(isOpen(firstFd), false);
    assert.deepEqual(cache.snapshot(), [{ uid: 'uid-1', info: INFO, netnsFd: other.fd }]);
    cache.clear();
    assert.equal(other.fd, -1);
  });

  it('a pod known without a netns is sent as Keep; ensure keeps a held netns', async () => {
    const a = netns('a');
    const cache = new PodCache();
    cache.ensure('uid-lost', INFO);
    const ns = await openNetns(a.path, 0);
    cache.upsert('uid-held', INFO, ns);
    cache.ensure('uid-held', INFO);
    assert.deepEqual(cache.snapshot(), [
      { uid: 'uid-lost', info: INFO, netnsFd: null },
      { uid: 'uid-held', info: INFO, netnsFd: ns.fd },
    ]);
    assert.deepEqual(cache.withoutNetns(), ['uid-lost']);
    cache.clear();
  });

  it('while held (a snapshot being sent), a removed netns stays open; it closes with the last release', async () => {
    const a = netns('a');
    const cache = new PodCache();
    const ns = await openNetns(a.path, 0);
    const fd = ns.fd;
    cache.upsert('uid-1', INFO, ns);
    const r1 = cache.hold();
    const r2 = cache.hold();
    cache.release(cache.take('uid-1'));
    assert.equal(isOpen(fd), true, 'an fd a snapshot may be sending must not be closed (its number could be reused)');
    r1();
    r1(); // a second call does nothing
    assert.equal(isOpen(fd), true);
    r2();
    assert.equal(ns.fd, -1);
    assert.equal(isOpen(fd), false);
  });

  it('leaks no fd over 1,000 add/replace/remove cycles', async () => {
    const a = netns('a');
    const b = netns('b');
    const cache = new PodCache();
    const before = fdSnapshot();
    for (let i = 0; i < 1000; i++) {
      const uid = `uid-${i % 7}`;
      cache.upsert(uid, INFO, await openNetns(a.path, 0));
      cache.upsert(uid, INFO, await openNetns(a.path, 0)); // same netns again: the new fd closed
      cache.upsert(uid, INFO, await openNetns(b.path, 0)); // another: the old one closed
      if (i % 3 === 0) {
        const release = cache.hold();
        cache.release(cache.take(uid));
        release();
      } else {
        cache.release(cache.take(uid));
      }
    }
    cache.clear();
    assert.deepEqual(fdsOpenedSince(before), []);
    assert.equal(cache.size, 0);
  });
});

describe('findPodsNetns: many pods, one walk of /proc', () => {
  const UIDS = ['0f1e2d3c-4b5a-4697-8877-665544332211', '1a2b3c4d-5e6f-4a0b-9c8d-7e6f5a4b3c2d'];
  const LOST = '9e8d7c6b-5a49-4837-a625-140312f0e1d2';
  const NO_IP = '5b4a3928-1706-4f5e-8d3c-2b1a09f8e7d6';

  it('finds each pod, says why for the others, and lists /proc once', async () => {
    const n0 = netns('p0', ['198.18.44.2']);
    const n1 = netns('p1', ['198.18.44.3']);
    const proc = new FakeProc();
    defer(async () => proc.remove());
    proc
      .add({ pid: 40, cgroup: cgroupV1(kubepodsPath(UIDS[0]!, 'c'.repeat(64))), starttime: 5, netns: n0.path })
      .add({ pid: 41, cgroup: cgroupV2(kubepodsPath(UIDS[1]!, 'd'.repeat(64))), starttime: 6, netns: n1.path })
      .add({ pid: 42, cgroup: cgroupV2(kubepodsPath(UIDS[1]!, 'e'.repeat(64))), starttime: 9, netns: n1.path })
      .add({ pid: 43, cgroup: cgroupV2('/system.slice/cron.service'), starttime: 1, netns: '/proc/self/ns/net' });
    const readdir = mock.method(fsp, 'readdir');
    defer(async () => readdir.mock.restore());
    const before = fdSnapshot();
    const got = await findPodsNetns(
      [
        { uid: UIDS[0]!, ips: ['198.18.44.2'] },
        { uid: UIDS[1]!.toUpperCase(), ips: ['198.18.44.3'] },
        { uid: LOST, ips: ['198.18.44.4'] },
        { uid: NO_IP, ips: [] },
      ],
      { hostProcDir: proc.dir, hostNetnsPath: '/proc/self/ns/net' },
    );
    const procReads = readdir.mock.calls.filter((c) => c.arguments[0] === proc.dir).length;
    assert.equal(procReads, 1, 'one walk of /proc for all the pods');
    const r0 = got.get(UIDS[0]!);
    const r1 = got.get(UIDS[1]!.toUpperCase());
    assert.ok(
      r0?.ok && r1?.ok,
      JSON.stringify([...got], (_k, v) => (typeof v === 'bigint' ? String(v) : v)),
    );
    assert.equal(r0.netns.ino, statSync(n0.path, { bigint: true }).ino);
    assert.equal(r1.netns.ino, statSync(n1.path, { bigint: true }).ino);
    assert.equal(r1.netns.pid, 41, 'the oldest process of the pod');
    const lost = got.get(LOST);
    assert.ok(lost && !lost.ok && lost.reason === 'no_netns', JSON.stringify(lost));
    const noIp = got.get(NO_IP);
    assert.ok(noIp && !noIp.ok && noIp.reason === 'ip_mismatch');
    assert.equal(fdsOpenedSince(before).length, 2, 'only the two found netns stay open');
    for (const r of [r0, r1] as { netns: HeldNetns }[]) r.netns.close();
    assert.deepEqual(fdsOpenedSince(before), []);
  });

  it('a netns is given to one pod only', async () => {
    const shared = netns('shared', ['198.18.45.2', '198.18.45.3']);
    const proc = new FakeProc();
    defer(async () => proc.remove());
    proc
      .add({ pid: 50, cgroup: cgroupV2(kubepodsPath(UIDS[0]!, 'a'.repeat(64))), starttime: 5, netns: shared.path })
      .add({ pid: 51, cgroup: cgroupV2(kubepodsPath(UIDS[1]!, 'b'.repeat(64))), starttime: 6, netns: shared.path });
    const got = await findPodsNetns(
      [
        { uid: UIDS[0]!, ips: ['198.18.45.2'] },
        { uid: UIDS[1]!, ips: ['198.18.45.3'] },
      ],
      { hostProcDir: proc.dir, hostNetnsPath: '/proc/self/ns/net' },
    );
    const first = got.get(UIDS[0]!);
    const second = got.get(UIDS[1]!);
    assert.ok(first?.ok);
    first.netns.close();
    assert.ok(second && !second.ok && second.reason === 'no_netns', JSON.stringify(second));
    assert.match(second.detail, /another pod's/);
  });
});

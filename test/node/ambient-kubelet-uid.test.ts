// kubelet's uid for the native nftables probe rule (src/ambient/kubeletuid.ts): --kubelet-uid when
// given, else what a fake /proc tree the test writes can vouch for (root only): per pid a comm, a cmdline (NUL-separated), a status with its Uid:
// line, and ns/net a symlink to a real netns file (the test process's own, which stands for the
// node's, or a test netns, which stands for a pod's). Temp dirs and netns are removed after each test.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { chooseKubeletUid, findKubeletUid } from '../../src/ambient/kubeletuid.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { Netns } from '../helpers/netns.ts';

const defer = cleanupAfterEach();
const NODE_NET = '/proc/self/ns/net';

function procTree(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-kubeletuid-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(path.join(dir, 'uptime'), '1.0 1.0\n');
  mkdirSync(path.join(dir, 'self'));
  return dir;
}

interface Proc {
  readonly comm: string;
  readonly argv: readonly string[];
  /** real, effective, saved, filesystem */
  readonly uids: readonly [number, number, number, number];
  readonly net?: string;
}

function proc(dir: string, pid: number, p: Proc): void {
  const d = path.join(dir, String(pid));
  mkdirSync(path.join(d, 'ns'), { recursive: true });
  writeFileSync(path.join(d, 'comm'), `${p.comm}\n`);
  writeFileSync(path.join(d, 'cmdline'), p.argv.map((a) => `${a}\0`).join(''));
  writeFileSync(
    path.join(d, 'status'),
    `Name:\t${p.comm}\nUmask:\t0022\nUid:\t${p.uids.join('\t')}\nGid:\t0\t0\t0\t0\n`,
  );
  symlinkSync(p.net ?? NODE_NET, path.join(d, 'ns', 'net'));
}

const same = (u: number): [number, number, number, number] => [u, u, u, u];

describe("kubelet's uid from the host's /proc", () => {
  it('kubelet as root with "kubelet" in its argv: uid 0; other processes and pids are skipped', async () => {
    const dir = procTree();
    proc(dir, 1, { comm: 'systemd', argv: ['/sbin/init'], uids: same(0) });
    proc(dir, 40, { comm: 'containerd', argv: ['/usr/bin/containerd'], uids: same(4242) });
    proc(dir, 812, {
      comm: 'kubelet',
      argv: ['/usr/bin/kubelet', '--config=/var/lib/kubelet/config.yaml'],
      uids: same(0),
    });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 812, comm: 'kubelet' });
  });

  it('kubelite (MicroK8s) and k3s (kubelet built in, no kubelet in argv) as root; kubelet named first', async () => {
    const dir = procTree();
    proc(dir, 30, { comm: 'k3s', argv: ['/usr/local/bin/k3s', 'agent'], uids: same(0) });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 30, comm: 'k3s' });
    proc(dir, 31, {
      comm: 'kubelite',
      argv: ['/snap/microk8s/current/kubelite', '--kubelet-args-file=x'],
      uids: same(0),
    });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 31, comm: 'kubelite' });
    proc(dir, 900, { comm: 'kubelet', argv: ['kubelet'], uids: same(0) });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 900, comm: 'kubelet' });
  });

  it("a process named kubelet in a pod's netns, or without kubelet in its argv, is not kubelet", async () => {
    const pod = new Netns('kuid');
    defer(async () => pod.remove());
    const dir = procTree();
    proc(dir, 500, { comm: 'kubelet', argv: ['/app/kubelet'], uids: same(1000), net: pod.path });
    proc(dir, 501, { comm: 'kubelet', argv: ['/usr/bin/something'], uids: same(1001) });
    const r = await findKubeletUid(dir, NODE_NET);
    assert.equal(r.found, false);
    assert.match(!r.found ? r.why : '', /no kubelet, kubelite, k3s process in the node's netns/);
    proc(dir, 77, { comm: 'kubelet', argv: ['/usr/bin/kubelet'], uids: same(0) });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 77, comm: 'kubelet' });
  });

  // Any local user can start a process named kubelet (argv and all) in the node's netns, or k3s,
  // before the agent starts, or while kubelet is down: believed, its uid's connections would pass
  // ztunnel as probes. Only root's claim is safe to take, and root is the default anyway.
  for (const [comm, argv] of [
    ['kubelet', ['/usr/bin/kubelet', '--config=/var/lib/kubelet/config.yaml']],
    ['kubelite', ['/snap/microk8s/current/kubelite', '--kubelet-args-file=x']],
    ['k3s', ['/usr/local/bin/k3s', 'agent']],
  ] as const) {
    it(`a process named ${comm} in the node's netns that is not root is not believed`, async () => {
      const dir = procTree();
      proc(dir, 900, { comm, argv, uids: same(1000) });
      assert.deepEqual(await findKubeletUid(dir, NODE_NET), {
        found: false,
        why:
          `${comm} (pid 900) in the node's netns runs as uid 1000, not root, and its name alone does not ` +
          'make it kubelet (any local user can name a process so): if kubelet runs as uid 1000 here, set ' +
          '--kubelet-uid=1000',
      });
    });
  }

  it("the filesystem uid is the one judged (the kernel's skuid): root with fsuid 4242 is not root", async () => {
    const dir = procTree();
    proc(dir, 812, { comm: 'kubelet', argv: ['/usr/bin/kubelet'], uids: [0, 0, 0, 4242] });
    const r = await findKubeletUid(dir, NODE_NET);
    assert.equal(r.found, false);
    assert.match(!r.found ? r.why : '', /kubelet \(pid 812\) in the node's netns runs as uid 4242, not root/);
  });

  it('kubelets of the node disagreeing on the uid: not found, both named', async () => {
    const dir = procTree();
    proc(dir, 77, { comm: 'kubelet', argv: ['/usr/bin/kubelet'], uids: same(0) });
    proc(dir, 78, { comm: 'kubelet', argv: ['kubelet', '--v=2'], uids: same(1000) });
    const r = await findKubeletUid(dir, NODE_NET);
    assert.deepEqual(r, {
      found: false,
      why:
        "processes taken for kubelet in the node's netns run as different uids (kubelet pid 77 uid 0, " +
        "kubelet pid 78 uid 1000): set --kubelet-uid to kubelet's uid",
    });
  });

  it('processes of different names disagreeing on the uid: not found, all named, whichever name', async () => {
    const dir = procTree();
    proc(dir, 30, { comm: 'k3s', argv: ['/usr/local/bin/k3s', 'agent'], uids: same(0) });
    proc(dir, 900, { comm: 'kubelet', argv: ['/home/eve/kubelet'], uids: same(1000) });
    const r = await findKubeletUid(dir, NODE_NET);
    assert.deepEqual(r, {
      found: false,
      why:
        "processes taken for kubelet in the node's netns run as different uids (kubelet pid 900 uid 1000, " +
        "k3s pid 30 uid 0): set --kubelet-uid to kubelet's uid",
    });
  });

  it('no /proc there: not found, saying which', async () => {
    const r = await findKubeletUid('/nonexistent/proc', NODE_NET);
    assert.equal(r.found, false);
    assert.match(!r.found ? r.why : '', /cannot list \/nonexistent\/proc/);
  });
});

describe("kubelet's uid for the probe rule: --kubelet-uid, else the scan, else root", () => {
  it('--kubelet-uid wins over the scan, whatever /proc holds or lacks', async () => {
    const dir = procTree();
    proc(dir, 77, { comm: 'kubelet', argv: ['/usr/bin/kubelet'], uids: same(0) });
    assert.deepEqual(await chooseKubeletUid(4242, dir, NODE_NET), { uid: 4242, from: 'flag' });
    assert.deepEqual(await chooseKubeletUid(0, '/nonexistent/proc', NODE_NET), { uid: 0, from: 'flag' });
  });

  it('unset: a root kubelet found, or uid 0 with the reason when the scan vouches for nothing', async () => {
    const dir = procTree();
    proc(dir, 30, { comm: 'k3s', argv: ['/usr/local/bin/k3s', 'agent'], uids: same(0) });
    assert.deepEqual(await chooseKubeletUid(undefined, dir, NODE_NET), { uid: 0, from: 'scan', pid: 30, comm: 'k3s' });
    proc(dir, 900, { comm: 'kubelet', argv: ['kubelet'], uids: same(1000) });
    const r = await chooseKubeletUid(undefined, dir, NODE_NET);
    assert.equal(r.uid, 0);
    assert.equal(r.from, 'default');
    assert.match(r.from === 'default' ? r.why : '', /kubelet pid 900 uid 1000, k3s pid 30 uid 0.*--kubelet-uid/);
  });
});

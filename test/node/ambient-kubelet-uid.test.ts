// kubelet's uid for the native nftables probe rule (src/ambient/kubeletuid.ts), read from a fake
// /proc tree the test writes: per pid a comm, a cmdline (NUL-separated), a status with its Uid:
// line, and ns/net a symlink to a real netns file (the test process's own, which stands for the
// node's, or a test netns, which stands for a pod's). Temp dirs and netns are removed after each test.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { findKubeletUid } from '../../src/ambient/kubeletuid.ts';
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
  it('kubelet with "kubelet" in its argv: its filesystem uid; other processes and pids are skipped', async () => {
    const dir = procTree();
    proc(dir, 1, { comm: 'systemd', argv: ['/sbin/init'], uids: same(0) });
    proc(dir, 40, { comm: 'containerd', argv: ['/usr/bin/containerd'], uids: same(0) });
    proc(dir, 812, {
      comm: 'kubelet',
      argv: ['/usr/bin/kubelet', '--config=/var/lib/kubelet/config.yaml'],
      uids: [7, 7, 7, 4242],
    });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 4242, pid: 812, comm: 'kubelet' });
  });

  it('kubelite (MicroK8s) and k3s (kubelet built in, no kubelet in argv); kubelet preferred to both', async () => {
    const dir = procTree();
    proc(dir, 30, { comm: 'k3s', argv: ['/usr/local/bin/k3s', 'agent'], uids: same(0) });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 0, pid: 30, comm: 'k3s' });
    proc(dir, 31, {
      comm: 'kubelite',
      argv: ['/snap/microk8s/current/kubelite', '--kubelet-args-file=x'],
      uids: same(5),
    });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 5, pid: 31, comm: 'kubelite' });
    proc(dir, 900, { comm: 'kubelet', argv: ['kubelet'], uids: same(6) });
    assert.deepEqual(await findKubeletUid(dir, NODE_NET), { found: true, uid: 6, pid: 900, comm: 'kubelet' });
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

  it('kubelets of the node disagreeing on the uid: not found, both named', async () => {
    const dir = procTree();
    proc(dir, 77, { comm: 'kubelet', argv: ['/usr/bin/kubelet'], uids: same(0) });
    proc(dir, 78, { comm: 'kubelet', argv: ['kubelet', '--v=2'], uids: same(1000) });
    const r = await findKubeletUid(dir, NODE_NET);
    assert.deepEqual(r, {
      found: false,
      why: "processes named kubelet in the node's netns run as different uids (pid 77 uid 0, pid 78 uid 1000)",
    });
  });

  it('no /proc there: not found, saying which', async () => {
    const r = await findKubeletUid('/nonexistent/proc', NODE_NET);
    assert.equal(r.found, false);
    assert.match(!r.found ? r.why : '', /cannot list \/nonexistent\/proc/);
  });
});

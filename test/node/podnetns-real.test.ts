// findPodNetns against this machine's real /proc: a real process in a real netns, moved into a
// kubelet-shaped cgroup (/kubepods/besteffort/pod<uid>/<container id> in every v1 hierarchy,
// test/helpers/kubepods.ts), and another process of the same "pod" left in the host netns (as
// CRI-O's conmon is). /proc/1/ns/net is unreadable here, so the host reference is
// /proc/self/ns/net (the test runs in the host netns). Every process, cgroup dir and netns made
// here is removed after each test, failed or not. Root.

import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { findPodNetns, runInNetns, type PodNetnsOptions } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { cgroupMounts, placeInPodCgroup, podCgroupDirs, removePodCgroups } from '../helpers/kubepods.ts';
import { Netns } from '../helpers/netns.ts';
import { TestCgroup } from '../helpers/podproc.ts';
import { eventually } from '../helpers/poll.ts';

const OPTS: PodNetnsOptions = { hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' };
const POD_IP = '198.18.60.7';
const SANDBOX_CID = '5a'.repeat(32);
/** The top of this suite's own cgroup dirs made outside kubepods (removed after each test). */
const V2_TOP = `mcni-podnetns-${process.pid}`;

const defer = cleanupAfterEach();
/** The pod UIDs made here, checked for left-over cgroup dirs at the end. */
const made: string[] = [];
const nsIno = (file: string) => statSync(file, { bigint: true }).ino;

/** `argv` as a child that is killed (and waited for) after the test. */
function start(argv: string[]): ChildProcess & { pid: number } {
  const child = spawn(argv[0]!, argv.slice(1), { stdio: 'ignore' });
  assert.ok(child.pid, `cannot start ${argv.join(' ')}`);
  const exited = new Promise((r) => child.once('exit', r));
  defer(async () => {
    child.kill('SIGKILL');
    await exited;
  });
  return child as ChildProcess & { pid: number };
}

/** A pod: its netns with POD_IP, its sandbox process in it, both in the pod's cgroup; and a host-netns process of it. */
async function runningPod() {
  const uid = randomUUID();
  made.push(uid);
  // Deferred first, so it runs last: after the processes are gone, the dirs can go.
  defer(async () => {
    const left = await removePodCgroups(uid);
    assert.deepEqual(left, [], 'pod cgroup dirs left behind');
  });
  const ns = new Netns('real');
  defer(async () => ns.remove());
  ns.exec(['ip', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
  ns.exec(['ip', 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
  // The pod's process in the host netns, started first: older than the sandbox.
  const conmon = start(['sleep', '300']);
  placeInPodCgroup(uid, conmon.pid, 'conmon');
  const sandbox = start(['ip', 'netns', 'exec', ns.name, 'sleep', '300']);
  placeInPodCgroup(uid, sandbox.pid, SANDBOX_CID);
  // ip netns exec enters the netns, then execs sleep under the same pid.
  await eventually(() => nsIno(`/proc/${sandbox.pid}/ns/net`) === nsIno(ns.path), 'the sandbox in its netns');
  return { uid, ns, conmon, sandbox };
}

describe('findPodNetns on the real /proc', () => {
  it('finds the netns of a real process in a kubepods cgroup and runs ip inside it', async () => {
    const { uid, ns, sandbox } = await runningPod();
    const r = await findPodNetns(uid, [POD_IP], OPTS);
    assert.ok(r.ok, r.ok ? '' : `${r.reason}: ${r.detail}`);
    defer(async () => r.netns.close());
    assert.equal(r.netns.pid, sandbox.pid, 'found through the sandbox, not the older host-netns process');
    assert.equal(r.netns.ino, nsIno(`/proc/${sandbox.pid}/ns/net`));
    assert.equal(r.netns.ino, nsIno(ns.path));
    const ip = await runInNetns(r.netns, ['ip', '-o', 'addr', 'show', 'eth0']);
    assert.equal(ip.code, 0, ip.stderr);
    assert.match(ip.stdout, /inet 198\.18\.60\.7\/24/);

    // The held fd keeps the netns: the process gone and the netns file removed, programs still run in it.
    sandbox.kill('SIGKILL');
    ns.remove();
    await eventually(() => sandbox.exitCode !== null || sandbox.signalCode !== null, 'the sandbox gone');
    const still = await runInNetns(r.netns, ['ip', '-o', 'addr', 'show', 'eth0']);
    assert.equal(still.code, 0, still.stderr);
    assert.match(still.stdout, /198\.18\.60\.7/);
    // And a new search finds no netns of the pod: only its host-netns process is left.
    const again = await findPodNetns(uid, [POD_IP], OPTS);
    assert.ok(!again.ok);
    assert.equal(again.reason, 'no_netns');
    assert.match(again.detail, /1 of the pod, 1 of them in the host netns/);
  });

  it('the wrong IP: ip_mismatch naming what the netns holds', async () => {
    const { uid } = await runningPod();
    const r = await findPodNetns(uid, ['198.18.60.8'], OPTS);
    assert.ok(!r.ok);
    assert.equal(r.reason, 'ip_mismatch');
    assert.match(
      r.detail,
      /no netns of the pod holds 198\.18\.60\.8: netns inode \d+ \(pid \d+\) holds .*198\.18\.60\.7/,
    );
  });

  it('finds a process in a systemd-driver slice (containerd, burstable) of the cgroup v2 hierarchy', async () => {
    const uid = randomUUID();
    const v2 = cgroupMounts().find((m) => existsSync(path.join(m, 'cgroup.controllers')));
    assert.ok(v2, 'no cgroup v2 hierarchy mounted');
    const slice = `kubepods-burstable-pod${uid.replaceAll('-', '_')}.slice`;
    const cg = new TestCgroup(
      v2,
      `${V2_TOP}/kubepods.slice/kubepods-burstable.slice/${slice}/cri-containerd-${SANDBOX_CID}.scope`,
    );
    defer(() => cg.remove());
    const ns = new Netns('real');
    defer(async () => ns.remove());
    ns.exec(['ip', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
    ns.exec(['ip', 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
    const sandbox = start(['ip', 'netns', 'exec', ns.name, 'sleep', '300']);
    cg.addPid(sandbox.pid);
    await eventually(() => nsIno(`/proc/${sandbox.pid}/ns/net`) === nsIno(ns.path), 'the sandbox in its netns');
    assert.match(readFileSync(`/proc/${sandbox.pid}/cgroup`, 'utf8'), new RegExp(`^0::${cg.cgroupPath}$`, 'm'));
    const r = await findPodNetns(uid, [POD_IP], OPTS);
    assert.ok(r.ok, r.ok ? '' : `${r.reason}: ${r.detail}`);
    defer(async () => r.netns.close());
    assert.equal(r.netns.pid, sandbox.pid);
    assert.equal(r.netns.ino, nsIno(ns.path));
  });

  it('no cgroup dir of the pods made here is left in any hierarchy', () => {
    assert.equal(made.length, 2);
    for (const uid of made) assert.deepEqual(podCgroupDirs(uid), [], uid);
    for (const m of cgroupMounts()) assert.equal(existsSync(path.join(m, V2_TOP)), false, path.join(m, V2_TOP));
  });
});

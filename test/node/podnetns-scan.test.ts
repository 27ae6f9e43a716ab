// findPodNetns over a fake /proc tree (test/helpers/podproc.ts) whose `ns/net` links lead to real
// netns made here (`ip netns add`), with /proc/self/ns/net as the host's: the scan, the host-netns
// skip by (dev, ino), the IP check run inside each netns with nsenter, the oldest-wins choice, the
// failures and their messages, and that no fd is left open. Root.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import {
  closeSync,
  existsSync,
  fstatSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import { once } from 'node:events';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { openCandidate } from '../../src/podnetns/find.ts';
import { findPodNetns, runInNetns, type FindResult, type PodNetnsOptions } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { Netns } from '../helpers/netns.ts';
import { cgroupV1, cgroupV2, FakeProc, kubepodsPath } from '../helpers/podproc.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';

const UID = '3c9e2f70-58d1-4b6a-a0e4-9d17c2b85f31';
const UID_SYSTEMD = UID.replaceAll('-', '_');
const FOREIGN_UID = 'e81a0b4c-2f6d-4d93-b7c5-60f4a9e3d128';
const POD_IP = '198.18.40.7';
const POD_IP6 = 'fd00:198:18:40::7';
const HOST_NETNS = '/proc/self/ns/net';
const SANDBOX_CID = 'c4'.repeat(32);
const APP_CID = '7b'.repeat(32);

const defer = cleanupAfterEach();

/** A real netns with a veth pair inside it carrying `addrs` (IPv6 ones without DAD). */
function netnsWith(tag: string, addrs: string[]): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  const ip = (...a: string[]) => {
    const r = spawnSync('ip', ['-n', n.name, ...a], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
  };
  ip('link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0');
  for (const a of addrs)
    ip('addr', 'add', a.includes(':') ? `${a}/64` : `${a}/24`, 'dev', 'eth0', ...(a.includes(':') ? ['nodad'] : []));
  return n;
}

function fakeProc(): FakeProc {
  const p = new FakeProc();
  defer(async () => p.remove());
  return p;
}

const opts = (p: FakeProc): PodNetnsOptions => ({ hostProcDir: p.dir, hostNetnsPath: HOST_NETNS });
const inode = (file: string) => statSync(file, { bigint: true }).ino;
const show = (r: FindResult) => (r.ok ? `found the netns of pid ${r.netns.pid}` : `${r.reason}: ${r.detail}`);

/** The result, its netns closed after the test. */
async function find(uid: string, ips: string[], o: PodNetnsOptions): Promise<FindResult> {
  const r = await findPodNetns(uid, ips, o);
  if (r.ok) defer(async () => r.netns.close());
  return r;
}

describe('findPodNetns over a fake /proc', () => {
  it('finds the sandbox netns of a pod among its containers, a host-netns process and another pod', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const other = netnsWith('other', ['198.18.41.7']);
    const p = fakeProc()
      // CRI-O's conmon: the pod's cgroup, the host netns, the oldest of all.
      .add({
        pid: 90,
        cgroup: cgroupV2(`/kubepods.slice/kubepods-pod${UID_SYSTEMD}.slice/crio-conmon-${SANDBOX_CID}.scope`),
        starttime: 10,
        netns: HOST_NETNS,
        comm: 'conmon',
      })
      .add({
        pid: 120,
        cgroup: cgroupV1(kubepodsPath(UID, APP_CID)),
        starttime: 300,
        netns: pod.path,
        comm: 'envoy (main)',
      })
      .add({ pid: 100, cgroup: cgroupV1(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: pod.path })
      .add({ pid: 200, cgroup: cgroupV1(kubepodsPath(FOREIGN_UID, SANDBOX_CID)), starttime: 5, netns: other.path })
      .add({ pid: 1, cgroup: cgroupV2('/init.scope'), starttime: 1, netns: HOST_NETNS, comm: 'systemd' });
    const before = fdSnapshot();
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(r.ok, show(r));
    assert.equal(r.netns.pid, 100);
    assert.equal(r.netns.ino, inode(pod.path));
    assert.equal(fstatSync(r.netns.fd, { bigint: true }).ino, inode(pod.path));
    assert.equal(fdsOpenedSince(before).length, 1, 'only the winner is left open');
  });

  it("the host's netns never qualifies, even holding the pod IP, and even when a pod's only process is in it", async () => {
    const p = fakeProc().add({
      pid: 90,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 10,
      netns: HOST_NETNS,
    });
    // Whatever the host holds: the agent's loopback address stands for a hostNetwork pod's IP.
    const r = await find(UID, ['127.0.0.1'], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'no_netns');
    assert.match(
      r.detail,
      new RegExp(
        `pod ${UID}: no process of the pod outside the host netns \\(7 processes|1 of the pod, 1 of them in the host netns`,
      ),
    );
  });

  it('the host netns is told by (dev, ino), not by path: another path to it is skipped too', async () => {
    const p = fakeProc().add({
      pid: 91,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 10,
      netns: `/proc/${process.pid}/ns/net`,
    });
    const r = await find(UID, ['127.0.0.1'], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'no_netns');
  });

  it('a process of the pod visiting another netns (older, without the pod IP) loses to the sandbox', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const visited = netnsWith('visited', ['198.18.42.7']);
    const p = fakeProc()
      .add({
        pid: 150,
        cgroup: cgroupV2(kubepodsPath(UID, APP_CID)),
        starttime: 50,
        netns: visited.path,
        comm: 'debug tool',
      })
      .add({ pid: 100, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: pod.path });
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(r.ok, show(r));
    assert.equal(r.netns.ino, inode(pod.path));
    assert.equal(r.netns.pid, 100);
  });

  it('two netns holding the pod IP: the oldest process wins', async () => {
    const a = netnsWith('a', [POD_IP]);
    const b = netnsWith('b', [POD_IP]);
    const p = fakeProc()
      .add({ pid: 100, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: a.path })
      .add({ pid: 101, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 199, netns: b.path });
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(r.ok);
    assert.equal(r.netns.ino, inode(b.path));
    assert.equal(r.netns.pid, 101);
  });

  it('a wrong IP: ip_mismatch, listing what the netns holds; nothing left open', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: pod.path,
    });
    const before = fdSnapshot();
    const r = await find(UID, ['198.18.40.8'], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'ip_mismatch');
    assert.match(
      r.detail,
      new RegExp(
        `no netns of the pod holds 198\\.18\\.40\\.8: netns inode ${inode(pod.path)} \\(pid 100\\) holds 127\\.0\\.0\\.1, ::1, ${POD_IP.replaceAll('.', '\\.')}`,
      ),
    );
    assert.deepEqual(fdsOpenedSince(before), []);
  });

  it('a dual-stack pod found by its IPv6 address, written differently from ip', async () => {
    const pod = netnsWith('pod6', [POD_IP6]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: pod.path,
    });
    const r = await find(UID, ['198.18.40.99', 'FD00:198:18:40:0:0:0:7'], opts(p));
    assert.ok(r.ok, show(r));
    assert.equal(r.netns.ino, inode(pod.path));
  });

  it('no IP in the pod status: ip_mismatch and no netns entered', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: pod.path,
    });
    const r = await find(UID, [], opts(p));
    assert.deepEqual([r.ok, !r.ok && r.reason], [false, 'ip_mismatch']);
    assert.match((r as { detail: string }).detail, /the pod has no IP in its status/);
  });

  it('the UID given in upper case or the pod named only by its systemd slice still matches', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(
        `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID_SYSTEMD}.slice/cri-containerd-${SANDBOX_CID}.scope`,
      ),
      starttime: 200,
      netns: pod.path,
    });
    const r = await find(UID.toUpperCase(), [POD_IP], opts(p));
    assert.ok(r.ok, show(r));
  });

  it('processes that vanished mid-scan are skipped quietly; unreadable ones are counted in the message', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc()
      .add({ pid: 100, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: null })
      .add({
        pid: 101,
        cgroup: cgroupV2(kubepodsPath(UID, APP_CID)),
        starttime: 300,
        netns: '/run/netns/mcni-gone-for-good',
      })
      .add({ pid: 102, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 300, netns: pod.path })
      .write(102, 'stat', '102 (x) S 1')
      .add({ pid: 103, cgroup: 'x', starttime: 300, netns: pod.path })
      .write(103, 'cgroup', cgroupV2(kubepodsPath(UID, APP_CID)).repeat(2000));
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'no_netns');
    assert.match(r.detail, /0 of the pod, 0 of them in the host netns, 2 exited during the scan, 2 unreadable: /);
    assert.match(r.detail, /\/102\/stat has no start time \(field 22\)/);
    assert.match(r.detail, /\/103\/cgroup is longer than 65536 bytes/);
  });

  it('a FIFO or a device where /proc/<pid>/cgroup or stat should be: counted unreadable by kind, never waited on', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc()
      .add({ pid: 100, cgroup: '', starttime: 200, netns: pod.path })
      .add({ pid: 101, cgroup: '', starttime: 300, netns: pod.path })
      .add({ pid: 102, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 100, netns: pod.path });
    const fifo = path.join(p.dir, '100', 'cgroup');
    rmSync(fifo);
    spawnSync('mkfifo', [fifo]);
    rmSync(path.join(p.dir, '101', 'cgroup'));
    spawnSync('mknod', [path.join(p.dir, '101', 'cgroup'), 'c', '1', '5']);
    rmSync(path.join(p.dir, '102', 'stat'));
    spawnSync('mkfifo', [path.join(p.dir, '102', 'stat')]);
    // A reader that waited on a FIFO here would block the event loop itself (the scan reads
    // synchronously): a writer that opens each FIFO once lets such a reader go, so that a scan
    // that waits fails this test instead of hanging it.
    for (const f of [fifo, path.join(p.dir, '102', 'stat')]) {
      const writer = spawn('sh', ['-c', 'exec 3>"$0"', f], { stdio: 'ignore' });
      defer(async () => void writer.kill('SIGKILL'));
    }
    const before = fdSnapshot();
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(!r.ok, show(r));
    assert.match(r.detail, /3 unreadable: /);
    assert.match(r.detail, /\/100\/cgroup is a FIFO, not a file of \/proc; not read/);
    assert.match(r.detail, /\/101\/cgroup is a character device, not a file of \/proc; not read/);
    assert.match(r.detail, /\/102\/stat is a FIFO, not a file of \/proc; not read/);
    assert.deepEqual(fdsOpenedSince(before), []);
  });

  it('a netns link that stats but cannot be opened (a socket here; EACCES without CAP_SYS_PTRACE): no_netns saying why', async () => {
    const p = fakeProc();
    const sock = path.join(p.dir, 'not-a-netns.sock');
    const server = net.createServer().listen(sock);
    await once(server, 'listening');
    defer(async () => server.close());
    p.add({ pid: 100, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: sock });
    const before = fdSnapshot();
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'no_netns');
    assert.match(
      r.detail,
      /the pod's netns could not be opened: netns inode \d+ \(pid 100\): \S+\/100\/ns\/net is a socket, not a network namespace file/,
    );
    assert.deepEqual(fdsOpenedSince(before), []);
  });

  it('a netns swapped after the scan stat it (pid reused, process moved) is passed over, never misread', async () => {
    const a = netnsWith('a', [POD_IP]);
    const b = netnsWith('b', [POD_IP]);
    // The scan saw pid 100 in netns a; by the time it is opened, pid 100's ns/net leads to b.
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: b.path,
    });
    const host = { dev: statSync(HOST_NETNS, { bigint: true }).dev, ino: inode(HOST_NETNS) };
    const id = { dev: statSync(a.path, { bigint: true }).dev, ino: inode(a.path) };
    const before = fdSnapshot();
    assert.equal(await openCandidate(p.dir, { netns: id, pids: [100], starttime: 200n }, host), null);
    assert.deepEqual(fdsOpenedSince(before), [], 'the fd opened on b is closed');
    // The next process of the same netns, still in it, is the one it is held through.
    p.add({ pid: 101, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 300, netns: a.path });
    const held = await openCandidate(p.dir, { netns: id, pids: [100, 101], starttime: 200n }, host);
    assert.ok(held && typeof held !== 'string');
    defer(async () => held.close());
    assert.deepEqual([held.pid, held.ino], [101, id.ino]);
    // A process that moved to the host netns since: passed over too.
    const hostNow = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 1,
      netns: HOST_NETNS,
    });
    assert.equal(await openCandidate(hostNow.dir, { netns: host, pids: [100], starttime: 1n }, host), null);
    assert.equal(fdsOpenedSince(before).length, 1);
  });

  it('an unreadable or wrong --host-netns-path rejects, naming the flag (never a guess)', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: pod.path,
    });
    const notNs = path.join(p.dir, 'uptime');
    for (const [hostNetnsPath, why] of [
      [path.join(p.dir, 'no-such-file'), /ENOENT/],
      [notNs, /not a namespace file/],
    ] as const) {
      await assert.rejects(findPodNetns(UID, [POD_IP], { hostProcDir: p.dir, hostNetnsPath }), (e: Error) => {
        assert.match(e.message, new RegExp(`cannot use ${hostNetnsPath} \\(--host-netns-path\\) as the host netns`));
        assert.match(e.message, why);
        assert.match(e.message, /set --host-netns-path to a file of the host network namespace/);
        return true;
      });
    }
  });

  it('a --host-proc-dir that cannot be listed rejects, naming the flag', async () => {
    const p = fakeProc();
    await assert.rejects(
      findPodNetns(UID, [POD_IP], { hostProcDir: path.join(p.dir, 'nope'), hostNetnsPath: HOST_NETNS }),
      /cannot list the host's processes in .*nope \(--host-proc-dir\): ENOENT/,
    );
  });

  it('the held netns runs programs inside it, and close() closes its fd once', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: pod.path,
    });
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(r.ok);
    const run = await runInNetns(r.netns, ['ip', '-br', 'addr', 'show', 'eth0']);
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, new RegExp(POD_IP.replaceAll('.', '\\.')));
    const fd = r.netns.fd;
    r.netns.close();
    assert.equal(r.netns.fd, -1);
    assert.throws(() => readlinkSync(`/proc/self/fd/${fd}`), /ENOENT/);
    // A file opened now takes the lowest free number, the old one: a second close must not close it.
    const probe = path.join(p.dir, 'uptime');
    const again = openSync(probe, 'r');
    defer(async () => closeSync(again));
    r.netns.close();
    assert.equal(readlinkSync(`/proc/self/fd/${again}`), probe);
    const after = await runInNetns(r.netns, ['true']);
    assert.match(after.error ?? '', /is closed; find it again/);
  });

  it('a long /proc is read in batches: the event loop turns meanwhile (the agent answers lookups)', async () => {
    const p = fakeProc();
    for (let pid = 1000; pid < 1640; pid++)
      p.add({ pid, cgroup: cgroupV2('/system.slice/x.service'), starttime: pid, netns: null });
    let turns = 0;
    let scanning = true;
    const spin = () => {
      if (!scanning) return;
      turns++;
      setImmediate(spin);
    };
    setImmediate(spin);
    const r = await findPodNetns(UID, [POD_IP], opts(p));
    scanning = false;
    assert.equal(r.ok, false);
    assert.match((r as { detail: string }).detail, /\(640 processes under/);
    assert.ok(turns >= 9, `the event loop turned ${turns} times during a scan of 640 processes`);
  });

  it('1,000 find+close cycles leave the open fd count where it was', async () => {
    const pod = netnsWith('pod', [POD_IP]);
    const visited = netnsWith('visited', ['198.18.42.7']);
    const p = fakeProc()
      .add({ pid: 150, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 50, netns: visited.path })
      .add({ pid: 100, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 200, netns: pod.path })
      .add({ pid: 90, cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)), starttime: 10, netns: HOST_NETNS });
    const before = fdSnapshot();
    for (let i = 0; i < 1000; i++) {
      const r = await findPodNetns(UID, i % 10 === 9 ? ['198.18.40.9'] : [POD_IP], opts(p));
      assert.equal(r.ok, i % 10 !== 9);
      if (r.ok) {
        r.netns.close();
        r.netns.close();
      }
    }
    assert.deepEqual(fdsOpenedSince(before), []);
  });
});

describe('findPodNetns: bounded work however many netns a pod makes', () => {
  /** `ip` runs (one per netns looked into), counted by a shim first on PATH (runInNetns keeps PATH's order). */
  function countIpRuns(): () => number {
    const shims = mkdtempSync(path.join(os.tmpdir(), 'mcni-ipshim-'));
    const log = path.join(shims, 'runs');
    writeFileSync(log, '');
    writeFileSync(path.join(shims, 'ip'), `#!/bin/sh\necho x >> ${log}\nexec ${REAL_IP} "$@"\n`, { mode: 0o755 });
    const saved = process.env.PATH;
    process.env.PATH = `${shims}:${saved ?? ''}`;
    defer(async () => {
      process.env.PATH = saved;
      rmSync(shims, { recursive: true, force: true });
    });
    return () =>
      readFileSync(log, 'utf8')
        .split('\n')
        .filter((l) => l === 'x').length;
  }
  const REAL_IP = ['/usr/sbin/ip', '/sbin/ip', '/usr/bin/ip', '/bin/ip'].find((f) => existsSync(f))!;
  const EXTRA = 30;

  // A pod process able to unshare(CLONE_NEWNET) (Kubernetes' default seccomp is Unconfined) can
  // make any number of netns: each was opened and kept open until the end, and `ip` run in each.
  it('stops at the oldest netns holding the pod IP: one look, one fd, however many younger netns', async () => {
    const sandbox = netnsWith('sbx', [POD_IP]);
    const p = fakeProc().add({
      pid: 100,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 200,
      netns: sandbox.path,
    });
    for (let i = 0; i < EXTRA; i++) {
      const n = new Netns('many');
      defer(async () => n.remove());
      p.add({ pid: 1000 + i, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 300 + i, netns: n.path });
    }
    const runs = countIpRuns();
    const before = fdSnapshot();
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(r.ok, show(r));
    assert.equal(r.netns.pid, 100);
    assert.equal(runs(), 1, 'ip run in the sandbox netns only');
    assert.equal(fdsOpenedSince(before).length, 1);
  });

  it('none holding the pod IP: at most 16 netns looked into, the rest named in the detail', async () => {
    const p = fakeProc();
    for (let i = 0; i < EXTRA; i++) {
      const n = new Netns('many');
      defer(async () => n.remove());
      p.add({ pid: 1000 + i, cgroup: cgroupV2(kubepodsPath(UID, APP_CID)), starttime: 300 + i, netns: n.path });
    }
    const runs = countIpRuns();
    const before = fdSnapshot();
    const r = await find(UID, [POD_IP], opts(p));
    assert.ok(!r.ok);
    assert.equal(r.reason, 'ip_mismatch');
    assert.equal(runs(), 16);
    assert.match(r.detail, new RegExp(`the ${EXTRA - 16} younger of the pod's ${EXTRA} netns were not looked into`));
    assert.deepEqual(fdsOpenedSince(before), []);
  });
});

describe("findPodNetns: the agent's own netns never qualifies either", () => {
  it('with --host-netns-path naming another netns, a pod process in the netns the agent runs in is still skipped', async () => {
    // The agent runs with hostNetwork: its own netns IS the node's. A --host-netns-path that names
    // some other netns (a wrong pid, a stale path) must not let the node's netns through.
    const elsewhere = netnsWith('notahost', ['198.18.42.7']);
    const p = fakeProc().add({
      pid: 90,
      cgroup: cgroupV2(kubepodsPath(UID, SANDBOX_CID)),
      starttime: 10,
      netns: HOST_NETNS,
    });
    // The agent's loopback address stands for an address the node holds.
    const r = await find(UID, ['127.0.0.1'], { hostProcDir: p.dir, hostNetnsPath: elsewhere.path });
    assert.ok(!r.ok, show(r));
    assert.equal(r.reason, 'no_netns');
  });
});

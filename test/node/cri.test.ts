// The CRI client (test/helpers/cri.ts) against a real containerd of our own
// (test/helpers/cri-containerd.ts), the one the plugin bench's CRI part drives: Version, one pod
// sandbox started, seen ready with an address from its network, stopped and removed, with the
// CNI calls containerd made logged by the timing shim; then nothing of it is left on the host,
// also when containerd died (SIGKILL) with a sandbox running (seen failing with the harness's shim,
// cgroup and CNI cache cleanup left out; and with the loopback cache and shim socket left).
// With mesh-cni last in containerd's chain, a sandbox gets the same traffic matrix under each
// redirect backend (iptables, native nftables).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { decode, getMessage, getMessages, getString, getUint, map, msg, str, uint, CriClient } from '../helpers/cri.ts';
import { bridgePortmap, compileStatic, Containerd, DEBIAN_PLUGINS } from '../helpers/cri-containerd.ts';
import { runCleanups } from '../helpers/e2e-node.ts';
import { meshPod, tempDir } from '../helpers/plugin.ts';
import { forwardLoopback } from '../helpers/podman.ts';
import { sh as shared } from '../helpers/sh.ts';
import {
  assertRedirectedTraffic,
  assertWrittenWith,
  BACKENDS,
  trafficAnnotations,
  trafficListeners,
} from '../helpers/sidecar-traffic.ts';

describe('CRI protobuf subset', () => {
  it('encodes and decodes nested messages, maps, varints past 32 bits and skips unknown fields', () => {
    const wire = Buffer.concat([
      msg(1, str(1, 'web'), str(2, 'u-1'), str(3, 'shop'), uint(4, 3)),
      map(6, { app: 'web', tier: 'front' }),
      uint(9, 2 ** 40),
      Buffer.from([0x15, 1, 2, 3, 4]), // field 2, fixed32: not ours, skipped
      str(5, ''), // proto3: empty values are left out
    ]);
    const d = decode(wire);
    const meta = getMessage(d, 1)!;
    const metaFields = [getString(meta, 1), getString(meta, 2), getString(meta, 3), getUint(meta, 4)];
    assert.deepEqual(metaFields, ['web', 'u-1', 'shop', 3]);
    const labels = getMessages(d, 6).map((e) => [getString(e, 1), getString(e, 2)]);
    assert.deepEqual(labels, [
      ['app', 'web'],
      ['tier', 'front'],
    ]);
    assert.equal(getUint(d, 9), 2 ** 40);
    assert.equal(d.has(5), false);
    assert.throws(() => decode(Buffer.from([0x0a, 5, 1])), /runs past the message end/);
  });

  it('says which socket a call could not reach', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-cri-none-'));
    const cri = new CriClient(path.join(dir, 'nothing.sock'));
    try {
      await assert.rejects(cri.version(), /nothing\.sock/);
    } finally {
      cri.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function procArgv(pid: string): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

describe('CRI against our own containerd', () => {
  let ctrd: Containerd | undefined;
  let shimDir: string;

  before(async () => {
    shimDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-cri-shim-'));
    ctrd = await Containerd.start({
      tag: 't',
      plugins: bridgePortmap('mcnicri0', '198.18.164.0/24'),
      binaries: DEBIAN_PLUGINS,
      timingShim: compileStatic('cnitime', path.join(shimDir, 'cnitime')),
    });
  });

  after(async () => {
    try {
      await ctrd?.stop();
    } finally {
      rmSync(shimDir, { recursive: true, force: true });
    }
  });

  it('answers Version over runtime.v1', async () => {
    const v = await ctrd!.cri.version();
    assert.equal(v.runtimeName, 'containerd');
    assert.equal(v.runtimeApiVersion, 'v1');
    assert.match(v.runtimeVersion, /\d+\.\d+/);
  });

  it('starts a pod sandbox with its network, then stops and removes it', async () => {
    const c = ctrd!;
    const uid = '5b0c1a2e-0000-4000-8000-000000000001';
    const id = await c.cri.runPodSandbox({
      name: 'web-0',
      namespace: 'shop',
      uid,
      labels: { 'mcni-test': 'cri' },
      cgroupParent: `${c.cgroupParent}/pod${uid}`,
    });
    const st = await c.cri.podSandboxStatus(id);
    assert.equal(st.ready, true);
    assert.deepEqual([st.name, st.namespace, st.uid], ['web-0', 'shop', uid]);
    assert.match(st.ip, /^198\.18\.164\.\d+$/);
    const netns = await c.cri.podSandboxNetns(id);
    assert.ok(netns.startsWith(`${c.dir}/`), `the pod netns is under our state dir: ${netns}`);
    assert.ok(existsSync(netns));
    assert.deepEqual(
      (await c.cri.listPodSandbox({ 'mcni-test': 'cri' })).map((s) => s.id),
      [id],
    );

    const adds = c.cniCalls().filter((k) => k.command === 'ADD' && k.containerId === id);
    const expected = [
      ['bridge', 0],
      ['host-local', 0],
      ['loopback', 0],
      ['portmap', 0],
    ];
    assert.deepEqual(adds.map((k) => [k.plugin, k.code]).sort(), expected);

    await c.cri.stopPodSandbox(id);
    assert.equal((await c.cri.podSandboxStatus(id)).ready, false);
    await c.cri.removePodSandbox(id);
    assert.deepEqual(await c.cri.listPodSandbox(), []);
    const dels = c.cniCalls().filter((k) => k.command === 'DEL' && k.containerId === id && k.plugin !== 'host-local');
    assert.ok(dels.length >= 2, `containerd ran DEL for bridge and portmap: ${dels.map((k) => k.plugin).join(', ')}`);
    assert.ok(dels.every((k) => k.code === 0));
  });

  it('leaves nothing behind after stop()', async () => {
    const c = ctrd!;
    await leftBehindCheck(c, async () => {
      await c.stop();
      ctrd = undefined;
    });
  });
});

// mesh-cni as the runtime runs it: last in containerd's chain (bridge, portmap, mesh-cni, the
// shipped executable), the pod read from the test API server (forwarded into containerd's netns,
// where the plugins run), for a sandbox started over CRI as kubelet starts one. Under each
// redirect backend (our entry's native_nftables, as install-cni writes it) the sandbox's netns
// gets the same traffic matrix, and ours in that backend alone. Each case has its own containerd,
// stopped (sandboxes, netns and all) after it, passed or not.
describe('CRI: a sandbox with mesh-cni in the chain, the traffic matrix per redirect backend', () => {
  let api: TestApiServer;
  const tmp = tempDir();
  const cleanups: (() => unknown)[] = [];

  before(async () => {
    assert.ok(
      existsSync(path.join(ROOT, 'dist/bin/mesh-cni')),
      'dist/bin/mesh-cni is missing: run npm run build first',
    );
    api = await startTestApiServer();
  });
  afterEach(() => runCleanups(cleanups.splice(0), 'CRI traffic case cleanup'));
  after(async () => {
    await api?.close();
    tmp.remove();
  });

  for (const [k, backend] of BACKENDS.entries())
    it(`${backend}: outbound to 15001, inbound to 15006, the proxy's uid and the exclusions go direct`, async () => {
      const subnet = `198.18.${167 + k}`;
      const bridge = `mcnicrit${k}`;
      // Our entry as install-cni writes it (src/install/template.ts), native_nftables as chosen.
      const entry = {
        type: 'mesh-cni',
        log_level: 'info',
        orch: {
          orchconfig: api.writeOrchconfig(path.join(tmp.dir, `orch-${k}`)),
          cni_bin_dir: '/opt/cni/bin',
          exclude_namespaces: ['mesh-system', 'kube-system'],
          node_name: 'node-1',
        },
        native_nftables: backend === 'nftables',
      };
      const c = await Containerd.start({
        tag: `m${k}`,
        plugins: [...bridgePortmap(bridge, `${subnet}.0/24`), entry],
        binaries: { ...DEBIAN_PLUGINS, 'mesh-cni': path.join(ROOT, 'dist/bin/mesh-cni') },
      });
      cleanups.push(() => c.stop());
      const nodeNetns = `/run/netns/${c.netnsName}`;
      const forward = await forwardLoopback(nodeNetns, api.port);
      cleanups.push(() => forward.close());
      // The matrix's excluded range: another address of the node's, on the pods' bridge (made
      // by the first sandbox).
      const excludedIp = `${subnet}.250`;
      const pod = api.upsertPod(
        meshPod('shop', `web-${backend}`, trafficAnnotations(excludedIp), { nodeName: 'node-1' }),
      );
      const uid = pod.metadata!.uid!;
      const id = await c.cri.runPodSandbox({
        name: pod.metadata!.name!,
        namespace: 'shop',
        uid,
        cgroupParent: `${c.cgroupParent}/pod${uid}`,
      });
      const st = await c.cri.podSandboxStatus(id);
      assert.equal(st.ready, true);
      const netns = await c.cri.podSandboxNetns(id);
      shared(['ip', '-n', c.netnsName, 'addr', 'replace', `${excludedIp}/32`, 'dev', bridge]);
      await assertWrittenWith(backend, netns);
      const p = { netns, ip: st.ip, nodeNetns, nodeIp: `${subnet}.1`, excludedIp };
      await trafficListeners(p, cleanups);
      await assertRedirectedTraffic(p);
    });
});

describe('CRI harness cleanup after containerd dies', () => {
  it('removes the shim, the sandbox, its mounts, cgroups, netns and CNI cache files', async () => {
    const plugins = bridgePortmap('mcnicri9', '198.18.165.0/24');
    const c = await Containerd.start({ tag: 'k', plugins, binaries: DEBIAN_PLUGINS });
    try {
      await leftBehindCheck(c, async () => {
        await c.crash();
        await c.stop();
      });
    } finally {
      await c.stop();
    }
  });
});

describe('CRI harness cleanup on Ctrl-C', () => {
  it('a SIGINT to the process group (a bench interrupted) stops its containerd and removes what it made', async () => {
    const helper = JSON.stringify(path.join(ROOT, 'test/helpers/cri-containerd.ts'));
    const script = `
      const { bridgePortmap, Containerd, DEBIAN_PLUGINS } = await import(${helper});
      const plugins = bridgePortmap('mcnicri8', '198.18.166.0/24');
      const c = await Containerd.start({ tag: 'i', plugins, binaries: DEBIAN_PLUGINS });
      const uid = 'u-int-' + process.pid;
      await c.cri.runPodSandbox({ name: 'int-0', namespace: 'shop', uid, cgroupParent: c.cgroupParent + '/pod' + uid });
      console.log(JSON.stringify({ dir: c.dir, netns: c.netnsName, socket: c.socket, cgroupParent: c.cgroupParent }));
      setInterval(() => {}, 1000);
    `;
    // Its own process group, as a shell gives a job: Ctrl-C goes to every process in it.
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      detached: true,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let made: { dir: string; netns: string; socket: string; cgroupParent: string } | undefined;
    try {
      const [line] = (await once(child.stdout, 'data')) as [Buffer];
      made = JSON.parse(line.toString()) as typeof made;
      assert.ok(existsSync(made!.dir));
      process.kill(-child.pid!, 'SIGINT');
      const [, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
      assert.equal(signal, 'SIGINT', 'it still ends by the signal');
      assert.equal(existsSync(made!.dir), false, `${made!.dir} removed`);
      assert.equal(existsSync(`/run/netns/${made!.netns}`), false);
      assert.deepEqual(
        readdirSync('/proc').filter((p) => /^\d+$/.test(p) && procArgv(p).includes(made!.socket)),
        [],
      );
      const cgroups = readdirSync('/sys/fs/cgroup').filter((k) =>
        existsSync(path.join('/sys/fs/cgroup', k, made!.cgroupParent)),
      );
      assert.deepEqual(cgroups, []);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      if (made && existsSync(made.dir)) {
        // What the harness left: the cleanup of the test above, by hand.
        for (const p of readdirSync('/proc')) {
          if (/^\d+$/.test(p) && procArgv(p).includes(made.socket)) process.kill(Number(p), 'SIGKILL');
        }
        const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .map((m) => m.split(' ')[4] ?? '');
        for (const m of mounts.reverse()) if (m.startsWith(made.dir)) spawnSync('umount', ['-l', m]);
        spawnSync('ip', ['netns', 'del', made.netns]);
        const rmdirs = ['-exec', 'find', '{}', '-depth', '-type', 'd', '-delete', ';'];
        spawnSync('find', ['/sys/fs/cgroup', '-maxdepth', '2', '-path', `*${made.cgroupParent}`, ...rmdirs]);
        rmSync(made.dir, { recursive: true, force: true });
      }
    }
  });
});

/** Starts a sandbox on `c`, runs `stop`, then checks nothing of containerd's is left on the host. */
async function leftBehindCheck(c: Containerd, stop: () => Promise<void>): Promise<void> {
  const uid = `u-left-${c.netnsName}`;
  const sid = await c.cri.runPodSandbox({
    name: 'left-0',
    namespace: 'shop',
    uid,
    cgroupParent: `${c.cgroupParent}/pod${uid}`,
  });
  const cgroups = () =>
    readdirSync('/sys/fs/cgroup').filter((k) => existsSync(path.join('/sys/fs/cgroup', k, c.cgroupParent)));
  assert.ok(cgroups().length > 0, 'the sandbox has its cgroups below our parent');
  const shims = () => readdirSync('/proc').filter((p) => /^\d+$/.test(p) && procArgv(p).includes(c.socket));
  assert.ok(shims().length > 0, 'a shim runs the sandbox');
  const cniCache = () =>
    (existsSync('/var/lib/cni/results') ? readdirSync('/var/lib/cni/results') : []).filter((f) =>
      f.startsWith(`${c.networkName}-`),
    );
  assert.ok(
    cniCache().some((f) => f.includes(sid)),
    'libcni cached the sandbox result',
  );
  assert.ok(readFileSync('/proc/self/mountinfo', 'utf8').includes(c.dir), 'the sandbox has mounts in our dir');
  // Outside our dir by containerd's design: CRI's own loopback network caches its result as
  // cni-loopback-<sandbox>-lo, and the shim's socket is in /run/containerd/s, the host's own
  // containerd's dir, whatever our config says.
  const loopbackCache = () =>
    (existsSync('/var/lib/cni/results') ? readdirSync('/var/lib/cni/results') : []).filter((f) =>
      f.startsWith(`cni-loopback-${sid}-`),
    );
  assert.ok(loopbackCache().length > 0, 'libcni cached the loopback result');
  const shimAddress = readFileSync(
    path.join(c.dir, 'state/io.containerd.runtime.v2.task/k8s.io', sid, 'address'),
    'utf8',
  );
  const shimSocket = shimAddress.trim().replace(/^unix:\/\//, '');
  assert.ok(shimSocket.startsWith('/run/containerd/s/') && existsSync(shimSocket), shimAddress);
  await stop();
  assert.deepEqual(loopbackCache(), []);
  assert.equal(existsSync(shimSocket), false, `the shim's socket ${shimSocket} is gone`);
  assert.deepEqual(shims(), []);
  assert.deepEqual(cgroups(), []);
  assert.deepEqual(cniCache(), []);
  assert.equal(existsSync(c.dir), false);
  assert.equal(existsSync(`/run/netns/${c.netnsName}`), false);
  assert.equal(readFileSync('/proc/self/mountinfo', 'utf8').includes(c.dir), false);
}

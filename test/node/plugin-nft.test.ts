// mesh-cni with `native_nftables: true`, run as a runtime runs it, against the real nft 1.0.6:
// real connections from and into a pod netns show what the table does (outbound to 15001, inbound
// to 15006, the proxy's uid 1337 let through, excluded ports and ranges let through), in REDIRECT
// and TPROXY mode and for a `hostUsers: false` pod; CHECK, DEL; a switch between iptables and
// nftables leaves ours in one backend only; nft crashing fails the pod closed with nothing
// written. Every netns, server and temp dir goes after each test, passed or not.

import assert from 'node:assert/strict';
import { chmodSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { spawn, spawnSync } from 'node:child_process';
import { bunBinary } from '../../scripts/plugin-runtime.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach, type Defer } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns, rulesIn, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { sh } from '../helpers/sh.ts';
import { podWithTraffic, reachedAs, tagServer } from '../helpers/userns.ts';

const BUN = bunBinary(ROOT);
const PLUGIN_UNDER_BUN =
  process.env.MESH_TEST_SHIPPED === '1' ? MESH_CNI_SOURCE : [BUN, path.join(ROOT, 'bin/mesh-cni.js')];

/** Annotations every traffic test uses: one excluded port, range and inbound port each. */
const EXCLUDES = (subnet: string) => ({
  'traffic.sidecar.mesh.io/excludeOutboundPorts': '8081',
  'traffic.sidecar.mesh.io/excludeOutboundIPRanges': `${subnet}.10/32`,
  'traffic.sidecar.mesh.io/excludeInboundPorts': '9091',
});

/** A transparent listener (IP_TRANSPARENT), as the proxy's TPROXY inbound port is. */
const TRANSPARENT_SERVER = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_IP, 19, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
`;

async function transparentServer(netns: string, port: number, tag: string, defer: Defer): Promise<void> {
  const child = spawn('nsenter', [`--net=${netns}`, '--', 'python3', '-c', TRANSPARENT_SERVER, String(port), tag], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  defer(async () => {
    child.kill('SIGKILL');
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`transparent server ${tag} exited (${code})`)));
  });
}

/** What a TCP connection to dst:port from `netns` (as `uid`, when given) reads back. */
function reached(netns: string, dst: string, port: number, uid?: number): string {
  const as = uid === undefined ? [] : [`--setuid=${uid}`, `--setgid=${uid}`];
  const r = spawnSync(
    'nsenter',
    [`--net=${netns}`, ...as, '--', 'bash', '-c', `exec 3<>/dev/tcp/${dst}/${port} && head -c 16 <&3`],
    { encoding: 'utf8', timeout: 10_000 },
  );
  return r.status === 0 ? r.stdout : `failed (${r.status ?? r.signal}): ${r.stderr}`;
}

interface Pod {
  readonly ns: Netns;
  readonly far: Netns;
  readonly ip: string;
  readonly subnet: string;
}

/**
 * A pod netns at `subnet`.2 (eth0, its default route) and, over a veth, a far netns at .9 and
 * .10 answering "dest" on 8080 and "dest81" on 8081; in the pod the proxy's outbound port 15001
 * ("proxy"), its inbound port 15006 ("inbound"; transparent for TPROXY) and the app's 9090 / 9091.
 */
async function podWithServers(subnet: string, tproxy: boolean, defer: Defer): Promise<Pod> {
  const ns = new Netns('nftp');
  defer(async () => ns.remove());
  const far = new Netns('nftf');
  defer(async () => far.remove());
  sh(['ip', '-n', far.name, 'link', 'add', 'vd', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns.name]);
  for (const a of [`${subnet}.9/24`, `${subnet}.10/24`]) sh(['ip', '-n', far.name, 'addr', 'add', a, 'dev', 'vd']);
  sh(['ip', '-n', far.name, 'link', 'set', 'vd', 'up']);
  sh(['ip', '-n', ns.name, 'addr', 'add', `${subnet}.2/24`, 'dev', 'eth0']);
  sh(['ip', '-n', ns.name, 'link', 'set', 'eth0', 'up']);
  sh(['ip', '-n', ns.name, 'route', 'add', 'default', 'dev', 'eth0']);
  await tagServer(far.path, 8080, 'dest', defer);
  await tagServer(far.path, 8081, 'dest81', defer);
  await tagServer(ns.path, 15001, 'proxy', defer);
  if (tproxy) await transparentServer(ns.path, 15006, 'inbound', defer);
  else await tagServer(ns.path, 15006, 'inbound', defer);
  await tagServer(ns.path, 9090, 'app', defer);
  await tagServer(ns.path, 9091, 'app91', defer);
  return { ns, far, ip: `${subnet}.2`, subnet };
}

const nftTables = (netns: string): string =>
  spawnSync('nsenter', [`--net=${netns}`, '--', 'nft', 'list', 'tables'], { encoding: 'utf8' }).stdout;

describe('mesh-cni with native nftables', () => {
  const defer = cleanupAfterEach();
  const tmp = tempDir();
  let api: TestApiServer;
  let orchconfig: string;
  let n = 0;
  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig'));
  });
  after(async () => {
    await api?.close();
    tmp.remove();
  });

  function request(
    netns: string,
    ip: string,
    annotations: Record<string, string>,
    extra: Partial<Parameters<typeof meshPod>[3]> = {},
  ) {
    const k8s = api.upsertPod(meshPod('shop', `nft-${++n}`, annotations, extra));
    const id = `nft${process.pid}x${n}`;
    const chain: ChainEnv = { containerId: id, netns, ifname: 'eth0', args: k8sArgs(k8s, id) };
    const prev = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: netns }],
      ips: [{ address: `${ip}/24`, interface: 0 }],
    };
    const conf = (nativeNftables: boolean) =>
      pluginConfig({ cniVersion: '1.0.0', orchconfig, extra: { native_nftables: nativeNftables } }, prev);
    return { chain, nft: conf(true), iptables: conf(false) };
  }

  /** The traffic matrix of a redirected pod (REDIRECT or TPROXY inbound alike). */
  function assertRedirected(p: Pod): void {
    const [far9, far10] = [`${p.subnet}.9`, `${p.subnet}.10`];
    assert.equal(reached(p.ns.path, far9, 8080, 1000), 'proxy', 'the app goes out through the proxy');
    assert.equal(reached(p.ns.path, far9, 8080, 1337), 'dest', 'the proxy (uid 1337) goes out directly');
    assert.equal(reached(p.ns.path, far9, 8081, 1000), 'dest81', 'an excluded outbound port is not redirected');
    assert.equal(reached(p.ns.path, far10, 8080, 1000), 'dest', 'an excluded outbound range is not redirected');
    assert.equal(reached(p.far.path, p.ip, 9090), 'inbound', 'inbound goes to the proxy inbound port');
    assert.equal(reached(p.far.path, p.ip, 9091), 'app91', 'an excluded inbound port reaches the app');
  }

  function assertUntouched(p: Pod): void {
    assert.equal(reached(p.ns.path, `${p.subnet}.9`, 8080, 1000), 'dest');
    assert.equal(reached(p.far.path, p.ip, 9090), 'app');
  }

  for (const [mode, subnet] of [
    ['REDIRECT', '198.18.40'],
    ['TPROXY', '198.18.41'],
  ] as const) {
    it(`${mode}: ADD writes one nftables table and no iptables rule; traffic is redirected as with iptables; CHECK; DEL`, async () => {
      const p = await podWithServers(subnet, mode === 'TPROXY', defer);
      assertUntouched(p);
      const r = request(p.ns.path, p.ip, { ...EXCLUDES(subnet), 'sidecar.mesh.io/interceptionMode': mode });

      const add = await meshCni('ADD', r.chain, r.nft);
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.match(nftTables(p.ns.path), /table inet mesh_pod/);
      assert.doesNotMatch(rulesIn(p.ns.path), /MESH_/, 'no iptables rule of ours');
      assertRedirected(p);
      // What we wrote, as `nft list ruleset` prints it, is what nft itself takes back.
      const listed = p.ns.exec(['nft', 'list', 'ruleset']);
      p.ns.exec(['nft', '-c', '-f', '-'], `flush ruleset\n${listed}`);

      const again = await meshCni('ADD', r.chain, r.nft);
      assert.equal(again.code, 0, again.stdout + again.stderr);
      assert.equal(nftTables(p.ns.path).match(/mesh_pod/g)?.length, 1);
      const check = await meshCni('CHECK', r.chain, r.nft);
      assert.equal(check.code, 0, check.stdout + check.stderr);

      const del = await meshCni('DEL', r.chain, r.nft);
      assert.equal(del.code, 0, del.stdout + del.stderr);
      assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);
      assertUntouched(p);
    });
  }

  it('CHECK finds a rule taken out of our table', async () => {
    const p = await podWithServers('198.18.42', false, defer);
    const r = request(p.ns.path, p.ip, {});
    assert.equal((await meshCni('ADD', r.chain, r.nft)).code, 0);
    p.ns.exec(['nft', 'flush', 'chain', 'inet', 'mesh_pod', 'nat4_MESH_REDIRECT']);
    const check = await meshCni('CHECK', r.chain, r.nft);
    assert.notEqual(check.code, 0, check.stdout);
    const err = JSON.parse(check.stdout) as { msg: string; details: string };
    assert.match(err.msg, /missing or changed/);
    assert.match(err.details, /nat4_MESH_REDIRECT has 0 rules, not 1/);
  });

  it('iptables -> nftables -> iptables: each ADD leaves ours in its backend only, and DEL takes both', async () => {
    const p = await podWithServers('198.18.43', false, defer);
    const r = request(p.ns.path, p.ip, EXCLUDES('198.18.43'));

    assert.equal((await meshCni('ADD', r.chain, r.iptables)).code, 0);
    assert.match(rulesIn(p.ns.path), /-A MESH_OUTPUT/);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);

    const toNft = await meshCni('ADD', r.chain, r.nft);
    assert.equal(toNft.code, 0, toNft.stdout + toNft.stderr);
    assert.doesNotMatch(rulesIn(p.ns.path), /MESH_/, 'our iptables rules are gone');
    assert.match(nftTables(p.ns.path), /table inet mesh_pod/);
    assertRedirected(p);

    const back = await meshCni('ADD', r.chain, r.iptables);
    assert.equal(back.code, 0, back.stdout + back.stderr);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/, 'our nftables table is gone');
    assert.match(rulesIn(p.ns.path), /-A MESH_OUTPUT/);
    assertRedirected(p);

    // A DEL under nftables takes the iptables rules a pod ADDed before the switch has.
    const del = await meshCni('DEL', r.chain, r.nft);
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.doesNotMatch(rulesIn(p.ns.path), /MESH_/);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);
    assertUntouched(p);
  });

  it('a DEL under iptables takes the nftables table a pod ADDed before the switch has', async () => {
    const p = await podWithServers('198.18.44', false, defer);
    const r = request(p.ns.path, p.ip, {});
    assert.equal((await meshCni('ADD', r.chain, r.nft)).code, 0);
    assert.match(nftTables(p.ns.path), /table inet mesh_pod/);
    const del = await meshCni('DEL', r.chain, r.iptables);
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);
    assertUntouched(p);
  });

  it('nft crashing fails the ADD closed (101), with nothing of ours in either backend', async () => {
    const p = await podWithServers('198.18.45', false, defer);
    const r = request(p.ns.path, p.ip, {});
    const bin = path.join(tmp.dir, 'crashing-bin');
    sh(['mkdir', '-p', bin]);
    writeFileSync(path.join(bin, 'nft'), '#!/bin/sh\nkill -SEGV $$\n');
    chmodSync(path.join(bin, 'nft'), 0o755);
    const add = await meshCni('ADD', r.chain, r.nft, MESH_CNI_SOURCE, { PATH: `${bin}:${process.env.PATH ?? ''}` });
    assert.equal(add.code, 1, add.stdout);
    const err = JSON.parse(add.stdout) as { code: number; msg: string; details: string };
    assert.equal(err.code, 101);
    assert.match(err.msg, /cannot apply the redirect rules/);
    assert.match(err.details, /killed by a signal .*did nft crash/);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);
    assert.doesNotMatch(rulesIn(p.ns.path), /MESH_/);
    assertUntouched(p);
  });

  it('on an iptables node a crashing nft fails no pod: the ADD redirects and warns', async () => {
    // The skewed-nft segfault: a node that does not use nftables must not lose every pod to it.
    const p = await podWithServers('198.18.47', false, defer);
    const r = request(p.ns.path, p.ip, EXCLUDES('198.18.47'));
    const bin = path.join(tmp.dir, 'crashing-bin-2');
    sh(['mkdir', '-p', bin]);
    writeFileSync(path.join(bin, 'nft'), '#!/bin/sh\nkill -SEGV $$\n');
    chmodSync(path.join(bin, 'nft'), 0o755);
    const add = await meshCni('ADD', r.chain, r.iptables, MESH_CNI_SOURCE, {
      PATH: `${bin}:${process.env.PATH ?? ''}`,
    });
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assertRedirected(p);
    assert.doesNotMatch(nftTables(p.ns.path), /mesh_pod/);
  });

  it(`a hostUsers: false pod: uid 1337 inside its user namespace goes out directly, another uid is redirected`, async () => {
    const { pod, dst } = await podWithTraffic('198.18.46', defer);
    const r = request(pod.path, '198.18.46.2', {}, { hostUsers: false });
    const add = await meshCni('ADD', r.chain, r.nft, PLUGIN_UNDER_BUN);
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(nftTables(pod.path), /table inet mesh_pod/);
    assert.equal(reachedAs(pod, 1337, dst), 'dest', 'the proxy (uid 1337 inside) is not redirected');
    assert.equal(reachedAs(pod, 1000, dst), 'proxy', 'the app is redirected to the proxy port');
    assert.equal((await meshCni('CHECK', r.chain, r.nft, PLUGIN_UNDER_BUN)).code, 0);
    assert.equal((await meshCni('DEL', r.chain, r.nft, PLUGIN_UNDER_BUN)).code, 0);
    assert.doesNotMatch(nftTables(pod.path), /mesh_pod/);
    assert.equal(reachedAs(pod, 1000, dst), 'dest', 'after DEL nothing is redirected');
  });
});

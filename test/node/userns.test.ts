// Pods with `hostUsers: false`: their netns is owned by the pod's own user namespace, and the
// kernel takes the proxy's `-m owner --uid-owner 1337` rules into it only from inside that user
// namespace. The plugin finds the owner (NS_GET_USERNS, Bun's FFI) and enters it too; under Node,
// which has no ioctl, it refuses such a pod rather than write from the host's user namespace.
// Real traffic: a process running as uid 1337 inside the pod is let through, another uid is
// redirected to the proxy port, on legacy iptables and on the nft shim.

import assert from 'node:assert/strict';
import { statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { bunBinary } from '../../scripts/plugin-runtime.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns, rulesIn, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { sh } from '../helpers/sh.ts';
import { flockedByNodeUser, podWithTraffic, reachedAs, usernsNetns, type UsernsNetns } from '../helpers/userns.ts';

const BUN = bunBinary(ROOT);
// The sources under Bun; with MESH_TEST_SHIPPED=1 the shipped executable (Bun's by default).
const PLUGIN_UNDER_BUN =
  process.env.MESH_TEST_SHIPPED === '1' ? MESH_CNI_SOURCE : [BUN, path.join(ROOT, 'bin/mesh-cni.js')];
const PLUGIN_UNDER_NODE = [process.execPath, path.join(ROOT, 'bin/mesh-cni.js')];
const PROXY_UID = 1337;
const APP_UID = 1000;

describe('the netns owner: NS_GET_USERNS (Bun) or the sysctl owner (Node)', () => {
  const defer = cleanupAfterEach();
  const script = (netns: string) => `
import { podUserns } from ${JSON.stringify(path.join(ROOT, 'cni-plugin/netns/userns.ts'))};
import { statSync } from 'node:fs';
try {
  const u = await podUserns(${JSON.stringify(netns)});
  console.log(JSON.stringify(u === null ? { host: true } : { ino: String(statSync(u.path).ino) }));
  u?.close();
} catch (e) {
  console.log(JSON.stringify({ error: e.message, name: e.constructor.name }));
}`;
  const ownerUnder = (argv0: string, netns: string, dir: string) => {
    const file = path.join(dir, 'owner.ts');
    writeFileSync(file, script(netns));
    return JSON.parse(sh([argv0, file])) as { host?: true; ino?: string; error?: string; name?: string };
  };
  const tmp = tempDir();
  after(() => tmp.remove());

  it("finds the pod's own user namespace under Bun, and none for a netns the host's owns", async () => {
    const pod = await usernsNetns('own', defer);
    const plain = new Netns('own');
    defer(async () => plain.remove());
    assert.deepEqual(ownerUnder(BUN, pod.path, tmp.dir), { ino: String(statSync(pod.userns).ino) });
    assert.deepEqual(ownerUnder(BUN, plain.path, tmp.dir), { host: true });
  });

  it('tells under Node that a user namespace owns it, and refuses it (no ioctl to enter it)', async () => {
    const pod = await usernsNetns('own', defer);
    const plain = new Netns('own');
    defer(async () => plain.remove());
    const r = ownerUnder(process.execPath, pod.path, tmp.dir);
    assert.equal(r.name, 'UsernsError');
    assert.match(r.error ?? '', /owned by a user namespace .*uid 200000 on the host.*runs on Node/);
    assert.deepEqual(ownerUnder(process.execPath, plain.path, tmp.dir), { host: true });
  });
});

describe('mesh-cni ADD, CHECK, DEL for a hostUsers: false pod', () => {
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

  function request(pod: UsernsNetns, flavour: 'legacy' | 'nft', ip: string) {
    const k8s = api.upsertPod(meshPod('shop', `userns-${++n}`, {}, { hostUsers: false }));
    const id = `uns${process.pid}x${n}`;
    const chain: ChainEnv = { containerId: id, netns: pod.path, ifname: 'eth0', args: k8sArgs(k8s, id) };
    const prev = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: pod.path }],
      ips: [{ address: `${ip}/24`, interface: 0 }],
    };
    const stdin = pluginConfig({ cniVersion: '1.0.0', orchconfig, extra: { iptables_flavour: flavour } }, prev);
    return { chain, stdin };
  }

  for (const [flavour, subnet] of [
    ['legacy', '198.18.3'],
    ['nft', '198.18.4'],
  ] as const) {
    it(`${flavour}: ADD enters the pod's user namespace; uid ${PROXY_UID} inside goes out, another uid is redirected; DEL removes ours`, async () => {
      const { pod, dst } = await podWithTraffic(subnet, defer);
      assert.equal(reachedAs(pod, APP_UID, dst), 'dest', 'before ADD nothing is redirected');
      const { chain, stdin } = request(pod, flavour, `${subnet}.2`);

      const add = await meshCni('ADD', chain, stdin, PLUGIN_UNDER_BUN);
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.match(rulesIn(pod.path), /-A MESH_OUTPUT -m owner --uid-owner 1337 -j RETURN/);
      assert.equal(reachedAs(pod, PROXY_UID, dst), 'dest', 'the proxy (uid 1337 inside) is not redirected');
      assert.equal(reachedAs(pod, APP_UID, dst), 'proxy', 'the app is redirected to the proxy port');

      const check = await meshCni('CHECK', chain, stdin, PLUGIN_UNDER_BUN);
      assert.equal(check.code, 0, check.stdout + check.stderr);

      const del = await meshCni('DEL', chain, stdin, PLUGIN_UNDER_BUN);
      assert.equal(del.code, 0, del.stdout + del.stderr);
      assert.doesNotMatch(rulesIn(pod.path), /MESH_/);
      assert.equal(reachedAs(pod, APP_UID, dst), 'dest', 'after DEL nothing is redirected');
    });
  }

  it("legacy: a node user's lock on the netns file keeps no ADD waiting (the lock is the plugin's own)", async () => {
    const pod = await usernsNetns('uns', defer);
    await flockedByNodeUser(pod.path, defer);
    const { chain, stdin } = request(pod, 'legacy', '198.18.6.2');
    const add = await meshCni('ADD', chain, stdin, PLUGIN_UNDER_BUN);
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(rulesIn(pod.path), /-A MESH_OUTPUT -m owner --uid-owner 1337 -j RETURN/);
    const del = await meshCni('DEL', chain, stdin, PLUGIN_UNDER_BUN);
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.doesNotMatch(rulesIn(pod.path), /MESH_/);
  });

  it('under Node, ADD fails closed and writes nothing into the pod netns', async () => {
    const pod = await usernsNetns('uns', defer);
    const { chain, stdin } = request(pod, 'legacy', '198.18.5.2');
    const add = await meshCni('ADD', chain, stdin, PLUGIN_UNDER_NODE);
    assert.notEqual(add.code, 0, add.stdout);
    const err = JSON.parse(add.stdout) as { msg: string; details: string };
    assert.match(err.msg, /cannot apply the redirect rules/);
    assert.match(err.details, /owned by a user namespace .* runs on Node/);
    assert.doesNotMatch(rulesIn(pod.path), /MESH_/);
  });
});

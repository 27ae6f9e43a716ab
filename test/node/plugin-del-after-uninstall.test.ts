// DEL after mesh-cni was uninstalled from the node (docs/uninstall.md, the plugin's half). Pods
// started while we were installed have our entry in the runtime's cached config, so their DEL still
// runs mesh-cni, with the orchconfig, the agent's sockets and maybe the API server gone. DEL must
// then succeed on its own (our rules out if the netns is still there), so the runtime goes on down
// the chain and host-local frees the pod's address.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';

describe('mesh-cni DEL after uninstall', () => {
  const tmp = tempDir();
  let api: TestApiServer;
  let network: BridgeNetwork;
  const pods: Netns[] = [];
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    network = new BridgeNetwork('198.18.9.0/24');
  });
  after(async () => {
    for (const p of pods) p.remove();
    network?.cleanup();
    await api?.close();
    tmp.remove();
  });

  /** The addresses host-local holds leases for. */
  const leases = () =>
    readdirSync(path.join(network.dataDir, 'mcni-plg-net')).filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f));

  /** A pod started while we were installed: bridge + host-local, then mesh-cni with its rules. */
  async function installedPod(): Promise<{
    ns: Netns;
    chain: ChainEnv;
    stdin: Record<string, unknown>;
    prev: Record<string, unknown>;
    orchconfig: string;
  }> {
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, `ZZZ-mesh-cni-orchconfig-${++n}`));
    const pod = api.upsertPod(meshPod('shop', `gone-${n}`));
    const ns = new Netns('pod');
    pods.push(ns);
    const chain: ChainEnv = {
      containerId: `ctr${process.pid}u${n}`,
      netns: ns.path,
      ifname: 'eth0',
      args: k8sArgs(pod, `ctr${process.pid}u${n}`),
    };
    const prev = await network.addPod(chain);
    // What the runtime caches: our entry as install-cni wrote it (agent sockets, flavour auto).
    const stdin = pluginConfig(
      {
        cniVersion: '1.0.0',
        orchconfig,
        logUds: path.join(tmp.dir, 'run/log.sock'),
        extra: { pod_lookup_uds_address: path.join(tmp.dir, 'run/pods.sock'), iptables_flavour: 'auto' },
      },
      prev,
    );
    const add = await meshCni('ADD', chain, stdin);
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(ns.exec(['iptables-save', '-t', 'nat']), /-A OUTPUT -j MESH_OUTPUT/);
    return { ns, chain, stdin, prev, orchconfig };
  }

  it('with the orchconfig and the API server gone: our rules out, exit 0, and the chain frees the lease', async () => {
    const { ns, chain, stdin, prev, orchconfig } = await installedPod();
    const ip = (prev.ips as { address: string }[])[0]!.address.split('/')[0]!;
    assert.ok(leases().includes(ip), 'host-local holds the pod address');
    rmSync(orchconfig);
    await api.stop();
    try {
      const before = api.requests.length;
      const del = await meshCni('DEL', chain, stdin);
      assert.equal(del.code, 0, del.stdout + del.stderr);
      assert.equal(del.stdout, '');
      assert.equal(api.requests.length, before, 'no API request');
      assert.doesNotMatch(ns.exec(['iptables-save']), /MESH_/, 'our rules are out');
      // The runtime goes on down the chain (in reverse): the bridge's host-local frees the address.
      const bridgeDel = await network.bridgeCmd('DEL', chain, prev);
      assert.equal(bridgeDel.code, 0, bridgeDel.stdout + bridgeDel.stderr);
      assert.ok(!leases().includes(ip), 'the lease is freed');
    } finally {
      await api.start();
    }
  });

  it('with the orchconfig gone and the netns already removed: exit 0', async () => {
    const { ns, chain, stdin, orchconfig } = await installedPod();
    rmSync(orchconfig);
    ns.remove();
    assert.ok(!existsSync(ns.path));
    const del = await meshCni('DEL', chain, stdin);
    assert.equal(del.code, 0, del.stdout + del.stderr);
  });

  it('with a config that names no orchconfig at all (an entry from before orch.orchconfig): exit 0', async () => {
    const { ns, chain, stdin } = await installedPod();
    const del = await meshCni('DEL', chain, { ...stdin, orch: {} });
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.doesNotMatch(ns.exec(['iptables-save']), /MESH_/);
  });
});

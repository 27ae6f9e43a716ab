// The traffic matrix of a pod podman started with install-cni ready, under each redirect backend
// (--native-nftables=false and true): the same connections go to the same places
// (sidecar-traffic.ts), and ours is in that backend alone. One suite per way install-cni puts our
// entry where the runtime reads it (spliced into the primary's conflist, or our own file with
// --mesh-owned-cni-config): the entry must carry the backend either way. One node and podman
// (e2e-node.ts) for both backends; each case runs its own agent, which uninstalls when it stops
// (--cleanup-on-exit=always), so the next one writes our entry afresh. The pod's container, the
// listeners and the agent go after each case, the node after the suite, passed or not.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import type { AgentProcess } from './agent.ts';
import type { TestApiServer } from './apiserver.ts';
import { ROOT } from './cli.ts';
import { addHostNetns, apiAndTree, podmanOn, runCleanups, startContainer, startNodeAgent } from './e2e-node.ts';
import type { HostTree } from './hosttree.ts';
import { meshPod } from './plugin.ts';
import type { Podman } from './podman.ts';
import { runtimeView } from './runtime-view.ts';
import { sh } from './sh.ts';
import {
  assertRedirectedTraffic,
  assertWrittenWith,
  BACKENDS,
  trafficAnnotations,
  trafficListeners,
} from './sidecar-traffic.ts';

/** The primary CNI's conflist: a bridge on `subnet`.0/24, its gateway `subnet`.1. */
function bridgeConflist(network: string, bridge: string, subnet: string, ipamDir: string): string {
  const ipam = {
    type: 'host-local',
    ranges: [[{ subnet: `${subnet}.0/24`, gateway: `${subnet}.1` }]],
    dataDir: ipamDir,
  };
  const plugins = [{ type: 'bridge', bridge, isGateway: true, ipMasq: false, ipam }];
  return JSON.stringify({ cniVersion: '1.0.0', name: network, plugins }, null, 2);
}

/**
 * The suite, its names from `tag` (unique per process and suite), its pods on `subnet`.0/24, our
 * entry in the primary's conflist or, `owned`, in our own file.
 */
export function podmanTrafficSuite(o: { tag: string; subnet: string; owned: boolean }): void {
  const how = o.owned ? 'our own conflist (--mesh-owned-cni-config)' : "the primary's conflist";
  describe(`e2e: podman + install-cni, our entry in ${how}: the traffic matrix per redirect backend`, () => {
    const NETWORK = o.tag;
    const BUSYBOX = `localhost/${o.tag}-busybox:latest`;
    const hostNetns = `${o.tag}-host`;
    const hostNetnsPath = `/run/netns/${hostNetns}`;
    const bridge = `mcnit${o.owned ? 'o' : 's'}${process.pid % 100000}`;
    const nodeIp = `${o.subnet}.1`;
    // The matrix's excluded range: another address of the node's, on the pods' bridge.
    const excludedIp = `${o.subnet}.250`;
    let api: TestApiServer;
    let tree: HostTree;
    let podman: Podman;
    let agent: AgentProcess | undefined;
    const cleanups: (() => unknown)[] = [];
    const caseCleanups: (() => unknown)[] = [];

    before(async () => {
      assert.ok(existsSync(path.join(ROOT, 'dist/bin/mesh-cni')), 'dist/bin/mesh-cni is missing: run npm run build');
      addHostNetns(hostNetns, cleanups);
      ({ api, tree } = await apiAndTree(hostNetnsPath, cleanups));
      const ipamDir = path.join(tree.root, 'ipam');
      await fs.mkdir(ipamDir);
      await fs.writeFile(
        path.join(tree.netDir, '10-mcni-traffic.conflist'),
        bridgeConflist(NETWORK, bridge, o.subnet, ipamDir),
      );
      podman = await podmanOn(
        NETWORK,
        BUSYBOX,
        { cniPluginDirs: [tree.binDir, '/usr/lib/cni'], networkConfigDir: tree.netDir, hostNetns: hostNetnsPath },
        cleanups,
      );
    });

    afterEach(async () => {
      await agent?.stop('SIGKILL');
      agent = undefined;
      await runCleanups(caseCleanups.splice(0), 'e2e traffic case cleanup');
    });

    after(() => runCleanups(cleanups, 'e2e traffic cleanup'));

    for (const backend of BACKENDS)
      it(`${backend}: outbound to 15001, inbound to 15006, the proxy's uid and the exclusions go direct`, async () => {
        agent = await startNodeAgent(tree, api, nodeIp, {
          'cleanup-on-exit': 'always',
          'mesh-owned-cni-config': String(o.owned),
          'native-nftables': String(backend === 'nftables'),
        });
        const read = runtimeView(tree.netDir).file;
        assert.equal(read === '10-mcni-traffic.conflist', !o.owned, `the runtime reads ${read}`);
        const conf = JSON.parse(await fs.readFile(path.join(tree.netDir, read!), 'utf8')) as {
          plugins: { type: string; native_nftables?: boolean }[];
        };
        const entry = conf.plugins.find((p) => p.type === 'mesh-cni');
        assert.equal(entry?.native_nftables ?? false, backend === 'nftables', `our entry in ${read} names the backend`);

        const name = `${o.tag}-${backend}`;
        api.upsertPod({ ...meshPod('default', name, trafficAnnotations(excludedIp)), status: { phase: 'Pending' } });
        caseCleanups.push(() => podman.run(['rm', '--force', '--time', '0', name]));
        const netns = await startContainer(podman, NETWORK, BUSYBOX, name);
        sh(['ip', '-n', hostNetns, 'addr', 'replace', `${excludedIp}/32`, 'dev', bridge]);
        const ipFormat = `{{(index .NetworkSettings.Networks "${NETWORK}").IPAddress}}`;
        const ip = (await podman.ok(['inspect', '--format', ipFormat, name])).trim();
        await assertWrittenWith(backend, netns);
        const pod = { netns, ip, nodeNetns: hostNetnsPath, nodeIp, excludedIp };
        await trafficListeners(pod, caseCleanups);
        await assertRedirectedTraffic(pod);

        assert.equal(await agent.stop('SIGTERM', 30_000), 0);
        agent = undefined;
      });
  });
}

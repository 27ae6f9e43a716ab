// The race --mesh-owned-cni-config closes, with a real runtime: the primary CNI rewrites its
// conflist (without our entry) 50 times while podman starts 20 containers on its network. What each
// start ran is in libcni's result cache (/var/lib/cni/results/<network>-<container id>-eth0, the
// conflist podman used): with --mesh-owned-cni-config every one of them ran mesh-cni. The same
// storm with our entry spliced into the primary's file runs first, its count printed (not asserted:
// how many starts hit the window depends on the machine's timing).
//
// What tells the modes apart (asserted, not timing-bound): in owned mode the primary's file never
// held mesh-cni (checked before each of its rewrites replaced it, and by a sampler reading it
// every few ms), so a cached chain with mesh-cni came from our file; the file the runtime would
// pick never lacked our entry in any sample; and the cached configs carry the primary's
// x-generation from more than one rewrite, so ours followed the rewrites between the starts. With
// the splice the primary does hold our entry (asserted), and the samples without it are printed.
//
// As in e2e-podman.test.ts: a netns this test makes is the node's host network, podman (CNI
// backend) runs in it, install-cni runs from source with the sandbox dirs as its host mounts,
// podman's network config dir is the node's net dir. podman names no namespace, so mesh-cni
// passes these calls through (no pod to redirect): it is in the chain, which is what counts.
// Then, with our own file, the traffic matrix of a pod under each redirect backend
// (test/helpers/podman-traffic.ts): our file must carry native_nftables as a spliced entry does.

import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import type { TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { addHostNetns, apiAndTree, CNI_CACHE, podmanOn, runCleanups } from '../helpers/e2e-node.ts';
import type { HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import type { Podman } from '../helpers/podman.ts';
import { podmanTrafficSuite } from '../helpers/podman-traffic.ts';
import { runtimeView } from '../helpers/runtime-view.ts';

const TAG = `mcni-own-${process.pid}`;
const NETWORK = TAG;
const NODE = 'node-1';
const SUBNET = '198.19.1.0/24';
const STARTS = 20;
const REWRITES = 50;
const PRIMARY = '10-mcni-own.conflist';

function primaryConflist(bridge: string, ipamDir: string, generation: number): string {
  return `{
  "cniVersion": "1.0.0",
  "name": "${NETWORK}",
  "x-generation": ${generation},
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${bridge}",
      "isGateway": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "${SUBNET}", "gateway": "198.19.1.1" }]],
        "dataDir": "${ipamDir}"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
`;
}

describe('e2e: a primary CNI rewriting its config while podman starts containers', { timeout: 600_000 }, () => {
  const hostNetns = `${TAG}-host`;
  const hostNetnsPath = `/run/netns/${hostNetns}`;
  const bridge = `mcnio${process.pid % 100000}`.slice(0, 15);
  const BUSYBOX = `localhost/${TAG}-busybox:latest`;
  let api: TestApiServer;
  let tree: HostTree;
  let podman: Podman;
  let agent: AgentProcess | undefined;
  let ipamDir: string;
  let generation = 0;
  const cleanups: (() => unknown)[] = [];

  before(async () => {
    addHostNetns(hostNetns, cleanups);
    ({ api, tree } = await apiAndTree(hostNetnsPath, cleanups));
    ipamDir = path.join(tree.root, 'ipam');
    await fs.mkdir(ipamDir);
    podman = await podmanOn(
      NETWORK,
      BUSYBOX,
      { cniPluginDirs: [tree.binDir, '/usr/lib/cni'], networkConfigDir: tree.netDir, hostNetns: hostNetnsPath },
      cleanups,
    );
  });

  after(async () => {
    await agent?.stop('SIGKILL');
    await runCleanups(cleanups, 'e2e cleanup');
  });

  /** What the primary's file held just before each rewrite replaced it: ours in it or not. */
  let replacedWithEntry = 0;
  /**
   * The primary CNI rewrites its file as it does on upgrade: temp file + rename, no entry of
   * ours. What it replaces is looked at first: with the owned file it is what we wrote last.
   */
  const rewrite = async () => {
    const file = path.join(tree.netDir, PRIMARY);
    const tmp = path.join(tree.netDir, `.${PRIMARY}.primary-tmp`);
    const before = await fs.readFile(file, 'utf8').catch(() => '');
    if (before.includes('mesh-cni')) replacedWithEntry++;
    await fs.writeFile(tmp, primaryConflist(bridge, ipamDir, ++generation));
    await fs.rename(tmp, file);
  };

  /** Samples, every few ms until stopped: the primary's file and the file the runtime would pick. */
  function sampler() {
    const seen = { samples: 0, primaryWithEntry: 0, runtimeWithout: 0 };
    let running = true;
    const loop = (async () => {
      while (running) {
        seen.samples++;
        if ((await fs.readFile(path.join(tree.netDir, PRIMARY), 'utf8').catch(() => '')).includes('mesh-cni'))
          seen.primaryWithEntry++;
        if (runtimeView(tree.netDir).entries !== 1) seen.runtimeWithout++;
        await new Promise((r) => setTimeout(r, 3));
      }
    })();
    return {
      seen,
      stop: async () => {
        running = false;
        await loop;
        return seen;
      },
    };
  }

  /** Starts `STARTS` containers with `REWRITES` rewrites around them; the chain each start ran. */
  async function storm(owned: boolean): Promise<{
    chains: string[][];
    generations: number[];
    replacedWithEntry: number;
    seen: ReturnType<typeof sampler>['seen'];
  }> {
    await rewrite();
    replacedWithEntry = 0;
    agent = spawnAgent(
      tree,
      {
        'cni-net-dir': tree.netDir,
        'cni-bin-dir': tree.binDir,
        'cleanup-on-exit': 'always',
        'mesh-owned-cni-config': String(owned),
      },
      {
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String(api.port),
        NODE_NAME: NODE,
        HOST_IP: '198.19.1.1',
      },
    );
    await eventually(async () => (await agent!.get('/readyz')).status === 200, 'install-cni to be ready', 30_000).catch(
      async (e: Error) => {
        throw new Error(`${e.message}: ${(await agent!.get('/readyz')).body}; stderr: ${agent!.stderr()}`);
      },
    );
    const sampling = sampler();
    const names: string[] = [];
    let done = 0;
    for (let i = 0; i < STARTS; i++) {
      const name = `${TAG}-${owned ? 'o' : 's'}${i}`;
      names.push(name);
      // 50 rewrites over 20 starts: 3 around each of the first 10, 2 around the others, made
      // while podman is starting the container.
      const n = i < REWRITES - 2 * STARTS ? 3 : 2;
      const start = podman.ok(['run', '--detach', '--name', name, '--network', NETWORK, BUSYBOX, 'sleep', '600']);
      for (let k = 0; k < n; k++) {
        await new Promise((r) => setTimeout(r, 15 + 20 * k));
        await rewrite();
        done++;
      }
      await start;
    }
    assert.equal(done, REWRITES);
    const seen = await sampling.stop();
    const chains: string[][] = [];
    const generations: number[] = [];
    for (const name of names) {
      const id = (await podman.ok(['inspect', '--format', '{{.Id}}', name])).trim();
      const cache = JSON.parse(readFileSync(path.join(CNI_CACHE, `${NETWORK}-${id}-eth0`), 'utf8')) as {
        config: string;
      };
      const list = JSON.parse(Buffer.from(cache.config, 'base64').toString('utf8')) as {
        'x-generation': number;
        plugins: { type: string }[];
      };
      chains.push(list.plugins.map((p) => p.type));
      generations.push(list['x-generation']);
    }
    for (const name of names) await podman.ok(['rm', '--force', '--time', '0', name]);
    assert.equal(await agent.stop('SIGTERM', 30_000), 0);
    agent = undefined;
    assert.ok(!existsSync(path.join(tree.netDir, '02-mesh-cni.conflist')), 'uninstall removed our owned file');
    return { chains, generations, replacedWithEntry, seen };
  }

  it(`${STARTS} container starts under ${REWRITES} primary rewrites: none without mesh-cni with --mesh-owned-cni-config`, async (t) => {
    for (const bin of ['dist/bin/mesh-cni'])
      assert.ok(existsSync(path.join(ROOT, bin)), `${bin} is missing: run npm run build first`);
    const without = (chains: string[][]) => chains.filter((c) => !c.includes('mesh-cni'));
    const report = (mode: string, r: Awaited<ReturnType<typeof storm>>) =>
      t.diagnostic(
        `${mode}: ${without(r.chains).length} of ${STARTS} starts without mesh-cni; ${r.seen.runtimeWithout} of ${r.seen.samples} samples of the runtime's file without our entry; primary held our entry in ${r.seen.primaryWithEntry} samples and before ${r.replacedWithEntry} of ${REWRITES} rewrites; ${new Set(r.generations).size} primary generations in the cached configs`,
      );
    const spliced = await storm(false);
    report('spliced', spliced);
    // The splice writes into the primary's file: our entry was there before some rewrite.
    assert.ok(
      spliced.replacedWithEntry + spliced.seen.primaryWithEntry > 0,
      'with the splice the primary held our entry at some point',
    );
    const owned = await storm(true);
    report('owned  ', owned);
    // The primary never held our entry, so a chain with it came from our file...
    assert.equal(owned.replacedWithEntry, 0, 'the primary held our entry before a rewrite: it was edited');
    assert.equal(owned.seen.primaryWithEntry, 0, 'the primary held our entry in a sample');
    // ...the file the runtime would pick always had it...
    assert.ok(owned.seen.samples > 0);
    assert.equal(owned.seen.runtimeWithout, 0, "a sample of the runtime's file without our entry");
    // ...and ours followed the rewrites between the starts (not all made from one generation).
    assert.ok(new Set(owned.generations).size > 1, `cached generations ${JSON.stringify(owned.generations)}`);
    assert.deepEqual(without(owned.chains), [], 'every start ran mesh-cni');
    for (const c of owned.chains) assert.deepEqual(c, ['bridge', 'portmap', 'mesh-cni']);
  });
});

podmanTrafficSuite({ tag: `${TAG}-t`, subnet: '198.19.4', owned: true });

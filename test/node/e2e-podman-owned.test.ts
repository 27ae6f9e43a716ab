// Issue 13 with a real runtime: the primary CNI rewrites its conflist (without our entry) 50
// times while podman starts 20 containers on its network. What each start ran is in libcni's
// result cache (/var/lib/cni/results/<network>-<container id>-eth0, the conflist podman used):
// with --mesh-owned-cni-config every one of them ran mesh-cni. The same storm with our entry
// spliced into the primary's file runs first, its count printed (not asserted: how many starts
// hit the window depends on the machine's timing).
//
// As in e2e-podman.test.ts: a netns this test makes is the node's host network, podman (CNI
// backend) runs in it, install-cni runs from source with the sandbox dirs as its host mounts,
// podman's network config dir is the node's net dir. podman names no namespace, so mesh-cni
// passes these calls through (no pod to redirect): it is in the chain, which is what counts.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, linkSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { forwardLoopback, importBusybox, makePodman, type LoopbackForward, type Podman } from '../helpers/podman.ts';

const TAG = `mcni-own-${process.pid}`;
const NETWORK = TAG;
const NODE = 'node-1';
/** libcni's result cache: podman 4.3 gives no setting for it, so it is the machine's. */
const CNI_CACHE = '/var/lib/cni/results';
const SUBNET = '198.19.1.0/24';
const STARTS = 20;
const REWRITES = 50;
const PRIMARY = '10-mcni-own.conflist';

function sh(file: string, args: readonly string[]): string {
  const r = spawnSync(file, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${file} ${args.join(' ')} failed (${r.status}): ${r.stderr}`);
  return r.stdout;
}

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

describe('e2e: a primary CNI rewriting its config while podman starts containers (issue 13)', { timeout: 600_000 }, () => {
  const hostNetns = `${TAG}-host`;
  const hostNetnsPath = `/run/netns/${hostNetns}`;
  const bridge = `mcnio${process.pid % 100000}`.slice(0, 15);
  const BUSYBOX = `localhost/${TAG}-busybox:latest`;
  let api: TestApiServer;
  let tree: HostTree;
  let podman: Podman;
  let forward: LoopbackForward | undefined;
  let agent: AgentProcess | undefined;
  let ipamDir: string;
  let generation = 0;
  const cleanups: (() => unknown)[] = [];

  before(async () => {
    sh('ip', ['netns', 'add', hostNetns]);
    cleanups.push(() => spawnSync('ip', ['netns', 'del', hostNetns]));
    sh('ip', ['-n', hostNetns, 'link', 'set', 'lo', 'up']);
    api = await startTestApiServer();
    cleanups.push(() => api.close());
    forward = await forwardLoopback(hostNetnsPath, api.port);
    cleanups.push(() => forward?.close());
    tree = await makeHostTree({ token: api.token, ca: api.caPem });
    cleanups.push(() => tree.remove());
    const exe = path.join(tree.binariesDir, 'mesh-cni');
    await fs.rm(exe);
    try {
      linkSync(path.join(ROOT, 'dist/bin/mesh-cni'), exe);
    } catch {
      copyFileSync(path.join(ROOT, 'dist/bin/mesh-cni'), exe);
    }
    ipamDir = path.join(tree.root, 'ipam');
    await fs.mkdir(ipamDir);
    podman = makePodman({ cniPluginDirs: [tree.binDir, '/usr/lib/cni'], networkConfigDir: tree.netDir, hostNetns: hostNetnsPath });
    cleanups.push(async () => {
      for (const f of await fs.readdir(CNI_CACHE).catch(() => [] as string[])) {
        if (f.startsWith(`${NETWORK}-`)) await fs.rm(path.join(CNI_CACHE, f), { force: true });
      }
    });
    cleanups.push(() => podman.remove());
    await importBusybox(podman, BUSYBOX);
  });

  after(async () => {
    await agent?.stop('SIGKILL');
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (e) {
        console.error(`e2e cleanup: ${(e as Error).message}`);
      }
    }
  });

  /** The primary CNI rewrites its file as it does on upgrade: temp file + rename, no entry of ours. */
  const rewrite = async () => {
    const file = path.join(tree.netDir, PRIMARY);
    const tmp = path.join(tree.netDir, `.${PRIMARY}.primary-tmp`);
    await fs.writeFile(tmp, primaryConflist(bridge, ipamDir, ++generation));
    await fs.rename(tmp, file);
  };

  /** Starts `STARTS` containers with `REWRITES` rewrites around them; the chain each start ran. */
  async function storm(owned: boolean): Promise<string[][]> {
    await rewrite();
    agent = spawnAgent(tree, {
      'cni-net-dir': tree.netDir,
      'cni-bin-dir': tree.binDir,
      'cleanup-on-exit': 'always',
      'mesh-owned-cni-config': String(owned),
    }, { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(api.port), NODE_NAME: NODE, HOST_IP: '198.19.1.1' });
    await eventually(async () => (await agent!.get('/readyz')).status === 200, 'install-cni to be ready', 30_000).catch(async (e: Error) => {
      throw new Error(`${e.message}: ${(await agent!.get('/readyz')).body}; stderr: ${agent!.stderr()}`);
    });
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
    const chains: string[][] = [];
    for (const name of names) {
      const id = (await podman.ok(['inspect', '--format', '{{.Id}}', name])).trim();
      const cache = JSON.parse(readFileSync(path.join(CNI_CACHE, `${NETWORK}-${id}-eth0`), 'utf8')) as { config: string };
      const list = JSON.parse(Buffer.from(cache.config, 'base64').toString('utf8')) as { plugins: { type: string }[] };
      chains.push(list.plugins.map((p) => p.type));
    }
    for (const name of names) await podman.ok(['rm', '--force', '--time', '0', name]);
    assert.equal(await agent.stop('SIGTERM', 30_000), 0);
    agent = undefined;
    assert.ok(!existsSync(path.join(tree.netDir, '02-mesh-cni.conflist')), 'uninstall removed our owned file');
    return chains;
  }

  it(`${STARTS} container starts under ${REWRITES} primary rewrites: none without mesh-cni with --mesh-owned-cni-config`, async (t) => {
    for (const bin of ['dist/bin/mesh-cni']) assert.ok(existsSync(path.join(ROOT, bin)), `${bin} is missing: run npm run build first`);
    const without = (chains: string[][]) => chains.filter((c) => !c.includes('mesh-cni'));
    const spliced = await storm(false);
    t.diagnostic(`spliced: ${without(spliced).length} of ${STARTS} starts without mesh-cni: ${JSON.stringify(without(spliced))}`);
    const owned = await storm(true);
    t.diagnostic(`owned:   ${without(owned).length} of ${STARTS} starts without mesh-cni`);
    assert.deepEqual(without(owned), [], 'every start ran mesh-cni');
    for (const c of owned) assert.deepEqual(c, ['bridge', 'portmap', 'mesh-cni']);
  });
});

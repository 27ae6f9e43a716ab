// The node the podman end-to-end tests share: a netns standing in for the node's own network, the
// test API server reachable from it, a host tree with the built plugin where the image puts it, a
// private podman with a busybox image on the test's CNI network, and the suite's cleanups run
// newest first at the end. Each piece is removed with the
// suite, even when the suite fails.

import { spawnSync } from 'node:child_process';
import { copyFileSync, linkSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import assert from 'node:assert/strict';
import { spawnAgent, type AgentProcess } from './agent.ts';
import { startTestApiServer, type TestApiServer, type TestApiServerOptions } from './apiserver.ts';
import { ROOT } from './cli.ts';
import { makeHostTree, type HostTree } from './hosttree.ts';
import { forwardLoopback, importBusybox, makePodman, type Podman, type PodmanOptions } from './podman.ts';
import { eventually } from './poll.ts';
import { sh } from './sh.ts';
import { DEFAULT_TEMPLATE } from '../../src/install/template.ts';

/** What a suite removes at its end, pushed as it makes each thing. */
export type SuiteCleanups = (() => unknown)[];

/** The node the podman suites' agent runs for. */
export const NODE = 'node-1';

/** libcni's result cache: podman 4.3 gives no setting for it, so it is the machine's. */
export const CNI_CACHE = '/var/lib/cni/results';

/** Adds netns `name` (/run/netns/<name>) with loopback up: the node's "host" network. */
export function addHostNetns(name: string, cleanups: SuiteCleanups): void {
  sh(['ip', 'netns', 'add', name]);
  cleanups.push(() => spawnSync('ip', ['netns', 'del', name]));
  sh(['ip', '-n', name, 'link', 'set', 'lo', 'up']);
}

/**
 * The test API server (`apiOptions`), reachable on loopback inside the host netns at
 * `hostNetnsPath` as a node reaches its own, and a host tree with its token and CA and the built
 * plugin.
 */
export async function apiAndTree(
  hostNetnsPath: string,
  cleanups: SuiteCleanups,
  apiOptions?: TestApiServerOptions,
): Promise<{ api: TestApiServer; tree: HostTree }> {
  const api = await startTestApiServer(apiOptions);
  cleanups.push(() => api.close());
  const forward = await forwardLoopback(hostNetnsPath, api.port);
  cleanups.push(() => forward.close());
  const tree = await makeHostTree({ token: api.token, ca: api.caPem });
  cleanups.push(() => tree.remove());
  await putBuiltPlugin(tree);
  return { api, tree };
}

/** The image's binaries dir holds the plugin executable only (see scripts/image.sh): the built one. */
async function putBuiltPlugin(tree: HostTree): Promise<void> {
  const exe = path.join(tree.binariesDir, 'mesh-cni');
  await fs.rm(exe);
  try {
    linkSync(path.join(ROOT, 'dist/bin/mesh-cni'), exe);
  } catch {
    copyFileSync(path.join(ROOT, 'dist/bin/mesh-cni'), exe);
  }
}

/**
 * A private podman (`opts`) with busybox imported as `image`. DEL (podman rm) removes podman's
 * cache entries; whatever a failed run left in libcni's cache for `network` is ours by name, and
 * goes with the podman at the end.
 */
export async function podmanOn(
  network: string,
  image: string,
  opts: PodmanOptions,
  cleanups: SuiteCleanups,
): Promise<Podman> {
  const podman = makePodman(opts);
  cleanups.push(async () => {
    for (const f of await fs.readdir(CNI_CACHE).catch(() => [] as string[]))
      if (f.startsWith(`${network}-`)) await fs.rm(path.join(CNI_CACHE, f), { force: true });
  });
  cleanups.push(() => podman.remove());
  await importBusybox(podman, image);
  return podman;
}

/**
 * install-cni against this node (its host IP `hostIp`), from source, as our DaemonSet's pod
 * `mesh-system/mesh-cni-node-e2e`, with `flags` over what every podman suite gives it; resolves
 * once it is ready.
 */
export async function startNodeAgent(
  tree: HostTree,
  api: TestApiServer,
  hostIp: string,
  flags: Record<string, string>,
): Promise<AgentProcess> {
  const agent = spawnAgent(
    tree,
    {
      'cni-net-dir': tree.netDir,
      'cni-bin-dir': tree.binDir,
      // The plugin's own level: its info records (rules applied) reach the agent's log.
      'log-level': 'info',
      log_output_level: 'default:info,install:debug,cni:debug,repair:debug',
      // podman names no namespace; this test's pods live in default, so the plugin is told to
      // assume it (by default such calls are no Kubernetes pods and pass through).
      'cni-network-config': DEFAULT_TEMPLATE.replace(
        '"orch": {',
        '"orch": {\n    "assume_namespace_when_missing": "default",',
      ),
      ...flags,
    },
    {
      KUBERNETES_SERVICE_HOST: '127.0.0.1',
      KUBERNETES_SERVICE_PORT: String(api.port),
      NODE_NAME: NODE,
      POD_NAME: 'mesh-cni-node-e2e',
      POD_NAMESPACE: 'mesh-system',
      HOST_IP: hostIp,
    },
  );
  await eventually(async () => (await agent.get('/readyz')).status === 200, 'install-cni to be ready', 30_000).catch(
    async (e: Error) => {
      throw new Error(`${e.message}: ${(await agent.get('/readyz')).body}; stderr: ${agent.stderr()}`);
    },
  );
  return agent;
}

/** `podman run` of a sleeping busybox named `name` on `network`; the path of its netns. */
export async function startContainer(podman: Podman, network: string, image: string, name: string): Promise<string> {
  await podman.ok(['run', '--detach', '--name', name, '--network', network, image, 'sleep', '600']);
  const netns = (await podman.ok(['inspect', '--format', '{{.NetworkSettings.SandboxKey}}', name])).trim();
  assert.match(netns, /^\/run\/netns\//, `podman put ${name} in a named netns`);
  return netns;
}

/** Runs the cleanups newest first; one that fails is logged as `<label>: why` and the rest still run. */
export async function runCleanups(cleanups: SuiteCleanups, label: string): Promise<void> {
  for (const c of cleanups.reverse()) {
    try {
      await c();
    } catch (e) {
      console.error(`${label}: ${(e as Error).message}`);
    }
  }
}

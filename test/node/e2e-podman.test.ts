// End to end on one node with a real container runtime: podman (CNI backend) creates containers
// on a bridge network whose conflist install-cni edits; the runtime runs the mesh-cni single
// executable install-cni copied; the test API server holds the pods; the test plays the
// kubelet's part for the validation init container's status; the repair controller (in the same
// install-cni) labels, or in a second run deletes, the pod that raced the plugin. Then the traffic
// matrix of a pod the runtime started, under each redirect backend (iptables, native nftables).
//
// The node: a network namespace this test makes stands in for the node's host network (podman
// and the CNI plugins it runs are started in it with `nsenter --net`), so the bridge, its
// address and routes never touch the machine's own network. 127.0.0.1:<API port> inside it is
// forwarded to the test API server. install-cni runs as a process from source (the image is
// tested in deploy-image.test.ts) with the sandbox dirs as its host mounts; podman's private
// network config dir *is* the node's CNI net dir.
//
// mesh-validation runs with `nsenter --net=<the container's netns>` from the host: the check is
// about the netns (its rules, its loopback), and the validation executable is glibc-linked while
// the busybox-static container has no libc to run it with.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { AgentProcess } from '../helpers/agent.ts';
import { apiRequest, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import {
  addHostNetns,
  apiAndTree,
  CNI_CACHE,
  NODE,
  podmanOn,
  runCleanups,
  startContainer,
  startNodeAgent,
} from '../helpers/e2e-node.ts';
import type { HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { rulesIn, run, type Run } from '../helpers/netns.ts';
import { delFromCachedConfig, type Podman } from '../helpers/podman.ts';
import { meshPod } from '../helpers/plugin.ts';
import { podmanTrafficSuite } from '../helpers/podman-traffic.ts';

const RUN = `mcni-e2e-${process.pid}`;
const REPAIR_LABEL = 'cni.mesh.io/uninitialized';
const OUR_CHAIN = /^:MESH_OUTPUT /m;

function validate(netnsPath: string): Promise<Run> {
  return run(
    'nsenter',
    [
      `--net=${netnsPath}`,
      '--',
      path.join(ROOT, 'dist/mesh-validation'),
      '--termination-log',
      '/nonexistent/termination-log',
    ],
    { timeoutMs: 30_000 },
  );
}

function primaryConflist(network: string, bridge: string, ipamDir: string, subnet = '198.19.0'): string {
  // What a primary CNI would write: indented its own way, with a field we do not know.
  return `{
    "cniVersion": "1.0.0",
    "name": "${network}",
    "x-vendor-note": "written by the e2e test as the primary CNI",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "${bridge}",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "routes": [{ "dst": "0.0.0.0/0" }],
                "ranges": [[{ "subnet": "${subnet}.0/24", "gateway": "${subnet}.1" }]],
                "dataDir": "${ipamDir}"
            }
        }
    ]
}
`;
}

function nodeSuite(mode: 'label' | 'delete'): void {
  describe(`e2e: one node, podman + install-cni + mesh-cni + repair (${mode})`, { timeout: 600_000 }, () => {
    const TAG = `${RUN}-${mode[0]}`;
    const NETWORK = TAG;
    const BUSYBOX = `localhost/${TAG}-busybox:latest`;
    const hostNetns = `${TAG}-host`;
    const hostNetnsPath = `/run/netns/${hostNetns}`;
    const bridge = `mcnie${mode[0]}${process.pid % 100000}`.slice(0, 15);
    let api: TestApiServer;
    let tree: HostTree;
    let podman: Podman;
    let agent: AgentProcess | undefined;
    let primaryFile: string;
    let primaryBytes: Buffer;
    let ipamDir: string;
    const cleanups: (() => unknown)[] = [];

    const podNamed = (name: string): V1Pod => ({
      ...meshPod('default', name),
      spec: {
        ...meshPod('default', name).spec!,
        nodeName: NODE,
        initContainers: [{ name: 'mesh-validation', image: 'mesh/proxy' }],
      },
      status: { phase: 'Pending' },
    });
    /** What the kubelet reports once the validation init container of `name` exited. */
    const kubeletReports = async (name: string, r: Run) => {
      const terminated = {
        exitCode: r.code ?? -1,
        reason: r.code === 0 ? 'Completed' : 'Error',
        message: r.stderr.trim().slice(0, 1024),
        finishedAt: new Date().toISOString(),
      };
      const res = await apiRequest(
        api,
        'PATCH',
        `/api/v1/namespaces/default/pods/${name}/status`,
        {
          status: {
            phase: r.code === 0 ? 'Running' : 'Pending',
            initContainerStatuses: [
              {
                name: 'mesh-validation',
                image: 'mesh/proxy',
                imageID: '',
                ready: r.code === 0,
                restartCount: 0,
                state: { terminated },
              },
            ],
          },
        },
        { 'content-type': 'application/merge-patch+json' },
      );
      assert.equal(res.status, 200, `status patch: ${res.text}`);
    };

    before(async () => {
      // The node's "host" network: loopback only, removed (with the bridge in it) at the end.
      addHostNetns(hostNetns, cleanups);
      ({ api, tree } = await apiAndTree(hostNetnsPath, cleanups));
      ipamDir = path.join(tree.root, 'ipam');
      await fs.mkdir(ipamDir);
      primaryFile = path.join(tree.netDir, '10-mcni-e2e.conflist');
      await fs.writeFile(primaryFile, primaryConflist(NETWORK, bridge, ipamDir));
      primaryBytes = await fs.readFile(primaryFile);

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

    it(`redirects the pods started after install-cni is ready, ${mode}s the one that raced it, and uninstalls cleanly`, async () => {
      for (const bin of ['dist/bin/mesh-cni', 'dist/mesh-validation'])
        assert.ok(existsSync(path.join(ROOT, bin)), `${bin} is missing: run npm run build first`);
      const early = `${TAG}-early`;
      const late = `${TAG}-late`;
      api.upsertPod(podNamed(early));
      api.upsertPod(podNamed(late));
      // Our own pod, owned by a DaemonSet the API server no longer has: stopping is an uninstall.
      api.upsertPod({
        metadata: {
          name: 'mesh-cni-node-e2e',
          namespace: 'mesh-system',
          ownerReferences: [
            { apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'mesh-cni-node', uid: 'gone', controller: true },
          ],
        },
        spec: { nodeName: NODE, containers: [{ name: 'install-cni', image: 'localhost/mesh-cni:0.1.0' }] },
      });

      // 1. A pod that starts before the agent: the runtime runs bridge only.
      const earlyNetns = await startContainer(podman, NETWORK, BUSYBOX, early);
      assert.doesNotMatch(rulesIn(earlyNetns), OUR_CHAIN, 'no redirect rules without install-cni');

      // 2. install-cni comes up against this node.
      agent = await startNodeAgent(tree, api, '198.19.0.1', {
        'cleanup-on-exit': 'auto',
        'repair-enabled': 'true',
        ...(mode === 'label' ? { 'repair-label-pods': 'true' } : { 'repair-delete-pods': 'true' }),
      });
      const conf = JSON.parse(await fs.readFile(primaryFile, 'utf8')) as {
        plugins: { type: string }[];
        'x-vendor-note': string;
      };
      assert.deepEqual(
        conf.plugins.map((p) => p.type),
        ['bridge', 'mesh-cni'],
        'our entry is chained after the primary plugin',
      );
      assert.equal(conf['x-vendor-note'], 'written by the e2e test as the primary CNI');
      assert.deepEqual(
        await fs.readFile(path.join(tree.binDir, 'mesh-cni')),
        await fs.readFile(path.join(ROOT, 'dist/bin/mesh-cni')),
        'the plugin executable is on the node',
      );
      assert.ok(existsSync(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')), 'orchconfig written');

      // 3. A pod started now: podman runs bridge, then mesh-cni, which reads the pod from the API
      // server and applies the rules in the container's netns.
      const lateNetns = await startContainer(podman, NETWORK, BUSYBOX, late);
      const lateRules = rulesIn(lateNetns);
      assert.match(lateRules, OUR_CHAIN, `redirect chains in ${late}'s netns`);
      assert.match(lateRules, /-j REDIRECT --to-ports 15001/, 'outbound goes to 15001');
      assert.match(lateRules, /-j REDIRECT --to-ports 15006/, 'inbound goes to 15006');
      // The runtime ran mesh-cni: its record came over the log socket into the agent's scope cni.
      const applied = await agent
        .waitForLog(
          (r) => r.msg === 'redirect rules applied',
          'mesh-cni (run by podman) to report over the log socket',
          30_000,
        )
        .catch((e: Error) => {
          throw new Error(`${e.message}; agent logs: ${JSON.stringify(agent!.logs.slice(-15))}`);
        });
      assert.equal(applied.scope, 'cni');
      // The plugin looked the pod up (podman gives no namespace; our entry assumes default), from the agent's pod
      // watch (a lookup hit) or, failing that, from the API server.
      const viaAgent = /^mesh_cni_pod_lookups_total\{result="hit"\} [1-9]/m.test((await agent.get('/metrics')).body);
      const viaApi = api.requests.some(
        (q) => q.method === 'GET' && q.path === `/api/v1/namespaces/default/pods/${late}`,
      );
      assert.ok(viaAgent || viaApi, 'the plugin looked the pod up in namespace default');
      const lateValidation = await validate(lateNetns);
      assert.equal(
        lateValidation.code,
        0,
        `mesh-validation in ${late}'s netns: ${lateValidation.stdout}${lateValidation.stderr}`,
      );
      await kubeletReports(late, lateValidation);

      // 4. The early pod: still no rules; its validation fails with 126, the kubelet reports it,
      // the repair controller labels or deletes it (and not the healthy one).
      assert.doesNotMatch(rulesIn(earlyNetns), OUR_CHAIN);
      const earlyValidation = await validate(earlyNetns);
      assert.equal(
        earlyValidation.code,
        126,
        `mesh-validation in ${early}'s netns: ${earlyValidation.stdout}${earlyValidation.stderr}`,
      );
      await kubeletReports(early, earlyValidation);
      if (mode === 'label') {
        await eventually(
          () => api.getPod('default', early)?.metadata?.labels?.[REPAIR_LABEL] === 'true',
          `the repair controller to label ${early}`,
          30_000,
        );
      } else {
        await eventually(
          () => api.getPod('default', early) === undefined,
          `the repair controller to delete ${early}`,
          30_000,
        );
      }
      const healthy = api.getPod('default', late);
      assert.ok(healthy, 'the redirected pod is not deleted');
      assert.equal(healthy.metadata?.labels?.[REPAIR_LABEL], undefined, 'the redirected pod is not labelled');
      await eventually(
        () => api.events().some((ev) => ev.involvedObject.name === early),
        `an Event on ${early} saying why`,
        10_000,
      );

      // 5. The early container goes while we are installed (podman runs DEL through the chain,
      // mesh-cni included), then install-cni is stopped: its DaemonSet is gone, so it uninstalls:
      // the primary config is exactly the original, the orchconfig is gone, the plugin stays.
      await podman.ok(['rm', '--force', '--time', '0', early]);
      assert.ok(!existsSync(earlyNetns), 'container netns removed');
      const code = await agent.stop('SIGTERM', 30_000);
      agent = undefined;
      assert.equal(code, 0);
      assert.deepEqual(
        await fs.readFile(primaryFile),
        primaryBytes,
        'the primary config is byte for byte the original',
      );
      assert.ok(!existsSync(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')), 'orchconfig removed');
      assert.ok(existsSync(path.join(tree.binDir, 'mesh-cni')), 'plugin executable kept for the DELs still to come');

      // 6. The late pod, started with our entry, goes after the uninstall. A runtime
      // that tears down with the config it cached at ADD (CRI-O) still runs mesh-cni first; the
      // test plays that runtime from libcni's own cache entry, which podman wrote at ADD (podman
      // 4.3 itself re-reads the config dir). mesh-cni, without its orchconfig now, removes its
      // rules and exits 0, so bridge runs and host-local frees the pod's IP lease.
      const lateId = (await podman.ok(['inspect', '--format', '{{.Id}}', late])).trim();
      const leases = async () => {
        const dir = path.join(ipamDir, NETWORK);
        const out: string[] = [];
        for (const f of await fs.readdir(dir).catch(() => [] as string[])) {
          if ((await fs.readFile(path.join(dir, f), 'utf8').catch(() => '')).startsWith(lateId)) out.push(f);
        }
        return out;
      };
      assert.equal((await leases()).length, 1, `${late} holds one host-local lease`);
      const dels = await delFromCachedConfig({
        cacheFile: path.join(CNI_CACHE, `${NETWORK}-${lateId}-eth0`),
        netns: lateNetns,
        pluginDirs: [tree.binDir, '/usr/lib/cni'],
        hostNetns: hostNetnsPath,
      });
      assert.deepEqual(
        dels.map((d) => [d.type, d.code]),
        [
          ['mesh-cni', 0],
          ['bridge', 0],
        ],
        `DEL from the cached config: ${JSON.stringify(dels)}`,
      );
      assert.deepEqual(await leases(), [], `${late}'s host-local lease is freed`);
      assert.doesNotMatch(rulesIn(lateNetns), OUR_CHAIN, 'our rules are gone from its netns');
      await podman.ok(['rm', '--force', '--time', '0', late]);
      assert.ok(!existsSync(lateNetns), 'container netns removed');
      const cached = (await fs.readdir(CNI_CACHE).catch(() => [] as string[])).filter((f) =>
        f.startsWith(`${NETWORK}-`),
      );
      assert.deepEqual(cached, [], 'the runtime dropped its cache');
    });
  });
}

nodeSuite('label');
nodeSuite('delete');
podmanTrafficSuite({ tag: `${RUN}-t`, subnet: '198.19.3', owned: false });

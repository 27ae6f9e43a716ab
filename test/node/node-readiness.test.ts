// The node's readiness for mesh pods (docs/node-readiness.md): the agent keeps its condition on
// its node from its readiness and takes the start-up taint off, once, when first ready.
//
// The test API server cannot schedule. "A pod waits" is modelled by a scheduler stand-in in this
// file that reads the node's taints from the API server and binds a pod (sets spec.nodeName)
// only when the pod tolerates every NoSchedule/NoExecute taint on the node: the taint filter of
// kube-scheduler, nothing more. The agent, its RBAC (rendered from deploy/ with the
// node-readiness component), the node writes and the plugin ADD are real.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import type { V1Node, V1Pod, V1Taint } from '@kubernetes/client-node';
import { buildSettings } from '../../src/config/settings.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { startNodeReadiness } from '../../src/node/index.ts';
import { nodeClient } from '../../src/node/nodeclient.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { apiRequest, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, meshCni, meshPod, pluginConfig } from '../helpers/plugin.ts';
import { DEPLOY_DIR, kustomize } from '../helpers/podman-daemonset.ts';
import { eventually, waitFor } from '../helpers/poll.ts';
import { rulesFor } from '../helpers/rbac.ts';
import { orchClientArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const NODE = 'node-1';
const STARTUP_TAINT: V1Taint = { key: 'mesh.io/cni-not-ready', effect: 'NoSchedule' };
/** A taint the agent must leave alone (and which does not keep pods off). */
const OTHER_TAINT: V1Taint = { key: 'example.com/spot', value: 'true', effect: 'PreferNoSchedule' };

/** A node as the kubelet registers it with --register-with-taints=mesh.io/cni-not-ready:NoSchedule. */
function freshNode(): V1Node {
  return {
    metadata: { name: NODE, labels: { 'kubernetes.io/os': 'linux', 'kubernetes.io/hostname': NODE } },
    spec: { taints: [STARTUP_TAINT, OTHER_TAINT] },
    status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady' }] },
  };
}

const tolerates = (pod: V1Pod, t: V1Taint) =>
  (pod.spec?.tolerations ?? []).some(
    (tol) =>
      (tol.operator === 'Exists' && (tol.key === undefined || tol.key === t.key)) ||
      (tol.key === t.key && (tol.value ?? '') === (t.value ?? '')),
  );

/**
 * The scheduler stand-in: reads the node from the API server and binds the pod to it unless a
 * NoSchedule or NoExecute taint it does not tolerate is on the node. True when it bound the pod.
 */
async function schedule(api: TestApiServer, namespace: string, name: string): Promise<boolean> {
  const pod = api.getPod(namespace, name)!;
  if (pod.spec?.nodeName) return true;
  const r = await apiRequest(api, 'GET', `/api/v1/nodes/${NODE}`);
  assert.equal(r.status, 200, r.text);
  const taints = (r.body as V1Node).spec?.taints ?? [];
  if (taints.some((t) => (t.effect === 'NoSchedule' || t.effect === 'NoExecute') && !tolerates(pod, t))) return false;
  api.upsertPod({ ...pod, spec: { ...pod.spec!, nodeName: NODE } });
  return true;
}

async function readNode(api: TestApiServer): Promise<V1Node> {
  const r = await apiRequest(api, 'GET', `/api/v1/nodes/${NODE}`);
  assert.equal(r.status, 200, r.text);
  return r.body as V1Node;
}
const meshCondition = (n: V1Node) => n.status?.conditions?.find((c) => c.type === 'MeshCNIReady');

/** The agent's rights as deploy/ with the node-readiness component grants them. */
function nodeReadinessRules(dir: string) {
  const op = path.join(dir, 'op');
  mkdirSync(op);
  const rel = path.relative(op, DEPLOY_DIR);
  writeFileSync(
    path.join(op, 'kustomization.yaml'),
    `resources:\n  - ${rel}\ncomponents:\n  - ${rel}/overlays/node-readiness\n`,
  );
  const objects = kustomize(op).objects;
  const ds = objects.find((o) => o.kind === 'DaemonSet') as unknown as {
    spec: { template: { spec: { containers: { env?: { name: string; value?: string }[] }[] } } };
  };
  // The component's settings as it renders them (the downward API values are the test's own).
  const env = Object.fromEntries(
    (ds.spec.template.spec.containers[0]!.env ?? [])
      .filter((e) => /^(NODE_READINESS_CONDITION|STARTUP_TAINT)$/.test(e.name))
      .map((e) => [e.name, e.value ?? ''] as const),
  );
  return { rules: rulesFor(objects, 'mesh-system', 'mesh-cni'), env };
}

describe('node readiness settings', () => {
  it('are off by default, and one setting turns them on with the default taint', () => {
    const off = buildSettings({}, { NODE_NAME: NODE });
    assert.equal(off.nodeReadiness?.conditionType, '');
    const on = buildSettings({}, { NODE_NAME: NODE, NODE_READINESS_CONDITION: 'MeshCNIReady' });
    assert.deepEqual(on.nodeReadiness, {
      conditionType: 'MeshCNIReady',
      startupTaint: { key: 'mesh.io/cni-not-ready', value: undefined, effect: 'NoSchedule' },
      intervalMs: 1000,
    });
    const noTaint = buildSettings(
      { 'node-readiness-condition': 'MeshCNIReady', 'startup-taint': '' },
      { NODE_NAME: NODE },
    );
    assert.equal(noTaint.nodeReadiness?.startupTaint, undefined);
  });

  it("refuses a kubelet's condition, a malformed taint, and a condition without NODE_NAME", () => {
    const refused = (flags: Record<string, string>, env: Record<string, string>, want: RegExp) =>
      assert.throws(
        () => buildSettings(flags, env),
        (e: unknown) => e instanceof ConfigErrors && want.test(e.message),
      );
    refused({ 'node-readiness-condition': 'Ready' }, { NODE_NAME: NODE }, /condition the kubelet keeps/);
    refused({ 'node-readiness-condition': 'Mesh CNI' }, { NODE_NAME: NODE }, /expected a condition type/);
    refused({ 'startup-taint': 'mesh.io/cni-not-ready' }, {}, /expected key\[=value\]:effect/);
    refused({ 'startup-taint': 'mesh.io/cni-not-ready:NoRun' }, {}, /effect must be one of/);
    refused({ 'node-readiness-condition': 'MeshCNIReady' }, {}, /needs NODE_NAME/);
  });
});

describe('node readiness with a real agent: the start-up taint keeps mesh pods off until the agent is ready', () => {
  const cleanups: (() => unknown)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
  });

  async function setUp() {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-node-ready-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const api = await startTestApiServer();
    cleanups.push(() => api.close());
    const { rules, env } = nodeReadinessRules(dir);
    api.upsertNode(freshNode());
    const tree = await makeHostTree({ token: api.serviceAccount('mesh-system', 'mesh-cni', rules), ca: api.caPem });
    cleanups.push(() => tree.remove());
    return { api, tree, env };
  }

  function agentOn(api: TestApiServer, tree: HostTree, env: Record<string, string>, cleanup: 'never' | 'always') {
    const agent = spawnAgent(
      tree,
      { 'node-readiness-interval': '100ms', 'cleanup-on-exit': cleanup },
      { KUBERNETES_SERVICE_HOST: api.host, KUBERNETES_SERVICE_PORT: String(api.port), NODE_NAME: NODE, ...env },
    );
    cleanups.push(() => agent.stop('SIGKILL'));
    return agent;
  }

  const logged = (agent: AgentProcess, msg: string, extra: (r: Record<string, unknown>) => boolean = () => true) =>
    agent.waitForLog((r) => r.msg === msg && extra(r), msg, 20_000);

  it('waits while the agent is not ready; the taint is gone in the pass that finds it ready; the bound pod is redirected by its ADD', async () => {
    const { api, tree, env } = await setUp();
    assert.deepEqual(
      [env.NODE_READINESS_CONDITION, env.STARTUP_TAINT],
      ['MeshCNIReady', 'mesh.io/cni-not-ready:NoSchedule'],
    );
    const app = api.upsertPod(meshPod('shop', 'cart-1'));
    // A pod that tolerates the taint (as the agent's own DaemonSet does) shows that the stand-in
    // binds what the taint does not keep off.
    api.upsertPod(meshPod('shop', 'tolerant', {}, { tolerations: [{ key: STARTUP_TAINT.key, operator: 'Exists' }] }));

    // No primary CNI config yet: the agent cannot put mesh-cni in place and is not ready.
    const agent = agentOn(api, tree, env, 'never');
    const notReady = await logged(agent, 'set the node condition', (r) => r.status === 'False');
    assert.equal(notReady.reason, 'AgentNotReady');
    const before = await readNode(api);
    assert.equal(meshCondition(before)?.status, 'False');
    assert.match(meshCondition(before)?.message ?? '', /not ready/);
    assert.equal((await agent.get('/readyz')).status, 503);
    for (let i = 0; i < 5; i++) assert.equal(await schedule(api, 'shop', 'cart-1'), false, 'cart-1 is not bound');
    assert.equal(await schedule(api, 'shop', 'tolerant'), true, 'a pod tolerating the taint is bound');
    assert.equal(api.getPod('shop', 'cart-1')!.spec?.nodeName, undefined);
    assert.ok(
      (await readNode(api)).spec?.taints?.some((t) => t.key === STARTUP_TAINT.key),
      'the taint is still on',
    );

    // The primary CNI arrives: the agent installs, becomes ready, and in that pass sets the
    // condition True and removes the taint.
    writeFileSync(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await waitFor('cart-1 bound to the node', () => schedule(api, 'shop', 'cart-1'), { timeoutMs: 20_000 });
    const ready = await logged(agent, 'set the node condition', (r) => r.status === 'True');
    const removed = await logged(agent, 'removed the start-up taint');
    assert.equal(removed.pass, ready.pass, 'the taint goes in the readiness pass that first finds the agent ready');
    assert.equal(removed.taint, 'mesh.io/cni-not-ready:NoSchedule');
    assert.equal((await agent.get('/readyz')).status, 200);

    const after = await readNode(api);
    assert.deepEqual(after.spec?.taints, [OTHER_TAINT], 'only the start-up taint was removed');
    assert.equal(meshCondition(after)?.status, 'True');
    assert.equal(meshCondition(after)?.reason, 'AgentReady');
    assert.equal(after.status?.conditions?.find((c) => c.type === 'Ready')?.reason, 'KubeletReady');
    const taintPatches = api.requests.filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${NODE}`);
    assert.equal(taintPatches.length, 1, 'the taint was removed with one patch');
    const events = api.events().filter((e) => e.involvedObject.kind === 'Node' && e.involvedObject.name === NODE);
    assert.deepEqual(
      events.map((e) => e.reason),
      ['StartupTaintRemoved'],
    );
    const metrics = (await agent.get('/metrics')).body;
    assert.match(metrics, /mesh_cni_node_startup_taint_removals_total\{result="removed"\} 1\b/);
    assert.match(metrics, /mesh_cni_node_startup_taint_removed_timestamp_seconds [1-9]/);
    assert.match(metrics, /mesh_cni_node_condition_writes_total\{status="True",result="success"\} 1\b/);

    // The pod's ADD, as the runtime runs it on this node, with what the agent installed: our
    // entry in the primary config, the orchconfig with the plugin's minted token, the pod lookup.
    const primary = JSON.parse(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')) as {
      plugins: { type: string }[];
    };
    assert.ok(
      primary.plugins.some((p) => p.type === 'mesh-cni'),
      'the agent put our entry in place',
    );
    const orchconfig = readdirSync(tree.netDir).find((f) => /orchconfig/.test(f));
    assert.ok(orchconfig, `an orchconfig in ${readdirSync(tree.netDir).join(', ')}`);
    const network = new BridgeNetwork('198.18.113.0/24');
    cleanups.push(() => network.cleanup());
    const netns = new Netns('pod');
    cleanups.push(() => netns.remove());
    const bound = api.getPod('shop', 'cart-1')!;
    assert.equal(bound.metadata?.uid, app.metadata?.uid);
    const chain: ChainEnv = {
      containerId: `ctr${process.pid}nodeready`,
      netns: netns.path,
      ifname: 'eth0',
      args: k8sArgs(bound, `ctr${process.pid}nodeready`),
    };
    const prev = await network.addPod(chain);
    const add = await meshCni(
      'ADD',
      chain,
      pluginConfig(
        {
          cniVersion: '1.0.0',
          orchconfig: path.join(tree.netDir, orchconfig),
          extra: { pod_lookup_uds_address: tree.flags['pod-lookup-uds-address'] },
        },
        prev,
      ),
    );
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(
      netns.exec(['iptables-nft-save', '-t', 'nat']),
      /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/,
    );

    // A stop that keeps the plugin (a restart or upgrade) leaves the condition True and re-adds no taint.
    assert.equal(await agent.stop('SIGTERM'), 0);
    const kept = await readNode(api);
    assert.equal(meshCondition(kept)?.status, 'True');
    assert.deepEqual(kept.spec?.taints, [OTHER_TAINT]);

    // The next agent on the node finds no taint: nothing to remove, no patch. A stop that
    // uninstalls turns the condition False before the plugin goes.
    const next = agentOn(api, tree, env, 'always');
    await logged(next, 'the start-up taint is not on the node: nothing to remove');
    assert.equal(await next.stop('SIGTERM'), 0);
    const gone = await readNode(api);
    assert.equal(meshCondition(gone)?.status, 'False');
    assert.equal(meshCondition(gone)?.reason, 'Uninstalled');
    assert.equal(api.requests.filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${NODE}`).length, 1);
    const uninstalled = next.logs.findIndex((r) => r.msg === 'set the node condition' && r.reason === 'Uninstalled');
    const uninstalling = next.logs.findIndex((r) => r.msg === 'uninstalling mesh-cni from this node');
    assert.ok(0 <= uninstalled && uninstalled < uninstalling, 'the condition turned False before the uninstall began');
  });
});

describe('node writes the agent may not make', () => {
  const cleanups: (() => unknown)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
  });

  it("without the component's RBAC (403) show as notes and never make the agent unready; the taint stays", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-node-403-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const api = await startTestApiServer();
    cleanups.push(() => api.close());
    api.upsertNode(freshNode());
    const baseRules = rulesFor(kustomize(DEPLOY_DIR).objects, 'mesh-system', 'mesh-cni');
    const token = api.serviceAccount('mesh-system', 'mesh-cni', baseRules);
    const orchconfig = api.writeOrchconfig(path.join(dir, 'agent-orchconfig'), { token });
    const settings = buildSettings({ orchconfig, 'node-readiness-condition': 'MeshCNIReady' }, { NODE_NAME: NODE });
    const part = startNodeReadiness(settings.nodeReadiness!, {
      client: nodeClient(orchKubeConfig(orchClientArgs(settings)), NODE),
      nodeName: NODE,
      podName: 'mesh-cni-node-test',
      notReadyReasons: () => [],
      decideCleanup: async () => ({ cleanup: false }),
    });
    cleanups.push(() => part.stop('SIGTERM'));
    await eventually(() => (part.notes?.() ?? []).length === 2, 'both refusals as notes', 10_000);
    const notes = part.notes!();
    assert.match(notes[0]!, /cannot set condition MeshCNIReady of node node-1: .*403|forbidden/i);
    assert.match(notes[1]!, /cannot remove the start-up taint mesh\.io\/cni-not-ready:NoSchedule of node node-1/);
    assert.deepEqual(part.notReadyReasons(), []);
    assert.deepEqual((await readNode(api)).spec?.taints, [STARTUP_TAINT, OTHER_TAINT]);
  });
});

describe('the start-up taint removal keeps what changed under it', () => {
  const cleanups: (() => unknown)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
  });

  it('a node changed between its read and the patch is read again (resourceVersion precondition), and a taint added meanwhile stays', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-node-rv-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const api = await startTestApiServer();
    cleanups.push(() => api.close());
    api.upsertNode(freshNode());
    const orchconfig = api.writeOrchconfig(path.join(dir, 'agent-orchconfig'));
    const settings = buildSettings({ orchconfig, 'node-readiness-condition': 'MeshCNIReady' }, { NODE_NAME: NODE });
    const real = nodeClient(orchKubeConfig(orchClientArgs(settings)), NODE);
    let reads = 0;
    // Another writer (a cloud controller adding its own taint) lands between the first read and the patch.
    const client = {
      ...real,
      getNode: async (signal: AbortSignal) => {
        const node = await real.getNode(signal);
        if (++reads === 2) {
          const now = (await readNode(api)) as V1Node;
          api.upsertNode({
            ...now,
            spec: { taints: [...(now.spec?.taints ?? []), { key: 'late', effect: 'NoExecute' }] },
          });
        }
        return node;
      },
    };
    const part = startNodeReadiness(settings.nodeReadiness!, {
      client,
      nodeName: NODE,
      podName: 'mesh-cni-node-test',
      notReadyReasons: () => [],
      decideCleanup: async () => ({ cleanup: false }),
    });
    cleanups.push(() => part.stop('SIGTERM'));
    await eventually(() => (part.status() as { taint: string }).taint === 'removed', 'the taint removed', 10_000);
    const node = await readNode(api);
    assert.deepEqual(
      node.spec?.taints?.map((t) => t.key),
      ['example.com/spot', 'late'],
    );
    const patches = api.requests.filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${NODE}`);
    assert.deepEqual(
      patches.map((r) => r.status),
      [409, 200],
      'the first patch met the changed node and was refused; the second, after a new read, went through',
    );
  });
});

// --cleanup-on-exit=auto's decision against the test HTTPS API server: an uninstall only on
// positive evidence (our DaemonSet gone, being deleted, or no longer targeting this node by its
// nodeSelector, required node affinity or tolerations), every other answer keeps the node as it
// is, with a log line and mesh_cni_cleanup_decisions_total naming the reason. Transient answers
// are asked again until the deadline.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1DaemonSet, V1Node, V1PodSpec } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { buildSettings } from '../../src/config/settings.ts';
import { decideCleanup } from '../../src/install/uninstall.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { startTestApiServer, type RbacRule, type TestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { tempDir } from '../helpers/plugin.ts';
import type { K8sObject } from '../helpers/podman-daemonset.ts';
import { rulesFor } from '../helpers/rbac.ts';
import { cleanupArgs } from '../../src/partargs.ts';

const defer = cleanupAfterEach();

const records: Record<string, unknown>[] = [];
configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'install:info' }, {}).logging.outputLevels },
  { write: (line) => void records.push(JSON.parse(line) as Record<string, unknown>) },
);

const NS = 'mesh-system';
const DS = 'mesh-cni-node';
const POD = 'mesh-cni-node-abcde';
const NODE = 'node-1';
// Short, so the cases that wait out the deadline stay quick; long enough for several attempts.
const FAST = { deadlineMs: 1500, attemptTimeoutMs: 500 };

/** deploy/daemonset.yaml's own pod template: every taint tolerated, Linux nodes only. */
const OURS: V1PodSpec = {
  containers: [{ name: 'install-cni' }],
  hostNetwork: true,
  nodeSelector: { 'kubernetes.io/os': 'linux' },
  tolerations: [{ operator: 'Exists' }],
};
const LINUX = { 'kubernetes.io/os': 'linux' };

/** Ours, required on nodes labelled mesh=on (by this operator). */
const oursWithAffinity = (operator: string): V1PodSpec => ({
  ...OURS,
  affinity: {
    nodeAffinity: {
      requiredDuringSchedulingIgnoredDuringExecution: {
        nodeSelectorTerms: [{ matchExpressions: [{ key: 'mesh', operator, values: ['on'] }] }],
      },
    },
  },
});

interface World {
  readonly api: TestApiServer;
  readonly orchconfig: string;
}

async function world(
  o: { template?: V1PodSpec; node?: V1Node | null; ds?: Partial<V1DaemonSet['metadata']> | null } = {},
): Promise<World> {
  const api = await startTestApiServer();
  defer(() => api.close());
  const dir = tempDir();
  defer(async () => dir.remove());
  const orchconfig = api.writeOrchconfig(path.join(dir.dir, 'orchconfig'));
  if (o.ds !== null)
    api.upsertDaemonSet({
      metadata: { name: DS, namespace: NS, uid: 'ds-uid', ...o.ds },
      spec: { selector: {}, template: { spec: o.template ?? OURS } },
    });
  api.upsertPod({
    metadata: {
      name: POD,
      namespace: NS,
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: DS, uid: 'ds-uid', controller: true }],
    },
    spec: { nodeName: NODE, containers: [{ name: 'install-cni' }] },
  });
  if (o.node !== null) api.upsertNode(o.node ?? { metadata: { name: NODE, labels: LINUX } });
  return { api, orchconfig };
}

function settings(w: World, env: Record<string, string> = { POD_NAME: POD, POD_NAMESPACE: NS, NODE_NAME: NODE }) {
  return buildSettings({ orchconfig: w.orchconfig, 'cleanup-on-exit': 'auto' }, env);
}

async function decisions(decision: string, reason: string): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === 'mesh_cni_cleanup_decisions_total');
  return m?.values.find((v) => v.labels.decision === decision && v.labels.reason === reason)?.value ?? NaN;
}

/** Decides, and checks the metric and the log line name the reason. */
async function decide(
  w: World,
  want: { cleanup: boolean; reason: string; why: RegExp },
  s = settings(w),
): Promise<{ attempts: number }> {
  const decision = want.cleanup ? 'uninstall' : 'keep';
  const before = await decisions(decision, want.reason);
  const from = records.length;
  const got = await decideCleanup(cleanupArgs(s), FAST);
  assert.equal(got.cleanup, want.cleanup, got.why);
  assert.match(got.why, want.why);
  assert.equal(
    await decisions(decision, want.reason),
    before + 1,
    `mesh_cni_cleanup_decisions_total{${decision},${want.reason}}`,
  );
  const said = records.slice(from).filter((r) => r.reason !== undefined);
  assert.equal(said.length, 1, 'one log line');
  assert.deepEqual([said[0]!.decision, said[0]!.reason, said[0]!.why], [decision, want.reason, got.why]);
  assert.equal(said[0]!.level, want.cleanup || want.reason === 'daemonset_targets_node' ? 'info' : 'warn');
  return { attempts: Number(said[0]!.attempts) };
}

const dsReads = (api: TestApiServer) =>
  api.requests.filter((r) => r.path === `/apis/apps/v1/namespaces/${NS}/daemonsets/${DS}`);

describe('--cleanup-on-exit=auto: uninstall on positive evidence', () => {
  it('every decision and reason is a series from the start, at 0 or more', async () => {
    for (const reason of ['daemonset_gone', 'node_affinity', 'untolerated_taint'])
      assert.ok((await decisions('uninstall', reason)) >= 0, reason);
    for (const reason of ['unreachable', 'timeout', 'unauthorized', 'forbidden', 'server_error', 'no_pod_name'])
      assert.ok((await decisions('keep', reason)) >= 0, reason);
  });

  it('the DaemonSet is gone: uninstall', async () => {
    const w = await world({ ds: null });
    await decide(w, {
      cleanup: true,
      reason: 'daemonset_gone',
      why: /DaemonSet mesh-system\/mesh-cni-node is gone: uninstall/,
    });
  });

  it('the DaemonSet is being deleted: uninstall', async () => {
    const w = await world({ ds: { deletionTimestamp: new Date() } });
    await decide(w, { cleanup: true, reason: 'daemonset_deleting', why: /is being deleted: uninstall/ });
  });

  it("the node no longer matches the DaemonSet's required node affinity: uninstall", async () => {
    const template = oursWithAffinity('In');
    const w = await world({ template, node: { metadata: { name: NODE, labels: { ...LINUX, mesh: 'off' } } } });
    await decide(w, {
      cleanup: true,
      reason: 'node_affinity',
      why: /no longer matches the DaemonSet's required node affinity/,
    });
  });

  it("the node no longer matches the DaemonSet's nodeSelector: uninstall", async () => {
    const w = await world({ node: { metadata: { name: NODE, labels: { 'kubernetes.io/os': 'windows' } } } });
    await decide(w, { cleanup: true, reason: 'node_selector', why: /nodeSelector/ });
  });

  for (const effect of ['NoExecute', 'NoSchedule'])
    it(`an untolerated ${effect} taint: uninstall`, async () => {
      const template: V1PodSpec = { ...OURS, tolerations: [{ key: 'other', operator: 'Exists' }] };
      const node: V1Node = {
        metadata: { name: NODE, labels: LINUX },
        spec: { taints: [{ key: 'dedicated', effect }] },
      };
      const w = await world({ template, node });
      await decide(w, { cleanup: true, reason: 'untolerated_taint', why: new RegExp(`taint dedicated:${effect}`) });
    });

  it('with only the rights deploy/ grants the agent (nodes get among them)', async () => {
    const manifests = parseAllDocuments(readFileSync(path.join(ROOT, 'deploy/daemonset.yaml'), 'utf8')).map(
      (d) => d.toJS() as K8sObject,
    );
    const rules: RbacRule[] = rulesFor(manifests, NS, 'mesh-cni');
    const template: V1PodSpec = { ...OURS, tolerations: [] };
    const node: V1Node = {
      metadata: { name: NODE, labels: LINUX },
      spec: { taints: [{ key: 'dedicated', effect: 'NoExecute' }] },
    };
    const w = await world({ template, node });
    const agent = {
      ...w,
      orchconfig: w.api.writeOrchconfig(`${w.orchconfig}-agent`, {
        token: w.api.serviceAccount(NS, 'mesh-cni', rules),
      }),
    };
    await decide(agent, { cleanup: true, reason: 'untolerated_taint', why: /taint dedicated:NoExecute/ });
  });
});

describe('--cleanup-on-exit=auto: everything else keeps the node as it is', () => {
  it('the DaemonSet still targets this node (a restart or upgrade), cordoned or not: keep', async () => {
    const w = await world({
      node: {
        metadata: { name: NODE, labels: LINUX },
        spec: { unschedulable: true, taints: [{ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' }] },
      },
    });
    const { attempts } = await decide(w, {
      cleanup: false,
      reason: 'daemonset_targets_node',
      why: /DaemonSet mesh-system\/mesh-cni-node still exists and still targets node node-1/,
    });
    assert.equal(attempts, 1);
  });

  it('the API server unreachable: keep, after asking again until the deadline', async () => {
    const w = await world();
    await w.api.stop();
    const { attempts } = await decide(w, {
      cleanup: false,
      reason: 'unreachable',
      why: /cannot ask the API server.*gave up after \d+ attempts/,
    });
    assert.ok(attempts > 1, `asked ${attempts} times`);
  });

  it('no answer in time: keep', async () => {
    const w = await world();
    w.api.faults.delayMs = 5000;
    await decide(w, { cleanup: false, reason: 'timeout', why: /no answer in time/ });
  });

  it('401: keep, without asking again, saying how to uninstall', async () => {
    const w = await world();
    const bad = { ...w, orchconfig: w.api.writeOrchconfig(`${w.orchconfig}-bad`, { token: 'not-a-token' }) };
    const { attempts } = await decide(bad, {
      cleanup: false,
      reason: 'unauthorized',
      why: /HTTP 401.*delete the DaemonSet and wait for its pods/,
    });
    assert.equal(attempts, 1);
  });

  it('403: keep, naming the rights the agent needs', async () => {
    const w = await world();
    const rules: RbacRule[] = [{ verbs: ['get'], apiGroups: [''], resources: ['pods'] }];
    const limited = {
      ...w,
      orchconfig: w.api.writeOrchconfig(`${w.orchconfig}-ltd`, { token: w.api.serviceAccount(NS, 'mesh-cni', rules) }),
    };
    await decide(limited, { cleanup: false, reason: 'forbidden', why: /HTTP 403.*daemonsets get/ });
  });

  it('500: keep, after asking again until the deadline', async () => {
    const w = await world({ ds: null });
    w.api.faults.status = { code: 500 };
    const { attempts } = await decide(w, { cleanup: false, reason: 'server_error', why: /HTTP 500/ });
    assert.ok(attempts > 1, `asked ${attempts} times`);
  });

  it('no POD_NAME: keep, without asking', async () => {
    const w = await world({ ds: null });
    await decide(
      w,
      { cleanup: false, reason: 'no_pod_name', why: /POD_NAME\/POD_NAMESPACE are not set/ },
      settings(w, { POD_NAMESPACE: NS, NODE_NAME: NODE }),
    );
    assert.equal(w.api.requests.length, 0);
  });

  it('our pod not found (so which DaemonSet is ours cannot be known): keep', async () => {
    const w = await world({ ds: null });
    w.api.deletePodFromStore(NS, POD);
    await decide(w, {
      cleanup: false,
      reason: 'pod_not_found',
      why: /our pod mesh-system\/mesh-cni-node-abcde is not found/,
    });
  });

  it("NODE_NAME names another node than our pod's: keep, whatever that node is", async () => {
    const w = await world();
    // A node the DaemonSet does not target; ours (the pod's spec.nodeName) it still does.
    w.api.upsertNode({ metadata: { name: 'other-node', labels: {} } });
    await decide(
      w,
      { cleanup: false, reason: 'no_node_name', why: /NODE_NAME other-node is not our pod's node/ },
      settings(w, { POD_NAME: POD, POD_NAMESPACE: NS, NODE_NAME: 'other-node' }),
    );
  });

  it('the node not found: keep', async () => {
    const w = await world({ node: null });
    await decide(w, { cleanup: false, reason: 'node_not_found', why: /node node-1 is not found/ });
  });

  it('a node affinity that cannot be read: keep', async () => {
    const template = oursWithAffinity('Resembles');
    const w = await world({ template });
    await decide(w, { cleanup: false, reason: 'unsure_scheduling', why: /unknown operator "Resembles"/ });
  });
});

describe('--cleanup-on-exit=auto: transient answers are asked again within the deadline', () => {
  it('503 twice, then the DaemonSet gone: uninstall', async () => {
    const w = await world({ ds: null });
    w.api.faults.status = { code: 503, count: 2, paths: /daemonsets/ };
    const { attempts } = await decide(w, { cleanup: true, reason: 'daemonset_gone', why: /is gone: uninstall/ });
    assert.equal(attempts, 3);
    assert.deepEqual(
      dsReads(w.api).map((r) => r.status),
      [503, 503, 404],
    );
  });
});

// The node-scope component's admission policies (deploy/overlays/node-scope), rendered by the
// pinned kustomize and their CEL evaluated by a CEL library (test/helpers/vap.ts) on admission
// requests shaped as the API server builds them: the agent's own writes, as its code makes them,
// are allowed; every write to another node, another pod, another field, or without the token's
// node claim is refused; other users are not matched.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { conditionFromReadiness, conditionPatch, taintRemovalPatch, type NodeCondition } from '../../src/node/plan.ts';
import { mergePatch } from '../helpers/apiserver.ts';
import { DEPLOY_DIR, kustomize, one, type K8sObject } from '../helpers/podman-daemonset.ts';
import { admit, type AdmissionCase, type PolicyObject } from '../helpers/vap.ts';

const NODE = 'node-1';
const AGENT = 'system:serviceaccount:mesh-system:mesh-cni';
/** The user info extra of a token the kubelet mounted into the agent's pod on node-1 (KEP-4193). */
const CLAIMS = {
  'authentication.kubernetes.io/credential-id': ['JTI=0bd5e3ef-3c21-4e2b-9a33-3c7a5ad0c6f1'],
  'authentication.kubernetes.io/node-name': [NODE],
  'authentication.kubernetes.io/node-uid': ['6a1f6f46-8c4e-4a5e-9d0b-5b1e2d3c4f50'],
  'authentication.kubernetes.io/pod-name': ['mesh-cni-node-x7k2p'],
  'authentication.kubernetes.io/pod-uid': ['3f0e0c57-2f5a-4e2e-8d51-1a2b3c4d5e6f'],
};
const TAINT = { key: 'mesh.io/cni-not-ready', value: undefined, effect: 'NoSchedule' } as const;

/** A node as the kubelet registered it, with the start-up taint and the kubelet's conditions. */
function node(name = NODE): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      uid: '6a1f6f46-8c4e-4a5e-9d0b-5b1e2d3c4f50',
      resourceVersion: '4711',
      labels: {
        'kubernetes.io/hostname': name,
        'kubernetes.io/os': 'linux',
        'node.kubernetes.io/instance-type': 'm7i',
      },
      annotations: {
        'node.alpha.kubernetes.io/ttl': '0',
        'volumes.kubernetes.io/controller-managed-attach-detach': 'true',
      },
    },
    spec: {
      podCIDR: '198.18.4.0/24',
      podCIDRs: ['198.18.4.0/24'],
      providerID: 'aws:///eu-west-1a/i-0abc',
      taints: [
        { key: 'mesh.io/cni-not-ready', effect: 'NoSchedule' },
        { key: 'example.com/gpu', value: 'true', effect: 'NoSchedule' },
      ],
    },
    status: {
      capacity: { cpu: '4', memory: '16Gi', pods: '110' },
      allocatable: { cpu: '3920m', memory: '15Gi', pods: '110' },
      conditions: [
        { type: 'MemoryPressure', status: 'False', reason: 'KubeletHasSufficientMemory' },
        { type: 'Ready', status: 'True', reason: 'KubeletReady', message: 'kubelet is posting ready status' },
      ],
      addresses: [
        { type: 'InternalIP', address: '198.18.0.10' },
        { type: 'Hostname', address: name },
      ],
      daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
      nodeInfo: { kubeletVersion: 'v1.34.2', containerRuntimeVersion: 'containerd://2.1.4', osImage: 'Linux' },
    },
  };
}

/** A pod of `nodeName` (none: not scheduled yet). */
function pod(name: string, nodeName: string | undefined, labels: Record<string, string> = { app: 'cart' }) {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name,
      namespace: 'shop',
      uid: `uid-${name}`,
      resourceVersion: '812',
      labels,
      annotations: { 'sidecar.mesh.io/status': '{"initContainers":["mesh-validation"]}' },
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'cart-5d9', uid: 'rs-1', controller: true }],
    },
    spec: { ...(nodeName ? { nodeName } : {}), containers: [{ name: 'app', image: 'cart:1' }] },
    status: { phase: 'Running', podIP: '198.18.4.17', hostIP: '198.18.0.10' },
  };
}

type Obj = Record<string, unknown>;
/** What the node strategies let through: a strategic merge patch of conditions merges them by type. */
function withCondition(n: Obj, c: NodeCondition): Obj {
  const status = n.status as { conditions: NodeCondition[] };
  const others = status.conditions.filter((o) => o.type !== c.type);
  const at = status.conditions.findIndex((o) => o.type === c.type);
  const conditions = at < 0 ? [...others, c] : status.conditions.map((o) => (o.type === c.type ? c : o));
  return { ...n, status: { ...status, conditions } };
}
/** The fields the cases change, on a node or a pod. */
interface Editable {
  metadata: { labels: Record<string, string>; annotations: Record<string, string> };
  spec: { taints: object[]; unschedulable?: boolean; containers: { image: string }[] };
  status: { addresses: { address: string }[]; podIP: string };
}
const edit = (o: Obj, f: (copy: Editable) => void): Obj => {
  const copy = structuredClone(o);
  f(copy as unknown as Editable);
  return copy;
};
/** The agent's own writes, built by the code that builds them in the agent. */
const agentTaintRemoval = (n: Obj) => mergePatch(n, taintRemovalPatch(n, TAINT)) as Obj;
const agentCondition = (n: Obj, reasons: string[] = []) =>
  withCondition(
    n,
    conditionPatch('MeshCNIReady', conditionFromReadiness(reasons), undefined, new Date()).status.conditions[0]!,
  );

const nodeWrite = (o: Partial<AdmissionCase> & { object: unknown; oldObject: unknown }): AdmissionCase => ({
  operation: 'UPDATE',
  resource: 'nodes',
  name: NODE,
  username: AGENT,
  extra: CLAIMS,
  ...o,
});
const podWrite = (o: Partial<AdmissionCase> & { oldObject: Obj }): AdmissionCase => ({
  operation: 'UPDATE',
  resource: 'pods',
  subResource: 'status',
  namespace: 'shop',
  name: (o.oldObject.metadata as { name: string }).name,
  username: AGENT,
  extra: CLAIMS,
  object: null,
  ...o,
});
const labelled = (p: Obj, key: string, value: string) =>
  edit(p, (c) => {
    c.metadata.labels = { ...c.metadata.labels, [key]: value };
  });

// [what, policy, request, allowed (true) or the refusal's message]
const CASES: [string, 'node' | 'pod', AdmissionCase, true | RegExp][] = [
  [
    'the agent removes the start-up taint from its own node (its merge patch), the GPU taint stays',
    'node',
    nodeWrite({ object: agentTaintRemoval(node()), oldObject: node() }),
    true,
  ],
  [
    'the agent sets its condition on its own node (a new condition, by its strategic merge patch)',
    'node',
    nodeWrite({ subResource: 'status', object: agentCondition(node()), oldObject: node() }),
    true,
  ],
  [
    'the agent turns its condition False on its own node (not ready)',
    'node',
    nodeWrite({
      subResource: 'status',
      object: agentCondition(agentCondition(node()), ['installer: no primary CNI config yet']),
      oldObject: agentCondition(node()),
    }),
    true,
  ],
  [
    'the same taint removal on another node is refused',
    'node',
    nodeWrite({ name: 'node-2', object: agentTaintRemoval(node('node-2')), oldObject: node('node-2') }),
    /only patch its own node/,
  ],
  [
    'the condition on another node is refused',
    'node',
    nodeWrite({
      name: 'node-2',
      subResource: 'status',
      object: agentCondition(node('node-2')),
      oldObject: node('node-2'),
    }),
    /only patch its own node/,
  ],
  [
    'removing another taint (the GPU one) is refused',
    'node',
    nodeWrite({
      object: edit(node(), (n) => {
        n.spec.taints = [n.spec.taints[0]!];
      }),
      oldObject: node(),
    }),
    /only remove the start-up taint/,
  ],
  [
    'adding a taint is refused',
    'node',
    nodeWrite({
      object: edit(node(), (n) => n.spec.taints.push({ key: 'evil', effect: 'NoExecute' })),
      oldObject: node(),
    }),
    /only remove the start-up taint/,
  ],
  [
    'cordoning its own node (spec.unschedulable) is refused',
    'node',
    nodeWrite({
      object: edit(agentTaintRemoval(node()), (n) => {
        n.spec.unschedulable = true;
      }),
      oldObject: node(),
    }),
    /only remove the start-up taint/,
  ],
  [
    'a label on its own node with the taint removal is refused',
    'node',
    nodeWrite({
      object: edit(agentTaintRemoval(node()), (n) => {
        n.metadata.labels['node-role.kubernetes.io/control-plane'] = '';
      }),
      oldObject: node(),
    }),
    /labels, annotations, owners, finalizers/,
  ],
  [
    "changing the kubelet's Ready condition is refused",
    'node',
    nodeWrite({
      subResource: 'status',
      object: withCondition(agentCondition(node()), { type: 'Ready', status: 'False', reason: 'Forged' }),
      oldObject: node(),
    }),
    /only set its own condition/,
  ],
  [
    "changing the node's addresses along with its condition is refused",
    'node',
    nodeWrite({
      subResource: 'status',
      object: edit(agentCondition(node()), (n) => {
        n.status.addresses[0]!.address = '203.0.113.9';
      }),
      oldObject: node(),
    }),
    /only set its own condition/,
  ],
  [
    'deleting its own node is refused',
    'node',
    nodeWrite({ operation: 'DELETE', object: null, oldObject: node() }),
    /only patch its own node/,
  ],
  [
    'a token without the node claim (a legacy secret token) is refused even for its own node',
    'node',
    nodeWrite({ extra: undefined, object: agentTaintRemoval(node()), oldObject: node() }),
    /pod-bound token/,
  ],
  [
    'another account (the kubelet) is not matched',
    'node',
    nodeWrite({
      username: `system:node:${NODE}`,
      extra: undefined,
      subResource: 'status',
      object: withCondition(node(), { type: 'Ready', status: 'False', reason: 'KubeletNotReady' }),
      oldObject: node(),
    }),
    true,
  ],
  [
    "repair labels a pod on the agent's node (pods/status)",
    'pod',
    podWrite({
      object: labelled(pod('cart-1', NODE), 'cni.mesh.io/uninitialized', 'true'),
      oldObject: pod('cart-1', NODE),
    }),
    true,
  ],
  [
    "ambient annotates a pod on the agent's node (pods/status)",
    'pod',
    podWrite({
      object: edit(pod('cart-1', NODE), (p) => {
        p.metadata.annotations['ambient.mesh.io/redirection'] = 'enabled';
      }),
      oldObject: pod('cart-1', NODE),
    }),
    true,
  ],
  [
    'repair deletes a pod on its node',
    'pod',
    podWrite({ operation: 'DELETE', subResource: '', object: null, oldObject: pod('cart-1', NODE) }),
    true,
  ],
  [
    'labelling a pod on another node is refused',
    'pod',
    podWrite({
      object: labelled(pod('cart-2', 'node-2'), 'cni.mesh.io/uninitialized', 'true'),
      oldObject: pod('cart-2', 'node-2'),
    }),
    /only write pods on its own node/,
  ],
  [
    'deleting a pod on another node is refused',
    'pod',
    podWrite({ operation: 'DELETE', subResource: '', object: null, oldObject: pod('cart-2', 'node-2') }),
    /only write pods on its own node/,
  ],
  [
    'deleting a pod not yet scheduled is refused',
    'pod',
    podWrite({ operation: 'DELETE', subResource: '', object: null, oldObject: pod('cart-3', undefined) }),
    /only write pods on its own node/,
  ],
  [
    'a label not ours on a pod of its node is refused (it could move the pod into a Service)',
    'pod',
    podWrite({ object: labelled(pod('cart-1', NODE), 'app', 'payments'), oldObject: pod('cart-1', NODE) }),
    /only set its own label and annotation/,
  ],
  [
    "changing a pod's status (its IP) is refused",
    'pod',
    podWrite({
      object: edit(labelled(pod('cart-1', NODE), 'cni.mesh.io/uninitialized', 'true'), (p) => {
        p.status.podIP = '198.18.4.99';
      }),
      oldObject: pod('cart-1', NODE),
    }),
    /status or finalizers/,
  ],
  [
    'patching a pod itself (its spec) is refused',
    'pod',
    podWrite({
      subResource: '',
      object: edit(pod('cart-1', NODE), (p) => {
        p.spec.containers[0]!.image = 'evil:1';
      }),
      oldObject: pod('cart-1', NODE),
    }),
    /only patch pods\/status and delete pods/,
  ],
  [
    "another account's pod label is not matched",
    'pod',
    podWrite({
      username: 'system:serviceaccount:kube-system:replicaset-controller',
      extra: undefined,
      object: labelled(pod('cart-2', 'node-2'), 'app', 'x'),
      oldObject: pod('cart-2', 'node-2'),
    }),
    true,
  ],
];

describe('deploy: the node-scope component (admission policies evaluated with CEL)', () => {
  let opDir: string;
  const policies: Record<'node' | 'pod', PolicyObject> = {} as never;
  let objects: K8sObject[];
  before(() => {
    opDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-node-scope-'));
    const dir = path.join(opDir, 'op');
    mkdirSync(dir);
    const rel = path.relative(dir, DEPLOY_DIR);
    writeFileSync(
      path.join(dir, 'kustomization.yaml'),
      `resources:\n  - ${rel}\ncomponents:\n  - ${rel}/overlays/node-scope\n`,
    );
    objects = kustomize(dir).objects;
    policies.node = one<PolicyObject & K8sObject>(objects, 'ValidatingAdmissionPolicy', 'mesh-cni-node-writes');
    policies.pod = one<PolicyObject & K8sObject>(objects, 'ValidatingAdmissionPolicy', 'mesh-cni-pod-writes');
  });
  after(() => rmSync(opDir, { recursive: true, force: true }));

  it('renders each policy with a Deny binding, failing closed', () => {
    for (const p of Object.values(policies)) {
      assert.equal(p.spec.failurePolicy, 'Fail');
      const b = one<K8sObject & { spec: { policyName: string; validationActions: string[] } }>(
        objects,
        'ValidatingAdmissionPolicyBinding',
        p.metadata.name,
      );
      assert.equal(b.spec.policyName, p.metadata.name);
      assert.deepEqual(b.spec.validationActions, ['Deny']);
    }
  });

  for (const [what, which, request, want] of CASES) {
    it(`${want === true ? 'allows' : 'refuses'}: ${what}`, () => {
      const verdict = admit(policies[which], request);
      if (want === true) assert.deepEqual(verdict.allowed, true, JSON.stringify(verdict));
      else {
        assert.equal(verdict.allowed, false, `expected a refusal (${want})`);
        assert.match((verdict as { message: string }).message, want);
      }
    });
  }

  it('each refusal is a validation, not an expression that failed to evaluate', () => {
    for (const [what, which, request, want] of CASES) {
      if (want === true) continue;
      const verdict = admit(policies[which], request);
      assert.ok(!verdict.allowed && !/failed/.test(verdict.message), `${what}: ${JSON.stringify(verdict)}`);
    }
  });
});

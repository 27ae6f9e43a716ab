// Which pods are ambient (issue 17, A3): the enablement table, with the default selectors and
// operator-given ones, and the pod facts the informer reads (redirection, terminal, IPs).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import {
  ambientPodOf,
  DEFAULT_ENABLEMENT_SELECTORS,
  enabledPods,
  isAmbientPod,
  isTerminal,
  namespaceSelected,
  podIPs,
  redirectionOf,
  type EnablementSelector,
} from '../../src/ambient/enablement.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ambientRules } from '../../src/ambient/enablement.ts';

const MODE = 'mesh.io/dataplane-mode';

function pod(
  o: {
    ns?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    hostNetwork?: boolean;
    phase?: string;
    ips?: string[];
  } = {},
): V1Pod {
  return {
    metadata: {
      name: 'cart-1',
      namespace: o.ns ?? 'shop',
      uid: 'uid-cart-1',
      labels: o.labels ?? {},
      annotations: o.annotations ?? {},
    },
    spec: { containers: [{ name: 'app' }], hostNetwork: o.hostNetwork ?? false, serviceAccountName: 'cart' },
    status: { phase: o.phase ?? 'Running', podIPs: (o.ips ?? []).map((ip) => ({ ip })) },
  };
}

const AMBIENT_NS = { [MODE]: 'ambient' };
const rules = ambientRules(buildSettings({}, {}));

describe('isAmbientPod with the default selectors', () => {
  const table: [string, V1Pod, Record<string, string> | undefined, boolean][] = [
    ['pod labelled ambient, plain namespace', pod({ labels: { [MODE]: 'ambient' } }), {}, true],
    ['pod labelled ambient, namespace unknown', pod({ labels: { [MODE]: 'ambient' } }), undefined, true],
    ['unlabelled pod of an ambient namespace', pod(), AMBIENT_NS, true],
    ['pod labelled none in an ambient namespace', pod({ labels: { [MODE]: 'none' } }), AMBIENT_NS, false],
    ['pod labelled something else in an ambient namespace', pod({ labels: { [MODE]: 'sidecar' } }), AMBIENT_NS, true],
    ['unlabelled pod, plain namespace', pod(), {}, false],
    ['namespace labelled none', pod(), { [MODE]: 'none' }, false],
    ['pod labelled other value, plain namespace', pod({ labels: { [MODE]: 'Ambient' } }), {}, false],
    ['hostNetwork pod labelled ambient', pod({ labels: { [MODE]: 'ambient' }, hostNetwork: true }), AMBIENT_NS, false],
    [
      'pod with a sidecar (status annotation) in an ambient namespace',
      pod({ annotations: { 'sidecar.mesh.io/status': '{}' } }),
      AMBIENT_NS,
      false,
    ],
    [
      'pod with a sidecar, labelled ambient',
      pod({ labels: { [MODE]: 'ambient' }, annotations: { 'sidecar.mesh.io/status': '' } }),
      {},
      false,
    ],
    [
      'excluded namespace (kube-system), labelled ambient',
      pod({ ns: 'kube-system', labels: { [MODE]: 'ambient' } }),
      AMBIENT_NS,
      false,
    ],
    ['excluded namespace (mesh-system: ztunnel)', pod({ ns: 'mesh-system' }), AMBIENT_NS, false],
  ];
  for (const [name, p, ns, want] of table) {
    it(`${name}: ${want}`, () => assert.equal(isAmbientPod(p, ns, DEFAULT_ENABLEMENT_SELECTORS, rules), want));
  }

  it('a sidecar is the annotation of --repair-sidecar-annotation, and sidecar.mesh.io/status whatever it says', () => {
    const r = ambientRules(buildSettings({ 'repair-sidecar-annotation': 'inject.example/done' }, {}));
    const p = pod({ annotations: { 'inject.example/done': 'x' } });
    assert.equal(isAmbientPod(p, AMBIENT_NS, DEFAULT_ENABLEMENT_SELECTORS, r), false);
    // The plugin knows only sidecar.mesh.io/status (its sidecar path reads it): such a pod gets the
    // plugin's sidecar rules, so the agent must not enroll it into ztunnel on top of them.
    const q = pod({ annotations: { 'sidecar.mesh.io/status': 'x' } });
    assert.equal(isAmbientPod(q, AMBIENT_NS, DEFAULT_ENABLEMENT_SELECTORS, r), false);
  });
});

describe('isAmbientPod with given selectors', () => {
  const sel: EnablementSelector[] = [
    // Pods of team blue in namespaces that are not legacy; or any pod with app in (cart, shop).
    {
      podSelector: { matchLabels: { team: 'blue' } },
      namespaceSelector: { matchExpressions: [{ key: 'legacy', operator: 'DoesNotExist' }] },
    },
    { podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['cart', 'shop'] }] } },
  ];
  const table: [string, Record<string, string>, Record<string, string>, boolean][] = [
    ['team blue, modern namespace', { team: 'blue' }, {}, true],
    ['team blue, legacy namespace', { team: 'blue' }, { legacy: 'yes' }, false],
    ['app cart, legacy namespace', { app: 'cart' }, { legacy: 'yes' }, true],
    ['app web', { app: 'web' }, {}, false],
    ['team red', { team: 'red' }, {}, false],
    // The explicit opt-out wins over any selector.
    ['team blue labelled none', { team: 'blue', [MODE]: 'none' }, {}, false],
  ];
  for (const [name, labels, ns, want] of table) {
    it(`${name}: ${want}`, () => assert.equal(isAmbientPod(pod({ labels }), ns, sel, rules), want));
  }

  it('an empty pair (no pod and no namespace selector) selects every pod, as in Istio', () => {
    assert.equal(isAmbientPod(pod(), {}, [{}], rules), true);
    assert.equal(isAmbientPod(pod(), {}, [], rules), false);
  });

  it('NotIn matches a pod without the key; Exists needs it', () => {
    const notIn: EnablementSelector[] = [
      { podSelector: { matchExpressions: [{ key: 'x', operator: 'NotIn', values: ['a'] }] } },
    ];
    assert.equal(isAmbientPod(pod(), {}, notIn, rules), true);
    assert.equal(isAmbientPod(pod({ labels: { x: 'a' } }), {}, notIn, rules), false);
    const exists: EnablementSelector[] = [{ podSelector: { matchExpressions: [{ key: 'x', operator: 'Exists' }] } }];
    assert.equal(isAmbientPod(pod(), {}, exists, rules), false);
    assert.equal(isAmbientPod(pod({ labels: { x: '' } }), {}, exists, rules), true);
  });
});

describe('namespaceSelected (a relabel that flips it re-checks the namespace pods)', () => {
  it('the default: only the ambient label counts; pod-only selectors never', () => {
    assert.equal(namespaceSelected(DEFAULT_ENABLEMENT_SELECTORS, AMBIENT_NS), true);
    assert.equal(namespaceSelected(DEFAULT_ENABLEMENT_SELECTORS, {}), false);
    assert.equal(namespaceSelected(DEFAULT_ENABLEMENT_SELECTORS, { [MODE]: 'none' }), false);
    assert.equal(namespaceSelected([{ podSelector: { matchLabels: { a: 'b' } } }], AMBIENT_NS), false);
  });
});

describe('pod facts the informer reads', () => {
  it('redirection: enabled, pending, else nothing', () => {
    const a = 'ambient.mesh.io/redirection';
    assert.equal(redirectionOf(pod({ annotations: { [a]: 'enabled' } })), 'enabled');
    assert.equal(redirectionOf(pod({ annotations: { [a]: 'pending' } })), 'pending');
    assert.equal(redirectionOf(pod({ annotations: { [a]: 'disabled' } })), undefined);
    assert.equal(redirectionOf(pod()), undefined);
  });

  it('terminal: Succeeded and Failed', () => {
    assert.deepEqual(
      ['Pending', 'Running', 'Succeeded', 'Failed', 'Unknown'].map((phase) => isTerminal(pod({ phase }))),
      [false, false, true, true, false],
    );
  });

  it('IPs: podIPs, else podIP', () => {
    assert.deepEqual(podIPs(pod({ ips: ['198.18.0.5', 'fd00::5'] })), ['198.18.0.5', 'fd00::5']);
    const one = pod();
    one.status = { podIP: '198.18.0.6' };
    assert.deepEqual(podIPs(one), ['198.18.0.6']);
    assert.deepEqual(podIPs(pod()), []);
  });

  it('the AmbientPod of a pod (mirror UID of a static pod)', () => {
    const p = pod({ ips: ['198.18.0.5'], annotations: { 'kubernetes.io/config.mirror': 'kubelet-uid' } });
    assert.deepEqual(ambientPodOf(p), {
      uid: 'uid-cart-1',
      namespace: 'shop',
      name: 'cart-1',
      serviceAccount: 'cart',
      ips: ['198.18.0.5'],
      annotations: { 'kubernetes.io/config.mirror': 'kubelet-uid' },
      mirrorUid: 'kubelet-uid',
    });
  });

  it('the start-up snapshot: annotated enabled and not terminal', () => {
    const a = 'ambient.mesh.io/redirection';
    const pods = [
      pod({ annotations: { [a]: 'enabled' } }),
      pod({ annotations: { [a]: 'pending' } }),
      pod({ annotations: { [a]: 'enabled' }, phase: 'Succeeded' }),
      pod({ labels: { [MODE]: 'ambient' } }),
    ];
    assert.deepEqual(enabledPods(pods), [pods[0]]);
  });

  // R6 review: the annotation is on the pod, and its owner may write it (at creation, say). A
  // sidecar or host-network pod is never enrolled by the agent, so its "enabled" is not ours: in
  // the snapshot, the start would put ambient rules into a sidecar pod (sweeping its MESH_* chains).
  it('the start-up snapshot leaves out sidecar and host-network pods whatever they are annotated', () => {
    const a = 'ambient.mesh.io/redirection';
    const pods = [
      pod({ annotations: { [a]: 'enabled', 'sidecar.mesh.io/status': '{}' } }),
      pod({ annotations: { [a]: 'enabled', 'sidecar.example/status': '{}' } }),
      pod({ annotations: { [a]: 'enabled' }, hostNetwork: true }),
      pod({ annotations: { [a]: 'enabled' } }),
    ];
    assert.deepEqual(enabledPods(pods, { sidecarAnnotation: 'sidecar.example/status' }), [pods[3]]);
  });
});

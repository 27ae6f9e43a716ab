// Which pods are ambient (docs/ambient.md "How pods are selected"): the enablement table, with the
// default selectors and operator-given ones, and the pod facts the informer reads (redirection,
// terminal, IPs).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import {
  ambientPodOf,
  DEFAULT_ENABLEMENT_SELECTORS,
  isAmbientPod,
  isTerminal,
  namespaceSelected,
  podIPs,
  redirectionOf,
  type EnablementSelector,
} from '../../src/ambient/enablement.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { sidecarSkipReason } from '../../cni-plugin/shared/sidecar.ts';
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
    /** A mesh-proxy container beside the app (a sidecar pod, with the status annotation). */
    proxy?: boolean;
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
    spec: {
      containers: [{ name: 'app' }, ...(o.proxy ? [{ name: 'mesh-proxy' }] : [])],
      hostNetwork: o.hostNetwork ?? false,
      serviceAccountName: 'cart',
    },
    status: { phase: o.phase ?? 'Running', podIPs: (o.ips ?? []).map((ip) => ({ ip })) },
  };
}

const AMBIENT_NS = { [MODE]: 'ambient' };
const rules = ambientRules(ambientArgs(buildSettings({}, {})));

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
      'pod with a sidecar (status annotation, mesh-proxy) in an ambient namespace',
      pod({ annotations: { 'sidecar.mesh.io/status': '{}' }, proxy: true }),
      AMBIENT_NS,
      false,
    ],
    [
      'pod with a sidecar, labelled ambient',
      pod({ labels: { [MODE]: 'ambient' }, annotations: { 'sidecar.mesh.io/status': '' }, proxy: true }),
      {},
      false,
    ],
    [
      'pod with the status annotation and no mesh-proxy in an ambient namespace (no sidecar path either)',
      pod({ annotations: { 'sidecar.mesh.io/status': '{}' } }),
      AMBIENT_NS,
      true,
    ],
    [
      'pod with the status annotation and no mesh-proxy, plain namespace',
      pod({ annotations: { 'sidecar.mesh.io/status': '{}' } }),
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

  // A sidecar pod is the one the plugin's sidecar path redirects, for the agent as for the plugin:
  // --repair-sidecar-annotation only says which pods repair looks at. Before, a pod carrying it
  // was never ambient for the agent, while the plugin (which never reads the flag) handed it over.
  it('--repair-sidecar-annotation makes no pod a sidecar pod: the sidecar path decides', () => {
    const r = ambientRules(ambientArgs(buildSettings({ 'repair-sidecar-annotation': 'inject.example/done' }, {})));
    const p = pod({ annotations: { 'inject.example/done': 'x' }, proxy: true });
    assert.equal(isAmbientPod(p, AMBIENT_NS, DEFAULT_ENABLEMENT_SELECTORS, r), true);
    const q = pod({ annotations: { 'sidecar.mesh.io/status': 'x' }, proxy: true });
    assert.equal(isAmbientPod(q, AMBIENT_NS, DEFAULT_ENABLEMENT_SELECTORS, r), false);
  });
});

// The class of the gap: each field the sidecar path reads is its author's, so no combination of
// them may leave a pod of an ambient namespace with neither path (nor with both). Every
// combination of what the sidecar path reads, against the one decision the plugin and the agent
// share; the opt-outs that stay (labelled none, host network, excluded namespace) are above.
describe('a pod of an ambient namespace is ambient or a sidecar pod: never neither, never both', () => {
  const proxies: [string, V1Container[], V1Container[]][] = [
    ['no mesh-proxy', [], []],
    ['mesh-proxy', [], [{ name: 'mesh-proxy' }]],
    ['mesh-proxy as a native sidecar', [{ name: 'mesh-proxy' }], []],
    ['a gateway mesh-proxy', [], [{ name: 'mesh-proxy', args: ['proxy', 'router'] }]],
    ['mesh-proxy with DISABLE_ENVOY', [], [{ name: 'mesh-proxy', env: [{ name: 'DISABLE_ENVOY', value: '1' }] }]],
  ];
  const options = <T>(...v: T[]) => v;
  let combos = 0;
  const wrong: string[] = [];
  for (const status of options<string | undefined>(undefined, '{}', ''))
    for (const [proxyName, init, containers] of proxies)
      for (const ownInit of [false, true])
        for (const injectLabel of options<string | undefined>(undefined, 'false', 'true'))
          for (const injectAnnotation of options<string | undefined>(undefined, '0'))
            for (const interception of options<string | undefined>(undefined, 'NONE', 'TPROXY'))
              for (const modeLabel of options<string | undefined>(undefined, 'ambient')) {
                const annotations: Record<string, string> = {};
                if (status !== undefined) annotations['sidecar.mesh.io/status'] = status;
                if (injectAnnotation !== undefined) annotations['sidecar.mesh.io/inject'] = injectAnnotation;
                if (interception !== undefined) annotations['sidecar.mesh.io/interceptionMode'] = interception;
                const labels: Record<string, string> = {};
                if (injectLabel !== undefined) labels['sidecar.mesh.io/inject'] = injectLabel;
                if (modeLabel !== undefined) labels[MODE] = modeLabel;
                const p = pod({ annotations, labels });
                p.spec!.initContainers = [...init, ...(ownInit ? [{ name: 'mesh-init' }] : [])];
                p.spec!.containers = [{ name: 'app' }, ...containers];
                const ambient = isAmbientPod(p, AMBIENT_NS, DEFAULT_ENABLEMENT_SELECTORS, rules);
                const sidecar = sidecarSkipReason(p) === null;
                if (ambient === sidecar) {
                  const what = JSON.stringify({
                    status,
                    proxyName,
                    ownInit,
                    injectLabel,
                    injectAnnotation,
                    interception,
                  });
                  wrong.push(`${what}: ${ambient ? 'both paths' : `neither path (${sidecarSkipReason(p)})`}`);
                }
                combos++;
              }
  it(`each of the ${combos} combinations takes exactly one path`, () => {
    assert.equal(combos, 3 * 5 * 2 * 3 * 2 * 3 * 2);
    assert.deepEqual(wrong.slice(0, 5), [], `${wrong.length} combinations take no path or both`);
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
});

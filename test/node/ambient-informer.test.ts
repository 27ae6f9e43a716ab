// The ambient informer: the decision table of src/ambient/informer.ts's header as a pure
// function, and the AmbientInformer around it (pending events per pod, the namespace relabel, the
// queue's retries and drops) with a fake dataplane that records its calls.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Namespace, V1Pod } from '@kubernetes/client-node';
import {
  DEFAULT_ENABLEMENT_SELECTORS,
  isAmbientPod,
  type AmbientPodInfo,
  type Redirection,
} from '../../src/ambient/enablement.ts';
import { decide, AmbientInformer, type Action, type DecisionInput } from '../../src/ambient/informer.ts';
import { metricValue } from '../helpers/metrics.ts';
import { eventually } from '../helpers/poll.ts';

const MODE = 'mesh.io/dataplane-mode';
const REDIRECTION = 'ambient.mesh.io/redirection';

function pod(
  o: {
    name?: string;
    uid?: string;
    ns?: string;
    labels?: Record<string, string>;
    redirection?: 'enabled' | 'pending';
    phase?: string;
    ips?: string[];
  } = {},
): V1Pod {
  return {
    metadata: {
      name: o.name ?? 'cart-1',
      namespace: o.ns ?? 'shop',
      uid: o.uid ?? 'uid-1',
      labels: o.labels ?? {},
      annotations: o.redirection ? { [REDIRECTION]: o.redirection } : {},
    },
    spec: { containers: [{ name: 'app' }], serviceAccountName: 'cart' },
    status: { phase: o.phase ?? 'Running', podIPs: (o.ips ?? ['198.18.0.5']).map((ip) => ({ ip })) },
  };
}

const ambient = { [MODE]: 'ambient' };
// Namespace labels {} everywhere: the pod's own label decides.
const shouldBeEnabled = (p: V1Pod) => isAmbientPod(p, {}, DEFAULT_ENABLEMENT_SELECTORS);

describe('the reconcile decision (pure)', () => {
  const enrolled = pod({ labels: ambient, redirection: 'enabled' });
  const table: [string, Omit<DecisionInput, 'shouldBeEnabled'>, Action['kind'], V1Pod?, boolean?][] = [
    [
      'add events are ignored',
      { event: 'add', old: undefined, latest: enrolled, current: enrolled, record: 'enabled' },
      'none',
    ],
    [
      'add of a labelled, unenrolled pod is ignored too (the plugin enrolls it)',
      {
        event: 'add',
        old: undefined,
        latest: pod({ labels: ambient }),
        current: pod({ labels: ambient }),
        record: undefined,
      },
      'none',
    ],
    [
      'update: enrolled and terminated -> remove the OLD pod (its IPs), as a delete',
      {
        event: 'update',
        old: enrolled,
        latest: pod({ labels: ambient, redirection: 'enabled', phase: 'Succeeded', ips: [] }),
        current: pod({ labels: ambient, redirection: 'enabled', phase: 'Succeeded', ips: [] }),
        record: 'enabled',
      },
      'remove',
      enrolled,
      true,
    ],
    [
      'update: pending and terminated -> remove',
      {
        event: 'update',
        old: pod({ labels: ambient, redirection: 'pending' }),
        latest: pod({ labels: ambient, redirection: 'pending', phase: 'Failed' }),
        current: pod({ labels: ambient, redirection: 'pending', phase: 'Failed' }),
        record: 'pending',
      },
      'remove',
      pod({ labels: ambient, redirection: 'pending' }),
      true,
    ],
    [
      'update: terminated, never enrolled -> nothing (not even when labelled)',
      {
        event: 'update',
        old: pod({ labels: ambient }),
        latest: pod({ labels: ambient, phase: 'Succeeded' }),
        current: pod({ labels: ambient, phase: 'Succeeded' }),
        record: undefined,
      },
      'none',
    ],
    [
      'update: enrolled, still wanted, IPs changed -> sync the probe ipset',
      {
        event: 'update',
        old: pod({ labels: ambient, redirection: 'enabled', ips: [] }),
        latest: enrolled,
        current: enrolled,
        record: 'enabled',
      },
      'syncProbeIPs',
      enrolled,
    ],
    [
      'update: enrolled, still wanted, same IPs in another order -> nothing',
      {
        event: 'update',
        old: pod({ labels: ambient, redirection: 'enabled', ips: ['fd00::5', '198.18.0.5'] }),
        latest: pod({ labels: ambient, redirection: 'enabled', ips: ['198.18.0.5', 'fd00::5'] }),
        current: pod({ labels: ambient, redirection: 'enabled', ips: ['198.18.0.5', 'fd00::5'] }),
        record: 'enabled',
      },
      'none',
    ],
    [
      'update: enrolled, IPs gone (no IP now) -> nothing (never a sync to no address)',
      {
        event: 'update',
        old: enrolled,
        latest: enrolled,
        current: pod({ labels: ambient, redirection: 'enabled', ips: [] }),
        record: 'enabled',
      },
      'none',
    ],
    [
      'update: enrolled, unlabelled -> remove (not a delete: its rules come out)',
      {
        event: 'update',
        old: enrolled,
        latest: pod({ redirection: 'enabled' }),
        current: pod({ redirection: 'enabled' }),
        record: 'enabled',
      },
      'remove',
      pod({ redirection: 'enabled' }),
      false,
    ],
    [
      'update: pending, labelled none -> remove',
      {
        event: 'update',
        old: enrolled,
        latest: pod({ labels: { [MODE]: 'none' }, redirection: 'pending' }),
        current: pod({ labels: { [MODE]: 'none' }, redirection: 'pending' }),
        record: 'pending',
      },
      'remove',
      pod({ labels: { [MODE]: 'none' }, redirection: 'pending' }),
      false,
    ],
    [
      'update: should be, not enrolled, has IPs -> add',
      {
        event: 'update',
        old: pod(),
        latest: pod({ labels: ambient }),
        current: pod({ labels: ambient }),
        record: undefined,
      },
      'add',
      pod({ labels: ambient }),
    ],
    [
      'update: pending and still wanted -> add again (ztunnel may be back)',
      {
        event: 'update',
        old: pod({ labels: ambient, redirection: 'pending' }),
        latest: pod({ labels: ambient, redirection: 'pending' }),
        current: pod({ labels: ambient, redirection: 'pending' }),
        record: 'pending',
      },
      'add',
      pod({ labels: ambient, redirection: 'pending' }),
    ],
    [
      'update: should be, no IP yet -> nothing',
      {
        event: 'update',
        old: pod(),
        latest: pod({ labels: ambient, ips: [] }),
        current: pod({ labels: ambient, ips: [] }),
        record: undefined,
      },
      'none',
    ],
    [
      'update: neither wanted nor enrolled -> nothing',
      { event: 'update', old: pod(), latest: pod(), current: pod(), record: undefined },
      'none',
    ],
    [
      'update: the pod is gone from the cache -> nothing (its delete follows)',
      { event: 'update', old: pod(), latest: pod({ labels: ambient }), current: undefined, record: undefined },
      'none',
    ],
    [
      'update: the cache is newer than the event: the current pod decides',
      { event: 'update', old: pod(), latest: pod(), current: pod({ labels: ambient }), record: undefined },
      'add',
      pod({ labels: ambient }),
    ],
    [
      'delete: enrolled -> remove as a delete',
      { event: 'delete', old: enrolled, latest: enrolled, current: undefined, record: 'enabled' },
      'remove',
      enrolled,
      true,
    ],
    [
      'delete: pending -> remove',
      {
        event: 'delete',
        old: undefined,
        latest: pod({ redirection: 'pending' }),
        current: undefined,
        record: 'pending',
      },
      'remove',
      pod({ redirection: 'pending' }),
      true,
    ],
    [
      'delete: matching, none of ours on record (the ADD may have half-run) -> remove',
      { event: 'delete', old: undefined, latest: pod({ labels: ambient }), current: undefined, record: undefined },
      'remove',
      pod({ labels: ambient }),
      true,
    ],
    [
      'delete: neither -> nothing',
      { event: 'delete', old: undefined, latest: pod(), current: undefined, record: undefined },
      'none',
    ],
  ];
  for (const [name, input, kind, withPod, isDelete] of table) {
    it(name, () => {
      const a = decide({ ...input, shouldBeEnabled });
      assert.equal(a.kind, kind, JSON.stringify(a));
      if (withPod && a.kind !== 'none') assert.deepEqual(a.pod, withPod);
      if (isDelete !== undefined && a.kind === 'remove') assert.equal(a.isDelete, isDelete);
    });
  }

  // The redirection annotation is its owner's to write (at creation, or any time): the decision
  // reads the dataplane's own record alone. A pod created "enabled" in a plain namespace was
  // taken for enrolled when the namespace was labelled, and ran unredirected.
  it('an owner-written enabled on a pod never enrolled: wanted -> add, not wanted -> nothing', () => {
    const claims = pod({ labels: ambient, redirection: 'enabled' });
    const base = { event: 'update', old: claims, latest: claims, current: claims, record: undefined } as const;
    assert.equal(decide({ ...base, shouldBeEnabled }).kind, 'add');
    const plain = pod({ redirection: 'enabled' });
    assert.equal(decide({ ...base, latest: plain, current: plain, shouldBeEnabled }).kind, 'none');
    assert.equal(
      decide({ event: 'delete', old: plain, latest: plain, current: undefined, record: undefined, shouldBeEnabled })
        .kind,
      'none',
      'nor is its delete a removal',
    );
  });

  it('enrolled on record, the annotation taken off by its owner: unlabelled -> remove, wanted -> nothing', () => {
    const bare = pod();
    const i = { event: 'update', old: bare, latest: bare, current: bare, record: 'enabled' } as const;
    assert.equal(decide({ ...i, shouldBeEnabled }).kind, 'remove');
    const labelled = pod({ labels: ambient });
    assert.equal(decide({ ...i, latest: labelled, current: labelled, shouldBeEnabled }).kind, 'none');
  });
});

type Call = { op: 'add' | 'remove' | 'sync'; uid: string; ips: readonly string[]; isDelete?: boolean };

/**
 * A dataplane that records calls and keeps its own record of enrollment as the real one does (an
 * add that works: enabled; a removal that works: none); `fail` decides a throw per call.
 */
function fakeDataplane(fail: (c: Call) => Error | undefined = () => undefined) {
  const calls: Call[] = [];
  const enrolled = new Map<string, Redirection>();
  const record = async (c: Call) => {
    calls.push(c);
    const e = fail(c);
    if (e) throw e;
    if (c.op === 'add') enrolled.set(c.uid, 'enabled');
    if (c.op === 'remove') enrolled.delete(c.uid);
  };
  return {
    calls,
    /** Enrolled before the test (by the plugin's ADD, or a start-up). */
    enrolled,
    enrollment: (uid: string) => enrolled.get(uid),
    addPodToMesh: (p: AmbientPodInfo) => record({ op: 'add', uid: p.uid, ips: p.ips }),
    removePodFromMesh: (p: AmbientPodInfo, isDelete: boolean) =>
      record({ op: 'remove', uid: p.uid, ips: p.ips, isDelete }),
    syncHostProbeIPs: (p: AmbientPodInfo) => record({ op: 'sync', uid: p.uid, ips: p.ips }),
  };
}

class EnrollError extends Error {
  readonly retryable: boolean;
  constructor(message: string, retryable: boolean) {
    super(message);
    this.name = 'EnrollError';
    this.retryable = retryable;
  }
}

/** A pod cache and namespace labels the test changes, and a AmbientInformer reading them. */
function harness(dp = fakeDataplane()) {
  const cache = new Map<string, V1Pod>();
  const nsLabels = new Map<string, Record<string, string>>([['shop', {}]]);
  const r = new AmbientInformer({
    pods: { get: (ns, name) => cache.get(`${ns}/${name}`), pods: () => [...cache.values()] },
    namespaceLabels: (n) => nsLabels.get(n),
    selectors: DEFAULT_ENABLEMENT_SELECTORS,
    isAmbient: (p, labels) => isAmbientPod(p, labels, DEFAULT_ENABLEMENT_SELECTORS),
    dataplane: dp,
  });
  const upsert = (p: V1Pod) => {
    cache.set(`${p.metadata!.namespace}/${p.metadata!.name}`, p);
    r.podHandler.upsert(p);
  };
  const remove = (p: V1Pod) => {
    cache.delete(`${p.metadata!.namespace}/${p.metadata!.name}`);
    r.podHandler.remove(p);
  };
  const idle = () => eventually(() => r.status().queued + r.status().inFlight + r.status().waiting === 0, 'queue idle');
  return { r, dp, cache, nsLabels, upsert, remove, idle };
}

const metric = (type: string) => metricValue('mesh_cni_ambient_reconcile_events_total', { type });

describe('the AmbientInformer', () => {
  it('holds events until started, then catches every pod up once (labelled while the agent was down)', async () => {
    const h = harness();
    h.upsert(pod({ uid: 'a', name: 'a', labels: ambient }));
    h.upsert(pod({ uid: 'b', name: 'b' }));
    h.dp.enrolled.set('c', 'enabled'); // the start-up enrolled it
    h.upsert(pod({ uid: 'c', name: 'c', labels: ambient, redirection: 'enabled' }));
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(h.dp.calls, [], 'nothing before start');
    const before = (await metric('add')) + (await metric('update'));
    h.r.start();
    await h.idle();
    assert.deepEqual(h.dp.calls, [{ op: 'add', uid: 'a', ips: ['198.18.0.5'] }]);
    // Only the pod with something to do went through the queue (b and c need nothing).
    assert.equal((await metric('add')) + (await metric('update')) - before, 1);
    await h.r.stop(100);
  });

  it('an unlabel removes, a relabel enrolls, a termination removes with the old IPs, a delete removes', async () => {
    const h = harness();
    h.r.start();
    const before = await metric('update');
    const p = pod({ uid: 'u', labels: ambient, redirection: 'enabled' });
    h.dp.enrolled.set('u', 'enabled'); // the plugin's ADD enrolled it
    h.upsert(p); // add: ignored
    await h.idle();
    h.upsert(pod({ uid: 'u', redirection: 'enabled' })); // unlabelled
    await h.idle();
    h.upsert(pod({ uid: 'u' })); // un-annotated by the dataplane
    await h.idle();
    h.upsert(pod({ uid: 'u', labels: ambient })); // labelled again
    await h.idle();
    h.upsert(pod({ uid: 'u', labels: ambient, redirection: 'enabled' }));
    await h.idle();
    h.upsert(pod({ uid: 'u', labels: ambient, redirection: 'enabled', phase: 'Succeeded', ips: [] }));
    await h.idle();
    h.remove(pod({ uid: 'u', labels: ambient, redirection: 'enabled', phase: 'Succeeded', ips: [] }));
    await h.idle();
    assert.deepEqual(h.dp.calls, [
      { op: 'remove', uid: 'u', ips: ['198.18.0.5'], isDelete: false },
      { op: 'add', uid: 'u', ips: ['198.18.0.5'] },
      { op: 'remove', uid: 'u', ips: ['198.18.0.5'], isDelete: true },
      { op: 'remove', uid: 'u', ips: [], isDelete: true },
    ]);
    assert.ok((await metric('update')) - before >= 5, 'update events counted');
    await h.r.stop(100);
  });

  it('a namespace relabelled to ambient enqueues all its pods (and only its own)', async () => {
    const h = harness();
    h.nsLabels.set('other', {});
    h.r.start();
    const shop = [1, 2, 3].map((i) => pod({ uid: `s${i}`, name: `s${i}` }));
    const other = pod({ uid: 'o1', name: 'o1', ns: 'other' });
    for (const p of [...shop, other]) h.upsert(p);
    await h.idle();
    assert.equal(h.dp.calls.length, 0);
    const ns = (labels: Record<string, string>): V1Namespace => ({ metadata: { name: 'shop', labels } });
    h.nsLabels.set('shop', ambient);
    h.r.namespaceHandler.upsert(ns(ambient), ns({}));
    await h.idle();
    assert.deepEqual(h.dp.calls.map((c) => `${c.op} ${c.uid}`).sort(), ['add s1', 'add s2', 'add s3']);
    // A relabel that flips nothing (another label) queues nothing.
    h.dp.calls.length = 0;
    h.r.namespaceHandler.upsert(ns({ ...ambient, team: 'x' }), ns(ambient));
    assert.equal(h.r.status().queued + h.r.status().inFlight, 0);
    await h.r.stop(100);
  });

  // With two selectors, a relabel from one's namespace part to the other's keeps "some
  // namespace selector matches" true, yet changes which pods are ambient (app=a out, app=b in).
  it('a relabel that swaps which selector matches the namespace re-checks its pods', async () => {
    const selectors = [
      { podSelector: { matchLabels: { app: 'a' } }, namespaceSelector: { matchLabels: { team: 'x' } } },
      { podSelector: { matchLabels: { app: 'b' } }, namespaceSelector: { matchLabels: { team: 'y' } } },
    ];
    const dp = fakeDataplane();
    const cache = new Map<string, V1Pod>();
    const nsLabels = new Map<string, Record<string, string>>([['shop', { team: 'x' }]]);
    const r = new AmbientInformer({
      pods: { get: (ns, name) => cache.get(`${ns}/${name}`), pods: () => [...cache.values()] },
      namespaceLabels: (n) => nsLabels.get(n),
      selectors,
      isAmbient: (p, labels) => isAmbientPod(p, labels, selectors),
      dataplane: dp,
    });
    const a = pod({ uid: 'a', name: 'a', labels: { app: 'a' }, redirection: 'enabled' });
    dp.enrolled.set('a', 'enabled');
    const b = pod({ uid: 'b', name: 'b', labels: { app: 'b' } });
    for (const p of [a, b]) {
      cache.set(`shop/${p.metadata!.name}`, p);
      r.podHandler.upsert(p);
    }
    r.start();
    const idle = () => eventually(() => r.status().queued + r.status().inFlight + r.status().waiting === 0, 'idle');
    await idle();
    assert.equal(dp.calls.length, 0, 'as wanted before the relabel');
    nsLabels.set('shop', { team: 'y' });
    const ns = (labels: Record<string, string>): V1Namespace => ({ metadata: { name: 'shop', labels } });
    r.namespaceHandler.upsert(ns({ team: 'y' }), ns({ team: 'x' }));
    await idle();
    assert.deepEqual(dp.calls.map((c) => `${c.op} ${c.uid}`).sort(), ['add b', 'remove a']);
    await r.stop(100);
  });

  // Every attempt takes a token of the queue's bucket (10 a second, burst 100; Istio's
  // limits only its retries). A relist of the pod watch, or a node's stream of status updates,
  // queued every pod although nothing was to be done, and an unlabel behind them waited for tokens.
  it('a pod update with nothing to do takes no turn of the queue (an unlabel behind 150 is not held up)', async () => {
    const dp = fakeDataplane();
    const cache = new Map<string, V1Pod>();
    // Time stands still: the bucket never refills, so only 100 attempts can ever start.
    const clock = {
      now: () => 0,
      sleep: (_ms: number, signal?: AbortSignal) =>
        new Promise<void>((_, reject) => signal?.addEventListener('abort', () => reject(new Error('stopped')))),
    };
    const r = new AmbientInformer({
      pods: { get: (ns, name) => cache.get(`${ns}/${name}`), pods: () => [...cache.values()] },
      namespaceLabels: () => ({}),
      selectors: DEFAULT_ENABLEMENT_SELECTORS,
      isAmbient: (p, labels) => isAmbientPod(p, labels, DEFAULT_ENABLEMENT_SELECTORS),
      dataplane: dp,
      clock,
    });
    const upsert = (p: V1Pod) => {
      cache.set(`${p.metadata!.namespace}/${p.metadata!.name}`, p);
      r.podHandler.upsert(p);
    };
    r.start();
    const plain = Array.from({ length: 150 }, (_, i) => pod({ uid: `p${i}`, name: `p${i}` }));
    dp.enrolled.set('e', 'enabled');
    upsert(pod({ uid: 'e', name: 'e', labels: ambient, redirection: 'enabled' }));
    for (const p of plain) upsert(p);
    for (const p of plain) upsert(p); // updates, nothing changed (a relist)
    upsert(pod({ uid: 'e', name: 'e', redirection: 'enabled' })); // unlabelled
    await eventually(() => dp.calls.length === 1, 'the unlabelled pod removed', 2000);
    assert.deepEqual(dp.calls[0], { op: 'remove', uid: 'e', ips: ['198.18.0.5'], isDelete: false });
    await r.stop(100);
  });

  // A termination (status without IPs, kubernetes#125370) and the delete right after it
  // fold into one delete; it removed with the delete's pod, without IPs, so the probe ipset kept
  // the pod's entry (removal takes entries out by IP) for the next pod given that IP.
  it('a termination folded into its delete still removes with the IPs the pod had', async () => {
    const h = harness();
    h.r.start();
    h.dp.enrolled.set('t', 'enabled');
    h.upsert(pod({ uid: 't', labels: ambient, redirection: 'enabled' }));
    await h.idle();
    const dead = pod({ uid: 't', labels: ambient, redirection: 'enabled', phase: 'Failed', ips: [] });
    // Both before the queue's turn: one pending delete.
    h.upsert(dead);
    h.remove(dead);
    await h.idle();
    assert.deepEqual(h.dp.calls, [{ op: 'remove', uid: 't', ips: ['198.18.0.5'], isDelete: true }]);
    await h.r.stop(100);
  });

  // A pod's owner can write ambient.mesh.io/redirection on it. On a sidecar pod (never
  // enrolled: the plugin and the agent refuse it) "enabled" and an update made the informer remove
  // it, and the removal found its netns and swept every MESH_* chain: its sidecar redirection too.
  it("a sidecar pod carrying the redirection annotation (its owner's) is never removed while it runs", async () => {
    const h = harness();
    const sidecar = { 'sidecar.mesh.io/status': '{"containers":["mesh-proxy"]}' };
    const p = (o: { phase?: string; ips?: string[] } = {}) => {
      const x = pod({ uid: 's', name: 's', redirection: 'enabled', ...o });
      x.metadata!.annotations = { ...x.metadata!.annotations, ...sidecar };
      x.spec!.containers = [...x.spec!.containers, { name: 'mesh-proxy' }];
      return x;
    };
    h.upsert(p({ ips: [] }));
    h.r.start();
    h.upsert(p());
    await h.idle();
    assert.equal(h.dp.calls.length, 0, 'no removal of a pod never ours');
    // Nor its delete: nothing of ours is on record for it to undo.
    h.remove(p());
    await h.idle();
    assert.deepEqual(h.dp.calls, []);
    await h.r.stop(100);
  });

  it('retries a ztunnel failure until it works (5 ms backoff upward), drops a netns failure', async () => {
    let ztunnelDown = 3;
    const dp = fakeDataplane((c) => {
      if (c.uid === 'z' && ztunnelDown-- > 0) return new EnrollError('ztunnel is not connected', true);
      if (c.uid === 'n') return new EnrollError('netns of pod not found', false);
      return undefined;
    });
    const h = harness(dp);
    h.r.start();
    h.upsert(pod({ uid: 'z', name: 'z' }));
    h.upsert(pod({ uid: 'n', name: 'n' }));
    h.upsert(pod({ uid: 'z', name: 'z', labels: ambient }));
    h.upsert(pod({ uid: 'n', name: 'n', labels: ambient }));
    await h.idle();
    const count = (uid: string) => dp.calls.filter((c) => c.op === 'add' && c.uid === uid).length;
    assert.equal(count('z'), 4, 'three ztunnel failures retried, then enrolled');
    assert.equal(count('n'), 1, 'a netns failure is not retried');
    await h.r.stop(100);
  });

  it('folds events that came while waiting: add then update is one update from the added state', async () => {
    const h = harness();
    h.dp.enrolled.set('f', 'enabled');
    h.upsert(pod({ uid: 'f', labels: ambient, redirection: 'enabled', ips: [] }));
    h.upsert(pod({ uid: 'f', labels: ambient, redirection: 'enabled', ips: ['198.18.0.9'] }));
    h.r.start();
    await h.idle();
    assert.deepEqual(h.dp.calls, [{ op: 'sync', uid: 'f', ips: ['198.18.0.9'] }]);
    await h.r.stop(100);
  });

  it('a pod whose namespace is not known yet waits for it (no decision on missing labels)', async () => {
    const h = harness();
    h.r.start();
    h.upsert(pod({ uid: 'w', ns: 'late' }));
    h.upsert(pod({ uid: 'w', ns: 'late', labels: { team: 'x' } }));
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(h.dp.calls, []);
    h.nsLabels.set('late', ambient);
    await h.idle();
    assert.deepEqual(h.dp.calls, [{ op: 'add', uid: 'w', ips: ['198.18.0.5'] }]);
    await h.r.stop(100);
  });
});

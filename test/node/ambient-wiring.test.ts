// Ambient mode wired into the agent (docs/ambient.md): startAmbient on the node's one pod
// watch and a namespace watch, against the test HTTPS API server, with a fake dataplane (the real
// one programs the node; it has tests of its own). The readiness gate, the start-up snapshot, a
// namespace relabel, one pod list/watch shared with the pod lookup, the stop decision; and the
// redirection annotator on pods/status.

import assert from 'node:assert/strict';
import { existsSync, lstatSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import type { AmbientPod, DataplaneStatus, MeshDataplane } from '../../src/ambient/dataplane.ts';
import { apiAnnotator } from '../../src/ambient/annotator.ts';
import { startAmbient, type AmbientComponent } from '../../src/ambient/index.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs, orchClientArgs, podLookupArgs } from '../../src/partargs.ts';
import { DEFAULT_POD_LOOKUP, startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { type OrchApi } from '../../src/orch/api.ts';
import { orchApi } from '../../src/orch/client.ts';
import { ApiError } from '../../src/orch/errors.ts';
import { realClock } from '../../src/orch/limits.ts';
import { NamespaceSource } from '../../src/orch/namespacesource.ts';
import { nodePodSource, type PodSource } from '../../src/orch/podsource.ts';
import { spawnAgent } from '../helpers/agent.ts';
import { ALLOW_ALL, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { noFirewallPath } from '../helpers/nofirewall.ts';
import { tempDir } from '../helpers/plugin.ts';
import { eventually } from '../helpers/poll.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const MODE = 'mesh.io/dataplane-mode';
const REDIRECTION = 'ambient.mesh.io/redirection';

function nodePod(
  ns: string,
  name: string,
  o: {
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    phase?: string;
    node?: string;
    ip?: string;
  } = {},
): V1Pod {
  return {
    metadata: { name, namespace: ns, labels: o.labels ?? {}, annotations: o.annotations ?? {} },
    spec: { nodeName: o.node ?? 'node-1', containers: [{ name: 'app', image: 'app' }], serviceAccountName: name },
    status: { phase: o.phase ?? 'Running', podIPs: [{ ip: o.ip ?? '198.18.0.10' }], podIP: o.ip ?? '198.18.0.10' },
  };
}

/**
 * A dataplane that records what it is asked, and keeps a record of enrollment as the real one
 * does (start: its pods enabled, its leftovers pending; add: enabled; removal: none); its start
 * waits until released.
 */
function fakeDataplane() {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let started = false;
  const calls: { op: string; pod?: string; arg?: unknown }[] = [];
  const startedWith: AmbientPod[][] = [];
  const leftWith: AmbientPod[][] = [];
  const record = new Map<string, 'enabled' | 'pending'>();
  const dp: MeshDataplane = {
    async start(pods, leftovers = []) {
      startedWith.push([...pods]);
      leftWith.push([...leftovers]);
      await gate;
      for (const p of leftovers) record.set(p.uid, 'pending');
      for (const p of pods) record.set(p.uid, 'enabled');
      started = true;
    },
    async addPodToMesh(pod, netnsPath) {
      calls.push({ op: 'add', pod: `${pod.namespace}/${pod.name}`, arg: netnsPath });
      record.set(pod.uid, 'enabled');
    },
    async removePodFromMesh(pod, isDelete) {
      calls.push({ op: 'remove', pod: `${pod.namespace}/${pod.name}`, arg: isDelete });
      record.delete(pod.uid);
    },
    async syncHostProbeIPs(pod) {
      calls.push({ op: 'sync', pod: `${pod.namespace}/${pod.name}` });
    },
    isEnrolled: (uid) => record.get(uid) === 'enabled',
    enrollment: (uid) => record.get(uid),
    notReadyReasons: () => (started ? [] : ['fake dataplane: snapshot not built yet']),
    status: () => ({ started }) as unknown as DataplaneStatus,
    async stop(cleanup) {
      calls.push({ op: 'stop', arg: cleanup });
    },
  };
  return { dp, calls, startedWith, leftWith, release };
}

describe('ambient mode in the agent', () => {
  const tmp = tempDir();
  let api: TestApiServer;
  let settings: Settings;
  let orch: OrchApi;
  let pods: PodSource;
  let lookup: Component | undefined;
  let ambient: AmbientComponent | undefined;
  const fake = fakeDataplane();

  before(async () => {
    api = await startTestApiServer();
    api.upsertNamespace({ metadata: { name: 'shop', labels: {} } });
    api.upsertNamespace({ metadata: { name: 'mesh-system', labels: {} } });
    api.upsertPod(
      nodePod('shop', 'enrolled', { labels: { [MODE]: 'ambient' }, annotations: { [REDIRECTION]: 'enabled' } }),
    );
    api.upsertPod(nodePod('shop', 'plain-1', { ip: '198.18.0.11' }));
    api.upsertPod(nodePod('shop', 'plain-2', { ip: '198.18.0.12' }));
    api.upsertPod(nodePod('shop', 'done', { annotations: { [REDIRECTION]: 'enabled' }, phase: 'Succeeded' }));
    api.upsertPod(nodePod('shop', 'elsewhere', { node: 'node-2' }));
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig'));
    settings = buildSettings(
      {
        orchconfig,
        'ambient-enabled': 'true',
        'pod-lookup-uds-address': path.join(tmp.dir, 'run/pods.sock'),
        'pluginevent-uds-address': path.join(tmp.dir, 'run/pluginevent.sock'),
        'orch-qps': '1000',
        'orch-burst': '1000',
      },
      { NODE_NAME: 'node-1' },
    );
    orch = orchApi(orchClientArgs(settings));
    pods = nodePodSource(orch, 'node-1', 'install');
    pods.start();
  });
  after(async () => {
    await ambient?.stop('SIGTERM').catch(() => {});
    await lookup?.stop('SIGTERM');
    await pods?.stop();
    await api?.close();
    tmp.remove();
  });

  it('stays not ready until the caches are read and the dataplane started, then starts the informer', async () => {
    ambient = startAmbient(ambientArgs(settings), {
      pods,
      api: orch,
      dataplane: fake.dp,
      decideCleanup: async () => ({ cleanup: false, why: 'the test: an upgrade' }),
    });
    lookup = await startPodLookup(
      podLookupArgs(settings),
      { ...DEFAULT_POD_LOOKUP, namespaceLabels: ambient.namespaceLabels },
      pods,
    );
    assert.notDeepEqual(ambient.notReadyReasons(), [], 'not ready at once');
    await eventually(() => fake.startedWith.length === 1, 'the dataplane asked to start', 15_000);
    // The start-up snapshot: the running pods that should be ambient (by the agent's decision, not
    // their annotation); the finished pod still annotated enabled is a leftover to take out.
    assert.equal(existsSync(path.join(tmp.dir, 'run/pluginevent.sock')), false, 'no plugin socket before the start');
    assert.deepEqual(
      fake.startedWith[0]!.map((p) => `${p.namespace}/${p.name} ${p.ips.join(',')}`),
      ['shop/enrolled 198.18.0.10'],
    );
    assert.deepEqual(
      fake.leftWith[0]!.map((p) => `${p.namespace}/${p.name}`),
      ['shop/done'],
    );
    await new Promise((r) => setTimeout(r, 100));
    assert.deepEqual(ambient.notReadyReasons(), ['fake dataplane: snapshot not built yet'], 'the dataplane says why');
    fake.release();
    await ambient.started;
    assert.deepEqual(ambient.notReadyReasons(), []);
    assert.equal((ambient.status() as { state: string }).state, 'running');
    // The plugin's ADDs are taken once the dataplane is up, not before.
    assert.equal(lstatSync(path.join(tmp.dir, 'run/pluginevent.sock')).isSocket(), true);
    // The informer's first pass: the finished pod still annotated enabled is taken out (as a delete).
    await eventually(() => fake.calls.length > 0, 'the catch-up pass');
    await new Promise((r) => setTimeout(r, 100));
    assert.deepEqual(fake.calls, [{ op: 'remove', pod: 'shop/done', arg: true }]);
    fake.calls.length = 0;
  });

  it('a namespace labelled ambient enrolls its pods (and an excluded namespace never)', async () => {
    api.upsertPod(nodePod('mesh-system', 'ztunnel-x', { ip: '198.18.0.20' }));
    await eventually(() => pods.get('mesh-system', 'ztunnel-x') !== undefined, 'the watch has ztunnel-x');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(fake.calls.length, 0, 'nothing to do before the relabel');
    api.upsertNamespace({ metadata: { name: 'shop', labels: { [MODE]: 'ambient' } } });
    api.upsertNamespace({ metadata: { name: 'mesh-system', labels: { [MODE]: 'ambient' } } });
    await eventually(() => fake.calls.length >= 2, 'the namespace pods enrolled', 10_000);
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(fake.calls.map((c) => `${c.op} ${c.pod} ${String(c.arg)}`).sort(), [
      'add shop/plain-1 null',
      'add shop/plain-2 null',
    ]);
    const metrics = await registry.metrics();
    assert.match(metrics, /^mesh_cni_ambient_reconcile_events_total\{type="update"\} [1-9]/m);
  });

  it('the lookup answers with the namespace labels from the same watches', async () => {
    assert.deepEqual(ambient!.namespaceLabels('shop'), { [MODE]: 'ambient' });
    assert.equal(ambient!.namespaceLabels('nowhere'), undefined);
  });

  it('one pod list/watch for the node (ambient and the pod lookup share it), one namespace watch', async () => {
    const podCalls = api.requests.filter((r) => r.method === 'GET' && r.path === '/api/v1/pods');
    const watches = podCalls.filter((r) => new URLSearchParams(r.query).get('watch') === 'true');
    assert.equal(watches.length, 1, JSON.stringify(podCalls.map((r) => r.query)));
    assert.ok(podCalls.length - watches.length <= 1, 'one list at most');
    assert.equal(api.openWatches(), 1);
    assert.equal(api.openNamespaceWatches(), 1);
  });

  it('stop: the informer, then the dataplane told the cleanup decision, then the namespace watch', async () => {
    fake.calls.length = 0;
    await ambient!.stop('SIGTERM');
    assert.deepEqual(fake.calls, [{ op: 'stop', arg: false }]);
    await eventually(() => api.openNamespaceWatches() === 0, 'the namespace watch closed');
    assert.equal(existsSync(path.join(tmp.dir, 'run/pluginevent.sock')), false, 'the plugin socket removed');
    ambient = undefined;
  });
});

describe('the redirection annotator (pods/status merge patch)', () => {
  let api: TestApiServer;
  const tmp = tempDir();
  before(async () => {
    api = await startTestApiServer();
  });
  after(async () => {
    await api.close();
    tmp.remove();
  });

  it('sets and removes the annotation, keeping the others; a replaced pod (new uid) is never annotated', async () => {
    const p = api.upsertPod(nodePod('shop', 'cart', { annotations: { keep: 'me', 'sidecar.example/x': '1' } }));
    const settings = buildSettings({ orchconfig: api.writeOrchconfig(path.join(tmp.dir, 'oc')) }, {});
    const annotator = apiAnnotator(orchApi(orchClientArgs(settings)));
    const ref = { namespace: 'shop', name: 'cart', uid: p.metadata!.uid! };
    await annotator.setRedirection(ref, 'pending');
    assert.deepEqual(api.getPod('shop', 'cart')!.metadata!.annotations, {
      keep: 'me',
      'sidecar.example/x': '1',
      [REDIRECTION]: 'pending',
    });
    await annotator.setRedirection(ref, 'enabled');
    assert.equal(api.getPod('shop', 'cart')!.metadata!.annotations![REDIRECTION], 'enabled');
    await annotator.setRedirection(ref, null);
    assert.deepEqual(api.getPod('shop', 'cart')!.metadata!.annotations, { keep: 'me', 'sidecar.example/x': '1' });
    const patches = api.requests.filter((r) => r.method === 'PATCH');
    assert.ok(
      patches.every((r) => r.path === '/api/v1/namespaces/shop/pods/cart/status'),
      'pods/status only',
    );
    await assert.rejects(annotator.setRedirection({ ...ref, uid: 'another-uid' }, 'enabled'), /409|uid|UID/i);
    assert.equal(api.getPod('shop', 'cart')!.metadata!.annotations![REDIRECTION], undefined);
  });
});

describe('the namespace watch (src/orch/namespacesource.ts)', () => {
  let api: TestApiServer;
  const tmp = tempDir();
  before(async () => {
    api = await startTestApiServer({ bookmarkIntervalMs: 50 });
  });
  after(async () => {
    await api.close();
    tmp.remove();
  });

  it('lists, follows relabels and deletes, lists again after 410 Gone, and resumes a closed watch', async () => {
    api.upsertNamespace({ metadata: { name: 'a', labels: { x: '1' } } });
    const settings = buildSettings({ orchconfig: api.writeOrchconfig(path.join(tmp.dir, 'oc')) }, {});
    const seen: string[] = [];
    const source = new NamespaceSource(orchApi(orchClientArgs(settings)), {
      backoff: { baseMs: 10, maxMs: 50 },
      tuning: { reconnectSpreadMs: 100 },
    });
    source.addHandler({
      upsert: (ns, old) =>
        seen.push(`${old ? 'update' : 'add'} ${ns.metadata!.name} ${JSON.stringify(ns.metadata!.labels ?? {})}`),
      remove: (ns) => seen.push(`remove ${ns.metadata!.name}`),
    });
    source.start();
    try {
      await source.synced;
      assert.deepEqual(source.labels('a'), { x: '1' });
      await eventually(() => api.openNamespaceWatches() === 1, 'watching');
      api.upsertNamespace({ metadata: { name: 'a', labels: { x: '2' } } });
      api.upsertNamespace({ metadata: { name: 'b' } });
      await eventually(() => source.labels('b') !== undefined && source.labels('a')?.x === '2', 'the changes');
      api.deleteNamespaceFromStore('b');
      await eventually(() => source.labels('b') === undefined, 'the delete');
      // Compacted: the watch ends with 410, the source lists again and sees what changed meanwhile.
      api.expireResourceVersions();
      api.upsertNamespace({ metadata: { name: 'c', labels: { y: '1' } } });
      await eventually(() => source.labels('c') !== undefined, 'c after the relist', 10_000);
      assert.ok(source.status().lists >= 2, JSON.stringify(source.status()));
      // Cut: watched again from where it was (no list).
      const lists = source.status().lists;
      api.closeWatches();
      await eventually(() => api.openNamespaceWatches() === 1, 'watching again');
      api.upsertNamespace({ metadata: { name: 'c', labels: { y: '2' } } });
      await eventually(() => source.labels('c')?.y === '2', 'c relabelled after the cut');
      assert.equal(source.status().lists, lists, 'a closed watch resumes without a list');
      assert.deepEqual(seen.slice(0, 4), ['add a {"x":"1"}', 'update a {"x":"2"}', 'add b {}', 'remove b']);
      // The relist tells every namespace again (a as an update), and c as new.
      assert.ok(seen.includes('add c {"y":"1"}') && seen.includes('update c {"y":"2"}'), JSON.stringify(seen));
    } finally {
      await source.stop();
    }
    await eventually(() => api.openNamespaceWatches() === 0, 'the watch closed by stop');
  });
});

// After 410 Gone the namespace list came from the watch cache at resourceVersion=0,
// any age: behind a load balancer, an API server whose cache lags could hand back labels older
// than those already seen, and the informer would undo a relabel until the watch caught up
// (pods removed from the mesh and enrolled again). As the pod watch: NotOlderThan what was seen.
describe('the namespace relist after 410 Gone', () => {
  it('asks for a state not older than the last one seen', async () => {
    const api = await startTestApiServer({ bookmarkIntervalMs: 50 });
    const tmp = tempDir();
    try {
      api.upsertNamespace({ metadata: { name: 'a' } });
      const settings = buildSettings({ orchconfig: api.writeOrchconfig(path.join(tmp.dir, 'oc')) }, {});
      const source = new NamespaceSource(orchApi(orchClientArgs(settings)), {
        backoff: { baseMs: 10, maxMs: 50 },
        tuning: { startJitterMs: 0 },
      });
      source.start();
      try {
        await source.synced;
        await eventually(() => api.openNamespaceWatches() === 1, 'watching');
        const seen = source.status().resourceVersion;
        api.expireResourceVersions();
        await eventually(() => source.status().lists === 2, 'listed again', 10_000);
        const lists = api.requests.filter(
          (r) => r.path === '/api/v1/namespaces' && new URLSearchParams(r.query).get('watch') !== 'true',
        );
        const first = new URLSearchParams(lists[0]!.query);
        assert.equal(first.get('resourceVersion'), '0', 'the first list: the watch cache, any age');
        const relist = new URLSearchParams(lists[1]!.query);
        assert.equal(relist.get('resourceVersionMatch'), 'NotOlderThan', lists[1]!.query);
        assert.ok(Number(relist.get('resourceVersion')) >= Number(seen), `${lists[1]!.query} vs ${seen}`);
      } finally {
        await source.stop();
      }
    } finally {
      await api.close();
      tmp.remove();
    }
  });
});

// Every node watches all namespaces. An API server restart cuts the fleet's watches
// together; re-watching at once brought a thousand watches back in the same instant. As the pod
// watch (docs/design.md "Fleet scale"): a healthy watch cut early comes back anywhere in a 12 s spread,
// and the first read waits up to 1 s at random.
describe('the namespace watch at fleet scale', () => {
  // The namespace watch was a copy of the pod watch that lacked two of its fixes; both now come
  // from the one informer (src/orch/informer.ts).
  it('a list refused with 410 starts over from any version; a watch closed at once backs off', async () => {
    const slept: number[] = [];
    let now = 0;
    const clock = { now: () => now, sleep: async (ms: number) => void (slept.push(Math.round(ms)), (now += ms)) };
    const lists: string[] = [];
    let watches = 0;
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const fakeApi = {
      list: async (_resource: string, q: { resourceVersion?: string; resourceVersionMatch?: string }) => {
        lists.push(`${q.resourceVersion ?? ''} ${q.resourceVersionMatch ?? ''}`.trim());
        // The relist not older than the expired version is refused as expired too.
        if (lists.length === 2) throw new ApiError('listing namespaces', 410, 'Expired: too old resource version');
        return { items: [{ metadata: { name: 'shop', resourceVersion: '5' } }], resourceVersion: '5' };
      },
      watch: async (
        _resource: string,
        _q: unknown,
        onEvent: (t: 'ERROR', o: unknown) => void,
        done: (e: unknown) => void,
      ) => {
        const n = ++watches;
        setImmediate(() => {
          if (n === 1) onEvent('ERROR', { code: 410, reason: 'Expired', message: 'too old resource version' });
          else if (n <= 3)
            done(null); // closed at once, nothing delivered: a failing watch
          else void hold.then(() => done(null));
        });
        return new AbortController();
      },
    } as unknown as OrchApi;
    const source = new NamespaceSource(fakeApi, {
      clock,
      random: () => 0.5,
      backoff: { baseMs: 100, maxMs: 1000 },
      tuning: { startJitterMs: 0 },
    });
    source.start();
    try {
      await eventually(() => watches === 4, 'four watches');
      assert.deepEqual(lists, ['0', '5 NotOlderThan', '0'], 'after the refused relist: from any version');
      assert.ok(slept.length >= 4 && slept.slice(-2).every((ms) => ms > 0), `waits: ${slept.join(', ')}`);
    } finally {
      release();
      await source.stop();
    }
  });

  it('spreads its first read and a re-watch after a cut; its own timeout re-watches at once', async () => {
    const slept: number[] = [];
    let now = 0;
    const clock = {
      now: () => now,
      sleep: async (ms: number) => {
        slept.push(Math.round(ms));
        now += ms;
      },
    };
    let watches = 0;
    let stopped!: () => void;
    const hold = new Promise<void>((r) => (stopped = r));
    const fakeApi = {
      list: async () => ({
        items: [{ metadata: { name: 'shop', resourceVersion: '5' } }],
        resourceVersion: '5',
      }),
      watch: async (
        _resource: string,
        q: { timeoutSeconds: number },
        onEvent: (t: 'ADDED' | 'MODIFIED', o: unknown) => void,
        done: (e: unknown) => void,
      ) => {
        const n = ++watches;
        setImmediate(() => {
          if (n === 1) {
            // Cut early (an API server restart) after an event: a healthy watch.
            onEvent('MODIFIED', { metadata: { name: 'shop', resourceVersion: '6', labels: { a: '1' } } });
            done(null);
          } else if (n === 2) {
            // Ended by the server at the timeoutSeconds we asked for.
            now += q.timeoutSeconds * 1000;
            done(null);
          } else void hold.then(() => done(null));
        });
        return new AbortController();
      },
    } as unknown as OrchApi;
    const source = new NamespaceSource(fakeApi, { clock, random: () => 0.5 });
    source.start();
    try {
      await eventually(() => watches === 3, 'three watches');
      assert.deepEqual(slept, [500, 6000], 'start jitter, then the cut spread; none after the timeout');
    } finally {
      stopped();
      await source.stop();
    }
  });
});

// The cache of every namespace of the cluster, on every node, kept whole objects
// (managedFields, last-applied annotations): ~1.5 KB of heap a namespace against ~0.3 KB for
// what is read (name and labels), 11 MB a node at 10,000 namespaces (ad hoc, node --expose-gc).
describe('the namespace cache', () => {
  it('keeps a namespace name, uid, resourceVersion and labels, nothing else', async () => {
    const api = await startTestApiServer();
    const tmp = tempDir();
    try {
      const big = {
        metadata: {
          name: 'team-a',
          labels: { [MODE]: 'ambient' },
          annotations: { 'kubectl.kubernetes.io/last-applied-configuration': '{"kind":"Namespace"}' },
          managedFields: [{ manager: 'kubectl', operation: 'Update', fieldsType: 'FieldsV1', fieldsV1: {} }],
        },
        spec: { finalizers: ['kubernetes'] },
      };
      api.upsertNamespace(big);
      const settings = buildSettings({ orchconfig: api.writeOrchconfig(path.join(tmp.dir, 'oc')) }, {});
      const source = new NamespaceSource(orchApi(orchClientArgs(settings)), { tuning: { startJitterMs: 0 } });
      const seen: unknown[] = [];
      source.addHandler({ upsert: (ns) => seen.push(ns), remove: () => {} });
      source.start();
      try {
        await source.synced;
        api.upsertNamespace({ ...big, metadata: { ...big.metadata, labels: { [MODE]: 'none' } } });
        await eventually(() => seen.length === 2, 'the relabel');
        for (const ns of seen as { metadata: Record<string, unknown> }[]) {
          assert.deepEqual(Object.keys(ns).sort(), ['metadata'], JSON.stringify(ns));
          assert.deepEqual(Object.keys(ns.metadata).sort(), ['labels', 'name', 'resourceVersion', 'uid']);
        }
        assert.deepEqual(source.labels('team-a'), { [MODE]: 'none' });
      } finally {
        await source.stop();
      }
    } finally {
      await api.close();
      tmp.remove();
    }
  });
});

// Istio decides once (ShouldStopCleanup) for the installer and the dataplane: two questions could
// get two answers (the API server unreachable for one), one part keeping the node for an upgrade
// while the other uninstalls.
describe('the agent with ambient mode on, stopping', () => {
  it('asks once whether this is an upgrade, and tells the installer and ambient mode the same', async () => {
    const api = await startTestApiServer();
    const tree = await makeHostTree({ token: api.token, ca: api.caPem });
    try {
      await writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      api.upsertNamespace({ metadata: { name: 'mesh-system' } });
      api.upsertDaemonSet({ metadata: { name: 'mesh-cni-node', namespace: 'mesh-system' } });
      const owner = { apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'mesh-cni-node', uid: 'u1', controller: true };
      api.upsertPod({
        metadata: { name: 'mesh-cni-node-abcde', namespace: 'mesh-system', ownerReferences: [owner] },
        spec: { nodeName: 'node-1', containers: [{ name: 'install-cni' }] },
      });
      const agent = spawnAgent(
        tree,
        { 'cleanup-on-exit': 'auto', 'ambient-enabled': 'true' },
        {
          KUBERNETES_SERVICE_HOST: api.host,
          KUBERNETES_SERVICE_PORT: String(api.port),
          NODE_NAME: 'node-1',
          POD_NAME: 'mesh-cni-node-abcde',
          POD_NAMESPACE: 'mesh-system',
          // No working iptables or ipset to find: the real dataplane cannot start, so it touches
          // nothing here.
          PATH: noFirewallPath(),
        },
      );
      try {
        await agent.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'installed', 20_000);
        assert.equal(await agent.stop('SIGTERM'), 0);
      } finally {
        await agent.stop('SIGKILL').catch(() => {});
      }
      const asks = api.requests.filter(
        (r) => r.path === '/apis/apps/v1/namespaces/mesh-system/daemonsets/mesh-cni-node',
      );
      assert.equal(asks.length, 1, 'one question for both');
      const kept = agent.logs.find((r) => r.msg === 'ambient: keeping the node as is');
      assert.match(String(kept?.why), /DaemonSet mesh-system\/mesh-cni-node still exists/);
      assert.ok(agent.logs.some((r) => r.msg === 'leaving mesh-cni installed'));
    } finally {
      await tree.remove();
      await api.close();
    }
  });
});

describe('a dataplane that cannot start', () => {
  it('is retried with backoff; /readyz names the failure until it starts', async () => {
    const api = await startTestApiServer();
    const tmp = tempDir();
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'oc'));
    const settings = buildSettings(
      {
        orchconfig,
        'ambient-enabled': 'true',
        'pluginevent-uds-address': path.join(tmp.dir, 'run/pluginevent.sock'),
      },
      { NODE_NAME: 'node-1' },
    );
    const orch = orchApi(orchClientArgs(settings));
    const pods = nodePodSource(orch, 'node-1', 'install');
    pods.start();
    let attempts = 0;
    let release!: () => void;
    const third = new Promise<void>((r) => (release = r));
    const fake = fakeDataplane();
    fake.release();
    const dataplane: MeshDataplane = {
      ...fake.dp,
      async start(list) {
        attempts++;
        if (attempts < 3) throw new Error(`ztunnel socket dir /var/run/ztunnel is missing (attempt ${attempts})`);
        await third;
        return fake.dp.start(list);
      },
    };
    // The backoff's waits, shortened (the sleeps still happen, and stop still cuts them).
    const clock = { now: () => performance.now(), sleep: (_ms: number, s?: AbortSignal) => realClock.sleep(5, s) };
    const amb = startAmbient(ambientArgs(settings), {
      pods,
      api: orch,
      dataplane,
      clock,
      decideCleanup: async () => ({ cleanup: true, why: 'test' }),
    });
    try {
      await eventually(() => attempts === 3, 'three attempts', 10_000);
      assert.ok(
        amb.notReadyReasons().some((r) => /start failed 2 time\(s\): ztunnel socket dir .* \(attempt 2\)/.test(r)),
        JSON.stringify(amb.notReadyReasons()),
      );
      release();
      await amb.started;
      assert.deepEqual(amb.notReadyReasons(), []);
      await amb.stop('SIGTERM');
      assert.deepEqual(fake.calls, [{ op: 'stop', arg: true }], 'an uninstall told to the dataplane');
    } finally {
      await amb.stop('SIGTERM').catch(() => {});
      await pods.stop();
      await api.close();
      tmp.remove();
    }
  });
});

// With namespaces `watch` missing from the role (list
// kept), the agent answered /readyz 200 while every namespace watch got 403: the namespace labels
// it decides with froze at the list, so a namespace labelled ambient later never had its pods
// enrolled, and nothing said so.
describe('a namespace watch that keeps failing', () => {
  it('makes ambient mode not ready, naming the error and what to grant, until it watches again', async () => {
    const noWatch = [
      { verbs: ['*'], apiGroups: ['*'], resources: ['pods', 'pods/status', 'events'] },
      { verbs: ['list'], apiGroups: [''], resources: ['namespaces'] },
    ];
    const api = await startTestApiServer({ rules: noWatch });
    const tmp = tempDir();
    const settings = buildSettings(
      {
        orchconfig: api.writeOrchconfig(path.join(tmp.dir, 'oc')),
        'ambient-enabled': 'true',
        'pluginevent-uds-address': path.join(tmp.dir, 'run/pluginevent.sock'),
      },
      { NODE_NAME: 'node-1' },
    );
    api.upsertNamespace({ metadata: { name: 'shop', labels: {} } });
    const orch = orchApi(orchClientArgs(settings));
    const pods = nodePodSource(orch, 'node-1', 'install');
    pods.start();
    const namespaces = new NamespaceSource(orch, { backoff: { baseMs: 10, maxMs: 50 }, notReadyAfterMs: 0 });
    const fake = fakeDataplane();
    fake.release();
    const amb = startAmbient(ambientArgs(settings), {
      pods,
      api: orch,
      dataplane: fake.dp,
      namespaces,
      decideCleanup: async () => ({ cleanup: false, why: 'test' }),
    });
    try {
      await amb.started;
      await eventually(() => /403|forbidden/i.test(namespaces.status().lastError), 'the watch refused', 10_000);
      const why = amb.notReadyReasons();
      assert.ok(
        why.some((r) => /namespace watch/.test(r) && /forbidden/i.test(r) && /namespaces list and watch/.test(r)),
        JSON.stringify(why),
      );
      api.setRules(api.token, ALLOW_ALL);
      await eventually(() => amb.notReadyReasons().length === 0, 'ready once it watches', 10_000);
      assert.equal(api.openNamespaceWatches(), 1);
    } finally {
      await amb.stop('SIGTERM').catch(() => {});
      await pods.stop();
      await api.close();
      tmp.remove();
    }
  });
});

// The agent's /cmdadd server (src/ambient/cmdadd.ts): the response codes of docs/plugin.md
// "Ambient mode: the plugin's ADD" with a stand-in dataplane and this node's pod watch fed by the
// test API server; the socket's mode; bounded requests. Then the real plugin against it: an
// enrolled pod starts, a ztunnel failure fails the ADD with code 11 naming ztunnel.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startCmdAddServer, type CmdAddDeps, type CmdAddServer, type EnrollPod } from '../../src/ambient/cmdadd.ts';
import { EnrollError } from '../../src/ambient/dataplane.ts';
import { ambientPodOf } from '../../src/ambient/enablement.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { orchApi } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { nodePodQuery, PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { DEFAULT_ENABLEMENT_SELECTORS, isAmbientPod } from '../../cni-plugin/shared/enablement.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, meshCni, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const NODE = 'node-1';

function ambientPod(name: string, labels: Record<string, string> = { 'mesh.io/dataplane-mode': 'ambient' }): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace: 'shop', name, labels },
    spec: { nodeName: NODE, serviceAccountName: 'cart', containers: [{ name: 'app', image: 'app:1' }] },
  };
}

/** The dataplane's part: records each add, fails as told. */
class FakeDataplane {
  readonly adds: { pod: EnrollPod; netns: string | null }[] = [];
  fail: Error | null = null;
  addPodToMesh(pod: EnrollPod, netns: string | null): Promise<void> {
    this.adds.push({ pod, netns });
    return this.fail ? Promise.reject(this.fail) : Promise.resolve();
  }
}

interface Answer {
  readonly status: number;
  readonly body: string;
  readonly json: { ok: boolean; reason?: string; message?: string } | null;
}

function post(socketPath: string, body: string | Buffer, o: { method?: string; path?: string } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        socketPath,
        path: o.path ?? '/cmdadd',
        method: o.method ?? 'POST',
        headers: { 'content-type': 'application/json' },
      },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => {
          let json = null;
          try {
            json = JSON.parse(text) as Answer['json'];
          } catch {
            /* not JSON */
          }
          resolve({ status: res.statusCode ?? 0, body: text, json });
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function requestsByCode(): Promise<Record<string, number>> {
  const m = await registry.getSingleMetric('mesh_cni_plugin_requests_total')!.get();
  return Object.fromEntries(m.values.map((v) => [String(v.labels.response_code), v.value]));
}

describe('the /cmdadd server (stand-in dataplane, the node pod watch on the test API server)', () => {
  let api: TestApiServer;
  let pods: PodSource;
  let server: CmdAddServer;
  const dataplane = new FakeDataplane();
  const tmp = tempDir();
  let sock: string;

  const deps = (over: Partial<CmdAddDeps> = {}): CmdAddDeps => ({
    pods,
    dataplane,
    // No namespace labels here: the pods are ambient by their own label.
    isAmbient: (pod) => isAmbientPod(pod, {}, DEFAULT_ENABLEMENT_SELECTORS),
    toEnrollPod: ambientPodOf,
    ...over,
  });
  const request = (pod: V1Pod, over: object = {}) =>
    JSON.stringify({
      netns: '/var/run/netns/cni-1234',
      podName: pod.metadata!.name,
      podNamespace: pod.metadata!.namespace,
      podUid: pod.metadata!.uid,
      ips: [{ interface: 1, address: '198.18.158.7/24', gateway: '198.18.158.1' }],
      ...over,
    });
  const cached = async (pod: V1Pod) => {
    const p = api.upsertPod(pod);
    await waitFor(
      `${p.metadata!.name} in the watch`,
      () => pods.get('shop', p.metadata!.name!)?.metadata?.uid === p.metadata!.uid,
    );
    return p;
  };

  before(async () => {
    api = await startTestApiServer();
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig'));
    pods = new PodSource(orchApi(orchClientArgs(buildSettings({ orchconfig }, {}))), null, {
      ...WATCH_DEFAULTS,
      query: nodePodQuery(NODE),
      backoff: { baseMs: 20, maxMs: 100 },
      clock: realClock,
      logScope: 'install',
      tuning: { listMode: 'cache', startJitterMs: 0, reconnectSpreadMs: 0 },
    });
    pods.start();
    await pods.synced;
    sock = path.join(tmp.dir, 'run', 'pluginevent.sock');
    server = await startCmdAddServer(sock, deps());
  });
  after(async () => {
    await server?.close();
    await pods?.stop();
    await api?.close();
    tmp.remove();
  });

  it('listens on a 0600 socket in a 0750 dir, and removes it when closed', async () => {
    assert.equal(statSync(sock).mode & 0o777, 0o600);
    assert.equal(statSync(path.dirname(sock)).mode & 0o777, 0o750);
    const other = path.join(tmp.dir, 'run2', 'pluginevent.sock');
    const s = await startCmdAddServer(other, deps());
    await s.close();
    assert.throws(() => statSync(other), /ENOENT/);
  });

  it("200: an ambient pod of the watch is enrolled with the ADD's IPs (prefix dropped) and netns path", async () => {
    const pod = await cached(ambientPod('cart-1'));
    const before = await requestsByCode();
    const from = dataplane.adds.length;
    const r = await post(sock, request(pod));
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(r.json, { ok: true });
    const [add] = dataplane.adds.slice(from);
    assert.equal(add!.netns, '/var/run/netns/cni-1234');
    assert.deepEqual(add!.pod.ips, ['198.18.158.7']);
    assert.equal(add!.pod.uid, pod.metadata!.uid);
    assert.equal(add!.pod.serviceAccount, 'cart');
    assert.equal(add!.pod.mirrorUid, undefined);
    assert.equal((await requestsByCode())['200'], (before['200'] ?? 0) + 1);
  });

  it('500 not found: a pod the watch does not hold, after 10 reads 10 ms apart; a stale namesake (another uid) too', async () => {
    const before = await requestsByCode();
    const from = dataplane.adds.length;
    const missing = await post(sock, request({ metadata: { namespace: 'shop', name: 'nowhere', uid: 'u-0' } }));
    assert.equal(missing.status, 500);
    assert.equal(missing.json?.reason, 'not_found');
    assert.match(missing.json?.message ?? '', /pod shop\/nowhere .*not found in the node agent's cache/);
    const pod = await cached(ambientPod('renamed'));
    const stale = await post(sock, request(pod, { podUid: 'another-uid' }));
    assert.equal(stale.status, 500);
    assert.equal(stale.json?.reason, 'not_found');
    assert.equal(dataplane.adds.length, from, 'nothing enrolled');
    assert.equal((await requestsByCode())['500'], (before['500'] ?? 0) + 2);
  });

  it('a pod the watch delivers late (a stale cache) is read again and enrolled', async () => {
    const pod = ambientPod('late');
    const stored = api.upsertPod(pod);
    let reads = 0;
    const lagging = {
      get: (ns: string, name: string) =>
        ++reads <= 4 ? undefined : { ...stored, metadata: { ...stored.metadata!, namespace: ns, name } },
    };
    const s = await startCmdAddServer(path.join(tmp.dir, 'lag', 'pluginevent.sock'), deps({ pods: lagging }));
    try {
      const r = await post(s.address, request(stored));
      assert.equal(r.status, 200, r.body);
      assert.equal(reads, 5);
    } finally {
      await s.close();
    }
  });

  it('a static pod: the ADD names the kubelet UID, the watch holds its mirror: enrolled with mirrorUid', async () => {
    const pod = await cached({
      ...ambientPod('static-web'),
      metadata: {
        ...ambientPod('static-web').metadata,
        annotations: { 'kubernetes.io/config.mirror': 'kubelet-hash-1' },
      },
    });
    const from = dataplane.adds.length;
    const r = await post(sock, request(pod, { podUid: 'kubelet-hash-1' }));
    assert.equal(r.status, 200, r.body);
    assert.equal(dataplane.adds[from]!.pod.mirrorUid, 'kubelet-hash-1');
  });

  it("500 not eligible: the pod is not ambient by the agent's decision (unlabelled, or a sidecar)", async () => {
    const from = dataplane.adds.length;
    const plain = await cached(ambientPod('plain', {}));
    const r = await post(sock, request(plain));
    assert.equal(r.status, 500);
    assert.equal(r.json?.reason, 'not_eligible');
    assert.match(r.json?.message ?? '', /pod shop\/plain is unexpectedly not eligible/);
    const sidecar = await cached({
      ...ambientPod('sidecar'),
      metadata: { ...ambientPod('sidecar').metadata, annotations: { 'sidecar.mesh.io/status': '{}' } },
      spec: { ...ambientPod('sidecar').spec!, containers: [{ name: 'app' }, { name: 'mesh-proxy' }] },
    });
    assert.equal((await post(sock, request(sidecar))).json?.reason, 'not_eligible');
    assert.equal(dataplane.adds.length, from);
  });

  it('500 naming ztunnel when ztunnel did not take the pod; naming the rules when they failed', async () => {
    const pod = await cached(ambientPod('zt'));
    try {
      dataplane.fail = new EnrollError('ztunnel', 'no ztunnel connection');
      const z = await post(sock, request(pod));
      assert.equal(z.status, 500);
      assert.equal(z.json?.reason, 'ztunnel');
      assert.match(z.json?.message ?? '', /cannot enroll pod shop\/zt in ambient mode: no ztunnel connection/);
      dataplane.fail = new EnrollError('ztunnel', 'the node proxy sent a nack');
      assert.match((await post(sock, request(pod))).json?.message ?? '', /ztunnel: the node proxy sent a nack/);
      dataplane.fail = new EnrollError('rules', 'in-pod rules: iptables-restore exited 4');
      const rules = await post(sock, request(pod));
      assert.equal(rules.json?.reason, 'rules');
      assert.match(rules.json?.message ?? '', /iptables-restore exited 4/);
      dataplane.fail = new Error('something else');
      const other = await post(sock, request(pod));
      assert.equal(other.status, 500);
      assert.equal(other.json?.reason, 'internal');
    } finally {
      dataplane.fail = null;
    }
  });

  it('bad requests: 400 for a body that is not the request, 405 for GET, 404 for another path', async () => {
    const before = await requestsByCode();
    assert.equal((await post(sock, 'not json')).status, 400);
    assert.equal((await post(sock, JSON.stringify({ podName: 'x' }))).status, 400);
    assert.equal((await post(sock, '', { method: 'GET' })).status, 405);
    assert.equal((await post(sock, '{}', { path: '/cmddel' })).status, 404);
    const after = await requestsByCode();
    assert.equal(after['400'], (before['400'] ?? 0) + 2);
    assert.equal(after['405'], (before['405'] ?? 0) + 1);
  });

  it('a body over 64 KiB is refused (413) whether it says its length or is chunked, and the server still answers', async () => {
    const big = JSON.stringify({ pad: 'x'.repeat(70 * 1024) });
    assert.equal((await post(sock, big)).status, 413);
    // Chunked, no Content-Length: refused once the limit is crossed.
    const chunked = await new Promise<number>((resolve, reject) => {
      const req = http.request({ socketPath: sock, path: '/cmdadd', method: 'POST' }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      for (let i = 0; i < 20; i++) req.write('y'.repeat(8 * 1024));
      req.end();
    });
    assert.equal(chunked, 413);
    const pod = await cached(ambientPod('after-big'));
    assert.equal((await post(sock, request(pod))).status, 200);
  });

  it("a node's worth of pods starting at once (kubelet's 110, each enrollment in flight): every ADD answered 200", async () => {
    // After a node reboot the runtime starts every pod of the node together; each POST holds its
    // connection while its pod is enrolled (rules, ztunnel's ack). With the cap below that, the
    // oldest in-flight ADDs were cut: code 11 and the kubelet's backoff for pods that were fine.
    const N = 110;
    let release!: () => void;
    const allIn = new Promise<void>((r) => (release = r));
    let inFlight = 0;
    const slow = {
      addPodToMesh: async () => {
        if (++inFlight === N) release();
        await Promise.race([allIn, new Promise((r) => setTimeout(r, 3000))]);
      },
    };
    const any = {
      get: (ns: string, name: string) => ({
        ...ambientPod(name),
        metadata: { namespace: ns, name, uid: `u-${name}`, labels: { 'mesh.io/dataplane-mode': 'ambient' } },
      }),
    };
    const s = await startCmdAddServer(
      path.join(tmp.dir, 'burst', 'pluginevent.sock'),
      deps({ pods: any, dataplane: slow }),
    );
    try {
      const one = (i: number) =>
        new Promise<number>((resolve) => {
          const req = http.request({ socketPath: s.address, path: '/cmdadd', method: 'POST', agent: false }, (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          });
          req.on('error', () => resolve(0));
          req.end(
            JSON.stringify({
              netns: '/var/run/netns/x',
              podName: `p${i}`,
              podNamespace: 'shop',
              podUid: `u-p${i}`,
              ips: [],
            }),
          );
        });
      const codes = await Promise.all(Array.from({ length: N }, (_, i) => one(i)));
      assert.deepEqual(
        codes.filter((c) => c !== 200).length,
        0,
        `answers other than 200: ${JSON.stringify(codes.filter((c) => c !== 200))}`,
      );
    } finally {
      await s.close();
    }
  });

  it('connections over the cap close the oldest, not the server', async () => {
    const s = await startCmdAddServer(path.join(tmp.dir, 'cap', 'pluginevent.sock'), deps(), { maxConnections: 4 });
    const held: net.Socket[] = [];
    try {
      for (let i = 0; i < 10; i++) held.push(net.createConnection(s.address).on('error', () => {}));
      await waitFor('the oldest closed', () => held.filter((c) => c.destroyed || c.readableEnded).length >= 1);
      const pod = await cached(ambientPod('under-cap'));
      for (const c of held) c.destroy();
      assert.equal((await post(s.address, request(pod))).status, 200);
    } finally {
      for (const c of held) c.destroy();
      await s.close();
    }
  });
});

describe('the real plugin against the /cmdadd server', () => {
  let api: TestApiServer;
  let pods: PodSource;
  let server: CmdAddServer;
  let network: BridgeNetwork;
  const dataplane = new FakeDataplane();
  const tmp = tempDir();
  const sandboxes: Netns[] = [];
  let orchconfig: string;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig'));
    api.upsertNamespace({ metadata: { name: 'shop' } });
    pods = new PodSource(orchApi(orchClientArgs(buildSettings({ orchconfig }, {}))), null, {
      ...WATCH_DEFAULTS,
      query: nodePodQuery(NODE),
      backoff: { baseMs: 20, maxMs: 100 },
      clock: realClock,
      logScope: 'install',
      tuning: { listMode: 'cache', startJitterMs: 0, reconnectSpreadMs: 0 },
    });
    pods.start();
    await pods.synced;
    server = await startCmdAddServer(path.join(tmp.dir, 'run', 'pluginevent.sock'), {
      pods,
      dataplane,
      isAmbient: (pod) => isAmbientPod(pod, {}, DEFAULT_ENABLEMENT_SELECTORS),
      toEnrollPod: ambientPodOf,
    });
    network = new BridgeNetwork('198.18.158.0/24');
  });
  after(async () => {
    for (const s of sandboxes) s.remove();
    network?.cleanup();
    await server?.close();
    await pods?.stop();
    await api?.close();
    tmp.remove();
  });

  async function add(name: string): Promise<{ code: number | null; stdout: string; ns: Netns; prev: object }> {
    const pod = api.upsertPod(ambientPod(name));
    await waitFor(`${name} in the watch`, () => pods.get('shop', name) !== undefined);
    const ns = new Netns('ambsrv');
    sandboxes.push(ns);
    const chain: ChainEnv = {
      containerId: `c${process.pid}${name}`,
      netns: ns.path,
      ifname: 'eth0',
      args: k8sArgs(pod, 'x'),
    };
    const prev = await network.addPod(chain);
    const conf = pluginConfig(
      { cniVersion: '1.0.0', orchconfig, extra: { ambient_enabled: true, pluginevent_uds_address: server.address } },
      prev,
    );
    const r = await meshCni('ADD', chain, conf);
    return { code: r.code, stdout: r.stdout, ns, prev };
  }

  it('an ambient pod: enrolled by the server with its netns and prevResult IP, ADD succeeds', async () => {
    const from = dataplane.adds.length;
    const r = await add('real-1');
    assert.equal(r.code, 0, r.stdout);
    assert.deepEqual(JSON.parse(r.stdout), r.prev);
    const [enrolled] = dataplane.adds.slice(from);
    assert.equal(enrolled!.netns, r.ns.path);
    assert.match(enrolled!.pod.ips[0]!, /^198\.18\.158\.\d+$/);
  });

  it('ztunnel down: the ADD fails with code 11 naming ztunnel', async () => {
    dataplane.fail = new EnrollError('ztunnel', 'no ztunnel connection');
    try {
      const r = await add('real-2');
      assert.notEqual(r.code, 0);
      const e = JSON.parse(r.stdout) as { code: number; msg: string; details: string };
      assert.equal(e.code, 11);
      assert.match(e.msg, /^ztunnel did not take ambient pod shop\/real-2/);
      assert.match(e.details, /no ztunnel connection/);
    } finally {
      dataplane.fail = null;
    }
  });
});

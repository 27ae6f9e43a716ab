// The agent answering the plugin's pod lookups from its watch of the node's pods, asked with the
// plugin's own client; and mesh-cni ADD taking its pod from there (no API round trip) or from
// the API server when the agent cannot answer.

import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { podFromAgent } from '../../cni-plugin/orch/agentlookup.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { spawnAgent } from '../helpers/agent.ts';
import { makeHostTree } from '../helpers/hosttree.ts';
import { eventually, waitFor } from '../helpers/poll.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { noFirewallPath } from '../helpers/nofirewall.ts';
import { podLookupArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const onNode = (ns: string, name: string, node: string, annotations: Record<string, string> = {}) => {
  const pod = meshPod(ns, name, annotations);
  return { ...pod, spec: { ...pod.spec!, nodeName: node } };
};

describe('pod lookups served by the agent', () => {
  const tmp = tempDir();
  const socket = () => path.join(tmp.dir, 'run/pods.sock');
  let api: TestApiServer;
  let lookup: Component;
  const ask = (namespace: string, name: string, uid = api.getPod(namespace, name)?.metadata?.uid ?? 'no-such-uid') =>
    podFromAgent(socket(), { namespace, name, uid }, 2000);
  /** One request line as is; the agent's whole reply. */
  const rawAsk = async (line: string): Promise<string> => {
    const net = await import('node:net');
    return new Promise<string>((resolve) => {
      const s = net.createConnection(socket(), () => s.write(line));
      let d = '';
      s.on('data', (c) => (d += c.toString()));
      s.on('close', () => resolve(d));
    });
  };

  before(async () => {
    api = await startTestApiServer();
    api.upsertPod(onNode('shop', 'cart-1', 'node-1'));
    api.upsertPod(onNode('shop', 'elsewhere', 'node-2'));
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig'));
    const settings = buildSettings({ 'pod-lookup-uds-address': socket(), orchconfig }, { NODE_NAME: 'node-1' });
    lookup = await startPodLookup(podLookupArgs(settings), { waitMs: 300, maxConnections: 16 });
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the pod watch');
  });
  after(async () => {
    await lookup?.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  it('listens on a 0600 socket', () => {
    assert.equal(statSync(socket()).mode & 0o777, 0o600);
  });

  it('answers a pod of its node from the watch', async () => {
    const r = await ask('shop', 'cart-1');
    assert.ok('pod' in r, JSON.stringify(r));
    assert.equal(r.pod.metadata?.name, 'cart-1');
    assert.equal(r.pod.metadata?.annotations?.['sidecar.mesh.io/status'] !== undefined, true);
  });

  it("does not answer a lookup without the runtime's pod uid: it cannot tell which pod of that name is meant", async () => {
    // Sent as is: the plugin's own client no longer asks without a uid.
    for (const line of ['{"namespace":"shop","name":"cart-1","uid":""}\n', '{"namespace":"shop","name":"cart-1"}\n']) {
      assert.match(await rawAsk(line), /"miss":"no pod uid in the request/, line);
    }
    const r = await ask('shop', 'cart-1', '');
    assert.ok('miss' in r && /no K8S_POD_UID/.test(r.miss), JSON.stringify(r));
  });

  it('misses a pod of another node, and a pod under another uid', async () => {
    const other = await ask('shop', 'elsewhere');
    assert.ok('miss' in other);
    assert.match(other.miss, /not in this node's pod watch/);
    const uid = await ask('shop', 'cart-1', 'some-other-uid');
    assert.ok('miss' in uid);
  });

  it('waits for a pod the watch has not delivered yet', async () => {
    const pod = onNode('shop', 'just-scheduled', 'node-1');
    pod.metadata!.uid = 'uid-just-scheduled';
    const asked = ask('shop', 'just-scheduled', 'uid-just-scheduled');
    setTimeout(() => api.upsertPod(pod), 50);
    const r = await asked;
    assert.ok('pod' in r, JSON.stringify(r));
  });

  it('answers nonsense with a miss and keeps serving', async () => {
    assert.match(await rawAsk('{"not":"a request"}\n'), /"miss":"bad request/);
    assert.ok('pod' in (await ask('shop', 'cart-1')));
  });

  it('answers nothing while its watch is down (the cache may be stale), and at once', async () => {
    const uid = api.getPod('shop', 'cart-1')!.metadata!.uid!;
    await api.stop();
    try {
      api.closeWatches();
      await eventually(() => (lookup.status() as { state: string }).state !== 'watching', 'the watch to notice');
      const t0 = Date.now();
      const r = await ask('shop', 'cart-1', uid);
      assert.ok('miss' in r, 'a cached pod is no answer while the watch is down');
      assert.match(r.miss, /watch is not current/);
      assert.ok('miss' in (await ask('shop', 'unknown-pod')));
      assert.ok(Date.now() - t0 < 250, 'no wait on a watch that is down');
    } finally {
      await api.start();
    }
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the watch back', 20_000);
  });

  it('counts hits and misses', async () => {
    const text = await registry.metrics();
    assert.match(text, /mesh_cni_pod_lookups_total\{result="hit"\} [1-9]/);
    assert.match(text, /mesh_cni_pod_lookups_total\{result="miss"\} [1-9]/);
    assert.match(text, /mesh_cni_pod_lookups_total\{result="bad_request"\} [1-9]/);
  });

  it('keeps the agent running, without the speed-up, when its socket cannot be made', async () => {
    const { writeFileSync } = await import('node:fs');
    const notASocket = path.join(tmp.dir, 'run/regular-file');
    writeFileSync(notASocket, 'not a socket');
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig-2'));
    const c = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': notASocket, orchconfig }, { NODE_NAME: 'node-1' })),
    );
    assert.match(String((c.status() as { error: string }).error), /it exists and is not a socket/);
  });

  it('is off without a node name (no cluster-wide watch from every node)', async () => {
    const c = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': path.join(tmp.dir, 'x.sock') }, {})),
    );
    assert.deepEqual(c.status(), { enabled: false });
  });
});

describe('mesh-cni ADD with the agent answering the pod lookup', () => {
  const tmp = tempDir();
  const socket = () => path.join(tmp.dir, 'run/pods.sock');
  let api: TestApiServer;
  let lookup: Component;
  let network: BridgeNetwork;
  const namespaces: Netns[] = [];
  let orchconfig: string;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    lookup = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': socket(), orchconfig }, { NODE_NAME: 'node-1' })),
    );
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the pod watch');
    network = new BridgeNetwork('198.18.96.0/24');
  });
  after(async () => {
    for (const n of namespaces) n.remove();
    network?.cleanup();
    await lookup?.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  async function addPod(
    name: string,
    lookupSocket: string,
    proxySecurityContext?: { runAsUser: number; runAsGroup: number },
  ) {
    const base = onNode('shop', name, 'node-1');
    const pod = api.upsertPod(
      proxySecurityContext
        ? {
            ...base,
            spec: {
              ...base.spec!,
              containers: [
                { name: 'app', image: 'app:1' },
                { name: 'mesh-proxy', image: 'proxy:1', securityContext: proxySecurityContext },
              ],
            },
          }
        : base,
    );
    const ns = new Netns('pod');
    namespaces.push(ns);
    const chain: ChainEnv = {
      containerId: `ctr${process.pid}${name}`,
      netns: ns.path,
      ifname: 'eth0',
      args: k8sArgs(pod, `ctr${process.pid}${name}`),
    };
    const prev = await network.addPod(chain);
    const gets = () =>
      api.requests.filter((r) => r.method === 'GET' && r.path === `/api/v1/namespaces/shop/pods/${name}`).length;
    const add = await meshCni(
      'ADD',
      chain,
      pluginConfig({ cniVersion: '1.0.0', orchconfig, extra: { pod_lookup_uds_address: lookupSocket } }, prev),
    );
    return { add, ns, gets: gets() };
  }

  it('takes the pod from the agent: rules applied, no GET of the pod', async () => {
    const { add, ns, gets } = await addPod('via-agent', socket());
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(ns.exec(['iptables-nft-save', '-t', 'nat']), /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/);
    assert.equal(gets, 0);
  });

  it("answers the whole pod: the mesh-proxy securityContext (the proxy's uid/gid) reaches the rules", async () => {
    const { add, ns, gets } = await addPod('via-agent-uid', socket(), {
      runAsUser: 1000670000,
      runAsGroup: 1000670001,
    });
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(
      ns.exec(['iptables-nft-save', '-t', 'nat']),
      /--uid-owner 1000670000 -j RETURN[\s\S]*--gid-owner 1000670001 -j RETURN/,
    );
    assert.equal(gets, 0);
  });

  it('asks the API server when the agent is not there', async () => {
    const { add, ns, gets } = await addPod('via-api', path.join(tmp.dir, 'run/no-agent.sock'));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(ns.exec(['iptables-nft-save', '-t', 'nat']), /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/);
    assert.equal(gets, 1);
  });
});

// The agent builds the node's pod watch once and hands it to every reader (src/agent.ts): a node
// runs one list/watch of its pods whichever of pod lookup and repair are on, and a second only
// when repair asks for other pods (its own selectors).
describe('one watch of the node pods per agent', () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c().catch(() => {});
  });

  async function agentWith(flags: Record<string, string>, env: Record<string, string> = {}) {
    const api = await startTestApiServer();
    cleanups.push(() => api.close());
    api.upsertPod(onNode('shop', 'cart-1', 'node-1'));
    api.upsertNamespace({ metadata: { name: 'shop' } });
    const tree = await makeHostTree({ token: api.token, ca: api.caPem });
    cleanups.push(() => tree.remove());
    const agent = spawnAgent(tree, flags, {
      KUBERNETES_SERVICE_HOST: api.host,
      KUBERNETES_SERVICE_PORT: String(api.port),
      NODE_NAME: 'node-1',
      ...env,
    });
    cleanups.push(() => agent.stop('SIGKILL'));
    const started = await agent.waitForLog((r) => r.msg === 'install-cni started', 'the agent started', 20_000);
    return { api, socket: tree.flags['pod-lookup-uds-address']!, agent, components: started.components as string[] };
  }

  /** The list and watch requests for pods, by the selectors they asked for. */
  function podRequests(api: TestApiServer): Map<string, { lists: number; watches: number }> {
    const by = new Map<string, { lists: number; watches: number }>();
    for (const q of api.requests.filter((r) => r.method === 'GET' && r.path === '/api/v1/pods')) {
      const p = new URLSearchParams(q.query);
      const key = `fields=${p.get('fieldSelector') ?? ''} labels=${p.get('labelSelector') ?? ''}`;
      const n = by.get(key) ?? { lists: 0, watches: 0 };
      if (p.get('watch') === 'true') n.watches++;
      else n.lists++;
      by.set(key, n);
    }
    return by;
  }

  /** Waits for `n` open watches, then checks that each watch of pods made one list and one watch request at most. */
  async function expectWatches(api: TestApiServer, n: number): Promise<string[]> {
    await eventually(() => api.openWatches() >= n, `${n} pod watch(es)`, 15_000);
    // Long enough for a second reader's watch to show up, if there were one.
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(api.openWatches(), n, 'open watches');
    const by = podRequests(api);
    assert.equal(by.size, n, `pod list/watch requests by selectors: ${JSON.stringify([...by])}`);
    for (const [sel, c] of by) {
      assert.ok(
        c.watches === 1 && c.lists <= 1,
        `${sel}: one list (or a watch-list) and one watch, not one per reader: ${JSON.stringify(c)}`,
      );
    }
    return [...by.keys()];
  }

  /** shop/cart-1 from the agent, asked until it is a hit (the lookup may be served before the watch has listed). */
  async function cartFromAgent(api: TestApiServer, socket: string) {
    let last: Awaited<ReturnType<typeof podFromAgent>> | undefined;
    const ref = { namespace: 'shop', name: 'cart-1', uid: api.getPod('shop', 'cart-1')!.metadata!.uid! };
    await waitFor(
      'a pod lookup hit (the watch listed)',
      async () => 'pod' in (last = await podFromAgent(socket, ref, 5000)),
      { timeoutMs: 15_000, context: () => JSON.stringify(last) },
    );
    return last!;
  }

  const node = 'fields=spec.nodeName=node-1 labels=';
  // The real dataplane programs the node (MESH_POSTRT, ipsets): here it finds no working iptables
  // or ipset, so its start fails and is retried, touching nothing; the watches are up before.
  const AMBIENT_ENV = { PATH: noFirewallPath() };
  const table: {
    name: string;
    flags: Record<string, string>;
    lookup: boolean;
    watches: string[];
    components: string[];
    /** Ambient mode on: its namespace watch is up too (its dataplane cannot start: see AMBIENT_ENV). */
    ambient?: boolean;
  }[] = [
    {
      name: 'pod lookup and repair read the one node watch',
      flags: { 'repair-enabled': 'true', 'repair-label-pods': 'true' },
      lookup: true,
      watches: [node],
      components: ['node-pod-watch', 'repair', 'pod-lookup'],
    },
    {
      name: 'ambient mode, pod lookup and repair read the one node watch',
      flags: { 'ambient-enabled': 'true', 'repair-enabled': 'true', 'repair-label-pods': 'true' },
      lookup: true,
      watches: [node],
      components: ['node-pod-watch', 'repair', 'ambient', 'pod-lookup'],
      ambient: true,
    },
    {
      name: 'ambient mode alone builds the node watch (lookup and repair off)',
      flags: { 'ambient-enabled': 'true', 'pod-lookup-uds-address': '' },
      lookup: false,
      watches: [node],
      components: ['node-pod-watch', 'ambient'],
      ambient: true,
    },
    {
      name: 'pod lookup alone',
      flags: {},
      lookup: true,
      watches: [node],
      components: ['node-pod-watch', 'repair', 'pod-lookup'],
    },
    {
      name: 'repair alone',
      flags: { 'repair-enabled': 'true', 'repair-label-pods': 'true', 'pod-lookup-uds-address': '' },
      lookup: false,
      watches: [node],
      components: ['node-pod-watch', 'repair', 'pod-lookup'],
    },
    {
      name: "repair with selectors of its own gets a second watch, the lookup keeps the node's",
      flags: { 'repair-enabled': 'true', 'repair-label-pods': 'true', 'repair-label-selectors': 'app=web' },
      lookup: true,
      watches: [node, 'fields=spec.nodeName=node-1 labels=app=web'],
      components: ['node-pod-watch', 'repair-pod-watch', 'repair', 'pod-lookup'],
    },
    {
      // Not this node's watch for repair (it would act on node-1's pods, never node-2's).
      name: "repair told another --repair-node-name gets a watch of that node, the lookup keeps this node's",
      flags: { 'repair-enabled': 'true', 'repair-label-pods': 'true', 'repair-node-name': 'node-2' },
      lookup: true,
      watches: [node, 'fields=spec.nodeName=node-2 labels='],
      components: ['node-pod-watch', 'repair-pod-watch', 'repair', 'pod-lookup'],
    },
  ];
  for (const c of table) {
    it(c.name, async () => {
      const { api, socket, components, agent } = await agentWith(c.flags, c.ambient ? AMBIENT_ENV : {});
      if (c.lookup) assert.ok('pod' in (await cartFromAgent(api, socket)));
      assert.deepEqual((await expectWatches(api, c.watches.length)).sort(), [...c.watches].sort());
      if (c.ambient) await eventually(() => api.openNamespaceWatches() === 1, "ambient's namespace watch");
      // The watches start before their readers (and so stop after them: components stop in reverse).
      assert.deepEqual(
        components.filter((n) => c.components.includes(n)),
        c.components,
        JSON.stringify(components),
      );
      // Repair's watch metrics count on the watch it reads, shared or its own (shop/cart-1 is on node-1 and
      // has no app=web label); its queue's metrics are there when repair is on.
      const repairOn = c.flags['repair-enabled'] === 'true';
      const watched = repairOn && !c.flags['repair-label-selectors'] && !c.flags['repair-node-name'] ? 1 : 0;
      await eventually(
        async () =>
          new RegExp(`^mesh_cni_repair_watched_pods ${watched}$`, 'm').test((await agent.get('/metrics')).body),
        `mesh_cni_repair_watched_pods ${watched}`,
      );
      const metrics = (await agent.get('/metrics')).body;
      assert.equal(
        /^mesh_cni_workqueue_depth\{queue="repair"\} 0$/m.test(metrics),
        repairOn,
        "the repair queue's depth",
      );
    });
  }
});

// A cached answer may never lead to fewer rules than the API server's current pod. A
// watch that went silent (the stream open, nothing coming) still looks alive for up to its
// silence timeout, while its cache holds a pod that may since have been replaced.
describe('a stale pod watch never lets a pod start without its rules', () => {
  const tmp = tempDir();
  const socket = () => path.join(tmp.dir, 'run/pods.sock');
  let api: TestApiServer;
  let lookup: Component;
  let network: BridgeNetwork;
  const namespaces: Netns[] = [];
  let orchconfig: string;
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    lookup = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': socket(), orchconfig }, { NODE_NAME: 'node-1' })),
    );
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the pod watch');
    network = new BridgeNetwork('198.18.97.0/24');
  });
  after(async () => {
    for (const ns of namespaces) ns.remove();
    network?.cleanup();
    await lookup?.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  /** ADD for pod shop/<name> as a runtime that passes `uid` as K8S_POD_UID (none when empty). */
  async function add(name: string, uid: string, lookupSocket = socket()) {
    const ns = new Netns('pod');
    namespaces.push(ns);
    const id = `ctr${process.pid}s${++n}`;
    const args = `IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=${name};K8S_POD_INFRA_CONTAINER_ID=${id}${uid === '' ? '' : `;K8S_POD_UID=${uid}`}`;
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args };
    const prev = await network.addPod(chain);
    const r = await meshCni(
      'ADD',
      chain,
      pluginConfig({ cniVersion: '1.0.0', orchconfig, extra: { pod_lookup_uds_address: lookupSocket } }, prev),
    );
    return { r, nat: ns.exec(['iptables-nft-save', '-t', 'nat']) };
  }

  const gets = (name: string) =>
    api.requests.filter((q) => q.method === 'GET' && q.path === `/api/v1/namespaces/shop/pods/${name}`).length;

  it('a pod re-created under the same name with the sidecar while the watch is silent gets its rules, with or without K8S_POD_UID', async () => {
    const plain = onNode('shop', 'reborn', 'node-1');
    plain.metadata!.annotations = {};
    const old = api.upsertPod(plain);
    const oldUid = old.metadata!.uid!;
    await eventually(
      async () => 'pod' in (await podFromAgent(socket(), { namespace: 'shop', name: 'reborn', uid: oldUid }, 1000)),
      'the agent to have the first pod',
    );
    api.faults.silentWatches = true;
    try {
      api.deletePodFromStore('shop', 'reborn');
      const reborn = api.upsertPod(onNode('shop', 'reborn', 'node-1'));
      assert.notEqual(reborn.metadata!.uid, oldUid);
      assert.equal((lookup.status() as { state: string }).state, 'watching', 'the silent watch still looks alive');
      for (const [what, uid] of [
        ['no K8S_POD_UID', ''],
        ["the new pod's K8S_POD_UID", reborn.metadata!.uid!],
      ] as const) {
        const before = gets('reborn');
        const { r, nat } = await add('reborn', uid);
        assert.equal(r.code, 0, `${what}: ${r.stdout}${r.stderr}`);
        assert.match(
          nat,
          /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/,
          `${what}: the new pod's rules are applied`,
        );
        assert.equal(gets('reborn'), before + 1, `${what}: read from the API server`);
      }
    } finally {
      api.faults.silentWatches = false;
    }
  });

  it('the plugin takes from the lookup socket only the pod of the uid it asked for', async () => {
    // Whatever answers there (an older agent that matched any uid, or anything else on the node)
    // cannot hand the plugin another pod of that name.
    const net = await import('node:net');
    const fakeSocket = path.join(tmp.dir, 'fake.sock');
    const stale = { metadata: { namespace: 'shop', name: 'checked', uid: 'an-older-pod', annotations: {} } };
    const server = net.createServer((c) => c.end(JSON.stringify({ pod: stale }) + '\n'));
    await new Promise<void>((resolve) => server.listen(fakeSocket, resolve));
    try {
      const pod = api.upsertPod(onNode('shop', 'checked', 'node-1'));
      for (const uid of ['', pod.metadata!.uid!]) {
        const { r, nat } = await add('checked', uid, fakeSocket);
        assert.equal(r.code, 0, r.stdout + r.stderr);
        assert.match(
          nat,
          /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/,
          `uid ${JSON.stringify(uid)}: the pod's rules, not the stale answer`,
        );
      }
    } finally {
      server.close();
    }
  });
});

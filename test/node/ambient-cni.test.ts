// The plugin's ambient branch (docs/plugin.md "Ambient mode: the plugin's ADD") as a runtime runs
// it: Debian bridge + host-local in a netns, then mesh-cni with "ambient_enabled" against the test
// API server and a stand-in agent (an HTTP server on a unix socket recording each POST /cmdadd and
// answering what the case asks). An ambient pod is handed to the agent with the prevResult IPs and
// gets no rules of the plugin's; an agent that is down, slow or says no fails the ADD with code 11
// (fail closed); other pods take the sidecar path as before. The main cases run on both runtimes
// the plugin ships with.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { bunBinary } from '../../scripts/plugin-runtime.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import type { CmdAddRequest } from '../../cni-plugin/shared/pluginevent.ts';

const RUNTIMES: [string, readonly string[]][] = [
  ['node', MESH_CNI_SOURCE],
  ['bun', [bunBinary(ROOT), path.join(ROOT, 'cni-plugin/main.ts')]],
];

/** A pod with no sidecar, labelled (or not) for ambient mode. */
function plainPod(namespace: string, name: string, labels: Record<string, string> = {}, spec: object = {}): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace, name, labels },
    spec: { containers: [{ name: 'app', image: 'app:1' }], ...spec },
  };
}

interface Seen {
  readonly method: string;
  readonly url: string;
  readonly body: CmdAddRequest;
}

/** The agent's plugin event socket, answering `answer` (status + JSON body) or never. */
class FakeAgent {
  readonly seen: Seen[] = [];
  answer: { status: number; body: object } | 'hang' = { status: 200, body: { ok: true } };
  readonly #server: http.Server;
  readonly path: string;
  constructor(dir: string) {
    this.path = path.join(dir, 'pluginevent.sock');
    this.#server = http.createServer((req, res) => {
      let text = '';
      req.on('data', (c: Buffer) => (text += c.toString()));
      req.on('end', () => {
        this.seen.push({ method: req.method ?? '', url: req.url ?? '', body: JSON.parse(text) as CmdAddRequest });
        if (this.answer === 'hang') return;
        res.writeHead(this.answer.status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(this.answer.body));
      });
    });
  }
  listen(): Promise<void> {
    return new Promise((r) => this.#server.listen(this.path, r));
  }
  close(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((r) => this.#server.close(() => r()));
  }
}

describe('mesh-cni ambient branch (bridge + host-local + mesh-cni, test API server, a stand-in agent)', () => {
  let api: TestApiServer;
  let network: BridgeNetwork;
  let agent: FakeAgent;
  const tmp = tempDir();
  const pods: Netns[] = [];
  let orchconfig: string;
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    network = new BridgeNetwork('198.18.157.0/24');
    agent = new FakeAgent(tmp.dir);
    await agent.listen();
    api.upsertNamespace({ metadata: { name: 'plain' } });
    api.upsertNamespace({ metadata: { name: 'amb', labels: { 'mesh.io/dataplane-mode': 'ambient' } } });
  });
  after(async () => {
    for (const p of pods) p.remove();
    network?.cleanup();
    await agent?.close();
    await api?.close();
    tmp.remove();
  });

  async function podSandbox(pod: V1Pod): Promise<{ ns: Netns; chain: ChainEnv; prev: Record<string, unknown> }> {
    const ns = new Netns('amb');
    pods.push(ns);
    const id = `ctr${process.pid}a${++n}`;
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
    const prev = await network.addPod(chain);
    return { ns, chain, prev };
  }

  const conf = (prev: unknown, extra: Record<string, unknown> = {}) =>
    pluginConfig(
      {
        cniVersion: '1.0.0',
        orchconfig,
        extra: { ambient_enabled: true, pluginevent_uds_address: agent.path, ...extra },
      },
      prev,
    );
  const mark = () => agent.seen.length;
  const postsSince = (from: number) => agent.seen.slice(from);
  const errorOf = (stdout: string) => JSON.parse(stdout) as { code: number; msg: string; details?: string };
  const rulesIn = (ns: Netns) => ns.exec(['iptables-nft-save']);

  for (const [runtime, argv] of RUNTIMES) {
    it(`${runtime}: an ambient pod is POSTed to the agent with the prevResult IPs; ADD prints prevResult, no rules`, async () => {
      agent.answer = { status: 200, body: { ok: true } };
      const pod = api.upsertPod(plainPod('plain', `labelled-${runtime}`, { 'mesh.io/dataplane-mode': 'ambient' }));
      const { ns, chain, prev } = await podSandbox(pod);
      const from = mark();
      const add = await meshCni('ADD', chain, conf(prev), argv);
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.deepEqual(JSON.parse(add.stdout), prev, 'ADD prints prevResult unchanged');
      const posts = postsSince(from);
      assert.equal(posts.length, 1);
      assert.equal(posts[0]!.method, 'POST');
      assert.equal(posts[0]!.url, '/cmdadd');
      const prevIps = prev.ips as { address: string; gateway?: string; interface?: number }[];
      assert.deepEqual(posts[0]!.body, {
        netns: ns.path,
        podName: pod.metadata!.name,
        podNamespace: 'plain',
        podUid: pod.metadata!.uid,
        ips: prevIps.map((ip) => ({ address: ip.address, interface: ip.interface, gateway: ip.gateway })),
      });
      assert.match(posts[0]!.body.ips[0]!.address, /^198\.18\.157\.\d+\/24$/);
      assert.doesNotMatch(rulesIn(ns), /MESH_/, 'the plugin wrote no rules of its own');
    });

    it(`${runtime}: the agent's socket is not there: code 11 naming the node agent`, async () => {
      const pod = api.upsertPod(plainPod('amb', `no-agent-${runtime}`));
      const { chain, prev } = await podSandbox(pod);
      const add = await meshCni(
        'ADD',
        chain,
        conf(prev, { pluginevent_uds_address: path.join(tmp.dir, 'gone.sock') }),
        argv,
      );
      assert.notEqual(add.code, 0, add.stdout);
      const e = errorOf(add.stdout);
      assert.equal(e.code, 11);
      assert.match(e.msg, /cannot reach the mesh node agent to enroll ambient pod amb\/no-agent/);
      assert.match(e.details ?? '', /gone\.sock/);
    });

    it(`${runtime}: the agent answers 500 for ztunnel: code 11 naming ztunnel`, async () => {
      agent.answer = {
        status: 500,
        body: { ok: false, reason: 'ztunnel', message: 'cannot enroll pod: no ztunnel connection' },
      };
      const pod = api.upsertPod(plainPod('amb', `ztunnel-down-${runtime}`));
      const { chain, prev } = await podSandbox(pod);
      const from = mark();
      const add = await meshCni('ADD', chain, conf(prev), argv);
      assert.equal(postsSince(from).length, 1);
      assert.notEqual(add.code, 0, add.stdout);
      const e = errorOf(add.stdout);
      assert.equal(e.code, 11);
      assert.match(e.msg, /^ztunnel did not take ambient pod amb\/ztunnel-down/);
      assert.match(e.details ?? '', /no ztunnel connection/);
    });
  }

  it('the agent answers 500 for the in-pod rules: code 11 naming the node agent and its text', async () => {
    agent.answer = {
      status: 500,
      body: { ok: false, reason: 'rules', message: 'in-pod rules: iptables-restore failed' },
    };
    const pod = api.upsertPod(plainPod('amb', 'rules-fail'));
    const { chain, prev } = await podSandbox(pod);
    const add = await meshCni('ADD', chain, conf(prev));
    const e = errorOf(add.stdout);
    assert.equal(e.code, 11);
    assert.match(e.msg, /the mesh node agent could not enroll ambient pod amb\/rules-fail \(HTTP 500\)/);
    assert.match(e.details ?? '', /iptables-restore failed/);
  });

  it('the agent does not answer within 5 s: code 11', async () => {
    agent.answer = 'hang';
    const pod = api.upsertPod(plainPod('amb', 'slow-agent'));
    const { chain, prev } = await podSandbox(pod);
    const add = await meshCni('ADD', chain, conf(prev));
    const e = errorOf(add.stdout);
    assert.equal(e.code, 11);
    assert.match(e.details ?? '', /did not answer .* within 5000 ms/);
    // The agent took the request: it is reachable, and what it waits on that long is ztunnel's ack.
    assert.match(e.msg, /^the mesh node agent did not finish enrolling ambient pod amb\/slow-agent within 5 s/);
    assert.match(e.details ?? '', /ztunnel/);
    agent.answer = { status: 200, body: { ok: true } };
  });

  it("a pod of a namespace labelled ambient is POSTed: the namespace's labels read from the API server", async () => {
    const pod = api.upsertPod(plainPod('amb', 'by-namespace'));
    const { chain, prev } = await podSandbox(pod);
    const from = mark();
    const before = api.requests.length;
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.equal(postsSince(from).length, 1);
    assert.ok(
      api.requests.slice(before).some((r) => r.method === 'GET' && r.path === '/api/v1/namespaces/amb'),
      'the namespace was read',
    );
  });

  it('a pod labelled none in an ambient namespace is not POSTed (no sidecar either: passed through)', async () => {
    const pod = api.upsertPod(plainPod('amb', 'opted-out', { 'mesh.io/dataplane-mode': 'none' }));
    const { ns, chain, prev } = await podSandbox(pod);
    const from = mark();
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.equal(postsSince(from).length, 0);
    assert.doesNotMatch(rulesIn(ns), /MESH_/);
  });

  it('a sidecar pod (labelled ambient, in an ambient namespace) takes the sidecar path: rules as before, no POST', async () => {
    const pod = api.upsertPod({
      ...meshPod('amb', 'with-sidecar'),
      metadata: { ...meshPod('amb', 'with-sidecar').metadata, labels: { 'mesh.io/dataplane-mode': 'ambient' } },
    });
    const { ns, chain, prev } = await podSandbox(pod);
    const from = mark();
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.deepEqual(JSON.parse(add.stdout), prev);
    assert.equal(postsSince(from).length, 0);
    assert.match(rulesIn(ns), /-A OUTPUT -j MESH_OUTPUT/);
  });

  it('a sidecar pod of a plain namespace: sidecar rules, no POST, no namespace read', async () => {
    const pod = api.upsertPod(meshPod('plain', 'sidecar-only'));
    const { ns, chain, prev } = await podSandbox(pod);
    const from = mark();
    const before = api.requests.length;
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.equal(postsSince(from).length, 0);
    assert.match(rulesIn(ns), /-A PREROUTING -j MESH_PREROUTING/);
    assert.ok(
      !api.requests
        .slice(before)
        .some((r) => r.path.startsWith('/api/v1/namespaces/plain') && !r.path.includes('/pods')),
    );
  });

  // What a pod author writes can make a pod look like a sidecar pod that the sidecar path then
  // skips: such a pod is an ambient pod like any other, never left between the two paths with no
  // redirection at all (docs/ambient.md "How pods are selected"; Istio leaves it so).
  const status = { 'sidecar.mesh.io/status': '{"containers":["mesh-proxy"]}' };
  const proxy = (over: object = {}) => ({ name: 'mesh-proxy', image: 'proxy:1', ...over });
  const claimsWithoutSidecar: [string, V1Pod][] = [
    ['the sidecar status annotation and no mesh-proxy container', plainPod('amb', 'status-only')],
    [
      'the status annotation and DISABLE_ENVOY on mesh-proxy',
      plainPod('amb', 'no-envoy', {}, { containers: [proxy({ env: [{ name: 'DISABLE_ENVOY', value: 'true' }] })] }),
    ],
    [
      'the status annotation, mesh-proxy and its own mesh-init container',
      plainPod('amb', 'own-init', {}, { initContainers: [{ name: 'mesh-init', image: 'x:1' }], containers: [proxy()] }),
    ],
    [
      'the status annotation and a mesh-proxy of type router',
      plainPod('amb', 'router', {}, { containers: [proxy({ args: ['proxy', 'router'] })] }),
    ],
    [
      'the status annotation, mesh-proxy and the label sidecar.mesh.io/inject=false',
      plainPod('amb', 'inject-off', { 'sidecar.mesh.io/inject': 'false' }, { containers: [proxy()] }),
    ],
  ];
  for (const [why, p] of claimsWithoutSidecar) {
    it(`a pod of an ambient namespace with ${why} is ambient: POSTed, not left unredirected`, async () => {
      const pod = api.upsertPod({ ...p, metadata: { ...p.metadata, annotations: status } });
      const { ns, chain, prev } = await podSandbox(pod);
      const from = mark();
      const add = await meshCni('ADD', chain, conf(prev));
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.deepEqual(JSON.parse(add.stdout), prev);
      assert.equal(postsSince(from).length, 1, 'handed to the agent');
      assert.equal(postsSince(from)[0]!.body.podName, pod.metadata!.name);
      assert.doesNotMatch(rulesIn(ns), /MESH_/, 'no sidecar rules of the plugin');
    });
  }

  it('a pod with interceptionMode NONE on its sidecar in an ambient namespace is ambient too', async () => {
    const p = meshPod('amb', 'no-interception', { 'sidecar.mesh.io/interceptionMode': 'NONE' });
    const pod = api.upsertPod(p);
    const { chain, prev } = await podSandbox(pod);
    const from = mark();
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.equal(postsSince(from).length, 1);
  });

  it('a host-network pod labelled ambient is never POSTed', async () => {
    const pod = api.upsertPod(
      plainPod('amb', 'host-net', { 'mesh.io/dataplane-mode': 'ambient' }, { hostNetwork: true }),
    );
    const { chain, prev } = await podSandbox(pod);
    const from = mark();
    const add = await meshCni('ADD', chain, conf(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.equal(postsSince(from).length, 0);
  });

  it('DEL and CHECK of an ambient pod POST nothing and succeed', async () => {
    const pod = api.upsertPod(plainPod('amb', 'del-me'));
    const { chain, prev } = await podSandbox(pod);
    assert.equal((await meshCni('ADD', chain, conf(prev))).code, 0);
    const from = mark();
    const check = await meshCni('CHECK', chain, conf(prev));
    assert.equal(check.code, 0, check.stdout + check.stderr);
    const del = await meshCni('DEL', chain, conf(prev));
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.equal(postsSince(from).length, 0);
  });

  it("the namespace cannot be read (the plugin's token may not get namespaces): code 11, not started", async () => {
    const token = api.serviceAccount('mesh-system', 'mesh-cni-plugin', [
      { verbs: ['get'], apiGroups: [''], resources: ['pods'] },
    ]);
    const narrow = api.writeOrchconfig(path.join(tmp.dir, 'narrow-orchconfig'), { token });
    const pod = api.upsertPod(plainPod('amb', 'no-ns-rbac'));
    const { chain, prev } = await podSandbox(pod);
    const from = mark();
    const add = await meshCni('ADD', chain, {
      ...conf(prev),
      orch: { ...(conf(prev).orch as object), orchconfig: narrow },
    });
    assert.equal(postsSince(from).length, 0);
    const e = errorOf(add.stdout);
    assert.equal(e.code, 11, add.stdout);
    assert.match(e.msg, /cannot read namespace amb from the API server \(unauthorized\)/);
    assert.match(e.details ?? '', /get namespaces/);
  });

  it("the agent's pod lookup answers with the namespace's labels: decided without the API server", async () => {
    // A stand-in pod lookup socket answering the pod and its namespace's labels.
    const pod = api.upsertPod(plainPod('elsewhere', 'looked-up'));
    const lookup = path.join(tmp.dir, 'pods.sock');
    const srv = net.createServer((c) =>
      c.once('data', () =>
        c.end(JSON.stringify({ pod, namespaceLabels: { 'mesh.io/dataplane-mode': 'ambient' } }) + '\n'),
      ),
    );
    await new Promise<void>((r) => srv.listen(lookup, r));
    try {
      const { chain, prev } = await podSandbox(pod);
      const from = mark();
      const before = api.requests.length;
      const add = await meshCni('ADD', chain, conf(prev, { pod_lookup_uds_address: lookup }));
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.equal(postsSince(from).length, 1);
      assert.deepEqual(api.requests.slice(before), [], 'no API request at all');
    } finally {
      await new Promise<void>((r) => srv.close(() => r()));
    }
  });

  /** A stand-in pod lookup socket answering `pod` with `namespaceLabels` (the agent's namespace watch). */
  async function lookupAnswering(
    pod: V1Pod,
    namespaceLabels: Record<string, string>,
  ): Promise<[string, () => Promise<void>]> {
    const lookup = path.join(tmp.dir, `pods-${++n}.sock`);
    const srv = net.createServer((c) => c.once('data', () => c.end(JSON.stringify({ pod, namespaceLabels }) + '\n')));
    await new Promise<void>((r) => srv.listen(lookup, r));
    return [lookup, () => new Promise<void>((r) => srv.close(() => r()))];
  }

  it("the agent's namespace labels say not ambient, the API server's namespace says ambient: the GET decides, POSTed", async () => {
    // The agent's namespace watch is behind a relabel (backing off, relisting, or slow): a "not
    // ambient" from it would start an ambient pod unredirected until the informer catches up.
    const pod = api.upsertPod(plainPod('amb', 'stale-watch'));
    const [lookup, close] = await lookupAnswering(pod, {});
    try {
      const { chain, prev } = await podSandbox(pod);
      const from = mark();
      const before = api.requests.length;
      const add = await meshCni('ADD', chain, conf(prev, { pod_lookup_uds_address: lookup }));
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.equal(postsSince(from).length, 1, 'the pod went to the agent');
      assert.deepEqual(
        api.requests.slice(before).map((r) => `${r.method} ${r.path}`),
        ['GET /api/v1/namespaces/amb'],
        'only the namespace was read',
      );
    } finally {
      await close();
    }
  });

  it("the agent's namespace labels say not ambient and so does the API server: sidecar path, no POST", async () => {
    const pod = api.upsertPod(plainPod('plain', 'confirmed-plain'));
    const [lookup, close] = await lookupAnswering(pod, {});
    try {
      const { ns, chain, prev } = await podSandbox(pod);
      const from = mark();
      const add = await meshCni('ADD', chain, conf(prev, { pod_lookup_uds_address: lookup }));
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.equal(postsSince(from).length, 0);
      assert.doesNotMatch(rulesIn(ns), /MESH_/);
    } finally {
      await close();
    }
  });

  it('no selector can match the pod whatever its namespace says: no namespace read at all', async () => {
    const selectors = [
      { podSelector: { matchLabels: { team: 'blue' } }, namespaceSelector: { matchLabels: { x: 'y' } } },
    ];
    const pod = api.upsertPod(plainPod('amb', 'team-red', { team: 'red' }));
    const [lookup, close] = await lookupAnswering(pod, {});
    try {
      const { chain, prev } = await podSandbox(pod);
      const from = mark();
      const before = api.requests.length;
      const add = await meshCni(
        'ADD',
        chain,
        conf(prev, { pod_lookup_uds_address: lookup, enablement_selectors: selectors }),
      );
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.equal(postsSince(from).length, 0);
      assert.deepEqual(api.requests.slice(before), [], 'no API request at all');
    } finally {
      await close();
    }
  });

  it('ambient_enabled without pluginevent_uds_address, or a bad selector: config errors (7)', async () => {
    const pod = api.upsertPod(plainPod('amb', 'bad-config'));
    const { chain, prev } = await podSandbox(pod);
    const noAddr = await meshCni('ADD', chain, conf(prev, { pluginevent_uds_address: '' }));
    assert.equal(errorOf(noAddr.stdout).code, 7);
    assert.match(errorOf(noAddr.stdout).msg, /pluginevent_uds_address is empty/);
    const badSel = await meshCni(
      'ADD',
      chain,
      conf(prev, { enablement_selectors: [{ podSelector: { matchLabels: 3 } }] }),
    );
    assert.equal(errorOf(badSel.stdout).code, 7);
    assert.match(errorOf(badSel.stdout).details ?? '', /matchLabels/);
  });
});

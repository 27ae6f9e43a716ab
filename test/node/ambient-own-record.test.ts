// What the agent counts as enrolled is its own record: the pods it handed to ztunnel, the rules it
// wrote, the IPs it put in the probe ipset. The pod's ambient.mesh.io/redirection annotation is
// what the agent tells others, and the pod's owner can write it (at creation, or any time): it
// must never make the agent skip a pod it should enroll, nor take a pod for enrolled at start-up.
//
// End to end on one node: the test HTTPS API server holds the namespaces and pods; the agent's
// ambient part (startAmbient) runs on the node's pod watch with the real dataplane; the node is a
// netns made here (its probe ipset and MESH_POSTRT); pods are netns with a `sleep` in a
// kubelet-shaped cgroup (found by the /proc scan) and real iptables-nft rules; ztunnel is the
// fake ztunnel on the real ZDS socket. Everything made is removed after each test.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { describe, it as nodeIt } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { apiAnnotator } from '../../src/ambient/annotator.ts';
import { createDataplane, type MeshDataplane } from '../../src/ambient/dataplane.ts';
import { DEFAULT_ENABLEMENT_SELECTORS, isAmbientPod, neverAmbient } from '../../src/ambient/enablement.ts';
import { parseProbeSet, PROBE_SET_V4 } from '../../src/ambient/hostrules.ts';
import { startAmbient, type AmbientComponent } from '../../src/ambient/index.ts';
import { applyInpod, podOptions, type Runner } from '../../src/ambient/podrules.ts';
import { podsAtStart } from '../../src/ambient/snapshot.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs, orchClientArgs } from '../../src/partargs.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { type OrchApi } from '../../src/orch/api.ts';
import { orchApi } from '../../src/orch/client.ts';
import { NamespaceSource } from '../../src/orch/namespacesource.ts';
import { nodePodSource, type PodSource } from '../../src/orch/podsource.ts';
import { openNetns, runInNetns } from '../../src/podnetns/index.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { makeNetnsPods, type NetnsPod } from '../helpers/kubepods.ts';
import { Netns } from '../helpers/netns.ts';
import { waitFor } from '../helpers/poll.ts';
import { shStatus } from '../helpers/sh.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const defer = cleanupAfterEach();
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 60_000 }, fn);

const NODE = 'node-1';
const MODE = 'mesh.io/dataplane-mode';
const REDIRECTION = 'ambient.mesh.io/redirection';

/** The pod's nat table as iptables-nft-save prints it. */
const natOf = (p: NetnsPod): string => shStatus(['ip', 'netns', 'exec', p.netns, 'iptables-nft-save', '-t', 'nat']).out;
const hasOurRules = (p: NetnsPod): boolean => /^:MESH_PRERT /m.test(natOf(p));

interface Node {
  readonly api: TestApiServer;
  readonly orch: OrchApi;
  readonly ns: Netns;
  readonly sock: string;
  readonly eventSock: string;
  /** The node's probe set (IP -> pod UID); empty when it does not exist. */
  probes(): Map<string, string>;
  /** Starts the agent's ambient part on this node; stopped after the test. */
  startAgent(over?: Record<string, string>): Promise<{ ambient: AmbientComponent; pods: PodSource }>;
  pod(p: NetnsPod, ns: string, o?: { annotations?: Record<string, string>; ip?: boolean }): V1Pod;
}

async function node(): Promise<Node> {
  const api = await startTestApiServer({ bookmarkIntervalMs: 200 });
  defer(() => api.close());
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ownrec-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  const ns = new Netns('node');
  defer(async () => ns.remove());
  const held = await openNetns(ns.path, 0);
  defer(async () => held.close());
  const sock = path.join(dir, 'ztunnel.sock');
  const eventSock = path.join(dir, 'run/pluginevent.sock');
  const orchconfig = api.writeOrchconfig(path.join(dir, 'orchconfig'));
  const settingsOf = (over: Record<string, string>): Settings =>
    buildSettings(
      {
        orchconfig,
        'ambient-enabled': 'true',
        'ambient-ipv6': 'false',
        'ztunnel-uds-address': sock,
        'pluginevent-uds-address': eventSock,
        'pod-lookup-uds-address': path.join(dir, 'run/pods.sock'),
        'host-root': '/',
        'host-proc-dir': '/proc',
        'host-netns-path': '/proc/self/ns/net',
        'orch-qps': '1000',
        'orch-burst': '1000',
        ...over,
      },
      { NODE_NAME: NODE },
    );
  const orch = orchApi(orchClientArgs(settingsOf({})));
  return {
    api,
    orch,
    ns,
    sock,
    eventSock,
    probes() {
      const r = shStatus(['ip', 'netns', 'exec', ns.name, 'ipset', 'save', PROBE_SET_V4]);
      return r.code === 0 ? parseProbeSet(r.out) : new Map();
    },
    async startAgent(over = {}) {
      const settings = settingsOf(over);
      const pods = nodePodSource(orch, NODE, 'install');
      pods.start();
      defer(() => pods.stop());
      const dataplane: MeshDataplane = createDataplane(ambientArgs(settings), {
        annotator: apiAnnotator(orch),
        host: (argv, o) => runInNetns(held, argv, { input: o?.input ?? null }),
        flavour: async () => 'nft',
      });
      const ambient = startAmbient(ambientArgs(settings), {
        pods,
        api: orch,
        dataplane,
        namespaces: new NamespaceSource(orch, { tuning: { startJitterMs: 0, reconnectSpreadMs: 100 } }),
        decideCleanup: async () => ({ cleanup: false, why: 'the test: an upgrade' }),
      });
      defer(() => ambient.stop('SIGTERM'));
      await ambient.started;
      return { ambient, pods };
    },
    pod(p, namespace, o = {}) {
      const ip = o.ip ?? true;
      return api.upsertPod({
        metadata: { name: p.name, namespace, uid: p.uid, labels: {}, annotations: o.annotations ?? {} },
        spec: { nodeName: NODE, serviceAccountName: 'app', containers: [{ name: 'app', image: 'app' }] },
        status: ip ? { phase: 'Running', podIP: p.ip, podIPs: [{ ip: p.ip }] } : { phase: 'Pending' },
      });
    },
  };
}

function netnsPods(tag: string, count: number, net: string): readonly NetnsPod[] {
  const made = makeNetnsPods(`${tag}-${process.pid}`, count, net);
  defer(async () => made.remove());
  return made.pods;
}

function fakeZtunnel(sock: string): FakeZtunnel {
  const z = new FakeZtunnel({ path: sock });
  defer(() => z.stop());
  return z;
}

/** POST /cmdadd as the plugin does for an ambient pod's ADD. */
function cmdAdd(eventSock: string, body: unknown): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const text = JSON.stringify(body);
    const req = http.request(
      {
        socketPath: eventSock,
        path: '/cmdadd',
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
      },
      (res) => {
        let out = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (out += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: out }));
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

describe('which pods a start-up takes (podsAtStart): the agent decides, the annotation never enrolls', () => {
  const ns = { [MODE]: 'ambient' };
  const wanted = (p: V1Pod) =>
    isAmbientPod(p, p.metadata!.namespace === 'demo' ? ns : {}, DEFAULT_ENABLEMENT_SELECTORS);
  const mk = (
    name: string,
    namespace: string,
    o: { ann?: string; phase?: string; host?: boolean; sidecar?: boolean } = {},
  ) => {
    const p: V1Pod = {
      metadata: {
        name,
        namespace,
        uid: name,
        annotations: {
          ...(o.ann ? { [REDIRECTION]: o.ann } : {}),
          ...(o.sidecar ? { 'sidecar.mesh.io/status': '{"containers":["mesh-proxy"]}' } : {}),
        },
      },
      spec: {
        containers: [{ name: 'app' }, ...(o.sidecar ? [{ name: 'mesh-proxy' }] : [])],
        hostNetwork: o.host ?? false,
      },
      status: { phase: o.phase ?? 'Running' },
    };
    return p;
  };
  it('every running pod that should be ambient is enrolled; annotated others are leftovers; never a sidecar', async () => {
    const pods = [
      mk('wanted', 'demo'),
      mk('wanted-claims', 'demo', { ann: 'enabled' }),
      mk('wanted-pending', 'demo', { ann: 'pending' }),
      mk('wanted-done', 'demo', { phase: 'Succeeded' }),
      mk('wanted-done-claims', 'demo', { ann: 'enabled', phase: 'Failed' }),
      mk('plain', 'plain'),
      mk('plain-claims', 'plain', { ann: 'enabled' }),
      mk('host-claims', 'demo', { ann: 'enabled', host: true }),
      mk('sidecar-claims', 'demo', { ann: 'enabled', sidecar: true }),
    ];
    const at = podsAtStart(pods, wanted, (p) => neverAmbient(p));
    assert.deepEqual(
      at.enroll.map((p) => p.metadata!.name),
      ['wanted', 'wanted-claims', 'wanted-pending'],
    );
    assert.deepEqual(
      at.leftover.map((p) => p.metadata!.name),
      ['wanted-done-claims', 'plain-claims'],
    );
  });
});

describe("the agent's record of ambient enrollment is its own, never the pod's annotation", () => {
  it('a pod created annotated enabled in a plain namespace is enrolled once the namespace is labelled', async () => {
    const n = await node();
    n.api.upsertNamespace({ metadata: { name: 'plain', labels: {} } });
    const { pods } = await n.startAgent();
    const z = fakeZtunnel(n.sock);
    await z.waitForNth('snapshot_sent', 1);
    const [p] = netnsPods('ownrec-a', 1, '198.18.81');
    // Its owner wrote the annotation at creation; the plugin's ADD left it alone (not ambient then).
    n.pod(p!, 'plain', { annotations: { [REDIRECTION]: 'enabled' } });
    await waitFor('the watch has the pod', () => pods.get('plain', p!.name));
    assert.equal(hasOurRules(p!), false);

    n.api.upsertNamespace({ metadata: { name: 'plain', labels: { [MODE]: 'ambient' } } });
    const add = await waitFor('Add of the pod at ztunnel', () => z.of('add').find((r) => r.uid === p!.uid), 15_000);
    assert.ok(add.acked);
    assert.equal(hasOurRules(p!), true, 'its in-pod rules are in');
    await waitFor('its IP in the probe set', () => n.probes().get(p!.ip) === p!.uid);
  });

  it('at start-up, a wanted pod annotated enabled but never enrolled gets its rules (reconcile flag off too)', async () => {
    const n = await node();
    n.api.upsertNamespace({ metadata: { name: 'demo', labels: { [MODE]: 'ambient' } } });
    const [p, q] = netnsPods('ownrec-b', 2, '198.18.82');
    // Annotated by its owner; no agent ever enrolled it: no rules in its netns.
    n.pod(p!, 'demo', { annotations: { [REDIRECTION]: 'enabled' } });
    // Not annotated: its namespace was labelled while the agent was down.
    n.pod(q!, 'demo');
    await n.startAgent({ 'ambient-reconcile-pod-rules-on-startup': 'false' });
    const z = fakeZtunnel(n.sock);
    await z.waitForNth('snapshot_sent', 1);
    assert.deepEqual(
      z
        .of('add', 1)
        .map((r) => r.uid)
        .sort(),
      [p!.uid, q!.uid].sort(),
      'both in the first snapshot',
    );
    assert.equal(hasOurRules(p!), true, 'handed to ztunnel, so its traffic must be redirected to it');
    assert.equal(hasOurRules(q!), true);
    assert.equal(n.probes().get(p!.ip), p!.uid);
    assert.equal(n.probes().get(q!.ip), q!.uid);
    await waitFor('q annotated enabled: what others are told', () => {
      return n.api.getPod('demo', q!.name)?.metadata?.annotations?.[REDIRECTION] === 'enabled';
    });
  });

  it('at start-up, a pod annotated but not wanted is never handed to ztunnel; only our chains come out', async () => {
    const n = await node();
    n.api.upsertNamespace({ metadata: { name: 'plain', labels: {} } });
    const [p] = netnsPods('ownrec-c', 1, '198.18.83');
    // Ours from an earlier run (its namespace unlabelled while the agent was down), and someone else's chain.
    const run = (argv: readonly string[], o?: { input?: string }) => {
      const r = spawnSync('ip', ['netns', 'exec', p!.netns, ...argv], { encoding: 'utf8', input: o?.input });
      return Promise.resolve({ code: r.status, stdout: r.stdout, stderr: r.stderr, error: null });
    };
    await applyInpod(run, 'nft', [4], podOptions({}, false));
    assert.equal(shStatus(['ip', 'netns', 'exec', p!.netns, 'iptables-nft', '-t', 'nat', '-N', 'KEEP_ME']).code, 0);
    n.pod(p!, 'plain', { annotations: { [REDIRECTION]: 'enabled' } });
    await n.startAgent();
    const z = fakeZtunnel(n.sock);
    await z.waitForNth('snapshot_sent', 1);
    await waitFor('the annotation taken off', () => {
      return n.api.getPod('plain', p!.name)?.metadata?.annotations?.[REDIRECTION] === undefined;
    });
    assert.equal(hasOurRules(p!), false, 'our chains are out');
    assert.match(natOf(p!), /^:KEEP_ME /m, "another's chain stays");
    assert.deepEqual(z.of('add'), [], 'never handed to ztunnel');
    assert.equal(n.probes().has(p!.ip), false);
  });

  it("a pod deleted before the kubelet wrote its IP leaves no probe entry (the ADD's IPs are remembered)", async () => {
    const n = await node();
    n.api.upsertNamespace({ metadata: { name: 'demo', labels: { [MODE]: 'ambient' } } });
    const { pods } = await n.startAgent();
    const z = fakeZtunnel(n.sock);
    await z.waitForNth('snapshot_sent', 1);
    const [p] = netnsPods('ownrec-d', 1, '198.18.84');
    n.pod(p!, 'demo', { ip: false });
    await waitFor('the watch has the pod', () => pods.get('demo', p!.name));
    const r = await cmdAdd(n.eventSock, {
      netns: p!.netnsPath,
      podName: p!.name,
      podNamespace: 'demo',
      podUid: p!.uid,
      ips: [{ address: `${p!.ip}/24` }],
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(n.probes().get(p!.ip), p!.uid, 'enrolled with the IP of the ADD');
    // Deleted while its status still says Pending, without IPs.
    n.api.deletePodFromStore('demo', p!.name);
    await z.waitFor((x) => x.kind === 'del' && x.uid === p!.uid);
    await waitFor('its IP out of the probe set', () => !n.probes().has(p!.ip));
  });
});

/** The node netns of a dataplane-only test and a host runner in it. */
async function nodeOnly() {
  const ns = new Netns('node');
  defer(async () => ns.remove());
  const held = await openNetns(ns.path, 0);
  defer(async () => held.close());
  const run = (argv: readonly string[], o?: { input?: string }) => runInNetns(held, argv, { input: o?.input ?? null });
  const probes = (): Map<string, string> => {
    const r = shStatus(['ip', 'netns', 'exec', ns.name, 'ipset', 'save', PROBE_SET_V4]);
    return r.code === 0 ? parseProbeSet(r.out) : new Map();
  };
  return { ns, run, probes };
}

function bareDataplane(run: Runner): { dp: MeshDataplane; sock: string } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ownrec-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'ztunnel.sock');
  const base = buildSettings({}, {});
  const settings: Settings = {
    ...base,
    ambient: { ...base.ambient, ztunnelUdsAddress: sock, hostRoot: '/', ipv6: false },
    repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
  };
  const dp = createDataplane(ambientArgs(settings), {
    annotator: { setRedirection: async () => {} },
    host: run,
    flavour: async () => 'nft',
  });
  defer(() => dp.stop(false));
  return { dp, sock };
}

describe('the probe ipset entries the agent put in are its own to take out', () => {
  it("a pod added again with another IP (a new sandbox): the old IP's entry goes", async () => {
    const node = await nodeOnly();
    const { dp, sock } = bareDataplane(node.run);
    await dp.start([]);
    const z = fakeZtunnel(sock);
    await z.waitForNth('snapshot_sent', 1);
    const [p] = netnsPods('ownrec-e', 1, '198.18.85');
    const pod = { uid: p!.uid, namespace: 'demo', name: p!.name, serviceAccount: 'app', annotations: {} };
    await dp.addPodToMesh({ ...pod, ips: ['198.18.85.2'] }, p!.netnsPath);
    assert.equal(node.probes().get('198.18.85.2'), p!.uid);
    await dp.addPodToMesh({ ...pod, ips: ['198.18.85.9'] }, p!.netnsPath);
    assert.deepEqual([...node.probes()], [['198.18.85.9', p!.uid]]);
    // Its removal takes out what was put in, though the pod it is told of has no IPs.
    await dp.removePodFromMesh({ ...pod, ips: [] }, true);
    assert.deepEqual([...node.probes()], []);
  });

  it('start-up with an enrolled pod that has no IP yet: its entry stays, every other stale one goes', async () => {
    const node = await nodeOnly();
    const first = bareDataplane(node.run);
    await first.dp.start([]);
    const [p] = netnsPods('ownrec-f', 1, '198.18.86');
    const pod = { uid: p!.uid, namespace: 'demo', name: p!.name, serviceAccount: 'app', annotations: {} };
    const z = fakeZtunnel(first.sock);
    await z.waitForNth('snapshot_sent', 1);
    await first.dp.addPodToMesh({ ...pod, ips: [p!.ip] }, p!.netnsPath);
    // A pod deleted while no agent ran: its entry is stale.
    const stale = randomUUID();
    assert.equal(
      shStatus(['ip', 'netns', 'exec', node.ns.name, 'ipset', 'add', PROBE_SET_V4, '198.18.86.77', 'comment', stale])
        .code,
      0,
    );
    await first.dp.stop(false);
    await z.stop();
    // After a kubelet restart its status has no IPs yet.
    const second = bareDataplane(node.run);
    await second.dp.start([{ ...pod, ips: [] }]);
    assert.deepEqual([...node.probes()], [[p!.ip, p!.uid]]);
  });
});

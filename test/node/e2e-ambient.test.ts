// Ambient mode end to end on one node (docs/ambient.md) with a real container
// runtime: podman (CNI backend) starts containers in kubelet-shaped cgroups
// (/kubepods/besteffort/pod<uid>/libpod-<id>) on a bridge network whose conflist install-cni
// edits; the runtime runs the mesh-cni executable install-cni copied; the test API server holds
// namespace `demo` (labelled mesh.io/dataplane-mode=ambient) and the pods; the test plays the
// kubelet (writes status.podIPs after `podman run`). No ztunnel exists here: a fake ztunnel
// (test/helpers/fake-ztunnel.ts) speaks ZDS to the agent and, on each Add, starts stand-in
// proxies on 15001/15006/15008 inside the netns fd it was given (test/helpers/ztunnel-listeners.ts).
//
// The node: a netns made here stands in for the node's host network. podman and the CNI plugins
// it runs, AND the agent, run in it (nsenter --net), so the bridge, the host probe rule
// (MESH_POSTRT) and the probe ipset go there and never into the machine's own netns; its
// 127.0.0.1:<API port> is forwarded to the test API server. The agent's host-netns reference is
// /proc/self/ns/net (its own: the node netns) and its host root is / (podman's /run/netns bind
// mounts are in the machine's mount namespace, which the agent shares).
//
// iptables flavour: the agent detects the node's (nft here: the node netns has no legacy rules),
// so the traffic checks run on iptables-nft; both flavours are covered in plain netns by
// ambient-rules-netns.test.ts. With --native-nftables=true a third suite runs enrolment, the
// same traffic matrix, unlabel, delete, the upgrade restart and uninstall: ours is then `table
// inet mesh_ambient_pod` in each pod and `table inet mesh_ambient_host` in the node, and no
// iptables rule or ipset of ours anywhere.
//
// The steps share state (one node, one agent at a time), in order: pre-existing pod, new pod,
// traffic, ztunnel down and back, unlabel, delete, upgrade restart, uninstall. Everything made
// here (containers, netns, cgroup dirs, listeners, sockets, dirs) is removed in `after`, pass or
// fail; the ipset and rules of the node live in the node netns and go with it.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { PLUGIN_SERVICE_ACCOUNT, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { addHostNetns, apiAndTree, podmanOn, runCleanups } from '../helpers/e2e-node.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import type { HostTree } from '../helpers/hosttree.ts';
import {
  makeNetnsPods,
  podCgroupParent,
  removePodCgroups,
  runPodContainer,
  type KubepodsContainer,
} from '../helpers/kubepods.ts';
import type { Podman } from '../helpers/podman.ts';
import { waitFor } from '../helpers/poll.ts';
import { connectFrom, listenIn, ZtunnelListeners, type Listening } from '../helpers/ztunnel-listeners.ts';
import { DEFAULT_TEMPLATE } from '../../src/install/template.ts';
import { sh } from '../helpers/sh.ts';
import { rulesIn } from '../helpers/netns.ts';
import { assertWrittenWith, type Backend } from '../helpers/sidecar-traffic.ts';
import { HOST_TABLE } from '../../src/ambient/hostnft.ts';
import { AMBIENT_POD_TABLE } from '../../src/ambient/podbackend.ts';

const NODE = 'node-1';
const NS = 'demo';
const MODE_LABEL = 'mesh.io/dataplane-mode';
const REDIRECTION = 'ambient.mesh.io/redirection';
const PROBE_SET = 'mesh-inpod-probes-v4';
const PROBE_SNAT = '169.254.7.127';
const IN_POD_CHAIN = /^:MESH_PRERT /m;
const HOST_RULE = /^-A POSTROUTING -j MESH_POSTRT$/m;
const SELF = { name: 'mesh-cni-node-amb', namespace: 'mesh-system' };
const DAEMONSET = 'mesh-cni-node';

function primaryConflist(network: string, subnet: string, bridge: string, ipamDir: string): string {
  // What a primary CNI would write: indented its own way, with a field we do not know.
  return `{
    "cniVersion": "1.0.0",
    "name": "${network}",
    "x-vendor-note": "written by the ambient e2e test as the primary CNI",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "${bridge}",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "routes": [{ "dst": "0.0.0.0/0" }],
                "ranges": [[{ "subnet": "${subnet}.0/24", "gateway": "${subnet}.1" }]],
                "dataDir": "${ipamDir}"
            }
        }
    ]
}
`;
}

/** Parses one sample of the agent's /metrics text; 0 when absent. */
function sample(metrics: string, name: string, labels: Record<string, string> = {}): number {
  for (const line of metrics.split('\n')) {
    const m = /^([^{ ]+)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) return Number(m[3]);
  }
  return 0;
}

const startFailed = (r: Record<string, unknown>) => r.msg === 'cannot start ambient mode; retrying';

interface PodContainer extends KubepodsContainer {
  readonly uid: string;
}

/**
 * The whole story on a node whose iptables flavour is `flavour` (the agent detects it as the
 * plugin does: a legacy hint chain in the node netns makes it legacy), on subnet `<subnet>.0/24`,
 * with the agent's redirect backend `backend` (--native-nftables). With native nftables the steps
 * that write, remove or keep ours run (enrolment, traffic, unlabel, delete, upgrade restart,
 * uninstall), not the ztunnel-down ones nor the restart in an outage: what differs there is
 * where ours is written and how it goes, which those steps check.
 */
function ambientSuite(flavour: 'nft' | 'legacy', subnet: string, backend: Backend = 'iptables'): void {
  const native = backend === 'nftables';
  const where = native ? 'native nftables' : `iptables-${flavour}`;
  describe(
    `e2e: ambient mode on one node, ${where} (podman, install-cni, mesh-cni, a fake ztunnel)`,
    { timeout: 900_000 },
    () => {
      const TAG = `mcni-amb-${process.pid}-${flavour[0]}${native ? 'x' : ''}`;
      const NETWORK = TAG;
      const GATEWAY = `${subnet}.1`;
      const hostNetns = `${TAG}-host`;
      const hostNetnsPath = `/run/netns/${hostNetns}`;
      const bridge = `mcnia${flavour[0]}${native ? 'x' : ''}${process.pid % 100000}`.slice(0, 15);
      const IMAGE = `localhost/${TAG}-busybox:latest`;
      let api: TestApiServer;
      let tree: HostTree;
      let podman: Podman;
      let primaryFile: string;
      let primaryBytes: Buffer;
      let zdsDir: string;
      let zdsSocket: string;
      let agent: AgentProcess | undefined;
      let fake: FakeZtunnel | undefined;
      const proxies = new ZtunnelListeners();
      const cleanups: (() => unknown)[] = [];
      const pods = new Map<string, PodContainer>();

      const inNode = (args: readonly string[]) => sh(['nsenter', `--net=${hostNetnsPath}`, '--', ...args]);
      /** The enrolled IPs in the node's probe set: the ipset, or our nftables table's set. */
      const probeSet = (): string[] => (native ? nftProbeSet() : ipsetProbeSet());
      const nftProbeSet = (): string[] => {
        const argv = ['nft', '-j', 'list', 'set', 'inet', HOST_TABLE, PROBE_SET];
        const r = spawnSync('nsenter', [`--net=${hostNetnsPath}`, '--', ...argv], { encoding: 'utf8' });
        if (r.status !== 0) return [];
        const out = JSON.parse(r.stdout) as { nftables: { set?: { elem?: (string | { elem: { val: string } })[] } }[] };
        const elems = out.nftables.flatMap((o) => o.set?.elem ?? []);
        return elems.map((e) => (typeof e === 'string' ? e : e.elem.val));
      };
      const ipsetProbeSet = (): string[] => {
        const r = spawnSync('nsenter', [`--net=${hostNetnsPath}`, '--', 'ipset', 'save', PROBE_SET], {
          encoding: 'utf8',
        });
        if (r.status !== 0) return [];
        return r.stdout
          .split('\n')
          .filter((l) => l.startsWith('add '))
          .map((l) => l.split(' ')[2]!);
      };
      const hasProbeSet = () =>
        spawnSync('nsenter', [`--net=${hostNetnsPath}`, '--', 'ipset', 'list', '-n'], { encoding: 'utf8' })
          .stdout.split('\n')
          .includes(PROBE_SET);
      const nodeNat = () => inNode(['iptables-nft-save', '-t', 'nat']) + inNode(['iptables-legacy-save', '-t', 'nat']);
      const hostTable = new RegExp(`^table inet ${HOST_TABLE}$`, 'm');
      /** The node's probe path in the agent's backend, and nothing of ours in the other. */
      const assertHostProbePath = (): void => {
        if (native) {
          assert.match(inNode(['nft', 'list', 'tables']), hostTable, 'our host table');
          assert.doesNotMatch(nodeNat(), /MESH_POSTRT/, 'no host probe rule of ours in iptables');
          assert.ok(!hasProbeSet(), 'no probe ipset');
        } else {
          assert.match(nodeNat(), HOST_RULE, 'the host probe rule');
          assert.doesNotMatch(inNode(['nft', 'list', 'tables']), hostTable, 'no host table of ours');
        }
      };
      /**
       * `ip` out of the probe set, read off a set that is there: a missing set reads empty, and
       * the host rule (iptables' --match-set, nft's @set) holds its set while it is there.
       */
      const assertOutOfProbeSet = (ip: string, who: string): void => {
        assertHostProbePath();
        assert.ok(!probeSet().includes(ip), `${who} out of the probe set`);
      };
      /** The pod's in-pod rules in the agent's backend, and none of ours in the other. */
      const assertInPod = async (netnsPath: string): Promise<void> => {
        await assertWrittenWith(backend, netnsPath, AMBIENT_POD_TABLE);
        if (!native) {
          assert.match(rulesIn(netnsPath), IN_POD_CHAIN);
          const save = sh(['nsenter', `--net=${netnsPath}`, '--', `iptables-${flavour}-save`]);
          assert.match(save, IN_POD_CHAIN, `written with iptables-${flavour}, the node's flavour`);
        }
      };
      /** The pod's rules in the agent's backend, to see them untouched (nft's without counters). */
      const podRules = (netnsPath: string): string =>
        native
          ? sh(['nsenter', `--net=${netnsPath}`, '--', 'nft', '-s', 'list', 'table', 'inet', AMBIENT_POD_TABLE])
          : rulesIn(netnsPath);
      /** Nothing of ours in the pod's netns, in either backend. */
      const assertNoPodRules = (netnsPath: string, who: string): void => {
        assert.doesNotMatch(rulesIn(netnsPath), /MESH_/, `no iptables rules of ours left in ${who}'s netns`);
        const tables = sh(['nsenter', `--net=${netnsPath}`, '--', 'nft', 'list', 'tables']);
        assert.doesNotMatch(tables, /mesh_/, `no nftables table of ours left in ${who}'s netns`);
      };
      /** A step of the story on iptables only (see ambientSuite). */
      const iptablesStep = (name: string, fn: () => Promise<void>): void => {
        if (!native) it(name, fn);
      };
      const redirection = (name: string) => api.getPod(NS, name)?.metadata?.annotations?.[REDIRECTION];
      const agentLogs = () =>
        (agent?.logs ?? [])
          .filter((r) => ['ambient', 'cni', 'install'].includes(String(r.scope)))
          .slice(-20)
          .map((r) => JSON.stringify(r))
          .join('\n');
      const metrics = async () => (await agent!.get('/metrics')).body;

      /** The pod object the kubelet would have: in `demo`, on this node, no sidecar. */
      const podObject = (name: string, uid: string, labels: Record<string, string> = {}): V1Pod => ({
        metadata: { name, namespace: NS, uid, labels, annotations: {} },
        spec: { nodeName: NODE, serviceAccountName: 'demo-sa', containers: [{ name: 'app', image: IMAGE }] },
        status: { phase: 'Pending' },
      });
      /** The kubelet's part once the sandbox is up: the pod runs with the IP the runtime gave it. */
      const kubeletReports = (name: string, ip: string, extra: Record<string, string> = {}) => {
        const cur = api.getPod(NS, name)!;
        api.upsertPod({
          ...cur,
          metadata: { ...cur.metadata, annotations: { ...cur.metadata?.annotations, ...extra } },
          status: { ...cur.status, phase: 'Running', podIP: ip, podIPs: [{ ip }], hostIP: GATEWAY },
        });
      };

      /** `podman run` of a container of pod `uid` (the caller made the pod object); removed in `after`. */
      async function startPod(name: string, uid: string): Promise<PodContainer> {
        cleanups.push(async () => {
          await podman.run(['rm', '--force', '--time', '0', name]);
          const left = await removePodCgroups(uid);
          if (left.length > 0) throw new Error(`cgroup dirs left: ${left.join(', ')}`);
        });
        const c = await runPodContainer(podman, { name, uid, network: NETWORK, image: IMAGE, argv: ['sleep', '600'] });
        const p = { ...c, uid };
        pods.set(name, p);
        return p;
      }

      function startAgent(): AgentProcess {
        const a = spawnAgent(
          tree,
          {
            'cni-net-dir': tree.netDir,
            'cni-bin-dir': tree.binDir,
            'cleanup-on-exit': 'auto',
            'log-level': 'info',
            'repair-enabled': 'false',
            'ambient-enabled': 'true',
            'native-nftables': String(native),
            'ztunnel-uds-address': zdsSocket,
            'host-proc-dir': '/proc',
            'host-netns-path': '/proc/self/ns/net',
            'host-root': '/',
            'pluginevent-uds-address': path.join(tree.root, 'run/pluginevent.sock'),
            log_output_level: 'default:info,install:debug,cni:debug,ambient:debug',
            // podman names no namespace; this test's pods live in demo, so the plugin is told to assume it.
            'cni-network-config': DEFAULT_TEMPLATE.replace(
              '"orch": {',
              `"orch": {\n    "assume_namespace_when_missing": "${NS}",`,
            ),
          },
          {
            KUBERNETES_SERVICE_HOST: '127.0.0.1',
            KUBERNETES_SERVICE_PORT: String(api.port),
            NODE_NAME: NODE,
            POD_NAME: SELF.name,
            POD_NAMESPACE: SELF.namespace,
            HOST_IP: GATEWAY,
          },
          'source',
          { netnsPath: hostNetnsPath },
        );
        agent = a;
        return a;
      }

      /** A fake ztunnel whose proxies are `proxies`; it connects (with backoff) to the agent's ZDS socket. */
      function startFake(): FakeZtunnel {
        fake = new FakeZtunnel({ path: zdsSocket, workloads: proxies });
        return fake;
      }
      async function stopFake(): Promise<void> {
        await fake?.stop();
        fake = undefined;
        await proxies.stopAll();
      }

      before(async () => {
        for (const bin of ['dist/bin/mesh-cni'])
          assert.ok(existsSync(path.join(ROOT, bin)), `${bin} is missing: run npm run build first`);
        addHostNetns(hostNetns, cleanups);
        // Kubernetes' flavour hint (iptables-wrapper): a node whose kubelet uses iptables-legacy.
        if (flavour === 'legacy') inNode(['iptables-legacy', '-t', 'mangle', '-N', 'KUBE-IPTABLES-HINT']);

        ({ api, tree } = await apiAndTree(hostNetnsPath, cleanups, { bookmarkIntervalMs: 1000 }));
        const ipamDir = path.join(tree.root, 'ipam');
        await fs.mkdir(ipamDir);
        primaryFile = path.join(tree.netDir, '10-mcni-amb.conflist');
        await fs.writeFile(primaryFile, primaryConflist(NETWORK, subnet, bridge, ipamDir));
        primaryBytes = await fs.readFile(primaryFile);
        // ztunnel's socket dir (the DaemonSet's /var/run/ztunnel): made once the agent is running, so
        // that its start-up is seen failing, not ready, until then.
        zdsDir = path.join(tree.root, 'ztunnel');
        zdsSocket = path.join(zdsDir, 'ztunnel.sock');

        podman = await podmanOn(
          NETWORK,
          IMAGE,
          { cniPluginDirs: [tree.binDir, '/usr/lib/cni'], networkConfigDir: tree.netDir, hostNetns: hostNetnsPath },
          cleanups,
        );

        api.upsertNamespace({ metadata: { name: NS, labels: { [MODE_LABEL]: 'ambient' } } });
        api.upsertNamespace({ metadata: { name: SELF.namespace } });
        // The plugin's account as the ambient component grants it: podman passes no K8S_POD_UID, so the
        // plugin cannot ask the agent (a lookup needs the uid) and reads the pod and its namespace itself.
        api.serviceAccount(PLUGIN_SERVICE_ACCOUNT.namespace, PLUGIN_SERVICE_ACCOUNT.name, [
          { verbs: ['get'], apiGroups: [''], resources: ['pods'] },
          { verbs: ['get'], apiGroups: [''], resources: ['namespaces'] },
        ]);
        // Our own pod, owned by a DaemonSet the API server has: a restart is an upgrade until the
        // DaemonSet goes (the uninstall step).
        // Its template as deploy/daemonset.yaml's (Linux nodes, every taint tolerated), and this
        // node, which it targets: --cleanup-on-exit=auto reads both.
        api.upsertDaemonSet({
          metadata: { name: DAEMONSET, namespace: SELF.namespace, uid: 'ds-uid' },
          spec: {
            selector: {},
            template: {
              spec: {
                hostNetwork: true,
                nodeSelector: { 'kubernetes.io/os': 'linux' },
                tolerations: [{ operator: 'Exists' }],
                containers: [{ name: 'install-cni', image: 'mesh-cni' }],
              },
            },
          },
        });
        api.upsertNode({ metadata: { name: NODE, labels: { 'kubernetes.io/os': 'linux' } } });
        api.upsertPod({
          metadata: {
            ...SELF,
            ownerReferences: [
              { apiVersion: 'apps/v1', kind: 'DaemonSet', name: DAEMONSET, uid: 'ds-uid', controller: true },
            ],
          },
          spec: { nodeName: NODE, hostNetwork: true, containers: [{ name: 'install-cni', image: 'mesh-cni' }] },
        });
      });

      after(async () => {
        await agent?.stop('SIGKILL');
        await stopFake().catch(() => undefined);
        await runCleanups(cleanups, 'e2e-ambient cleanup');
      });

      it('pre-existing pod: enrolled at start-up (not ready before), Add with its netns, SnapshotSent', async () => {
        const uidA = randomUUID();
        api.upsertPod(podObject(`${TAG}-a`, uidA));
        // Before the agent: the chain is the primary plugin alone; the pod runs unredirected.
        const a = await startPod(`${TAG}-a`, uidA);
        assert.doesNotMatch(rulesIn(a.netnsPath), IN_POD_CHAIN);
        // As a previous agent would have left it: enrolled.
        kubeletReports(a.name, a.ip, { [REDIRECTION]: 'enabled' });

        const ag = startAgent();
        // The ZDS socket's dir is not there yet: ambient cannot start, and /readyz must say so.
        let last = '';
        const notReady = await waitFor(
          'install-cni to say ambient is not ready (no ztunnel socket dir yet)',
          async () => {
            const r = await ag.get('/readyz');
            last = `${r.status} ${r.body}`;
            return (r.status === 503 && /ambient/.test(r.body)) || (ag.logs.filter(startFailed).length >= 3 && 'never');
          },
          { timeoutMs: 30_000, everyMs: 100, context: agentLogs },
        );
        await fs.mkdir(zdsDir, { mode: 0o750 });
        await waitFor('install-cni to be ready', async () => (await ag.get('/readyz')).status === 200, {
          timeoutMs: 30_000,
          everyMs: 100,
          context: agentLogs,
        });
        const z = startFake();
        const conf = JSON.parse(await fs.readFile(primaryFile, 'utf8')) as { plugins: Record<string, unknown>[] };
        assert.deepEqual(
          conf.plugins.map((p) => p.type),
          ['bridge', 'mesh-cni'],
        );

        const add = await waitFor('Add(uidA) at the fake ztunnel', () => z.of('add').find((r) => r.uid === uidA), {
          timeoutMs: 30_000,
          context: agentLogs,
        });
        assert.equal(add.netnsIno, statSync(`/proc/${a.pid}/ns/net`, { bigint: true }).ino, "the container's netns");
        assert.deepEqual(add.info, { name: a.name, namespace: NS, serviceAccount: 'demo-sa' });
        await z.waitForNth('snapshot_sent', 1);
        assert.deepEqual(
          z.records.filter((r) => r.conn === 1 && r.kind !== 'connected').map((r) => r.kind),
          ['add', 'snapshot_sent'],
        );
        assert.equal(z.openFds, 0);
        await assertInPod(a.netnsPath);
        assert.deepEqual(probeSet(), [a.ip], 'the probe set holds its IP');
        assertHostProbePath();
        await waitFor(
          'mesh_cni_ztunnel_connections 1',
          async () => sample(await metrics(), 'mesh_cni_ztunnel_connections') === 1,
        );
        assert.equal(redirection(a.name), 'enabled');
        assert.equal(conf.plugins[1]!.ambient_enabled, true, 'the entry says ambient');
        assert.notEqual(notReady, 'never', `/readyz while ambient could not start: ${last}`);
      });

      it('new pod: /cmdadd 200, Add(uidB) before `podman run` returns, annotated enabled', async () => {
        const uidB = randomUUID();
        const name = `${TAG}-b`;
        api.upsertPod(podObject(name, uidB));
        const before200 = sample(await metrics(), 'mesh_cni_plugin_requests_total', { response_code: '200' });
        const b = await startPod(name, uidB);
        // podman run has returned: the Add must be there already (the ADD waited for ztunnel's ack).
        const add = fake!.of('add').find((r) => r.uid === uidB);
        assert.ok(add, `Add(uidB) before podman run returned:\n${agentLogs()}`);
        assert.equal(add.netnsIno, statSync(`/proc/${b.pid}/ns/net`, { bigint: true }).ino);
        assert.ok(add.acked);
        assert.equal(
          sample(await metrics(), 'mesh_cni_plugin_requests_total', { response_code: '200' }),
          before200 + 1,
          'the plugin POSTed /cmdadd once, answered 200',
        );
        kubeletReports(name, b.ip);
        await waitFor('the annotation enabled on pod B', () => redirection(name) === 'enabled', { context: agentLogs });
        await assertInPod(b.netnsPath);
        await waitFor('B in the probe set', () => probeSet().includes(b.ip));
        assert.deepEqual(proxies.uids.sort(), [pods.get(`${TAG}-a`)!.uid, uidB].sort());
      });

      it(`traffic (${native ? 'native nftables' : flavour}): probe SNAT, inbound 15006, 15008 direct, outbound 15001, marked direct`, async () => {
        const b = pods.get(`${TAG}-b`)!;
        await assertInPod(b.netnsPath);
        // A peer pod in demo that opted out (label none): no redirection, a plain server on 9090.
        const uidP = randomUUID();
        const peerName = `${TAG}-peer`;
        api.upsertPod(podObject(peerName, uidP, { [MODE_LABEL]: 'none' }));
        const peer = await startPod(peerName, uidP);
        kubeletReports(peerName, peer.ip);
        assert.doesNotMatch(rulesIn(peer.netnsPath), IN_POD_CHAIN, 'the opted-out pod has no in-pod rules');
        assert.doesNotMatch(sh(['nsenter', `--net=${peer.netnsPath}`, '--', 'nft', 'list', 'tables']), /mesh_/);
        assert.equal(fake!.of('add').filter((r) => r.uid === uidP).length, 0, 'and no Add');
        const listening: Listening[] = [];
        cleanups.push(async () => {
          for (const l of listening) await l.stop();
        });
        listening.push(await listenIn(b.netnsPath, [8080]), await listenIn(peer.netnsPath, [9090]));

        const [port, source] = await connectFrom(hostNetnsPath, b.ip, 8080);
        assert.deepEqual([port, source], ['8080', PROBE_SNAT], 'node -> pod: the app sees the probe address');
        assert.deepEqual(await connectFrom(peer.netnsPath, b.ip, 8080), ['15006', peer.ip, `${b.ip}:8080`], 'inbound');
        assert.deepEqual(
          (await connectFrom(peer.netnsPath, b.ip, 15008)).slice(0, 2),
          ['15008', peer.ip],
          '15008 direct',
        );
        assert.deepEqual(await connectFrom(b.netnsPath, peer.ip, 9090), ['15001', b.ip, `${peer.ip}:9090`], 'outbound');
        assert.deepEqual((await connectFrom(b.netnsPath, peer.ip, 9090, 1337)).slice(0, 2), ['9090', b.ip], 'marked');
        // What ztunnel's proxies of B saw, with the original destinations.
        assert.deepEqual(
          proxies.connections(b.uid).map((c) => [c.port, c.source, c.originalDst]),
          [
            [15006, peer.ip, `${b.ip}:8080`],
            [15008, peer.ip, `${b.ip}:15008`],
            [15001, b.ip, `${peer.ip}:9090`],
          ],
        );
      });

      iptablesStep(
        'ztunnel down: ADD fails (code 11, names ztunnel), pod pending; ztunnel back: a new snapshot',
        async () => {
          await stopFake();
          await waitFor(
            'mesh_cni_ztunnel_connections 0',
            async () => sample(await metrics(), 'mesh_cni_ztunnel_connections') === 0,
          );
          const uidC = randomUUID();
          const name = `${TAG}-c`;
          api.upsertPod(podObject(name, uidC));
          cleanups.push(async () => {
            await podman.run(['rm', '--force', '--time', '0', name]);
            await removePodCgroups(uidC);
          });
          const r = await podman.run([
            ...['run', '--detach', '--name', name, '--cgroup-parent', podCgroupParent(uidC)],
            ...['--network', NETWORK, IMAGE, 'sleep', '600'],
          ]);
          assert.notEqual(r.code, 0, 'podman run fails: the pod never starts unredirected');
          assert.match(r.stderr, /ztunnel/, `the runtime's error names ztunnel: ${r.stderr}`);
          const said = await agent!.waitForLog(
            (l) => l.scope === 'cni' && l.level === 'error' && /ztunnel/.test(JSON.stringify(l)),
            "the plugin's error record naming ztunnel",
            10_000,
          );
          assert.equal(said.code, 11, `CNI error 11 (try again later): ${JSON.stringify(said)}`);
          await waitFor('pod C annotated pending', () => redirection(name) === 'pending', { context: agentLogs });
          assert.ok(sample(await metrics(), 'mesh_cni_plugin_requests_total', { response_code: '500' }) >= 1);
          // The runtime gave up on the sandbox (podman removed it); the pod goes from the API too, and
          // the agent lets go of the netns it held for the retry (the removal of a pending pod).
          await podman.run(['rm', '--force', '--time', '0', name]);
          api.deletePodFromStore(NS, name);
          await agent!.waitForLog(
            (l) => l.scope === 'ambient' && l.msg === 'ambient: removed' && l.uid === uidC,
            'the agent to remove pod C',
            15_000,
          );

          // ztunnel back: it gets every enrolled pod again (A and B, not C), then SnapshotSent.
          const z = startFake();
          await z.waitForNth('snapshot_sent', 1);
          const adds = z.of('add').map((r) => r.uid);
          assert.deepEqual(adds.sort(), [pods.get(`${TAG}-a`)!.uid, pods.get(`${TAG}-b`)!.uid].sort());
          assert.equal(z.of('keep').length, 0);
        },
      );

      iptablesStep(
        'ztunnel down, a running pod the informer enrolls: pending, retried, enabled with ztunnel back',
        async () => {
          await stopFake();
          await waitFor(
            'mesh_cni_ztunnel_connections 0',
            async () => sample(await metrics(), 'mesh_cni_ztunnel_connections') === 0,
          );
          // A pod whose sandbox the plugin never saw (a netns + a sleep in its kubelet-shaped cgroup):
          // the informer enrolls it once its status has an IP, finding its netns in /proc.
          const fleet = makeNetnsPods(`${TAG}-d`, 1, flavour === 'nft' ? '198.18.71' : '198.18.72');
          cleanups.push(async () => fleet.remove());
          const d = fleet.pods[0]!;
          // Added first (an added pod is the plugin's), then the kubelet writes its status: an update.
          api.upsertPod(podObject(d.name, d.uid));
          await new Promise((r) => setTimeout(r, 200));
          kubeletReports(d.name, d.ip);
          await waitFor('pod D annotated pending (ztunnel is down)', () => redirection(d.name) === 'pending', {
            timeoutMs: 15_000,
            context: agentLogs,
          });
          assert.ok(!probeSet().includes(d.ip), 'not in the probe set while ztunnel has not taken it');

          const z = startFake();
          await waitFor('pod D enrolled by the retry', () => redirection(d.name) === 'enabled', {
            timeoutMs: 20_000,
            context: agentLogs,
          });
          const adds = z.of('add').filter((r) => r.uid === d.uid);
          assert.ok(adds.length >= 1 && adds.every((r) => r.acked));
          assert.equal(adds.at(-1)!.netnsIno, statSync(d.netnsPath, { bigint: true }).ino, "D's netns");
          assert.ok(probeSet().includes(d.ip), 'D in the probe set');
          assert.match(rulesIn(d.netnsPath), IN_POD_CHAIN);

          // D goes (deleted from the API): Del, out of the probe set.
          api.deletePodFromStore(NS, d.name);
          await z.waitFor((r) => r.kind === 'del' && r.uid === d.uid);
          await waitFor('D out of the probe set', () => !probeSet().includes(d.ip), { context: agentLogs });
          fleet.remove();
        },
      );

      it('unlabel: pod B labelled none: Del(uidB), rules, probe set entry, annotation gone; traffic direct', async () => {
        const b = pods.get(`${TAG}-b`)!;
        const peer = pods.get(`${TAG}-peer`)!;
        const cur = api.getPod(NS, b.name)!;
        api.upsertPod({
          ...cur,
          metadata: { ...cur.metadata, labels: { ...cur.metadata?.labels, [MODE_LABEL]: 'none' } },
        });
        await waitFor('Del(uidB) at the fake ztunnel', () => fake!.of('del').some((r) => r.uid === b.uid), {
          context: agentLogs,
        });
        await waitFor('the annotation removed from B', () => redirection(b.name) === undefined, { context: agentLogs });
        assertNoPodRules(b.netnsPath, 'B');
        assertOutOfProbeSet(b.ip, 'B');
        assert.ok(!proxies.uids.includes(b.uid));
        // And by traffic (the traffic step's servers still listen): B is reached and reaches out
        // directly, and the node's connection keeps its own source, not the probe address.
        assert.deepEqual((await connectFrom(peer.netnsPath, b.ip, 8080)).slice(0, 2), ['8080', peer.ip], 'inbound');
        assert.deepEqual((await connectFrom(b.netnsPath, peer.ip, 9090)).slice(0, 2), ['9090', b.ip], 'outbound');
        assert.deepEqual((await connectFrom(hostNetnsPath, b.ip, 8080)).slice(0, 2), ['8080', GATEWAY], 'node -> B');
      });

      it('delete: pod A removed (podman rm, then the API delete): Del(uidA), probe set entry gone', async () => {
        const a = pods.get(`${TAG}-a`)!;
        await podman.ok(['rm', '--force', '--time', '0', a.name]);
        api.deletePodFromStore(NS, a.name);
        await waitFor('Del(uidA) at the fake ztunnel', () => fake!.of('del').some((r) => r.uid === a.uid), {
          context: agentLogs,
        });
        await waitFor('A out of the probe set', () => !probeSet().includes(a.ip), { context: agentLogs });
        assertOutOfProbeSet(a.ip, 'A');
      });

      it('upgrade restart (DaemonSet present): host rule and probe set stay, the snapshot is sent again', async () => {
        // B back in the mesh first, so there is an enrolled pod to keep.
        const b = pods.get(`${TAG}-b`)!;
        const cur = api.getPod(NS, b.name)!;
        const labels = { ...cur.metadata?.labels };
        delete labels[MODE_LABEL];
        api.upsertPod({ ...cur, metadata: { ...cur.metadata, labels } });
        await waitFor('B enrolled again', () => redirection(b.name) === 'enabled' && probeSet().includes(b.ip), {
          context: agentLogs,
        });
        await assertInPod(b.netnsPath);
        const rulesBefore = podRules(b.netnsPath);
        const connsBefore = fake!.connections;
        const delsBefore = fake!.of('del').length;

        assert.equal(await agent!.stop('SIGTERM', 30_000), 0);
        agent = undefined;
        assertHostProbePath();
        assert.deepEqual(probeSet(), [b.ip], 'the probe set and its entry stay');
        assert.equal(podRules(b.netnsPath), rulesBefore, "B's in-pod rules untouched");

        const ag = startAgent();
        await waitFor('install-cni to be ready again', async () => (await ag.get('/readyz')).status === 200, {
          timeoutMs: 30_000,
          everyMs: 100,
          context: agentLogs,
        });
        const z = fake!;
        const sent = await z.waitFor((r) => r.kind === 'snapshot_sent' && r.conn > connsBefore);
        assert.deepEqual(
          z.of('add', sent.conn).map((r) => r.uid),
          [b.uid],
          'the new agent sends B (netns found again from /proc)',
        );
        assert.equal(z.of('add', sent.conn)[0]!.netnsIno, statSync(`/proc/${b.pid}/ns/net`, { bigint: true }).ino);
        assertHostProbePath();
        assert.deepEqual(probeSet(), [b.ip]);
        await assertInPod(b.netnsPath);
        assert.equal(fake!.of('del').length, delsBefore, 'ztunnel was told to drop nothing');
        assert.equal(redirection(b.name), 'enabled');
      });

      // The agent restarted while the control plane is down: nothing says this is an uninstall, so
      // the node stays as it is and every enrolled pod stays redirected (its in-pod rules, the
      // probe rule and ipset), and new pods still get the plugin (entry, orchconfig, binary).
      const outage = flavour === 'nft' ? 'answers 503' : 'is unreachable';
      iptablesStep(
        `restart while the API server ${outage}: entry, orchconfig, binary, host rule, ipset, in-pod rules stay`,
        async () => {
          const b = pods.get(`${TAG}-b`)!;
          const rulesBefore = rulesIn(b.netnsPath);
          assert.match(rulesBefore, IN_POD_CHAIN);
          const primaryBefore = await fs.readFile(primaryFile, 'utf8');
          assert.match(primaryBefore, /"type": ?"mesh-cni"/, 'our entry is in the primary config');
          const stopping = agent!;
          if (flavour === 'nft') api.faults.status = { code: 503 };
          else await api.stop();
          try {
            assert.equal(await stopping.stop('SIGTERM', 30_000), 0);
          } finally {
            delete api.faults.status;
            await api.start();
          }
          agent = undefined;
          assert.equal(await fs.readFile(primaryFile, 'utf8'), primaryBefore, 'the entry stays');
          assert.ok(existsSync(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')), 'the orchconfig stays');
          assert.ok(existsSync(path.join(tree.binDir, 'mesh-cni')), 'the binary stays');
          assert.match(nodeNat(), HOST_RULE, 'the host rule stays');
          assert.deepEqual(probeSet(), [b.ip], 'the ipset and its entry stay');
          assert.equal(rulesIn(b.netnsPath), rulesBefore, "B's in-pod rules untouched: still redirected");
          assert.equal(redirection(b.name), 'enabled');
          const kept = stopping.logs.find(
            (r) => r.msg === 'cannot tell whether this stop is an uninstall: keeping mesh-cni on this node',
          );
          // Unreachable behind the node's forwarder: connections are taken, then go unanswered.
          const reasons = flavour === 'nft' ? ['server_error'] : ['unreachable', 'timeout'];
          assert.ok(reasons.includes(String(kept?.reason)), `kept for ${String(kept?.reason)}\n${agentLogs()}`);
          assert.ok(stopping.logs.some((r) => r.msg === 'ambient: keeping the node as is'));

          // The control plane back: the next agent takes the node over as after any upgrade.
          const ag = startAgent();
          await waitFor('install-cni to be ready again', async () => (await ag.get('/readyz')).status === 200, {
            timeoutMs: 30_000,
            everyMs: 100,
            context: agentLogs,
          });
        },
      );

      it('uninstall (DaemonSet gone): host rule and ipset removed, the primary conflist byte for byte', async () => {
        api.deleteDaemonSetFromStore(SELF.namespace, DAEMONSET);
        assert.equal(await agent!.stop('SIGTERM', 30_000), 0);
        agent = undefined;
        assert.doesNotMatch(nodeNat(), /MESH_POSTRT/, 'the host rule is gone');
        assert.ok(!hasProbeSet(), 'the probe ipset is gone');
        assert.doesNotMatch(inNode(['nft', 'list', 'tables']), hostTable, 'our host table is gone');
        assert.deepEqual(
          await fs.readFile(primaryFile),
          primaryBytes,
          'the primary config is byte for byte the original',
        );
      });
    },
  );
}

ambientSuite('nft', '198.19.9');
ambientSuite('legacy', '198.19.10');
ambientSuite('nft', '198.19.11', 'nftables');

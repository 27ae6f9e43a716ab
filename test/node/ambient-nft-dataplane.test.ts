// Ambient mode on native nftables (--native-nftables decided true): the dataplane
// (src/ambient/dataplane.ts) writes the node's probe path as table inet mesh_ambient_host and each
// pod's redirection as table inet mesh_ambient_pod, on the real Debian nft. A test netns stands for
// the node (its runner by fd, as the agent's), joined by a veth to a pod netns whose app and
// "ztunnel" are python3 listeners on 8080 and 15006 (each answers with its port and the peer it
// saw). kubelet's probe is a connect from the node as kubelet's uid (setpriv): SNATed to the probe
// address, the pod's rules let it reach 8080; any other uid's connect is captured to 15006.
// Switching: a node whose agent wrote iptables + ipset restarts with nftables, and back; nothing of
// ours is left in the backend it moved from. Every netns, process, socket and temp dir is removed
// after each test (our tables and sets live in the netns and go with them).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it as nodeIt } from 'node:test';
import {
  createDataplane,
  type AmbientPod,
  type MeshDataplane,
  type PodAnnotator,
} from '../../src/ambient/dataplane.ts';
import { HOST_TABLE } from '../../src/ambient/hostnft.ts';
import { parseProbeSet, PROBE_SET_V4 } from '../../src/ambient/hostrules.ts';
import { AMBIENT_POD_TABLE } from '../../src/ambient/podbackend.ts';
import type { ZdsTimings } from '../../src/ambient/ztunnelserver.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { openNetns, runInNetns } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { spawnAgent } from '../helpers/agent.ts';
import { apiAndTree, runCleanups, type SuiteCleanups } from '../helpers/e2e-node.ts';
import { Netns, run } from '../helpers/netns.ts';
import { eventually } from '../helpers/poll.ts';
import { shStatus } from '../helpers/sh.ts';
import { CLIENT, listenIn, PYTHON } from '../helpers/ztunnel-listeners.ts';

const defer = cleanupAfterEach();
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 120_000 }, fn);

const NODE_TO_POD = '198.18.94.1';
const POD = '198.18.94.2';
const PROBE = '169.254.7.127';
const KUBELET_UID = 4242;
const FLAVOUR = 'nft';
const FAST: Partial<ZdsTimings> = {
  acceptsPerSecond: 1000,
  helloTimeoutMs: 2000,
  writeTimeoutMs: 2000,
  ackTimeoutMs: 2000,
  keepaliveIntervalMs: 50,
  keepaliveReadMs: 10,
};

const annotator: PodAnnotator = { setRedirection: async () => {} };

function netns(tag: string): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  return n;
}

/** node <-> pod over a veth; the pod's app on 8080 and "ztunnel" on 15006. */
async function topology() {
  const node = netns('anftnode');
  const pod = netns('anftpod');
  const ip = (ns: Netns, ...args: string[]) => shStatus(['ip', '-n', ns.name, ...args]);
  ip(node, 'link', 'add', 'to-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.name);
  ip(node, 'addr', 'add', `${NODE_TO_POD}/24`, 'dev', 'to-pod');
  ip(node, 'link', 'set', 'to-pod', 'up');
  ip(pod, 'addr', 'add', `${POD}/24`, 'dev', 'eth0');
  ip(pod, 'link', 'set', 'eth0', 'up');
  ip(pod, 'route', 'add', 'default', 'via', NODE_TO_POD);
  const app = await listenIn(pod.path, [8080, 15006]);
  defer(() => app.stop());
  const held = await openNetns(node.path, 0);
  defer(async () => held.close());
  const hostRun = (argv: readonly string[], o?: { input?: string }) =>
    runInNetns(held, argv, { input: o?.input ?? null });
  return { node, pod, hostRun };
}

type Topology = Awaited<ReturnType<typeof topology>>;

function dataplane(t: Topology, nativeNftables: boolean): { dp: MeshDataplane; sock: string } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-anft-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'ztunnel.sock');
  const base = buildSettings({}, {});
  const settings = {
    ...base,
    ambient: { ...base.ambient, ztunnelUdsAddress: sock, hostRoot: '/' },
    repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
  };
  const dp = createDataplane(
    { ...ambientArgs(settings), nativeNftables },
    {
      annotator,
      host: t.hostRun,
      flavour: async () => FLAVOUR,
      kubeletUid: async () => KUBELET_UID,
      zdsTimings: FAST,
    },
  );
  defer(() => dp.stop(false));
  return { dp, sock };
}

/** A started dataplane with a ztunnel that has its snapshot. */
async function started(t: Topology, nativeNftables: boolean, pods: readonly AmbientPod[] = []) {
  const { dp, sock } = dataplane(t, nativeNftables);
  await dp.start(pods);
  const zt = new FakeZtunnel({ path: sock });
  defer(() => zt.stop());
  await zt.waitForNth('snapshot_sent', 1);
  return dp;
}

const pod = (uid: string, ips: readonly string[] = [POD]): AmbientPod => ({
  uid,
  namespace: 'shop',
  name: 'cart',
  serviceAccount: 'cart',
  ips,
  annotations: {},
});

/** A connect from the node to the pod's 8080 as `uid`: "<port that took it> <source it saw>". */
async function probeAs(node: Netns, uid: number): Promise<string> {
  const as = ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups'];
  const r = await run('nsenter', [`--net=${node.path}`, '--', ...as, PYTHON, '-c', CLIENT, POD, '8080', '0'], {
    timeoutMs: 15_000,
  });
  if (r.code !== 0) throw new Error(`connect to ${POD}:8080 as uid ${uid} failed (${r.code}): ${r.stderr}`);
  return r.stdout.trim().split(' ').slice(0, 2).join(' ');
}

const HEALTHY = `8080 ${PROBE}`;
const CAPTURED = `15006 ${NODE_TO_POD}`;

/** Our nft table's set elements in `ns` (IP -> UID); null when the table is not there. */
function nftElements(ns: Netns): Record<string, string> | null {
  const r = shStatus(['ip', 'netns', 'exec', ns.name, 'nft', '-j', 'list', 'set', 'inet', HOST_TABLE, PROBE_SET_V4]);
  if (r.code !== 0) return null;
  const json = JSON.parse(r.out) as { nftables: { set?: { elem?: { elem: { val: string; comment?: string } }[] } }[] };
  const s = json.nftables.find((i) => i.set)!.set!;
  return Object.fromEntries((s.elem ?? []).map((e) => [e.elem.val, e.elem.comment ?? '']));
}
const hasTable = (ns: Netns, table: string) =>
  shStatus(['ip', 'netns', 'exec', ns.name, 'nft', 'list', 'table', 'inet', table]).code === 0;
/** The node's probe ipset (IP -> UID); null when it does not exist. */
function ipsetEntries(ns: Netns): Record<string, string> | null {
  const r = shStatus(['ip', 'netns', 'exec', ns.name, 'ipset', 'save', PROBE_SET_V4]);
  return r.code === 0 ? Object.fromEntries(parseProbeSet(r.out)) : null;
}
/** Any chain of ours in the netns's iptables (nat, mangle, raw), either flavour. */
const ourChains = (ns: Netns): string[] =>
  ['iptables-nft-save', 'iptables-legacy-save'].flatMap((bin) =>
    shStatus(['ip', 'netns', 'exec', ns.name, bin])
      .out.split('\n')
      .filter((l) => /^:MESH_|-j MESH_/.test(l)),
  );

describe('ambient mode on native nftables', () => {
  it("writes the node's probe table and the pod's table: kubelet's probes reach the app from the probe address, another uid's go to ztunnel", async () => {
    const t = await topology();
    const dp = await started(t, true);
    assert.equal(hasTable(t.node, HOST_TABLE), true, "the node's probe table");
    const uid = randomUUID();
    await dp.addPodToMesh(pod(uid), t.pod.path);
    assert.deepEqual(nftElements(t.node), { [POD]: uid });
    assert.equal(hasTable(t.pod, AMBIENT_POD_TABLE), true, "the pod's table");
    assert.deepEqual(ourChains(t.pod), [], 'no iptables chain of ours in the pod');
    assert.deepEqual([ipsetEntries(t.node), ourChains(t.node)], [null, []], 'no ipset or iptables rule on the node');

    assert.equal(await probeAs(t.node, KUBELET_UID), HEALTHY, "kubelet's probe: SNATed, past ztunnel");
    assert.equal(await probeAs(t.node, KUBELET_UID + 1), CAPTURED, "another uid's connect: to ztunnel");

    await dp.removePodFromMesh(pod(uid), false);
    assert.deepEqual(nftElements(t.node), {});
    assert.equal(hasTable(t.pod, AMBIENT_POD_TABLE), false, "the pod's table is out");
    assert.equal(await probeAs(t.node, KUBELET_UID + 1), `8080 ${NODE_TO_POD}`, 'unredirected again');
    await dp.stop(true);
    assert.equal(hasTable(t.node, HOST_TABLE), false, 'uninstall: the probe table is out');
  });

  it('iptables to nftables on a live node: the entries move, probes keep working, nothing of ours stays in iptables or ipset', async () => {
    const t = await topology();
    const uid = randomUUID();
    const before = await started(t, false);
    await before.addPodToMesh(pod(uid), t.pod.path);
    assert.deepEqual(ipsetEntries(t.node), { [POD]: uid });
    assert.equal(await probeAs(t.node, 0), HEALTHY, 'on iptables: the node socket is SNATed');
    await before.stop(false); // an upgrade: the node and the pod keep what they have

    // Restarted with nftables; the pod is running, its IP not in its status yet (a kubelet
    // restart): its entry is the old backend's only, and must come along.
    const after = await started(t, true, [pod(uid, [])]);
    assert.deepEqual(nftElements(t.node), { [POD]: uid }, 'the entry moved to the nft set');
    assert.equal(ipsetEntries(t.node), null, 'the ipset is gone');
    assert.deepEqual(ourChains(t.node), [], 'MESH_POSTRT and its jump are gone');
    assert.equal(await probeAs(t.node, KUBELET_UID), HEALTHY, "the pod's iptables rules still let the probe past");

    await after.addPodToMesh(pod(uid), t.pod.path);
    assert.equal(hasTable(t.pod, AMBIENT_POD_TABLE), true);
    assert.deepEqual(ourChains(t.pod), [], "the pod's iptables chains are out");
    assert.equal(await probeAs(t.node, KUBELET_UID), HEALTHY);
    assert.equal(await probeAs(t.node, KUBELET_UID + 1), CAPTURED);
  });

  it('nftables back to iptables: the entries move, nothing of ours stays in nftables', async () => {
    const t = await topology();
    const uid = randomUUID();
    const before = await started(t, true);
    await before.addPodToMesh(pod(uid), t.pod.path);
    assert.deepEqual([nftElements(t.node), hasTable(t.pod, AMBIENT_POD_TABLE)], [{ [POD]: uid }, true], 'on nftables');
    assert.equal(await probeAs(t.node, KUBELET_UID), HEALTHY);
    await before.stop(false);

    const after = await started(t, false, [pod(uid, [])]);
    assert.deepEqual(ipsetEntries(t.node), { [POD]: uid }, 'the entry moved to the ipset');
    assert.equal(hasTable(t.node, HOST_TABLE), false, "the node's nft table is gone");
    assert.equal(await probeAs(t.node, 0), HEALTHY, "the pod's nft table still lets the probe past");

    await after.addPodToMesh(pod(uid), t.pod.path);
    assert.equal(hasTable(t.pod, AMBIENT_POD_TABLE), false, "the pod's nft table is out");
    assert.notDeepEqual(ourChains(t.pod), [], "the pod's iptables chains are in");
    assert.equal(await probeAs(t.node, 0), HEALTHY);
    assert.equal(await probeAs(t.node, 1000), HEALTHY, 'iptables SNATs every node socket, whatever its uid');
    await after.removePodFromMesh(pod(uid), false);
    assert.deepEqual([hasTable(t.pod, AMBIENT_POD_TABLE), ourChains(t.pod)], [false, []]);
  });
});

describe('the agent with --native-nftables=true', () => {
  it("ambient mode writes the node's probe table, not MESH_POSTRT or the ipsets, and its uninstall removes it", async () => {
    const node = netns('anftagent');
    const cleanups: SuiteCleanups = [];
    defer(() => runCleanups(cleanups, 'agent'));
    const { api, tree } = await apiAndTree(node.path, cleanups);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-anft-agent-'));
    defer(async () => rmSync(dir, { recursive: true, force: true }));
    const agent = spawnAgent(
      tree,
      {
        'cni-net-dir': tree.netDir,
        'cni-bin-dir': tree.binDir,
        'cleanup-on-exit': 'always',
        'repair-enabled': 'false',
        'ambient-enabled': 'true',
        'native-nftables': 'true',
        'ztunnel-uds-address': path.join(dir, 'ztunnel.sock'),
        'pluginevent-uds-address': path.join(dir, 'pluginevent.sock'),
        'host-proc-dir': '/proc',
        'host-netns-path': '/proc/self/ns/net',
        'host-root': '/',
        log_output_level: 'default:info,ambient:debug',
      },
      {
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String(api.port),
        NODE_NAME: 'node-anft',
        POD_NAME: 'mesh-cni-node-anft',
        POD_NAMESPACE: 'mesh-system',
      },
      'source',
      { netnsPath: node.path },
    );
    defer(() => agent.stop('SIGKILL'));
    await agent.waitForLog((r) => r.msg === 'ambient dataplane started', 'the ambient dataplane started', 60_000);
    const uid = await agent.waitForLog((r) => /kubelet's uid/.test(String(r.msg)), "kubelet's uid said");
    assert.equal(uid.uid, 0, 'no kubelet in the node netns: uid 0, said');
    assert.equal(hasTable(node, HOST_TABLE), true, "the node's probe table");
    assert.deepEqual([ipsetEntries(node), ourChains(node)], [null, []], 'no ipset, no MESH_POSTRT');
    assert.equal(await agent.stop('SIGTERM', 30_000), 0);
    await eventually(() => !hasTable(node, HOST_TABLE), 'the uninstall removed the probe table');
  });
});

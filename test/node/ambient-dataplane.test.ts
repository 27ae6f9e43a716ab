// The ambient dataplane (src/ambient/dataplane.ts) on real things: a test netns stands for the
// node (its probe ipset and MESH_POSTRT), pods are `ip netns add` netns holding an address in
// 198.18.0.0/15 (and, for the start-up snapshot, a `sleep` in a kubelet-shaped cgroup, found by
// the /proc scan), the in-pod rules are real iptables of both flavours, and ztunnel is the fake
// ztunnel on a real SOCK_SEQPACKET socket. The annotator is a fake that records its calls.
// Every netns, process, cgroup dir and socket made is removed after each test. Root.

import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, it as nodeIt, mock } from 'node:test';
import {
  createDataplane,
  EnrollError,
  type AmbientPod,
  type MeshDataplane,
  type PodAnnotator,
} from '../../src/ambient/dataplane.ts';
import { parseProbeSet, PROBE_SET_V4, PROBE_SET_V6 } from '../../src/ambient/hostrules.ts';
import { applyInpod, podOptions, type Flavour } from '../../src/ambient/podrules.ts';
import type { ZdsTimings } from '../../src/ambient/ztunnelserver.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { openNetns, runInNetns } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { placeInPodCgroup, removePodCgroups } from '../helpers/kubepods.ts';
import { Netns, podNetnsWithVeth } from '../helpers/netns.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';
import { shStatus } from '../helpers/sh.ts';

const defer = cleanupAfterEach();
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 60_000 }, fn);

const FAST: Partial<ZdsTimings> = {
  acceptsPerSecond: 1000,
  helloTimeoutMs: 2000,
  writeTimeoutMs: 2000,
  ackTimeoutMs: 2000,
  keepaliveIntervalMs: 50,
  keepaliveReadMs: 10,
};

type Call = { uid: string; value: 'enabled' | 'pending' | null };
class FakeAnnotator implements PodAnnotator {
  readonly calls: Call[] = [];
  fail: string | null = null;
  async setRedirection(pod: { uid: string }, value: 'enabled' | 'pending' | null): Promise<void> {
    if (this.fail !== null) throw new Error(this.fail);
    this.calls.push({ uid: pod.uid, value });
  }
}

/** The test's node: a netns the host runner runs in, by fd as the agent's pod runner does. */
async function nodeNetns() {
  const n = new Netns('node');
  defer(async () => n.remove());
  const held = await openNetns(n.path, 0);
  defer(async () => held.close());
  return {
    ns: n,
    run: (argv: readonly string[], o?: { input?: string }) => runInNetns(held, argv, { input: o?.input ?? null }),
  };
}

function settingsFor(sock: string, over: Partial<Settings['ambient']> = {}): Settings {
  const base = buildSettings({}, {});
  return {
    ...base,
    ambient: { ...base.ambient, ztunnelUdsAddress: sock, hostRoot: '/', ...over },
    repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
  };
}

function socketPath(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ambdp-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'ztunnel.sock');
}

type Node = Awaited<ReturnType<typeof nodeNetns>>;

function dataplane(
  sock: string,
  ann: FakeAnnotator,
  node: Node,
  flavour: Flavour,
  over: Partial<Settings['ambient']> = {},
): MeshDataplane {
  const dp = createDataplane(ambientArgs(settingsFor(sock, over)), {
    annotator: ann,
    host: node.run,
    flavour: async () => flavour,
    zdsTimings: FAST,
  });
  defer(() => dp.stop(false));
  return dp;
}

function fakeZtunnel(sock: string): FakeZtunnel {
  const z = new FakeZtunnel({ path: sock });
  defer(() => z.stop());
  return z;
}

const ambientPod = (ip: string | null, over: Partial<AmbientPod> = {}): AmbientPod => ({
  uid: randomUUID(),
  namespace: 'shop',
  name: `cart-${ip ?? 'noip'}`,
  serviceAccount: 'cart',
  ips: ip === null ? [] : [ip],
  annotations: {},
  ...over,
});

/** Whether our in-pod chains are in the netns (nat table). */
const inpodRules = (ns: Netns, flavour: Flavour): boolean =>
  shStatus(['ip', 'netns', 'exec', ns.name, `iptables-${flavour}-save`, '-t', 'nat']).out.includes(':MESH_PRERT');
/** The node's probe set (IP -> UID), or null when the set does not exist. */
function probeEntries(node: Netns, family: 4 | 6 = 4): Map<string, string> | null {
  const r = shStatus(['ip', 'netns', 'exec', node.name, 'ipset', 'save', family === 4 ? PROBE_SET_V4 : PROBE_SET_V6]);
  return r.code === 0 ? parseProbeSet(r.out) : null;
}
const hostRule = (node: Netns, flavour: Flavour): boolean =>
  shStatus(['ip', 'netns', 'exec', node.name, `iptables-${flavour}-save`, '-t', 'nat']).out.includes(
    '-A POSTROUTING -j MESH_POSTRT',
  );
const inode = (p: string) => statSync(p, { bigint: true }).ino;

async function rejection(p: Promise<unknown>): Promise<EnrollError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof EnrollError, `an EnrollError, got ${String(e)}`);
    return e;
  }
  assert.fail('expected a rejection');
}

/** A `sleep` in `ns`, in a kubelet-shaped cgroup of pod `uid`: what the /proc scan finds. */
function runningPod(uid: string, ns: Netns): ChildProcess {
  const p = spawn('ip', ['netns', 'exec', ns.name, 'sleep', '300'], { stdio: 'ignore' });
  defer(async () => {
    p.kill('SIGKILL');
    await removePodCgroups(uid);
  });
  placeInPodCgroup(uid, p.pid!, 'sandbox');
  // ip netns exec enters the netns, then execs sleep: until then the scan would see the host's.
  const want = statSync(ns.path).ino;
  for (let i = 0; i < 500 && statSync(`/proc/${p.pid}/ns/net`).ino !== want; i++) spawnSync('sleep', ['0.01']);
  return p;
}

for (const flavour of ['nft', 'legacy'] as const) {
  describe(`ambient dataplane, iptables-${flavour}`, () => {
    it('adds in order: rules in the netns before ztunnel sees Add, the probe ipset after its ack, annotation last', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.2', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      assert.deepEqual(dp.notReadyReasons(), ['ambient: snapshot not built yet']);
      await dp.start([]);
      assert.deepEqual(dp.notReadyReasons(), []);
      assert.equal(hostRule(node.ns, flavour), true, 'MESH_POSTRT in the node');
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      zt.ackDelayMs = 300;
      const pod = ambientPod('198.18.50.2');
      const atAdd = zt
        .waitFor((r) => r.kind === 'add')
        .then((r) => ({
          ino: r.kind === 'add' ? r.netnsIno : null,
          rules: inpodRules(ns, flavour),
          probe: probeEntries(node.ns)?.get('198.18.50.2') ?? null,
          annotations: ann.calls.length,
        }));
      await dp.addPodToMesh(pod, ns.path);
      assert.deepEqual(await atAdd, { ino: inode(ns.path), rules: true, probe: null, annotations: 0 });
      assert.equal(probeEntries(node.ns)?.get('198.18.50.2'), pod.uid, 'the probe ipset entry after the ack');
      assert.deepEqual(ann.calls, [{ uid: pod.uid, value: 'enabled' }]);
      assert.equal(dp.isEnrolled(pod.uid), true);
      assert.deepEqual(dp.status(), {
        started: true,
        socket: sock,
        listening: true,
        connections: 1,
        enrolledPods: 1,
        podsWithoutNetns: [],
      });
      assert.equal(zt.openFds, 0);
    });

    it('ztunnel down or nacking: the pod is annotated pending, the error names ztunnel and is retryable', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.3', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      await dp.start([]);
      const pod = ambientPod('198.18.50.3');
      const down = await rejection(dp.addPodToMesh(pod, ns.path));
      assert.equal(down.reason, 'ztunnel');
      assert.equal(down.retryable, true);
      assert.match(down.message, /ztunnel/);
      assert.deepEqual(ann.calls, [{ uid: pod.uid, value: 'pending' }]);
      assert.equal(inpodRules(ns, flavour), true, 'the rules stay: the pod never runs unredirected');
      assert.equal(probeEntries(node.ns)?.has('198.18.50.3'), false);
      assert.equal(dp.isEnrolled(pod.uid), false);

      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      // The pending pod stays known with its netns: a (re)connecting ztunnel gets it in its snapshot.
      assert.deepEqual(
        zt.of('add').map((r) => [r.uid, r.netnsIno]),
        [[pod.uid, inode(ns.path)]],
      );
      zt.nackUids.set(pod.uid, 'failed to start the proxy');
      const nack = await rejection(dp.addPodToMesh(pod, ns.path));
      assert.equal(nack.reason, 'ztunnel');
      assert.match(nack.message, /ztunnel refused .*failed to start the proxy/);
      zt.nackUids.delete(pod.uid);
      await dp.addPodToMesh(pod, ns.path);
      assert.deepEqual(
        ann.calls.map((c) => c.value),
        ['pending', 'pending', 'enabled'],
      );
      assert.equal(dp.isEnrolled(pod.uid), true);
    });

    it('netns gone, not a netns, or the host netns: not retryable, the pod out of the cache, nothing programmed', async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const file = path.join(path.dirname(sock), 'not-a-netns');
      writeFileSync(file, '');
      for (const [where, why] of [
        ['/run/netns/mcni-no-such-netns', /cannot open the pod's netns/],
        [file, /not a network namespace file/],
        ['/proc/self/ns/net', /host's netns/],
        ['relative/path', /not an absolute path/],
      ] as const) {
        const pod = ambientPod('198.18.50.4');
        const e = await rejection(dp.addPodToMesh(pod, where));
        assert.equal(e.reason, 'netns', e.message);
        assert.equal(e.retryable, false);
        assert.match(e.message, why);
        assert.match(e.message, /netns of pod shop\/cart-198\.18\.50\.4/);
        assert.equal(dp.status().podsWithoutNetns.includes(pod.uid), false, 'out of the cache');
      }
      assert.deepEqual(ann.calls, []);
      assert.deepEqual(zt.of('add'), []);
      assert.equal(probeEntries(node.ns)?.size, 0);
    });

    it('a bad annotation is a rules failure: not retryable, nothing sent to ztunnel', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.5', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const pod = ambientPod('198.18.50.5', { annotations: { 'ambient.mesh.io/dns-capture': 'maybe' } });
      const e = await rejection(dp.addPodToMesh(pod, ns.path));
      assert.equal(e.reason, 'rules');
      assert.equal(e.retryable, false);
      assert.match(e.message, /in-pod rules of pod shop\/cart-198\.18\.50\.5.*dns-capture/);
      assert.deepEqual(zt.of('add'), []);
      assert.deepEqual(ann.calls, []);
      assert.deepEqual(dp.status().podsWithoutNetns, []);
    });

    it('an IPv4-only pod gets the IPv6 in-pod rules too (--ambient-ipv6, as Istio): its link-local IPv6 is no way around ztunnel', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.9', defer);
      const sock = socketPath();
      const dp = dataplane(sock, new FakeAnnotator(), node, flavour);
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const pod = ambientPod('198.18.50.9');
      const v6 = () =>
        shStatus(['ip', 'netns', 'exec', ns.name, `ip6tables-${flavour}-save`, '-t', 'nat']).out.includes(
          ':MESH_PRERT',
        );
      await dp.addPodToMesh(pod, ns.path);
      assert.equal(inpodRules(ns, flavour), true);
      assert.equal(v6(), true, 'IPv6 in-pod rules in an IPv4-only pod');
      await dp.removePodFromMesh(pod, false);
      assert.equal(inpodRules(ns, flavour), false);
      assert.equal(v6(), false, 'and out again');

      // --ambient-ipv6=false: the pod's own families only.
      const node2 = await nodeNetns();
      const ns2 = podNetnsWithVeth('pod', '198.18.50.10', defer);
      const sock2 = socketPath();
      const dp2 = dataplane(sock2, new FakeAnnotator(), node2, flavour, { ipv6: false });
      await dp2.start([]);
      const zt2 = fakeZtunnel(sock2);
      await zt2.waitForNth('snapshot_sent', 1);
      await dp2.addPodToMesh(ambientPod('198.18.50.10'), ns2.path);
      assert.equal(inpodRules(ns2, flavour), true);
      assert.equal(
        shStatus(['ip', 'netns', 'exec', ns2.name, `ip6tables-${flavour}-save`, '-t', 'nat']).out.includes(
          ':MESH_PRERT',
        ),
        false,
      );
    });

    it('removes in order: probe ipset, rules out of the netns, ztunnel Del, annotation last', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.6', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const pod = ambientPod('198.18.50.6');
      await dp.addPodToMesh(pod, ns.path);
      zt.ackDelayMs = 300;
      const atDel = zt
        .waitFor((r) => r.kind === 'del')
        .then(() => ({
          rules: inpodRules(ns, flavour),
          probe: probeEntries(node.ns)?.has('198.18.50.6'),
          annotations: ann.calls.map((c) => c.value),
        }));
      await dp.removePodFromMesh(pod, false);
      assert.deepEqual(await atDel, { rules: false, probe: false, annotations: ['enabled'] });
      assert.deepEqual(
        ann.calls.map((c) => c.value),
        ['enabled', null],
      );
      assert.equal(dp.isEnrolled(pod.uid), false);
      assert.equal(dp.status().enrolledPods, 0);
    });

    it('a removal whose rules could not be taken out is retried with the netns still held', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.8', defer);
      const sock = socketPath();
      let broken = false;
      const dp = createDataplane(ambientArgs(settingsFor(sock)), {
        annotator: new FakeAnnotator(),
        host: node.run,
        flavour: async () => {
          if (broken) throw new Error('iptables lock held');
          return flavour;
        },
        zdsTimings: FAST,
      });
      defer(() => dp.stop(false));
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const pod = ambientPod('198.18.50.8');
      await dp.addPodToMesh(pod, ns.path);
      broken = true;
      const e = await rejection(dp.removePodFromMesh(pod, false));
      assert.equal(e.reason, 'rules');
      assert.equal(e.retryable, true);
      assert.deepEqual(zt.of('del'), [], 'ztunnel keeps the pod until its rules are out');
      broken = false;
      await dp.removePodFromMesh(pod, false);
      assert.equal(inpodRules(ns, flavour), false, 'the retry took the rules out');
      assert.deepEqual(
        zt.of('del').map((r) => r.uid),
        [pod.uid],
      );
    });

    it('a deleted pod: its netns is left alone, a failed un-annotation is ignored; a reused IP keeps its new owner', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.50.7', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      await dp.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      const old = ambientPod('198.18.50.7');
      await dp.addPodToMesh(old, ns.path);
      // The IP went to a new pod before the old one's late delete.
      const reused = ambientPod('198.18.50.7');
      await dp.syncHostProbeIPs(reused);
      ann.fail = 'pods "cart" not found';
      await dp.removePodFromMesh(old, true);
      assert.equal(inpodRules(ns, flavour), true, "a deleted pod's netns is not entered");
      assert.deepEqual(
        zt.of('del').map((r) => r.uid),
        [old.uid],
      );
      assert.equal(probeEntries(node.ns)?.get('198.18.50.7'), reused.uid);
      ann.fail = 'the API server is down';
      const e = await rejection(dp.removePodFromMesh(reused, false));
      assert.equal(e.reason, 'annotate', 'not being deleted: the annotation failure counts');
    });

    it('start-up: the probe ipset and the netns of running pods from ONE /proc scan, rules reconciled, snapshot Add/Keep then SnapshotSent', async () => {
      const node = await nodeNetns();
      const nsA = podNetnsWithVeth('a', '198.18.51.2', defer);
      const nsB = podNetnsWithVeth('b', '198.18.51.3', defer);
      const a = ambientPod('198.18.51.2');
      const b = ambientPod('198.18.51.3');
      const gone = ambientPod('198.18.51.4'); // enrolled, but no process of it runs any more
      runningPod(a.uid, nsA);
      runningPod(b.uid, nsB);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const dp = dataplane(sock, ann, node, flavour);
      const readdir = mock.method(fsp, 'readdir');
      defer(async () => readdir.mock.restore());
      await dp.start([a, gone, b]);
      assert.equal(readdir.mock.calls.filter((c) => c.arguments[0] === '/proc').length, 1, 'one walk of /proc');
      readdir.mock.restore();
      assert.equal(inpodRules(nsA, flavour), true, 'rules reconciled in the running pods');
      assert.equal(inpodRules(nsB, flavour), true);
      assert.deepEqual(
        [...(probeEntries(node.ns) ?? [])].sort(),
        [
          ['198.18.51.2', a.uid],
          ['198.18.51.3', b.uid],
          ['198.18.51.4', gone.uid],
        ].sort(),
      );
      assert.deepEqual(dp.status().podsWithoutNetns, [gone.uid]);
      assert.equal(dp.isEnrolled(a.uid), true);
      assert.equal(dp.enrollment(gone.uid), 'pending', 'its rules were not seen: the informer adds it');
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      assert.deepEqual(
        zt.records.filter((r) => r.kind !== 'connected'),
        [
          {
            kind: 'add',
            conn: 1,
            uid: a.uid,
            info: { name: a.name, namespace: 'shop', serviceAccount: 'cart' },
            netnsIno: inode(nsA.path),
            acked: true,
          },
          { kind: 'keep', conn: 1, uid: gone.uid, acked: true },
          {
            kind: 'add',
            conn: 1,
            uid: b.uid,
            info: { name: b.name, namespace: 'shop', serviceAccount: 'cart' },
            netnsIno: inode(nsB.path),
            acked: true,
          },
          { kind: 'snapshot_sent', conn: 1, acked: true },
        ],
      );
      // A new pod without a CNI netns path (the informer's add) is found by the /proc scan.
      const nsC = podNetnsWithVeth('c', '198.18.51.5', defer);
      const c = ambientPod('198.18.51.5');
      runningPod(c.uid, nsC);
      await dp.addPodToMesh(c, null);
      assert.equal(zt.of('add').at(-1)?.netnsIno, inode(nsC.path));
      // The start's pods did not say enabled (their annotation is output only): told so, then c;
      // not the one whose rules were never seen (pending).
      assert.deepEqual(ann.calls.at(-1), { uid: c.uid, value: 'enabled' });
      assert.deepEqual(
        ann.calls
          .slice(0, -1)
          .map((x) => `${x.uid} ${x.value}`)
          .sort(),
        [a, b].map((x) => `${x.uid} enabled`).sort(),
      );
    });

    it('start-up with --ambient-reconcile-pod-rules-on-startup=false leaves our rules in running pods as they are, writes them where there are none; a pod without an IP keeps its entry', async () => {
      const node = await nodeNetns();
      const nsA = podNetnsWithVeth('a', '198.18.52.2', defer);
      const a = ambientPod('198.18.52.2');
      runningPod(a.uid, nsA);
      // Ours, from an earlier version (DNS captured): not what this start would write.
      const inA = (argv: readonly string[], o?: { input?: string }) => {
        const r = spawnSync('ip', ['netns', 'exec', nsA.name, ...argv], { encoding: 'utf8', input: o?.input });
        return Promise.resolve({ code: r.status, stdout: r.stdout, stderr: r.stderr, error: null });
      };
      await applyInpod(inA, flavour, [4, 6], podOptions({}, true));
      // iptables-save's '# Generated ... on <time>' lines left out.
      const raw = (ns: Netns) =>
        shStatus(['ip', 'netns', 'exec', ns.name, `iptables-${flavour}-save`, '-t', 'raw']).out.replace(/^#.*\n/gm, '');
      const before = raw(nsA);
      assert.match(before, /:MESH_OUTPUT/);
      // Never enrolled (its namespace labelled while the agent was down): no rules of ours yet.
      const nsB = podNetnsWithVeth('b', '198.18.52.3', defer);
      const b = ambientPod('198.18.52.3');
      runningPod(b.uid, nsB);
      const noIp = ambientPod(null);
      assert.equal(
        shStatus(['ip', 'netns', 'exec', node.ns.name, 'ipset', 'create', PROBE_SET_V4, 'hash:ip', 'comment']).code,
        0,
      );
      assert.equal(
        shStatus([
          'ip',
          'netns',
          'exec',
          node.ns.name,
          'ipset',
          'add',
          PROBE_SET_V4,
          '198.18.52.9',
          'comment',
          noIp.uid,
        ]).code,
        0,
      );
      const sock = socketPath();
      const dp = dataplane(sock, new FakeAnnotator(), node, flavour, { reconcilePodRulesOnStartup: false });
      await dp.start([a, b, noIp]);
      assert.equal(raw(nsA), before, "a's rules left as they were");
      assert.equal(inpodRules(nsB, flavour), true, 'b handed to ztunnel with its rules written');
      assert.deepEqual(
        [...(probeEntries(node.ns) ?? [])].sort(),
        [
          ['198.18.52.2', a.uid],
          ['198.18.52.3', b.uid],
          ['198.18.52.9', noIp.uid],
        ].sort(),
      );
    });

    it('start-up keeps the probe entries of pods whose IPs are spelled otherwise than ipset prints them', async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const v6 = ambientPod('FD00:198:18:56:0:0:0:2');
      const mapped = ambientPod('::ffff:198.18.56.3');
      const dp = dataplane(sock, new FakeAnnotator(), node, flavour);
      await dp.start([v6, mapped]);
      assert.deepEqual([...(probeEntries(node.ns) ?? [])], [['198.18.56.3', mapped.uid]]);
      assert.deepEqual([...(probeEntries(node.ns, 6) ?? [])], [['fd00:198:18:56::2', v6.uid]]);
    });

    it('start-up: an IP the batch add refuses (no IPv6 set) fails alone, the other pods get their entries', async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const v6 = ambientPod('fd00:198:18:57::2');
      const v4 = ambientPod('198.18.57.3');
      const dp = dataplane(sock, new FakeAnnotator(), node, flavour, { ipv6: false });
      await dp.start([v6, v4]);
      assert.deepEqual([...(probeEntries(node.ns) ?? [])], [['198.18.57.3', v4.uid]]);
      assert.equal(probeEntries(node.ns, 6), null, 'no IPv6 set with --ambient-ipv6=false');
    });

    it('upgrade stop keeps the host rule, the ipset and the pods rules; uninstall stop removes the host rule and ipset', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.53.2', defer);
      const sock = socketPath();
      const ann = new FakeAnnotator();
      const pod = ambientPod('198.18.53.2');
      const first = createDataplane(ambientArgs(settingsFor(sock)), {
        annotator: ann,
        host: node.run,
        flavour: async () => flavour,
        zdsTimings: FAST,
      });
      await first.start([]);
      const zt = fakeZtunnel(sock);
      await zt.waitForNth('snapshot_sent', 1);
      await first.addPodToMesh(pod, ns.path);
      await first.stop(false);
      assert.equal(existsSync(sock), false, 'the ZDS socket is gone');
      assert.equal(hostRule(node.ns, flavour), true);
      assert.equal(probeEntries(node.ns)?.get('198.18.53.2'), pod.uid);
      assert.equal(inpodRules(ns, flavour), true);
      // The new agent of the upgrade: the pod found again, ztunnel reconnects and gets it.
      const second = createDataplane(ambientArgs(settingsFor(sock)), {
        annotator: ann,
        host: node.run,
        flavour: async () => flavour,
        zdsTimings: FAST,
      });
      runningPod(pod.uid, ns);
      await second.start([pod]);
      await zt.waitForNth('snapshot_sent', 2);
      assert.equal(zt.of('add', 2).at(0)?.uid, pod.uid);
      await second.stop(true);
      assert.equal(hostRule(node.ns, flavour), false, 'uninstall: MESH_POSTRT gone');
      assert.equal(probeEntries(node.ns), null, 'uninstall: the probe set destroyed');
      assert.equal(inpodRules(ns, flavour), true, 'running pods keep their rules (unlabel first)');
      assert.deepEqual(second.notReadyReasons(), ['ambient: stopped']);
    });
  });
}

describe('ambient dataplane: the ZDS socket', () => {
  it('a stale socket is replaced; something else there, no directory, or one another user can write, is a clear error', async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    // A socket left by a crashed agent (bound, never unlinked).
    const py = spawnSync('python3', [
      '-c',
      `import socket; socket.socket(socket.AF_UNIX).bind(${JSON.stringify(sock)})`,
    ]);
    assert.equal(py.status, 0, String(py.stderr));
    const dp = dataplane(sock, new FakeAnnotator(), node, 'nft');
    await dp.start([]);
    const zt = fakeZtunnel(sock);
    await zt.waitForNth('snapshot_sent', 1);
    await dp.stop(true);

    const file = socketPath();
    writeFileSync(file, 'mine');
    const other = dataplane(file, new FakeAnnotator(), node, 'nft');
    await assert.rejects(other.start([]), /something other than a socket is there/);
    assert.equal(existsSync(file), true, 'not removed');
    const nodir = dataplane('/nonexistent-mcni-dir/ztunnel.sock', new FakeAnnotator(), node, 'nft');
    await assert.rejects(
      nodir.start([]),
      /directory \/nonexistent-mcni-dir is not there.*--ztunnel-uds-address|--ztunnel-uds-address.*not there/s,
    );
    // A dir another user could write to (or owns): they could put their own socket in ours' place
    // and be handed every pod's netns, or feed ztunnel. Refused, never listened in.
    for (const [what, mode, uid] of [
      ['writable by all', 0o777, 0],
      ['writable by its group', 0o775, 0],
      ['of another user', 0o755, 65534],
    ] as const) {
      const shared = path.dirname(socketPath());
      chmodSync(shared, mode);
      chownSync(shared, uid, 0);
      const dp = dataplane(path.join(shared, 'ztunnel.sock'), new FakeAnnotator(), node, 'nft');
      await assert.rejects(dp.start([]), /writable by a user other than root|not root's/, what);
      assert.equal(existsSync(path.join(shared, 'ztunnel.sock')), false, `${what}: nothing listens there`);
    }
    // A dir of root's 0755 below one writable by all: the dir itself can be moved aside and replaced.
    const above = path.dirname(socketPath());
    chmodSync(above, 0o777);
    mkdirSync(path.join(above, 'ztunnel'), { mode: 0o755 });
    const below = dataplane(path.join(above, 'ztunnel', 'ztunnel.sock'), new FakeAnnotator(), node, 'nft');
    await assert.rejects(below.start([]), new RegExp(`${above} is writable by a user other than root`));
    assert.equal(existsSync(path.join(above, 'ztunnel', 'ztunnel.sock')), false, 'nothing listens below it');
  });

  it('a start that failed can be retried: pods of the failed attempt no longer enrolled are not in the snapshot', async () => {
    const node = await nodeNetns();
    const dir = path.dirname(socketPath());
    const sock = path.join(dir, 'later', 'ztunnel.sock');
    const dp = dataplane(sock, new FakeAnnotator(), node, 'nft');
    const stays = ambientPod('198.18.58.2');
    const left = ambientPod('198.18.58.3');
    await assert.rejects(dp.start([stays, left]), /is not there/);
    assert.deepEqual(dp.notReadyReasons(), ['ambient: snapshot not built yet']);
    mkdirSync(path.dirname(sock));
    await dp.start([stays]);
    const zt = fakeZtunnel(sock);
    await zt.waitForNth('snapshot_sent', 1);
    assert.deepEqual(
      zt.records.filter((r) => r.kind === 'keep' || r.kind === 'add').map((r) => (r as { uid: string }).uid),
      [stays.uid],
    );
    assert.equal(dp.isEnrolled(left.uid), false);
    await assert.rejects(dp.start([stays]), /started already/);
  });

  it("a static pod is found by its kubelet UID (the mirror pod's config.mirror), at start-up and on add", async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const nsA = podNetnsWithVeth('a', '198.18.59.2', defer);
    const nsB = podNetnsWithVeth('b', '198.18.59.3', defer);
    const kubeletA = randomUUID();
    const kubeletB = randomUUID();
    runningPod(kubeletA, nsA);
    runningPod(kubeletB, nsB);
    const a = ambientPod('198.18.59.2', { mirrorUid: kubeletA });
    const b = ambientPod('198.18.59.3', { mirrorUid: kubeletB });
    const dp = dataplane(sock, new FakeAnnotator(), node, 'nft');
    await dp.start([a]);
    assert.deepEqual(dp.status().podsWithoutNetns, []);
    const zt = fakeZtunnel(sock);
    await zt.waitForNth('snapshot_sent', 1);
    await dp.addPodToMesh(b, null);
    assert.deepEqual(
      zt.of('add').map((r) => [r.uid, r.netnsIno]),
      [
        [a.uid, inode(nsA.path)],
        [b.uid, inode(nsB.path)],
      ],
      'ztunnel knows the pods by their API UID',
    );
  });

  it("a pod removed while ztunnel's snapshot is being sent: its fd stays open until the snapshot is sent", async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const nsA = podNetnsWithVeth('a', '198.18.60.2', defer);
    const nsB = podNetnsWithVeth('b', '198.18.60.3', defer);
    const a = ambientPod('198.18.60.2');
    const b = ambientPod('198.18.60.3');
    const dp = dataplane(sock, new FakeAnnotator(), node, 'nft');
    await dp.start([]);
    // No ztunnel yet: both pending, both held in the cache for the next snapshot.
    await assert.rejects(dp.addPodToMesh(a, nsA.path), /ztunnel/);
    await assert.rejects(dp.addPodToMesh(b, nsB.path), /ztunnel/);
    const zt = fakeZtunnel(sock);
    zt.ackDelayMs = 300;
    await zt.waitFor((r) => r.kind === 'add' && r.uid === a.uid);
    await dp.removePodFromMesh(b, true); // returns after B's Del, queued behind the snapshot
    const conn1 = zt.records.filter((r) => r.conn === 1 && r.kind !== 'connected').map((r) => r.kind);
    assert.deepEqual(conn1, ['add', 'add', 'snapshot_sent', 'del'], 'one connection, no drop');
    assert.equal(zt.of('add', 1).find((r) => r.uid === b.uid)?.netnsIno, inode(nsB.path), "B's own netns");
  });

  it('no fd left after 50 add/remove cycles through ztunnel', async () => {
    const node = await nodeNetns();
    const ns = podNetnsWithVeth('pod', '198.18.54.2', defer);
    const sock = socketPath();
    const dp = dataplane(sock, new FakeAnnotator(), node, 'nft');
    await dp.start([]);
    const zt = fakeZtunnel(sock);
    await zt.waitForNth('snapshot_sent', 1);
    const pod = ambientPod('198.18.54.2');
    await dp.addPodToMesh(pod, ns.path);
    await dp.removePodFromMesh(pod, false);
    const before = fdSnapshot();
    for (let i = 0; i < 50; i++) {
      // A deleted pod's UID never comes back (its later adds are refused): a new pod each time.
      const p = { ...pod, uid: randomUUID() };
      await dp.addPodToMesh(p, ns.path);
      await dp.removePodFromMesh(p, i % 2 === 0);
    }
    assert.deepEqual(fdsOpenedSince(before), []);
    assert.equal(zt.openFds, 0);
  });
});

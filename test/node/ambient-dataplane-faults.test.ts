// Faults of the ambient dataplane (partial failures, stale state), each on real things as
// ambient-dataplane.test.ts does: a test netns stands for the node (probe ipset, MESH_POSTRT),
// pods are `ip netns add` netns with an address in 198.18.0.0/15 (a `sleep` in a kubelet-shaped
// cgroup where the /proc scan must find them), real iptables, the fake ztunnel on a real socket.
// Where a fault cannot be made for real (a program exiting non-zero without a word, an iptables
// write refused at the wrong moment), the real runner is wrapped and that one call answered.
// Everything made is removed after each test. Root.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it as nodeIt } from 'node:test';
import { createDataplane, INPOD_CONCURRENCY, type AmbientPod, type PodAnnotator } from '../../src/ambient/dataplane.ts';
import { parseProbeSet, PROBE_SET_V4 } from '../../src/ambient/hostrules.ts';
import { applyInpod, removeInpod, type Flavour, type Runner } from '../../src/ambient/podrules.ts';
import type { ZdsTimings } from '../../src/ambient/ztunnelserver.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { openNetns, runInNetns } from '../../src/podnetns/index.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { placeInPodCgroup, removePodCgroups } from '../helpers/kubepods.ts';
import { Netns, podNetnsWithVeth } from '../helpers/netns.ts';
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

class FakeAnnotator implements PodAnnotator {
  readonly calls: { uid: string; value: 'enabled' | 'pending' | null }[] = [];
  async setRedirection(pod: { uid: string }, value: 'enabled' | 'pending' | null): Promise<void> {
    this.calls.push({ uid: pod.uid, value });
  }
}

async function heldRunner(n: Netns): Promise<Runner> {
  const held = await openNetns(n.path, 0);
  defer(async () => held.close());
  return (argv, o) => runInNetns(held, argv, { input: o?.input ?? null });
}

async function nodeNetns() {
  const ns = new Netns('node');
  defer(async () => ns.remove());
  return { ns, run: await heldRunner(ns) };
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
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ambflt-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'ztunnel.sock');
}

function dataplane(sock: string, host: Runner, flavour: Flavour, over: Partial<Settings['ambient']> = {}) {
  const dp = createDataplane(ambientArgs(settingsFor(sock, over)), {
    annotator: new FakeAnnotator(),
    host,
    flavour: async () => flavour,
    zdsTimings: FAST,
  });
  defer(() => dp.stop(false));
  return dp;
}

const ambientPod = (ips: string[], over: Partial<AmbientPod> = {}): AmbientPod => ({
  uid: randomUUID(),
  namespace: 'shop',
  name: `cart-${ips[0] ?? 'noip'}`,
  serviceAccount: 'cart',
  ips,
  annotations: {},
  ...over,
});

const inpodRules = (ns: Netns, flavour: Flavour): boolean =>
  shStatus(['ip', 'netns', 'exec', ns.name, `iptables-${flavour}-save`, '-t', 'nat']).out.includes(':MESH_PRERT');

function probeEntries(node: Netns): Map<string, string> {
  const r = shStatus(['ip', 'netns', 'exec', node.name, 'ipset', 'save', PROBE_SET_V4]);
  assert.equal(r.code, 0, r.out);
  return parseProbeSet(r.out);
}

/** A `sleep` in `ns`, in a kubelet-shaped cgroup of pod `uid`: what the /proc scan finds. */
function runningPod(uid: string, ns: Netns): void {
  const p = spawn('ip', ['netns', 'exec', ns.name, 'sleep', '300'], { stdio: 'ignore' });
  defer(async () => {
    p.kill('SIGKILL');
    await removePodCgroups(uid);
  });
  placeInPodCgroup(uid, p.pid!, 'sandbox');
  const want = statSync(ns.path).ino;
  for (let i = 0; i < 500 && statSync(`/proc/${p.pid}/ns/net`).ino !== want; i++) spawnSync('sleep', ['0.01']);
}

/** `run`, with the first call `match` picks answered by `answer` instead. */
function failingOnce(run: Runner, match: (argv: readonly string[]) => boolean, answer: string): Runner {
  let done = false;
  return async (argv, o) => {
    if (!done && match(argv)) {
      done = true;
      return { code: 1, stdout: '', stderr: answer, error: null };
    }
    return run(argv, o);
  };
}

describe('ambient in-pod route batch (podrules ipBatch)', () => {
  it('ip exiting non-zero without a word is a failure, for the add and for the removal', async () => {
    const ns = podNetnsWithVeth('pod', '198.18.60.2', defer);
    const run = await heldRunner(ns);
    const silent: Runner = async (argv, o) => {
      if (argv[0] === 'ip' && argv.includes('-batch')) return { code: 2, stdout: '', stderr: '', error: null };
      return run(argv, o);
    };
    const opts = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
    await assert.rejects(applyInpod(silent, 'nft', [4], opts), /ip -4 -batch \(add\) failed.*exit 2/);
    await applyInpod(run, 'nft', [4], opts);
    await assert.rejects(removeInpod(silent, 'nft', [4]), /ip -4 -batch \(del\) failed.*exit 2/);
    // What the op wants already so ("File exists" on a second add) stays a success.
    await applyInpod(run, 'nft', [4], opts);
    await removeInpod(run, 'nft', [4]);
  });
});

for (const flavour of ['nft', 'legacy'] as const) {
  describe(`ambient dataplane faults, iptables-${flavour}`, () => {
    it("a restart whose host rule cannot be written keeps the enrolled pods' probe entries", async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.61.2', defer);
      const sock = socketPath();
      const pod = ambientPod(['198.18.61.2']);
      const first = dataplane(sock, node.run, flavour);
      await first.start([]);
      const zt = new FakeZtunnel({ path: sock });
      defer(() => zt.stop());
      await zt.waitForNth('snapshot_sent', 1);
      await first.addPodToMesh(pod, ns.path);
      await first.stop(false);
      assert.equal(probeEntries(node.ns).get('198.18.61.2'), pod.uid);
      // The new agent of an upgrade cannot read the node's IPv6 nat table (a node whose
      // ip6table_nat is not loaded yet); the start fails and is retried later.
      const refused = failingOnce(
        node.run,
        (argv) => /^ip6tables-\w+-save$/.test(argv[0]!),
        "ip6tables-save v1.8.9: can't initialize ip6tables table `nat': Table does not exist",
      );
      runningPod(pod.uid, ns);
      const second = dataplane(sock, refused, flavour);
      await assert.rejects(second.start([pod]), /host probe rules/);
      assert.equal(
        probeEntries(node.ns).get('198.18.61.2'),
        pod.uid,
        "the pod's kubelet probes still SNATed while the start waits for its retry",
      );
      await second.start([pod]);
      assert.equal(probeEntries(node.ns).get('198.18.61.2'), pod.uid);
    });

    it('start-up with an enrolled pod without an IP yet keeps its entry (the prune is skipped, so is any flush)', async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const pod = ambientPod(['198.18.62.2']);
      const first = dataplane(sock, node.run, flavour);
      await first.start([pod]);
      await first.stop(false);
      assert.equal(probeEntries(node.ns).get('198.18.62.2'), pod.uid);
      // After a kubelet restart the pod is read without its IPs for a while: its entry cannot be
      // told from a stale one, so it stays (Istio creates the set if absent, never flushes it).
      const second = dataplane(sock, node.run, flavour);
      await second.start([{ ...pod, ips: [] }]);
      assert.equal(probeEntries(node.ns).get('198.18.62.2'), pod.uid);
      // A complete start prunes what no enrolled pod has.
      const third = dataplane(sock, node.run, flavour);
      await second.stop(false);
      await third.start([ambientPod(['198.18.62.3'])]);
      assert.deepEqual([...probeEntries(node.ns).keys()], ['198.18.62.3']);
    });

    it("an entry kept at start-up for a pod without an IP yet goes with the pod's removal", async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const pod = ambientPod(['198.18.62.4']);
      const first = dataplane(sock, node.run, flavour);
      await first.start([pod]);
      await first.stop(false);
      // Restarted while the kubelet has not written its IPs: its entry is kept by its UID...
      const second = dataplane(sock, node.run, flavour);
      const noIp = { ...pod, ips: [] };
      await second.start([noIp]);
      assert.equal(probeEntries(node.ns).get('198.18.62.4'), pod.uid);
      // ...and it is deleted before they are: nothing else names that entry.
      await second.removePodFromMesh(noIp, true);
      assert.equal(
        probeEntries(node.ns).get('198.18.62.4'),
        undefined,
        'the next pod given this IP would see node traffic from the probe address',
      );
    });

    it('removing a running pod whose netns the agent does not hold finds it and takes its rules out', async () => {
      const node = await nodeNetns();
      const ns = podNetnsWithVeth('pod', '198.18.63.2', defer);
      const sock = socketPath();
      const pod = ambientPod(['198.18.63.2']);
      const first = dataplane(sock, node.run, flavour);
      await first.start([]);
      const zt = new FakeZtunnel({ path: sock });
      defer(() => zt.stop());
      await zt.waitForNth('snapshot_sent', 1);
      await first.addPodToMesh(pod, ns.path);
      await first.stop(false);
      // The next agent starts while the pod has no process to be found by (Keep for ztunnel)...
      const second = dataplane(sock, node.run, flavour);
      await second.start([pod]);
      assert.deepEqual(second.status().podsWithoutNetns, [pod.uid]);
      // ...then the pod runs on and is taken out of the mesh (its namespace unlabelled).
      runningPod(pod.uid, ns);
      await second.removePodFromMesh(pod, false);
      assert.equal(inpodRules(ns, flavour), false, 'its rules would send its traffic to a ztunnel that let it go');
    });
  });
}

/**
 * `ip6tables-<flavour>-restore` refusing every write, as on a node whose IPv6 nat table cannot
 * be initialised: a script first in the PATH the agent's children get (runInNetns keeps the
 * agent's PATH first), until the test ends.
 */
function brokenIp6tablesRestore(flavour: Flavour): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ambflt-bin-'));
  const script = path.join(dir, `ip6tables-${flavour}-restore`);
  writeFileSync(script, '#!/bin/sh\necho "ip6tables-restore: unable to initialize table \'nat\'" >&2\nexit 1\n', {
    mode: 0o755,
  });
  const before = process.env.PATH;
  process.env.PATH = `${dir}:${before ?? ''}`;
  defer(async () => {
    process.env.PATH = before;
    rmSync(dir, { recursive: true, force: true });
  });
}

for (const flavour of ['nft', 'legacy'] as const) {
  describe(`ambient dataplane, a failed in-pod rules write, iptables-${flavour}`, () => {
    it("a running pod's enrollment whose IPv6 rules fail takes its IPv4 rules out again; a pending pod keeps them", async () => {
      const node = await nodeNetns();
      const sock = socketPath();
      const dp = dataplane(sock, node.run, flavour);
      const ns = podNetnsWithVeth('pod', '198.18.64.2', defer);
      // Its owner wrote "pending" on it: no record of the agent's, so it is rolled back all the same.
      const pod = ambientPod(['198.18.64.2', 'fd00:198:18:64::2'], {
        annotations: { 'ambient.mesh.io/redirection': 'pending' },
      });
      runningPod(pod.uid, ns);
      const nsPending = podNetnsWithVeth('pend', '198.18.64.3', defer);
      const pending = ambientPod(['198.18.64.3', 'fd00:198:18:64::3']);
      runningPod(pending.uid, nsPending);
      // Pending on the agent's record (a start-up's leftover: some of ours may be in it).
      await dp.start([], [pending]);
      assert.equal(dp.enrollment(pending.uid), 'pending');
      const zt = new FakeZtunnel({ path: sock });
      defer(() => zt.stop());
      await zt.waitForNth('snapshot_sent', 1);
      brokenIp6tablesRestore(flavour);
      // The informer's add of a running pod (its namespace just labelled): no CNI netns path.
      await assert.rejects(dp.addPodToMesh(pod, null), (e: Error & { reason?: string; retryable?: boolean }) => {
        assert.equal(e.reason, 'rules');
        assert.equal(e.retryable, false);
        return true;
      });
      assert.equal(
        inpodRules(ns, flavour),
        false,
        'not enrolled, not retried, not known to the agent: half its redirection would black-hole its IPv4 traffic for good',
      );
      assert.deepEqual(zt.of('add'), []);
      // A pending pod ran redirected before this retry: it stays so (fail closed).
      await assert.rejects(dp.addPodToMesh(pending, null), /in-pod rules/);
      assert.equal(inpodRules(nsPending, flavour), true);
    });
  });
}

describe('ambient dataplane: a deleted pod', () => {
  it("a CNI ADD that lands after its pod's delete was reconciled enrolls nothing (nothing would ever remove it)", async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const dp = dataplane(sock, node.run, 'nft');
    await dp.start([]);
    const zt = new FakeZtunnel({ path: sock });
    defer(() => zt.stop());
    await zt.waitForNth('snapshot_sent', 1);
    const ns = podNetnsWithVeth('pod', '198.18.65.2', defer);
    const pod = ambientPod(['198.18.65.2']);
    // The plugin's /cmdadd read the pod from the watch; the pod is deleted and the informer's
    // removal runs before the ADD reaches the dataplane.
    await dp.removePodFromMesh(pod, true);
    await assert.rejects(dp.addPodToMesh(pod, ns.path), /deleted/);
    assert.deepEqual(zt.of('add'), [], 'ztunnel would proxy a pod that is gone');
    assert.equal(probeEntries(node.ns).has('198.18.65.2'), false, 'a stale probe entry for a reusable IP');
    assert.equal(inpodRules(ns, 'nft'), false);
    assert.equal(dp.status().podsWithoutNetns.length, 0);
    // Other pods are not concerned.
    const other = ambientPod(['198.18.65.3']);
    await dp.addPodToMesh(other, podNetnsWithVeth('other', '198.18.65.3', defer).path);
    assert.deepEqual(
      zt.of('add').map((r) => r.uid),
      [other.uid],
    );
  });
});

describe("ambient dataplane: the CNI ADD's netns path", () => {
  it("the agent's own netns is refused even when --host-netns-path names another", async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const elsewhere = new Netns('elsewhere');
    defer(async () => elsewhere.remove());
    let programmed = 0;
    let started = false;
    // Nothing may be written into this test's own netns: the flavour fails, so a path let
    // through shows as a rules failure instead of the netns refusal.
    const dp = createDataplane(
      { ...ambientArgs(settingsFor(sock)), hostNetnsPath: elsewhere.path },
      {
        annotator: new FakeAnnotator(),
        host: node.run,
        flavour: async () => {
          if (!started) return 'nft'; // the node's probe rule, in the node netns
          programmed++;
          throw new Error('no rules here');
        },
        zdsTimings: FAST,
      },
    );
    defer(() => dp.stop(false));
    await dp.start([]);
    started = true;
    await assert.rejects(
      dp.addPodToMesh(ambientPod(['198.18.66.2']), '/proc/self/ns/net'),
      (e: Error & { reason?: string }) => {
        assert.equal(e.reason, 'netns', e.message);
        assert.match(e.message, /the agent's own netns/);
        return true;
      },
    );
    assert.equal(programmed, 0);
  });
});

describe('ambient dataplane: a burst of ADDs', () => {
  it('in-pod rules are written for at most INPOD_CONCURRENCY pods at once (a node reboot starts all its pods together)', async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    // iptables-nft-save as the pods' rules run it, counting how many run at once (each stays a while).
    const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-ambflt-bin-'));
    const real = shStatus(['sh', '-c', 'command -v iptables-nft-save']).out.trim();
    const dp = dataplane(sock, node.run, 'nft');
    await dp.start([]);
    const zt = new FakeZtunnel({ path: sock });
    defer(() => zt.stop());
    await zt.waitForNth('snapshot_sent', 1);
    const pods = Array.from({ length: 24 }, (_, i) => ({
      pod: ambientPod([`198.18.67.${i + 2}`]),
      ns: podNetnsWithVeth(`b${i}`, `198.18.67.${i + 2}`, defer),
    }));
    writeFileSync(
      path.join(dir, 'iptables-nft-save'),
      `#!/bin/sh\nmkdir -p ${dir}/run\ntouch ${dir}/run/$$\nls ${dir}/run | wc -l >> ${dir}/counts\n` +
        `sleep 0.2\nrm -f ${dir}/run/$$\nexec ${real} "$@"\n`,
      { mode: 0o755 },
    );
    const before = process.env.PATH;
    process.env.PATH = `${dir}:${before ?? ''}`;
    defer(async () => {
      process.env.PATH = before;
      rmSync(dir, { recursive: true, force: true });
    });
    await Promise.all(pods.map(({ pod, ns }) => dp.addPodToMesh(pod, ns.path)));
    process.env.PATH = before;
    const counts = shStatus(['cat', path.join(dir, 'counts')])
      .out.trim()
      .split('\n')
      .map(Number);
    assert.ok(counts.length >= 24, `the wrapper ran (${counts.length} times)`);
    assert.ok(
      Math.max(...counts) <= INPOD_CONCURRENCY,
      `at most ${INPOD_CONCURRENCY} at once, saw ${Math.max(...counts)}`,
    );
    assert.equal(zt.of('add').length, 24);
  });
});

describe('ambient dataplane: a pod found without its netns at start-up', () => {
  it('is pending, never enabled on a guess: its rules were never seen, so the informer adds it', async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const ns = podNetnsWithVeth('pod', '198.18.69.2', defer);
    // Wanted now (its namespace labelled while the agent was down), never enrolled: no rules of
    // ours in it, and no process of it to be found by at start-up.
    const pod = ambientPod(['198.18.69.2']);
    const annotator = new FakeAnnotator();
    const dp = createDataplane(ambientArgs(settingsFor(sock)), {
      annotator,
      host: node.run,
      flavour: async () => 'nft',
      zdsTimings: FAST,
    });
    defer(() => dp.stop(false));
    await dp.start([pod]);
    assert.deepEqual(dp.status().podsWithoutNetns, [pod.uid]);
    assert.equal(inpodRules(ns, 'nft'), false);
    assert.equal(dp.enrollment(pod.uid), 'pending', 'enabled would have the informer leave it unredirected for good');
    assert.equal(dp.isEnrolled(pod.uid), false);
    assert.equal(dp.status().enrolledPods, 0);
    const zt = new FakeZtunnel({ path: sock });
    defer(() => zt.stop());
    await zt.waitForNth('snapshot_sent', 1);
    assert.deepEqual(
      annotator.calls.filter((c) => c.value === 'enabled'),
      [],
      'never annotated enabled while unredirected',
    );
    // The informer's add (pending, wanted, has IPs) once its process can be found.
    runningPod(pod.uid, ns);
    await dp.addPodToMesh(pod, null);
    assert.equal(inpodRules(ns, 'nft'), true);
    assert.equal(dp.enrollment(pod.uid), 'enabled');
    assert.deepEqual(
      zt.of('add').map((r) => r.uid),
      [pod.uid],
    );
  });

  it("is found when its IPs appear (the informer's add): ztunnel gets it, and any later snapshot too", async () => {
    const node = await nodeNetns();
    const sock = socketPath();
    const ns = podNetnsWithVeth('pod', '198.18.68.2', defer);
    const pod = ambientPod(['198.18.68.2']);
    runningPod(pod.uid, ns);
    const dp = dataplane(sock, node.run, 'nft');
    // After a kubelet restart the pod is read without its IPs: not found (Keep for ztunnel).
    await dp.start([{ ...pod, ips: [] }]);
    assert.deepEqual(dp.status().podsWithoutNetns, [pod.uid]);
    const zt = new FakeZtunnel({ path: sock });
    defer(() => zt.stop());
    await zt.waitForNth('snapshot_sent', 1);
    assert.equal(dp.enrollment(pod.uid), 'pending');
    await dp.addPodToMesh(pod, null);
    assert.deepEqual(dp.status().podsWithoutNetns, [], 'found now that its IP is known');
    assert.equal(probeEntries(node.ns).get('198.18.68.2'), pod.uid);
    assert.deepEqual(
      zt.of('add').map((r) => r.uid),
      [pod.uid],
      'a ztunnel that restarts later would otherwise be told Keep for a pod it never had',
    );
    assert.equal(inpodRules(ns, 'nft'), true, 'its rules written');
  });
});

// In-place repair's place in the repair controller (docs/repair.md "Repair in place"): the
// precedence (in place, then the operator's label/delete, else a report), the did-not-hold rule,
// the start-up capability check said once, metrics and Events, against the test HTTPS API server
// with the production controller and watch. The in-place repairer itself is a fake here (its
// outcome is the input of the decision); repair-inplace-netns.test.ts runs the real rule
// application in real netns.

import assert from 'node:assert/strict';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { buildSettings, type RawFlags, type Settings } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import type { RepairController, RepairTiming } from '../../src/repair/controller.ts';
import { inPlaceFor, repairPodSource, startRepair } from '../../src/repair/index.ts';
import { orchClientArgs, repairArgs } from '../../src/partargs.ts';
import { InPlaceRepairer, type InPlaceReason, type InPlaceResult } from '../../src/repair/inplace.ts';
import { inPlaceMissing, missingCapabilities } from '../../src/repair/capabilities.ts';
import { orchApi } from '../../src/orch/client.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor as pollFor } from '../helpers/poll.ts';
import { brokenPod, testPod } from '../helpers/pods.ts';

const FAST: Partial<RepairTiming> = {
  watchBackoffBaseMs: 50,
  watchBackoffMaxMs: 400,
  actionBackoffBaseMs: 20,
  actionBackoffMaxMs: 50,
  silenceTimeoutMs: 1500,
  healthyWatchMs: 1000,
  requestTimeoutMs: 3000,
  watchTimeoutSeconds: 30,
  resyncIntervalMs: 60_000,
  stopGraceMs: 5000,
  maxAttempts: 3,
};

const LABEL = 'cni.mesh.io/uninitialized';
const logs: string[] = [];
const waitFor = (what: string, pred: () => boolean, timeoutMs = 10_000) =>
  pollFor(what, pred, { timeoutMs, context: () => `last log lines:\n${logs.slice(-15).join('')}` });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function metric(name: string, labels: Record<string, string>): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  const v = m?.values.find((x) => Object.entries(labels).every(([k, val]) => x.labels[k] === val));
  return v?.value ?? 0;
}
const repaired = (type: string, result: string) => metric('mesh_cni_repair_pods_repaired_total', { type, result });
const failures = (reason: string) => metric('mesh_cni_repair_failures_total', { type: 'repair', reason });

/** A fake in-place repairer: each call gives the next outcome of the pod's script (the last repeats). */
class FakeInPlace {
  readonly calls: string[] = [];
  readonly #script: Map<string, InPlaceResult[]>;
  constructor(script: Record<string, InPlaceResult[]>) {
    this.#script = new Map(Object.entries(script).map(([k, v]) => [k, [...v]]));
  }
  async repair(pod: V1Pod): Promise<InPlaceResult> {
    const name = pod.metadata!.name!;
    this.calls.push(name);
    const s = this.#script.get(name) ?? [OK];
    return s.length > 1 ? s.shift()! : s[0]!;
  }
  count(name: string): number {
    return this.calls.filter((c) => c === name).length;
  }
}
const OK: InPlaceResult = { ok: true, detail: 'IPv4 created, nft; validation passed' };
const fail = (reason: InPlaceReason, final: boolean): InPlaceResult => ({
  ok: false,
  reason,
  detail: `fake ${reason}`,
  final,
});

describe('in-place repair in the repair controller', () => {
  let dir: string;
  let s: TestApiServer;
  const running: { stop(signal: NodeJS.Signals): Promise<void> }[] = [];

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-'));
    configureLogging(
      {
        asJson: false,
        outputLevels: buildSettings({ log_output_level: 'all:warn,repair:debug' }, {}).logging.outputLevels,
      },
      { write: (l) => void logs.push(l) },
    );
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  afterEach(async () => {
    for (const c of running.splice(0).reverse()) await c.stop('SIGTERM');
    await s?.close();
  });

  function settingsFor(flags: RawFlags): Settings {
    const kc = s.writeOrchconfig(path.join(dir, `kc-${Date.now()}-${Math.random()}.json`), {});
    return buildSettings(
      { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc, ...flags },
      { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test' },
    );
  }

  async function start(settings: Settings, inPlace: FakeInPlace | 'unavailable'): Promise<RepairController> {
    const api = orchApi(orchClientArgs(settings));
    const pods = repairPodSource(repairArgs(settings), api, FAST);
    pods.start();
    running.push({ stop: () => pods.stop() });
    const c = startRepair(repairArgs(settings), pods, api, FAST, inPlace);
    running.push(c);
    await c.synced;
    return c;
  }

  const labelled = (name: string) => s.getPod('default', name)?.metadata?.labels?.[LABEL] === 'true';
  const gone = (name: string) => s.getPod('default', name) === undefined;
  const eventsOf = (name: string) => s.events().filter((e) => e.involvedObject.name === name);

  // [repair-repair-pods, label, delete, the pod's in-place outcomes, what must happen]
  type Expect = 'repaired' | 'labelled' | 'deleted' | 'labelled+deleted' | 'reported';
  const TABLE: [boolean, boolean, boolean, InPlaceResult[], Expect, string][] = [
    [true, false, false, [OK], 'repaired', 'in place, nothing else configured'],
    [true, true, false, [OK], 'repaired', 'in place wins over label'],
    [true, false, true, [OK], 'repaired', 'in place wins over delete'],
    [true, true, true, [fail('proof_failed', false), OK], 'repaired', 'a retry that succeeds'],
    [true, true, false, [fail('no_netns', true)], 'labelled', 'a final failure falls through to label at once'],
    [true, false, true, [fail('proof_failed', false)], 'deleted', 'retried up to max attempts, then delete'],
    [true, true, true, [fail('ip_mismatch', true)], 'labelled+deleted', 'falls through to both'],
    [true, false, false, [fail('rules_failed', false)], 'reported', 'neither configured: reported, never silent'],
    [false, true, false, [OK], 'labelled', 'off: label as before, the repairer never called'],
    [true, true, false, [fail('will_not_restart', true)], 'labelled', 'restartPolicy Never: not tried in place'],
    [false, false, true, [OK], 'deleted', 'off: delete as before'],
  ];

  for (const [on, label, del, outcomes, expect, title] of TABLE) {
    const onOff = (b: boolean) => (b ? 'on' : 'off');
    it(`repair ${onOff(on)}, label ${onOff(label)}, delete ${onOff(del)}: ${title}`, async () => {
      s = await startTestApiServer({ bookmarkIntervalMs: 200 });
      const never = outcomes.some((o) => !o.ok && o.reason === 'will_not_restart');
      const p = brokenPod('p-0');
      s.upsertPod(never ? { ...p, spec: { ...p.spec!, restartPolicy: 'Never' } } : p);
      // A restartPolicy Never pod never reaches the repairer: its script is that it must not be called.
      const fake = new FakeInPlace({ 'p-0': never ? [] : outcomes });
      const reason = outcomes.find((o) => !o.ok) as { reason: string } | undefined;
      const before = {
        ok: await repaired('repair', 'success'),
        failed: await repaired('repair', 'fail'),
        reason: reason ? await failures(reason.reason) : 0,
      };
      const flags: RawFlags = {
        'repair-repair-pods': on ? 'true' : 'false',
        'repair-label-pods': label ? 'true' : 'false',
        'repair-delete-pods': del ? 'true' : 'false',
      };
      const c = await start(settingsFor(flags), fake);
      const finalOutcome = outcomes.at(-1)!;
      if (expect === 'repaired') {
        await waitFor('repaired in place', () => eventsOf('p-0').some((e) => e.reason === 'MeshCniRepairedInPlace'));
        const ev = eventsOf('p-0').find((e) => e.reason === 'MeshCniRepairedInPlace')!;
        assert.equal(ev.type, 'Normal');
        assert.match(ev.message ?? '', /proven by the validation check/);
        await sleep(200);
        assert.ok(!labelled('p-0') && !gone('p-0'), 'neither labelled nor deleted');
        assert.equal((await repaired('repair', 'success')) - before.ok, 1);
        assert.equal(fake.count('p-0'), outcomes.length);
        return;
      }
      if (expect === 'labelled') await waitFor('labelled', () => labelled('p-0'));
      if (expect === 'deleted' || expect === 'labelled+deleted') await waitFor('deleted', () => gone('p-0'));
      if (expect === 'reported')
        await waitFor('the report Event', () => eventsOf('p-0').some((e) => e.reason === 'MeshCniRepairInPlaceFailed'));
      await sleep(200);
      if (!on) {
        assert.equal(fake.calls.length, 0, 'no in-place attempt with the flag off');
        assert.equal((c.status() as { inPlace: string }).inPlace, 'off');
        return;
      }
      const attempts = never ? 0 : finalOutcome.ok === false && !finalOutcome.final ? FAST.maxAttempts! : 1;
      assert.equal(fake.count('p-0'), attempts, 'in-place attempts before falling through');
      assert.equal((await repaired('repair', 'fail')) - before.failed, 1, 'one fall-through per pod');
      assert.equal((await failures(reason!.reason)) - before.reason, 1, `failures{reason=${reason!.reason}}`);
      const evs = eventsOf('p-0');
      assert.equal(evs.length, 1, JSON.stringify(evs.map((e) => e.reason)));
      assert.equal(evs[0]!.type, 'Warning');
      const detail = never ? 'restartPolicy Never' : 'fake';
      assert.match(evs[0]!.message ?? '', new RegExp(`in-place repair failed \\(${reason!.reason}: ${detail}`));
      if (expect === 'reported') {
        assert.ok(!labelled('p-0') && !gone('p-0'));
        assert.ok(logs.some((l) => /stays broken/.test(l) && l.includes('p-0')));
      }
    });
  }

  it('a pod repaired in place that breaks again is not repaired in place again: repair_did_not_hold', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('again-0'));
    const fake = new FakeInPlace({});
    const before = await failures('repair_did_not_hold');
    await start(settingsFor({ 'repair-repair-pods': 'true', 'repair-label-pods': 'true' }), fake);
    await waitFor('repaired in place', () => eventsOf('again-0').some((e) => e.reason === 'MeshCniRepairedInPlace'));
    // The init container now passes (lastState keeps the old failed run): not broken any more
    // (detect.ts), so nothing happens.
    const p = s.getPod('default', 'again-0')!;
    const st = p.status!.initContainerStatuses![0]!;
    s.upsertPod({
      ...p,
      status: {
        ...p.status,
        initContainerStatuses: [
          { ...st, restartCount: 1, lastState: st.state, state: { terminated: { exitCode: 0, reason: 'Completed' } } },
        ],
      },
    });
    await sleep(300);
    assert.equal(fake.count('again-0'), 1);
    assert.ok(!labelled('again-0'));
    // A new failed run: the repair did not hold.
    const broken = brokenPod('again-0');
    s.upsertPod({ ...s.getPod('default', 'again-0')!, status: broken.status });
    await waitFor('labelled', () => labelled('again-0'));
    assert.equal(fake.count('again-0'), 1, 'not repaired in place a second time');
    assert.equal((await failures('repair_did_not_hold')) - before, 1);
    const ev = eventsOf('again-0').find((e) => e.reason === 'MeshCniRepairLabelled')!;
    assert.match(ev.message ?? '', /in-place repair failed \(repair_did_not_hold/);
  });

  it('missing capabilities: said once at start-up; each broken pod falls through with no_capability', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    for (let i = 0; i < 3; i++) s.upsertPod(brokenPod(`cap-${i}`));
    s.upsertPod(testPod('fine-0', { initExitCode: 0 }));
    const statusFile = path.join(dir, 'status');
    // CAP_NET_ADMIN and CAP_NET_RAW only (bits 12, 13): no SYS_ADMIN, no SYS_PTRACE.
    await writeFile(statusFile, 'Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t0000000000003000\n');
    const settings = settingsFor({
      'repair-repair-pods': 'true',
      'repair-label-pods': 'true',
      'host-proc-dir': dir,
    });
    const before = await failures('no_capability');
    const mark = logs.length;
    const inPlace = inPlaceFor(repairArgs(settings), null, { selfStatusPath: statusFile, path: dir });
    assert.equal(inPlace, 'unavailable');
    const c = await start(settings, inPlace as 'unavailable');
    await waitFor('all labelled', () => [0, 1, 2].every((i) => labelled(`cap-${i}`)));
    const warned = logs.slice(mark).filter((l) => /in-place repair \(--repair-repair-pods\) is off/.test(l));
    assert.equal(warned.length, 1, 'said once');
    for (const what of ['CAP_SYS_PTRACE', 'CAP_SYS_ADMIN', 'nsenter', `--host-proc-dir`, 'pod netns module'])
      assert.ok(warned[0]!.includes(what), `names ${what}: ${warned[0]}`);
    assert.ok(!warned[0]!.includes('CAP_NET_ADMIN'), 'names only what is missing');
    assert.equal((await failures('no_capability')) - before, 3, 'per pod');
    assert.equal((c.status() as { inPlace: string }).inPlace, 'unavailable');
  });

  it('the flags: default off, paths from the host proc dir, bad values refused in one line', () => {
    const d = buildSettings({}, {});
    assert.equal(d.repair.repairPods, false);
    assert.equal(d.repair.hostProcDir, '/host/proc');
    assert.equal(d.repair.hostNetnsPath, '/host/proc/1/ns/net');
    const e = buildSettings({}, { REPAIR_REPAIR_PODS: 'true', HOST_PROC_DIR: '/hp', HOST_NETNS_PATH: '/run/hostns' });
    assert.equal(e.repair.repairPods, true);
    assert.equal(e.repair.hostProcDir, '/hp');
    assert.equal(e.repair.hostNetnsPath, '/run/hostns');
    assert.equal(buildSettings({ 'host-proc-dir': '/p' }, {}).repair.hostNetnsPath, '/p/1/ns/net');
    assert.throws(
      () => buildSettings({ 'repair-repair-pods': 'maybe' }, {}),
      /invalid value "maybe" for --repair-repair-pods: expected true or false/,
    );
  });

  it('missingCapabilities reads CapEff', () => {
    assert.deepEqual(missingCapabilities('CapEff:\t000001ffffffffff\n'), []);
    assert.deepEqual(missingCapabilities('CapEff:\t0000000000000000\n'), [
      'CAP_NET_ADMIN',
      'CAP_NET_RAW',
      'CAP_SYS_PTRACE',
      'CAP_SYS_ADMIN',
    ]);
    assert.deepEqual(missingCapabilities('CapEff:\t0000000000203000\n'), ['CAP_SYS_PTRACE']);
    assert.equal(missingCapabilities('no such line').length, 4);
  });
});

describe('in-place repair never enters a hostNetwork pod', () => {
  it('a hostNetwork pod is host_network (final) before any netns is looked for or entered', async () => {
    const calls: string[] = [];
    const repairer = new InPlaceRepairer({
      netns: {
        // Were it asked, it would hand out a netns: the refusal must not depend on the scan
        // (a --host-netns-path naming the wrong netns would let the node's own through).
        findPodNetns: async () => {
          calls.push('find');
          return { ok: true, netns: { fd: 99, dev: 1n, ino: 2n, pid: 1, close: () => calls.push('close') } };
        },
        runInNetns: async (_n, argv) => {
          calls.push(argv[0]!);
          return { code: 0, stdout: '', stderr: '', error: null };
        },
        stillThere: async () => true,
      },
      validationBundle: '/nonexistent/mesh-validation.cjs',
      hostFlavour: async () => 'nft',
    });
    const p = brokenPod('hostnet-0');
    p.spec = { ...p.spec!, hostNetwork: true };
    p.status = { ...p.status, podIP: '198.18.7.1', podIPs: [{ ip: '198.18.7.1' }] };
    const r = await repairer.repair(p);
    assert.ok(!r.ok);
    assert.equal(r.reason, 'host_network');
    assert.equal(r.final, true);
    assert.match(r.detail, /hostNetwork/);
    assert.deepEqual(calls, [], 'nothing looked for, opened or run');
  });
});

describe('the start-up check of in-place repair: what every repair would fail on is said once', () => {
  let tmp: string;
  let fullCaps: string;
  before(async () => {
    tmp = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-check-'));
    fullCaps = path.join(tmp, 'status');
    await writeFile(fullCaps, 'Name:\tnode\nCapEff:\t000001ffffffffff\n');
  });
  after(async () => {
    await rm(tmp, { recursive: true, force: true });
  });
  const env = (o: { hostNetnsPath: string; xtablesLock: string }) => ({
    selfStatusPath: fullCaps,
    hostProcDir: '/proc',
    path: '/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin',
    ...o,
  });

  it('a usable host netns and a lock the agent can create: nothing missing', () => {
    const lock = path.join(tmp, 'xtables.lock');
    assert.deepEqual(inPlaceMissing(env({ hostNetnsPath: '/proc/self/ns/net', xtablesLock: lock })), []);
  });

  it('--host-netns-path that is no namespace file (each scan would refuse it) is named with what to set', async () => {
    const notNs = path.join(tmp, 'not-a-netns');
    await writeFile(notNs, '');
    for (const bad of [notNs, path.join(tmp, 'missing')]) {
      const missing = inPlaceMissing(env({ hostNetnsPath: bad, xtablesLock: path.join(tmp, 'l1') }));
      assert.equal(missing.length, 1, JSON.stringify(missing));
      assert.match(missing[0]!, new RegExp(`--host-netns-path ${bad}.*set it to`));
    }
  });

  it("in place only for this node's pods: none with every node's pods watched, or another node's", () => {
    // Every agent would try every broken pod; those on other nodes find no netns (final) and
    // fall through to label/delete at once, before the pod's own agent has repaired it.
    const module = {
      findPodNetns: async () => ({ ok: false as const, reason: 'no_netns' as const, detail: 'fake' }),
      runInNetns: async () => ({ code: 0, stdout: '', stderr: '', error: null }),
    };
    const check = { ...env({ hostNetnsPath: '/proc/self/ns/net', xtablesLock: path.join(tmp, 'l2') }) };
    const flags = { 'repair-enabled': true, 'repair-repair-pods': 'true', 'host-netns-path': '/proc/self/ns/net' };
    const mark = logs.length;
    assert.notEqual(
      inPlaceFor(repairArgs(buildSettings(flags, { NODE_NAME: 'node-a' })), module, check),
      'unavailable',
    );
    for (const [extra, envv] of [
      [{}, {}],
      [{ 'repair-node-name': 'node-a' }, { NODE_NAME: 'node-b' }],
    ] as const) {
      assert.equal(inPlaceFor(repairArgs(buildSettings({ ...flags, ...extra }, envv)), module, check), 'unavailable');
    }
    const warned = logs.slice(mark).filter((l) => /in-place repair \(--repair-repair-pods\) is off/.test(l));
    assert.equal(warned.length, 2, warned.join(''));
    for (const w of warned) assert.match(w, /--repair-node-name/);
  });

  it('the backend the agent decided reaches the repairer: nftables writes the table, iptables restores', async () => {
    const ns = await stat('/proc/self/ns/net', { bigint: true });
    const check = { ...env({ hostNetnsPath: '/proc/self/ns/net', xtablesLock: path.join(tmp, 'l3') }) };
    const flags = {
      'repair-enabled': true,
      'repair-repair-pods': 'true',
      'host-netns-path': '/proc/self/ns/net',
      'host-proc-dir': '/proc',
    };
    for (const native of [true, false]) {
      // What ran in the netns, and what a netns with nothing of ours answers.
      const ran: string[] = [];
      const module = {
        findPodNetns: async () => ({
          ok: true as const,
          netns: { fd: -1, dev: ns.dev, ino: ns.ino, pid: process.pid, close: () => {} },
        }),
        runInNetns: async (_n: unknown, argv: readonly string[]) => {
          ran.push(argv.join(' '));
          const absent = argv[0] === 'nft' && argv.includes('list');
          return absent
            ? { code: 1, stdout: '', stderr: 'Error: No such file or directory\n', error: null }
            : { code: 0, stdout: '', stderr: '', error: null };
        },
      };
      const args = repairArgs(buildSettings(flags, { NODE_NAME: 'node-a' }), native);
      const inPlace = inPlaceFor(args, module, check);
      assert.notEqual(inPlace, 'unavailable');
      const p = brokenPod('backend-0');
      p.status = { ...p.status, podIP: '198.18.7.2', podIPs: [{ ip: '198.18.7.2' }] };
      const r = await (inPlace as InPlaceRepairer).repair(p);
      assert.ok(r.ok, JSON.stringify(r));
      const wrote = ran.filter((c) => /^nft -f -|^ip6?tables-(legacy|nft)-restore/.test(c));
      if (native) assert.deepEqual(wrote, ['nft -f -'], ran.join('\n'));
      else assert.match(wrote.join('\n'), /^iptables-(legacy|nft)-restore/, ran.join('\n'));
      assert.match(r.detail, native ? /nftables table inet mesh_pod created/ : /IPv4 created/);
    }
  });

  it("iptables-legacy's lock file that cannot be created (a read-only /run) is named with what to mount", () => {
    const lock = path.join(tmp, 'no-such-dir', 'xtables.lock');
    const missing = inPlaceMissing(env({ hostNetnsPath: '/proc/self/ns/net', xtablesLock: lock }));
    assert.equal(missing.length, 1, JSON.stringify(missing));
    assert.match(missing[0]!, new RegExp(`${lock}.*ENOENT.*writable /run`));
  });
});

describe('in-place repair: a labelled pod that keeps failing is not acted on or counted again', () => {
  let s: TestApiServer;
  let dir: string;
  const running: { stop(signal: NodeJS.Signals): Promise<void> }[] = [];
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-loop-'));
  });
  after(async () => {
    for (const c of running.splice(0).reverse()) await c.stop('SIGTERM');
    await s?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('repair_did_not_hold: labelled with one Event and counted once, not again on each later failed run', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('loop-0'));
    const kc = s.writeOrchconfig(path.join(dir, 'kc.json'), {});
    const settings = buildSettings(
      { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc },
      { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test', REPAIR_REPAIR_PODS: 'true', REPAIR_LABEL_PODS: 'true' },
    );
    const api = orchApi(orchClientArgs(settings));
    const pods = repairPodSource(repairArgs(settings), api, FAST);
    pods.start();
    running.push({ stop: () => pods.stop() });
    const fake = new FakeInPlace({});
    const c = startRepair(repairArgs(settings), pods, api, FAST, fake);
    running.push(c);
    await c.synced;
    const events = () => s.events().filter((e) => e.involvedObject.name === 'loop-0');
    const isLabelled = () => s.getPod('default', 'loop-0')?.metadata?.labels?.[LABEL] === 'true';
    await waitFor('repaired in place', () => events().some((e) => e.reason === 'MeshCniRepairedInPlace'));
    const before = { held: await failures('repair_did_not_hold'), fell: await repaired('repair', 'fail') };
    // The pod's validation container fails again (a new run), and again, and again.
    for (let run = 0; run < 3; run++) {
      s.upsertPod({ ...s.getPod('default', 'loop-0')!, status: brokenPod('loop-0').status });
      if (run === 0) await waitFor('labelled', isLabelled);
      await sleep(300);
    }
    assert.equal(fake.count('loop-0'), 1, 'one in-place repair');
    const warnings = events().filter((e) => e.reason === 'MeshCniRepairLabelled');
    assert.equal(warnings.length, 1, JSON.stringify(events().map((e) => e.reason)));
    assert.equal((await failures('repair_did_not_hold')) - before.held, 1, 'did_not_hold counted once');
    assert.equal((await repaired('repair', 'fail')) - before.fell, 1, 'fell through once');
  });

  it('labelled after a failed in-place repair: later failed runs are not tried in place again (the label hands it over)', async () => {
    // A server of its own: the first test's controller still watches its server.
    const s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    running.push({ stop: () => s.close() });
    s.upsertPod(brokenPod('loop-1'));
    const fake = new FakeInPlace({ 'loop-1': [fail('no_netns', true)] });
    const kc = s.writeOrchconfig(path.join(dir, 'kc1.json'), {});
    const settings = buildSettings(
      { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc },
      { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test', REPAIR_REPAIR_PODS: 'true', REPAIR_LABEL_PODS: 'true' },
    );
    const api = orchApi(orchClientArgs(settings));
    const pods = repairPodSource(repairArgs(settings), api, FAST);
    pods.start();
    running.push({ stop: () => pods.stop() });
    const c = startRepair(repairArgs(settings), pods, api, FAST, fake);
    running.push(c);
    await c.synced;
    const events = () => s.events().filter((e) => e.involvedObject.name === 'loop-1');
    await waitFor('labelled', () => s.getPod('default', 'loop-1')?.metadata?.labels?.[LABEL] === 'true');
    for (let run = 0; run < 2; run++) {
      s.upsertPod({ ...s.getPod('default', 'loop-1')!, status: brokenPod('loop-1').status });
      await sleep(300);
    }
    assert.equal(fake.count('loop-1'), 1, 'one in-place attempt');
    assert.equal(events().length, 1, JSON.stringify(events().map((e) => e.reason)));
  });
});

describe('in-place repair: what a pod netns prints cannot blow up an Event or a log line', () => {
  let s: TestApiServer;
  let dir: string;
  const running: { stop(signal: NodeJS.Signals): Promise<void> }[] = [];
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-long-'));
  });
  after(async () => {
    for (const c of running.splice(0).reverse()) await c.stop('SIGTERM');
    await s?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('a 200 kB failure detail (a netns with thousands of addresses) is cut in the Event and the log', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('long-0'));
    const kc = s.writeOrchconfig(path.join(dir, 'kc.json'), {});
    const settings = buildSettings(
      { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc },
      { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test', REPAIR_REPAIR_PODS: 'true', REPAIR_LABEL_PODS: 'true' },
    );
    const api = orchApi(orchClientArgs(settings));
    const pods = repairPodSource(repairArgs(settings), api, FAST);
    pods.start();
    running.push({ stop: () => pods.stop() });
    const huge = `no netns of the pod holds 198.18.7.1: netns inode 1 holds ${'198.18.9.9, '.repeat(17_000)}`;
    const fake = new FakeInPlace({ 'long-0': [{ ok: false, reason: 'ip_mismatch', detail: huge, final: true }] });
    const mark = logs.length;
    const c = startRepair(repairArgs(settings), pods, api, FAST, fake);
    running.push(c);
    await c.synced;
    const events = () => s.events().filter((e) => e.involvedObject.name === 'long-0');
    await waitFor('the Event', () => events().length > 0);
    const msg = events()[0]!.message ?? '';
    assert.match(msg, /in-place repair failed \(ip_mismatch: no netns of the pod holds 198\.18\.7\.1/);
    assert.ok(msg.length <= 2048, `Event message of ${msg.length} characters`);
    assert.match(msg, /\d+ more characters/);
    const longest = Math.max(...logs.slice(mark).map((l) => l.length));
    assert.ok(longest <= 4096, `a log line of ${longest} characters`);
  });
});

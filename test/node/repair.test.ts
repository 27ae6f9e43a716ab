// The repair controller end to end against the test API server (real HTTPS, real client-node
// wire, real watch streams), with the API server misbehaving in the ways a real one can
// (throttling, errors, dropped watches). Timings are shortened through the controller's timing
// options; the logic is the production one.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { buildSettings, type RawFlags } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import type { RepairController, RepairTiming } from '../../src/repair/controller.ts';
import { repairPodSource, startRepair } from '../../src/repair/index.ts';
import { orchClientArgs, repairArgs } from '../../src/partargs.ts';
import { orchApi } from '../../src/orch/client.ts';
import type { Settings } from '../../src/config/settings.ts';
import { ROOT } from '../helpers/cli.ts';
import { apiRequest, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor as pollFor } from '../helpers/poll.ts';
import { brokenPod, testPod } from '../helpers/pods.ts';
import { DEPLOY_DIR, kustomize } from '../helpers/podman-daemonset.ts';
import { scratchAgentFlags } from '../helpers/agent.ts';
import { rulesFor } from '../helpers/rbac.ts';

const FAST: Partial<RepairTiming> = {
  watchBackoffBaseMs: 50,
  watchBackoffMaxMs: 400,
  actionBackoffBaseMs: 50,
  actionBackoffMaxMs: 400,
  silenceTimeoutMs: 1500,
  healthyWatchMs: 1000,
  requestTimeoutMs: 3000,
  watchTimeoutSeconds: 30,
  resyncIntervalMs: 60_000,
  stopGraceMs: 5000,
};

const LABEL = 'cni.mesh.io/uninitialized';
const logs: string[] = [];

/** waitFor with the last log lines of the controller in its timeout error. */
const waitFor = (what: string, pred: () => boolean, timeoutMs = 10_000) =>
  pollFor(what, pred, { timeoutMs, context: () => `last log lines:\n${logs.slice(-15).join('')}` });

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function count(s: TestApiServer, method: string, re: RegExp, since = 0): number {
  return s.requests.filter((r) => r.time >= since && r.method === method && re.test(r.path)).length;
}

async function metric(name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  const v = m?.values.find((x) => Object.entries(labels).every(([k, val]) => x.labels[k] === val));
  return v?.value ?? 0;
}

describe('repair controller end to end', () => {
  let dir: string;
  let s: TestApiServer;
  /** Controllers and the watches they read, stopped in reverse: each controller before its watch. */
  const running: { stop(signal: NodeJS.Signals): Promise<void> }[] = [];

  /** Repair on a watch of its own, as the agent runs it (the watch started first, stopped last). */
  function launch(settings: Settings, timing: Partial<RepairTiming>): RepairController {
    const api = orchApi(orchClientArgs(settings));
    const pods = repairPodSource(repairArgs(settings), api, timing);
    pods.start();
    running.push({ stop: () => pods.stop() });
    const c = startRepair(repairArgs(settings), pods, api, timing);
    running.push(c);
    return c;
  }

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-'));
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

  async function start(
    flags: RawFlags,
    timing: Partial<RepairTiming> = FAST,
    token?: string,
  ): Promise<RepairController> {
    const kc = s.writeOrchconfig(path.join(dir, `kc-${Date.now()}-${Math.random()}.json`), { token });
    const settings = buildSettings(
      { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc, ...flags },
      { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test' },
    );
    const c = launch(settings, timing);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>(
      (_, reject) => (timer = setTimeout(() => reject(new Error('controller never listed pods')), 10_000)),
    );
    await Promise.race([c.synced, timeout]).finally(() => clearTimeout(timer));
    return c;
  }

  const labelled = (name: string, ns = 'default') => s.getPod(ns, name)?.metadata?.labels?.[LABEL] === 'true';

  it('labels broken pods on its node exactly once and records why; leaves the rest alone', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    for (let i = 0; i < 3; i++) s.upsertPod(brokenPod(`web-${i}`));
    s.upsertPod(brokenPod('web-last', { where: 'lastState', namespace: 'shop' }));
    s.upsertPod(brokenPod('elsewhere-0', { node: 'node-b' }));
    s.upsertPod(testPod('healthy-0', { initExitCode: 0 }));
    s.upsertPod(brokenPod('plain-0', { meshed: false }));
    const before = await metric('mesh_cni_repair_pods_repaired_total', { type: 'label', result: 'success' });
    const c = await start({ 'repair-label-pods': true });
    assert.equal(c.mode, 'label');
    await waitFor(
      '4 pods labelled',
      () => ['web-0', 'web-1', 'web-2'].every((n) => labelled(n)) && labelled('web-last', 'shop'),
    );
    // A pod that breaks later, as kubelet reports it through the status subresource.
    s.upsertPod(testPod('late-0'));
    const broken = brokenPod('late-0');
    const st = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/late-0/status',
      { status: broken.status },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(st.status, 200, st.text);
    await waitFor('late pod labelled', () => labelled('late-0'));
    // More updates of the same broken state, a closed watch and a resync change nothing.
    s.upsertPod({
      ...s.getPod('default', 'web-0')!,
      metadata: {
        ...s.getPod('default', 'web-0')!.metadata,
        annotations: { 'sidecar.mesh.io/status': 'x', touched: '1' },
      },
    });
    const watchesBefore = count(s, 'GET', /\/api\/v1\/pods$/);
    s.closeWatches();
    await waitFor('a new watch', () => count(s, 'GET', /\/api\/v1\/pods$/) > watchesBefore);
    await sleep(300);
    assert.equal(
      count(s, 'PATCH', /\/pods\/[^/]+\/status$/),
      5 + 1,
      "one label patch per broken pod, on the status subresource (+ the kubelet's above)",
    );
    for (const n of ['elsewhere-0', 'healthy-0', 'plain-0']) {
      const p = s.listPods().find((x) => x.metadata?.name === n)!;
      assert.equal(p.metadata?.labels?.[LABEL], undefined, `${n} untouched`);
    }
    assert.equal(count(s, 'PATCH', /elsewhere|healthy|plain/), 0);
    assert.ok(!s.requests.some((r) => r.query.includes('node-b')), 'only its own node is asked for');
    const evs = s.events();
    assert.equal(evs.length, 5);
    const ev = evs.find((e) => e.involvedObject.name === 'web-last')!;
    assert.equal(ev.metadata?.namespace, 'shop');
    assert.equal(ev.involvedObject.uid, s.getPod('shop', 'web-last')!.metadata!.uid);
    assert.equal(ev.reason, 'MeshCniRepairLabelled');
    assert.match(ev.message ?? '', /mesh-validation.*exit code 126.*labelled cni.mesh.io\/uninitialized=true/);
    assert.equal(
      (await metric('mesh_cni_repair_pods_repaired_total', { type: 'label', result: 'success' })) - before,
      5,
    );
    const st2 = c.status() as { counts: { labelled: number; seenBroken: number } };
    assert.equal(st2.counts.labelled, 5);
    assert.equal(st2.counts.seenBroken, 5);
    assert.deepEqual(c.notReadyReasons(), []);
  });

  it('labels through pods/status with only the rights deploy/ gives the agent (no pods patch); deletes only with the repair-delete rights', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    const rules = rulesFor(kustomize(DEPLOY_DIR).objects, 'mesh-system', 'mesh-cni');
    const agentToken = s.serviceAccount('mesh-system', 'mesh-cni', rules);
    s.upsertPod(brokenPod('rbac-0'));
    const c = await start({ 'repair-label-pods': true }, FAST, agentToken);
    await waitFor('rbac-0 labelled', () => labelled('rbac-0'));
    // The Event goes beside the repair, not after it.
    await waitFor('the Event on rbac-0', () =>
      s.events().some((e) => e.involvedObject.name === 'rbac-0' && e.reason === 'MeshCniRepairLabelled'),
    );
    assert.equal(s.requests.filter((r) => r.status === 403).length, 0, 'no call beyond the granted rights');
    await c.stop('SIGTERM');
    // Delete mode with the base rights is refused (403): deleting is opt-in.
    s.upsertPod(brokenPod('rbac-1'));
    const failedBefore = await metric('mesh_cni_repair_pods_repaired_total', { type: 'delete', result: 'fail' });
    const d = await start({ 'repair-delete-pods': true }, FAST, agentToken);
    await waitFor('the refused delete of rbac-1', () =>
      s.requests.some((r) => r.method === 'DELETE' && r.path.endsWith('/rbac-1') && r.status === 403),
    );
    await waitFor(
      'gave up on the refused deletes',
      () => (d.status() as { counts: { gaveUp: number } }).counts.gaveUp >= 1,
    );
    assert.ok(s.getPod('default', 'rbac-1'));
    assert.equal(
      (await metric('mesh_cni_repair_pods_repaired_total', { type: 'delete', result: 'fail' })) - failedBefore,
      (d.status() as { counts: { gaveUp: number } }).counts.gaveUp,
      'each delete given up (rbac-0 and rbac-1) counts as result fail',
    );
    await d.stop('SIGTERM');
    s.setRules(agentToken, [...rules, { verbs: ['delete'], apiGroups: [''], resources: ['pods'] }]);
    s.upsertPod(brokenPod('rbac-2'));
    await start({ 'repair-delete-pods': true }, FAST, agentToken);
    await waitFor('rbac-2 deleted once the delete is granted', () => s.getPod('default', 'rbac-2') === undefined);
  });

  it('deletes broken pods once with a uid precondition; a new pod under the same name is never hit', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('db-0'));
    s.upsertPod(brokenPod('db-1'));
    s.upsertPod(brokenPod('elsewhere-0', { node: 'node-b' }));
    // The first delete of db-1 fails; meanwhile its controller replaces it with a new, healthy pod.
    s.faults.status = { code: 500, paths: /\/pods\/db-1$/, count: 1 };
    const c = await start(
      { 'repair-delete-pods': true },
      { ...FAST, actionBackoffBaseMs: 400, actionBackoffMaxMs: 400 },
    );
    await waitFor('db-0 deleted', () => s.getPod('default', 'db-0') === undefined);
    await waitFor('the failed delete of db-1', () =>
      s.requests.some((r) => r.method === 'DELETE' && r.path.endsWith('/db-1') && r.status === 500),
    );
    const oldUid = s.getPod('default', 'db-1')!.metadata!.uid;
    s.deletePodFromStore('default', 'db-1');
    const fresh = s.upsertPod(testPod('db-1'));
    assert.notEqual(fresh.metadata!.uid, oldUid);
    await waitFor('the retried delete', () => count(s, 'DELETE', /\/db-1$/) >= 2, 5000);
    await sleep(300);
    assert.equal(s.getPod('default', 'db-1')?.metadata?.uid, fresh.metadata!.uid, 'the new pod survives');
    const retried = s.requests.filter((r) => r.method === 'DELETE' && r.path.endsWith('/db-1'));
    assert.ok(
      retried.at(-1)!.status === 409 || retried.at(-1)!.status === 404,
      `retry answered ${retried.at(-1)!.status}`,
    );
    // The recreated db-0 (healthy) is untouched too.
    s.upsertPod(testPod('db-0', { initExitCode: 0 }));
    await sleep(300);
    assert.ok(s.getPod('default', 'db-0'));
    assert.equal(count(s, 'DELETE', /\/db-0$/), 1);
    assert.ok(s.getPod('default', 'elsewhere-0'));
    assert.equal(count(s, 'PATCH', /.*/), 0, 'delete mode does not label');
    const st = c.status() as { counts: { deleted: number } };
    assert.equal(st.counts.deleted, 1);
    assert.ok(s.events().some((e) => e.involvedObject.name === 'db-0' && e.reason === 'MeshCniRepairDeleting'));
  });

  it('with both flags: labels, records the Event, then deletes', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('both-0'));
    const c = await start({ 'repair-delete-pods': true, 'repair-label-pods': true });
    assert.equal(c.mode, 'label+delete');
    await waitFor('deleted', () => s.getPod('default', 'both-0') === undefined);
    const order = s.requests.filter((r) => r.method !== 'GET').map((r) => `${r.method} ${r.path.replace(/.*\//, '')}`);
    assert.deepEqual(order, ['PATCH status', 'POST events', 'DELETE both-0']);
  });

  // A repair not started yet of a pod deleted meanwhile is taken out of the queue.
  it('a queued repair of a pod deleted before its turn sends nothing for it', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    const c = await start({ 'repair-label-pods': true, 'repair-concurrency': '1' });
    s.faults.delayMs = 1000;
    s.upsertPod(brokenPod('slow-0'));
    await waitFor('slow-0 being labelled', () => count(s, 'PATCH', /\/pods\/slow-0\/status$/) === 1);
    s.upsertPod(brokenPod('gone-0'));
    await waitFor('gone-0 queued behind it', () => c.status().queued === 1);
    s.deletePodFromStore('default', 'gone-0');
    await waitFor('gone-0 out of the queue', () => c.status().queued === 0);
    delete s.faults.delayMs;
    await waitFor('slow-0 labelled', () => labelled('slow-0'));
    await sleep(300);
    assert.equal(count(s, 'PATCH', /\/pods\/gone-0\/status$/), 0, 'no request for the deleted pod');
  });

  it('--repair-enabled alone says at start that it is report only, and which flags act', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    const from = logs.length;
    const c = await start({});
    assert.equal(c.mode, 'report');
    const said = logs.slice(from).filter((l) => /\trepair\t.*report only/.test(l));
    assert.equal(said.length, 1, logs.slice(from).join(''));
    assert.match(said[0]!, /--repair-label-pods/);
    const acting = logs.length;
    await start({ 'repair-label-pods': true });
    assert.ok(!logs.slice(acting).some((l) => /report only/.test(l)), 'not when it acts');
  });

  it('report only: counts and logs, sends nothing', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('rep-0'));
    s.upsertPod(brokenPod('rep-1'));
    const c = await start({});
    assert.equal(c.mode, 'report');
    await waitFor('reported', () => (c.status() as { counts: { reported: number } }).counts.reported === 2);
    s.expireResourceVersions();
    await waitFor('relist', () => (c.status() as { watch: { lists: number } }).watch.lists >= 2);
    assert.equal(
      (c.status() as { counts: { reported: number; seenBroken: number } }).counts.seenBroken,
      2,
      'a relist is not a new broken state',
    );
    assert.equal(s.requests.filter((r) => r.method !== 'GET').length, 0);
    assert.ok(logs.some((l) => /\trepair\t.*report only.*rep-0/.test(l)));
  });

  it('410 Gone during the watch: relists and acts on nothing twice, even if the label was removed meanwhile', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    for (let i = 0; i < 3; i++) s.upsertPod(brokenPod(`gone-${i}`));
    const c = await start({ 'repair-label-pods': true });
    await waitFor('labelled', () => [0, 1, 2].every((i) => labelled(`gone-${i}`)));
    // An operator takes the label off gone-0 by hand: the same broken state is not labelled again.
    const un = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/gone-0',
      { metadata: { labels: { [LABEL]: null } } },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(un.status, 200);
    const restartsBefore = await metric('mesh_cni_repair_watch_restarts_total', { reason: 'expired' });
    s.expireResourceVersions();
    s.upsertPod(brokenPod('gone-3'));
    await waitFor('relist after 410', () => (c.status() as { watch: { lists: number } }).watch.lists >= 2);
    await waitFor('new pod labelled', () => labelled('gone-3'));
    await sleep(300);
    assert.equal(count(s, 'PATCH', /\/pods\/gone-\d(\/status)?$/), 5, '3 labels + the operator patch + gone-3');
    assert.equal(labelled('gone-0'), false);
    assert.equal((await metric('mesh_cni_repair_watch_restarts_total', { reason: 'expired' })) - restartsBefore, 1);
    // A new failed run of the init container is a new broken state: labelled again.
    s.upsertPod({ ...brokenPod('gone-0'), metadata: { ...s.getPod('default', 'gone-0')!.metadata } });
    await waitFor('new broken state labelled', () => labelled('gone-0'));
  });

  it('API server down for 10 s: keeps retrying with backoff and handles pods that broke meanwhile', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(brokenPod('early-0'));
    const c = await start({ 'repair-label-pods': true }, { ...FAST, watchBackoffMaxMs: 2000 });
    await waitFor('early labelled', () => labelled('early-0'));
    await s.stop();
    for (let i = 0; i < 3; i++) s.upsertPod(brokenPod(`down-${i}`));
    await sleep(10_000);
    const st = c.status() as { watch: { state: string; watchRestarts: { error: number; closed: number } } };
    assert.ok(st.watch.watchRestarts.error >= 3, `kept retrying: ${JSON.stringify(st.watch)}`);
    assert.ok(st.watch.watchRestarts.error <= 20, `with backoff, not a hot loop: ${JSON.stringify(st.watch)}`);
    const since = Date.now();
    await s.start();
    await waitFor('pods broken while down are labelled', () => [0, 1, 2].every((i) => labelled(`down-${i}`)), 10_000);
    assert.equal(count(s, 'PATCH', /\/pods\/down-\d\/status$/, since), 3);
    assert.equal(count(s, 'PATCH', /\/pods\/early-0\/status$/), 1);
  });

  it('a watch that goes silent is detected and restarted', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    const c = await start({ 'repair-label-pods': true });
    await waitFor('watching', () => s.openWatches() === 1);
    s.faults.silentWatches = true;
    s.upsertPod(brokenPod('hush-0'));
    await sleep(200);
    s.faults.silentWatches = false;
    assert.equal(labelled('hush-0'), false, 'the silent watch delivered nothing');
    await waitFor('silent restart and label', () => labelled('hush-0'), 8000);
    const st = c.status() as { watch: { watchRestarts: { silent: number } } };
    assert.ok(st.watch.watchRestarts.silent >= 1);
  });

  it('500 and 429 storms: backs off (no hot loop), honours Retry-After, and recovers', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.faults.status = { code: 500, paths: /^\/api\/v1\/pods$/ };
    const t0 = Date.now();
    const kc = s.writeOrchconfig(path.join(dir, 'storm.json'));
    const settings = buildSettings(
      { 'repair-enabled': true, 'repair-label-pods': true, 'repair-node-name': 'node-a', orchconfig: kc },
      {},
    );
    launch(settings, { ...FAST, watchBackoffBaseMs: 100, watchBackoffMaxMs: 1000 });
    await sleep(3000);
    const lists = count(s, 'GET', /^\/api\/v1\/pods$/, t0);
    // 100, 200, 400, 800, 1000 ms (+-50%): about 6 tries in 3 s; a hot loop would make hundreds.
    assert.ok(lists >= 3 && lists <= 12, `${lists} list requests in 3 s of 500s`);
    delete s.faults.status;
    s.upsertPod(brokenPod('storm-0'));
    await waitFor('recovered', () => labelled('storm-0'));

    // 429 with Retry-After: 1 on the pod: the next attempt waits at least that long.
    s.faults.status = { code: 429, retryAfterSeconds: 1, paths: /\/pods\/storm-1\/status$/, count: 2 };
    s.upsertPod(brokenPod('storm-1'));
    await waitFor('labelled after the 429s', () => labelled('storm-1'), 8000);
    const tries = s.requests.filter((r) => r.method === 'PATCH' && r.path.endsWith('/storm-1/status'));
    assert.deepEqual(
      tries.map((r) => r.status),
      [429, 429, 200],
    );
    assert.ok(tries[1]!.time - tries[0]!.time >= 950 && tries[2]!.time - tries[1]!.time >= 950, 'Retry-After honoured');
    assert.ok((await metric('mesh_cni_repair_failures_total', { type: 'label', reason: 'throttled' })) >= 2);
  });

  it('gives up after a bounded number of attempts when the API server keeps refusing, and says so', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.faults.status = { code: 403, paths: /\/pods\/deny-0\/status$/ };
    s.upsertPod(brokenPod('deny-0'));
    const c = await start({ 'repair-label-pods': true });
    await waitFor('gave up', () => (c.status() as { counts: { gaveUp: number } }).counts.gaveUp === 1);
    await sleep(300);
    assert.equal(count(s, 'PATCH', /deny-0\/status$/), 1, 'a 403 is not retried at once');
    assert.ok(logs.some((l) => /giving up/.test(l) && /deny-0/.test(l)));
  });

  it('SIGTERM to the real agent: in-flight repairs finish whole (label and delete), nothing new starts, exit 0', async (t) => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    for (let i = 0; i < 20; i++) s.upsertPod(brokenPod(`term-${i}`));
    // Slow answers, so SIGTERM lands while repairs are under way.
    s.faults.delayMs = 300;
    const root = await mkdtemp(path.join(dir, 'agent-'));
    for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(root, d));
    const kc = s.writeOrchconfig(path.join(root, 'kc.json'));
    const child = spawn(
      process.execPath,
      [
        path.join(ROOT, 'bin', 'install-cni.js'),
        '--repair-enabled',
        '--repair-label-pods',
        '--repair-delete-pods',
        '--repair-concurrency',
        '4',
        '--repair-node-name',
        'node-a',
        ...scratchAgentFlags(root, kc),
      ],
      {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    t.after(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    await waitFor('the first label patch', () => count(s, 'PATCH', /term-/) >= 1, 15_000);
    child.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([
      exited,
      new Promise<string>((r) => (timer = setTimeout(() => r('timeout'), 20_000))),
    ]).finally(() => clearTimeout(timer));
    assert.equal(code, 0, `agent exit ${String(code)}:\n${out.slice(-3000)}`);
    assert.match(out, /repair controller stopped/);
    const patched = s.requests
      .filter((r) => r.method === 'PATCH')
      .map((r) => r.path.replace(/\/status$/, '').replace(/.*\//, ''));
    const deleted = s.requests
      .filter((r) => r.method === 'DELETE' && r.status === 200)
      .map((r) => r.path.replace(/.*\//, ''));
    assert.ok(
      patched.length >= 1 && patched.length < 20,
      `SIGTERM stopped queued work (${patched.length} of 20 started)`,
    );
    assert.deepEqual(
      [...deleted].sort(),
      [...patched].sort(),
      'every pod that was labelled was also deleted: no half-done repair',
    );
    for (const p of s.listPods())
      assert.equal(p.metadata?.labels?.[LABEL], undefined, `${p.metadata?.name} left labelled but not deleted`);
  });
});

// Start-up you can see (docs/observability.md "Start-up stages"): the real agent against the test API server
// says in mesh_cni_startup_duration_seconds when it started its parts, when it was first ready
// and when each watch first asked, was first answered and first had the whole state; a stage not
// reached yet has no series. Every not-ready reason and note on /readyz and in ControlZ says since
// when. Only what is always true is asserted: orders within one watch and within the agent, never
// between watches and the agent's readiness (a watch need not be done for the agent to be ready).

import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { Component } from '../../src/component.ts';
import { AgentReadiness, SinceTracker } from '../../src/monitoring/readiness.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { run } from '../helpers/netns.ts';
import { noFirewallPath } from '../helpers/nofirewall.ts';
import { promtoolProblems, request } from '../helpers/observability.ts';
import { waitFor } from '../helpers/poll.ts';

const defer = cleanupAfterEach();
const FAMILY = 'mesh_cni_startup_duration_seconds';
const OPENMETRICS = 'application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5';
/** RFC 3339 as toISOString writes it. */
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/;

/** The start-up series of an exposition: `stage` or `watch/stage` -> seconds. */
function stages(exposition: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of exposition.matchAll(new RegExp(`^${FAMILY}\\{([^}]*)\\} (\\S+)$`, 'gm'))) {
    const labels = Object.fromEntries([...m[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1]!, l[2]!]));
    out.set(labels.watch ? `${labels.watch}/${labels.stage}` : labels.stage!, Number(m[2]));
  }
  return out;
}

/** The stages a watch went through are in their order, each after the process started. */
function assertWatchOrder(s: Map<string, number>, watch: string): void {
  const at = ['first_request', 'first_response', 'initial_list'].map((st) => s.get(`${watch}/${st}`));
  assert.ok(
    at.every((v) => v !== undefined && v > 0),
    `${watch}: ${JSON.stringify(Object.fromEntries(s))}`,
  );
  assert.ok(at[0]! <= at[1]! && at[1]! <= at[2]!, `${watch} in order: ${at.join(' <= ')}`);
}

/** promtool on the Prometheus text; a strict OpenMetrics parser, and promtool on the start-up family, for OpenMetrics. */
async function assertCleanExpositions(a: AgentProcess): Promise<void> {
  const text = (await a.get('/metrics')).body;
  assert.equal(await promtoolProblems(text), '');
  const port = await a.monitoringPort();
  const om = await request(`http://127.0.0.1:${port}/metrics`, { headers: { accept: OPENMETRICS } });
  assert.match(String(om.headers['content-type']), /^application\/openmetrics-text/);
  assert.deepEqual(stages(om.body), stages(text), 'the same start-up series in both formats');
  const py = await run(
    '/usr/bin/python3',
    [
      '-c',
      [
        'import sys',
        'from prometheus_client.openmetrics.parser import text_string_to_metric_families as p',
        `print([f.type for f in p(sys.stdin.read()) if f.name == '${FAMILY}'])`,
      ].join('\n'),
    ],
    { input: om.body },
  );
  assert.equal(py.code, 0, py.stderr);
  assert.equal(py.stdout.trim(), "['gauge']");
  // promtool reads the Prometheus text format only (an OpenMetrics counter's *_total sample is
  // foreign to it), so of the OpenMetrics answer it checks the start-up family, which is the same.
  const family = om.body.split('\n').filter((l) => l.includes(FAMILY));
  assert.equal(await promtoolProblems(family.join('\n') + '\n'), '');
}

/** /readyz reasons and notes: each with its since, which must be RFC 3339. */
function timedLines(body: string): { text: string; since: string }[] {
  return body
    .split('\n')
    .filter((l) => l.startsWith('- ') || l.startsWith('note: '))
    .map((l) => {
      const m = /^(?:- |note: )(.*) \(since (\S+)\)$/.exec(l);
      assert.ok(m, `no since on ${JSON.stringify(l)}`);
      assert.match(m[2]!, RFC3339);
      return { text: m[1]!, since: m[2]! };
    });
}

async function cluster(): Promise<{ api: TestApiServer; tree: HostTree }> {
  const api = await startTestApiServer();
  defer(() => api.close());
  const tree = await makeHostTree({ token: api.token, ca: api.caPem });
  defer(() => tree.remove());
  api.upsertNamespace({ metadata: { name: 'mesh-system' } });
  api.upsertPod({
    metadata: { name: 'web-0', namespace: 'shop' },
    spec: { nodeName: 'node-1', containers: [{ name: 'app', image: 'app' }] },
  });
  return { api, tree };
}

function agentOn(api: TestApiServer, tree: HostTree, flags: Record<string, string> = {}, env = {}): AgentProcess {
  const a = spawnAgent(
    tree,
    { 'cleanup-on-exit': 'never', ...flags },
    {
      KUBERNETES_SERVICE_HOST: api.host,
      KUBERNETES_SERVICE_PORT: String(api.port),
      NODE_NAME: 'node-1',
      POD_NAMESPACE: 'mesh-system',
      ...env,
    },
  );
  defer(() => a.stop('SIGKILL'));
  return a;
}

describe('start-up stages of the running agent', () => {
  it('an agent that becomes ready: started, then ready, no ready series before; the node pod watch in order; promtool clean', async () => {
    const { api, tree } = await cluster();
    const spawned = Date.now();
    // No primary CNI config: the installer waits, so the agent is not ready yet.
    const a = agentOn(api, tree);
    await a.waitForLog((r) => r.msg === 'install-cni started', 'every part started', 20_000);
    const before = await a.get('/readyz');
    assert.equal(before.status, 503, before.body);
    const waiting = timedLines(before.body);
    assert.ok(
      waiting.some((l) => /waiting for a primary CNI config/.test(l.text)),
      before.body,
    );
    for (const l of waiting) assert.ok(Date.parse(l.since) >= spawned - 1000, `${l.since} is after the spawn`);
    const notYet = stages((await a.get('/metrics')).body);
    assert.ok(notYet.has('started'), JSON.stringify(Object.fromEntries(notYet)));
    assert.equal(notYet.has('ready'), false, 'no ready series before the agent is ready');

    await writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    let last = '';
    await waitFor(
      '/readyz 200',
      async () => {
        const r = await a.get('/readyz');
        last = r.body;
        return r.status === 200;
      },
      { timeoutMs: 20_000, context: () => last },
    );
    // Ready once /readyz said so: the series is there at once, not a poll later.
    const s = stages((await a.get('/metrics')).body);
    assert.ok(s.get('started')! > 0 && s.get('started')! <= s.get('ready')!, JSON.stringify(Object.fromEntries(s)));
    const all = await waitFor(
      'the node pod watch to have its state',
      async () => {
        const now = stages((await a.get('/metrics')).body);
        return now.has('node_pods/initial_list') && now;
      },
      20_000,
    );
    assertWatchOrder(all, 'node_pods');
    assert.equal(all.get('ready'), s.get('ready'), 'set once, never moved');
    await assertCleanExpositions(a);
    assert.equal(await a.stop('SIGTERM'), 0, a.stderr());
  });

  it('an agent never ready (ambient mode cannot start here): both watches in order, no ready series, reasons with since in /readyz and ControlZ alike', async () => {
    const { api, tree } = await cluster();
    await writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    // No working iptables or ipset to find: the dataplane cannot start, so it touches nothing here.
    const a = agentOn(api, tree, { 'ambient-enabled': 'true' }, { PATH: noFirewallPath() });
    const ctrlz = await a.waitForLog((r) => r.msg === 'ControlZ listening', 'ControlZ', 20_000);
    const s = await waitFor(
      'both watches to have their state',
      async () => {
        const now = stages((await a.get('/metrics')).body);
        return now.has('node_pods/initial_list') && now.has('namespaces/initial_list') && now;
      },
      20_000,
    );
    assertWatchOrder(s, 'node_pods');
    assertWatchOrder(s, 'namespaces');
    assert.equal(s.has('ready'), false, 'not ready: no ready series');

    const readyz = await a.get('/readyz');
    assert.equal(readyz.status, 503, readyz.body);
    assert.match(readyz.body, /^not ready:\n- ambient: /);
    const lines = timedLines(readyz.body);
    const cs = JSON.parse((await request(`http://127.0.0.1:${String(ctrlz.port)}/api/components`)).body) as {
      name: string;
      not_ready: { reason: string; since: string }[];
      notes: { note: string; since: string }[];
    }[];
    const ambient = cs.find((c) => c.name === 'ambient')!;
    assert.ok(ambient.not_ready.length > 0, JSON.stringify(ambient));
    for (const r of ambient.not_ready) {
      assert.match(r.since, RFC3339);
      // One clock for both: a reason said alike has one since.
      const same = lines.find((l) => l.text === r.reason);
      if (same) assert.equal(r.since, same.since, r.reason);
    }
    for (const c of cs) for (const n of c.notes) assert.match(n.since, RFC3339);
    await assertCleanExpositions(a);
    assert.equal(await a.stop('SIGTERM'), 0, a.stderr());
  });
});

describe('since when a reason has been said', () => {
  it('keeps a line its since while only its numbers change; a line gone and back starts again', () => {
    let now = Date.parse('2026-01-01T00:00:00.000Z');
    const t = new SinceTracker(() => now);
    assert.deepEqual(t.observe(['failed 1 time(s): refused', 'waiting for a primary CNI config']), [
      { text: 'failed 1 time(s): refused', since: '2026-01-01T00:00:00.000Z' },
      { text: 'waiting for a primary CNI config', since: '2026-01-01T00:00:00.000Z' },
    ]);
    now += 5000;
    assert.deepEqual(t.observe(['failed 2 time(s): refused', 'something else']), [
      { text: 'failed 2 time(s): refused', since: '2026-01-01T00:00:00.000Z' },
      { text: 'something else', since: '2026-01-01T00:00:05.000Z' },
    ]);
    now += 5000;
    // The same text comes back after a call without it: a new since.
    assert.deepEqual(t.observe(['waiting for a primary CNI config']), [
      { text: 'waiting for a primary CNI config', since: '2026-01-01T00:00:10.000Z' },
    ]);
    // Two lines of one shape keep theirs by exact text first.
    now += 1000;
    t.observe(['passed over 10-a.conf', 'passed over 20-b.conf']);
    now += 1000;
    assert.deepEqual(
      t.observe(['passed over 20-b.conf', 'passed over 10-a.conf']).map((l) => l.since),
      ['2026-01-01T00:00:11.000Z', '2026-01-01T00:00:11.000Z'],
    );
  });

  it('says "starting" until every part started, then the parts\' reasons; calls back once when first ready', () => {
    let reasons = ['installer: not yet'];
    const part: Component = {
      name: 'installer',
      notReadyReasons: () => reasons,
      notes: () => ['passed over 00-x.conf'],
      status: () => ({}),
      stop: async () => {},
    };
    let ready = 0;
    const r = new AgentReadiness(() => [part], { onFirstReady: () => ready++ });
    assert.deepEqual(r.notReadyReasons(), ['starting']);
    assert.match(r.notReady()[0]!.since, RFC3339);
    r.markStarted();
    assert.deepEqual(r.notReadyReasons(), ['installer: not yet']);
    assert.deepEqual(
      r.notes().map((n) => n.text),
      ['passed over 00-x.conf'],
    );
    assert.equal(ready, 0);
    reasons = [];
    assert.deepEqual(r.notReady(), []);
    reasons = ['installer: again'];
    r.notReady();
    reasons = [];
    r.notReady();
    assert.equal(ready, 1, 'once');
    // ControlZ reads the same clock, part by part.
    assert.deepEqual(
      r.of(part).notes.map((n) => n.text),
      ['passed over 00-x.conf'],
    );
  });
});

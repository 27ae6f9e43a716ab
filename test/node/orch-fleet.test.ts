// Fleet scale (docs/design.md "Fleet scale"): what the agent's pod watch asks of the API server.
// The real pod source and API client against the test API server: lists from the watch cache
// (resourceVersion=0, no limit) or the streaming watch-list, the same after a 410, a closed watch
// resumed without a list, logged fallbacks for servers that refuse either, the client-side rate
// limit, Retry-After, the spread of re-watches after a cut, and the plugin's GET staying a
// consistent read.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { buildSettings, type RawFlags } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { type OrchApi } from '../../src/orch/api.ts';
import { orchApi } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS, type PodSourceOptions } from '../../src/orch/podsource.ts';
import { orchContext } from '../../src/orch/ratelimit.ts';
import { getPod, MAX_POD_GET_ATTEMPTS } from '../../cni-plugin/orch/podclient.ts';
import { NodePods } from '../../src/install/podlookup.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { startTestApiServer, type RequestRecord, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const logs: string[] = [];
let dir = '';
let s: TestApiServer;
const sources: PodSource[] = [];

function pod(name: string, node: string): V1Pod {
  const spec = { nodeName: node, containers: [{ name: 'app', image: 'app' }] };
  return { metadata: { name, namespace: 'default' }, spec };
}

/** The pod list and watch requests the server saw, split. */
function podRequests(since = 0) {
  const all = s.requests.filter((r) => r.time >= since && r.method === 'GET' && r.path === '/api/v1/pods');
  const q = (r: RequestRecord) => new URLSearchParams(r.query);
  return {
    lists: all.filter((r) => q(r).get('watch') !== 'true').map(q),
    watches: all.filter((r) => q(r).get('watch') === 'true').map(q),
    /** Consistent lists: no resourceVersion, so etcd reads every pod of the cluster. */
    consistent: all.filter((r) => q(r).get('watch') !== 'true' && (q(r).get('resourceVersion') ?? '') === '').length,
    objectsRead: all.reduce((n, r) => n + (r.objectsRead ?? 0), 0),
  };
}

function apiFor(flags: RawFlags = {}): OrchApi {
  const kc = s.writeOrchconfig(path.join(dir, `kc-${Math.random().toString(36).slice(2)}.json`));
  return orchApi(orchClientArgs(buildSettings({ orchconfig: kc, ...flags }, {})));
}

function source(api: OrchApi, o: Partial<PodSourceOptions> = {}): PodSource {
  const src = new PodSource(api, null, {
    ...WATCH_DEFAULTS,
    query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
    backoff: { baseMs: 50, maxMs: 400 },
    healthyAfterMs: 200,
    clock: realClock,
    logScope: 'install',
    ...o,
    tuning: { startJitterMs: 0, reconnectSpreadMs: 0, ...o.tuning },
  });
  sources.push(src);
  src.start();
  return src;
}

describe('fleet scale: settings', () => {
  it('--orch-qps, --orch-burst and --orch-list-mode: defaults, and bad values refused by name', () => {
    const o = buildSettings({}, {}).orch;
    assert.deepEqual({ qps: o.qps, burst: o.burst, listMode: o.listMode }, { qps: 1, burst: 10, listMode: 'auto' });
    assert.equal(buildSettings({ 'orch-list-mode': 'cache' }, {}).orch.listMode, 'cache');
    for (const [flag, value] of [
      ['orch-qps', '0'],
      ['orch-burst', '-1'],
      ['orch-list-mode', 'etcd'],
    ] as const) {
      const named = (e: unknown) => e instanceof ConfigErrors && e.message.includes(`--${flag}`);
      assert.throws(() => buildSettings({ [flag]: value }, {}), named, flag);
    }
  });
});

describe('fleet scale: the pod watch', () => {
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-fleet-'));
    const outputLevels = buildSettings({ log_output_level: 'all:warn' }, {}).logging.outputLevels;
    configureLogging({ asJson: false, outputLevels }, { write: (l) => void logs.push(l) });
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  afterEach(async () => {
    for (const src of sources.splice(0)) await src.stop();
    await s?.close();
    logs.length = 0;
  });

  async function cluster(): Promise<void> {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    for (let i = 0; i < 3; i++) s.upsertPod(pod(`a-${i}`, 'node-a'));
    for (let i = 0; i < 20; i++) s.upsertPod(pod(`b-${i}`, 'node-b'));
  }

  it("starts with one streaming watch-list: no list, only its node's pods read, and the watch goes on", async () => {
    await cluster();
    const src = source(apiFor());
    await src.synced;
    assert.equal(src.pods().length, 3);
    const r = podRequests();
    assert.equal(r.lists.length, 0, 'no list at all');
    assert.equal(r.watches.length, 1);
    const w = r.watches[0]!;
    assert.equal(w.get('sendInitialEvents'), 'true');
    assert.equal(w.get('resourceVersionMatch'), 'NotOlderThan');
    assert.equal(w.get('allowWatchBookmarks'), 'true');
    assert.equal(w.get('resourceVersion'), null, 'consistent from the watch cache: no resourceVersion');
    assert.ok(r.objectsRead <= 2 * 3, `objects read ${r.objectsRead}`);
    assert.equal(src.state, 'watching');
    s.upsertPod(pod('a-new', 'node-a'));
    await waitFor('the new pod through the same watch', () => src.get('default', 'a-new'));
    assert.equal(podRequests().watches.length, 1);
  });

  it('no watch-list: one logged fallback to a resourceVersion=0 list without limit, watched from there', async () => {
    await cluster();
    s.faults.rejectWatchList = true;
    const src = source(apiFor());
    await src.synced;
    assert.equal(src.pods().length, 3);
    const r = podRequests();
    assert.equal(r.lists.length, 1);
    assert.equal(r.lists[0]!.get('resourceVersion'), '0');
    assert.equal(r.lists[0]!.get('limit'), null, 'the watch cache ignores limit; none is sent');
    assert.equal(r.consistent, 0);
    await waitFor('the watch from the list', () => podRequests().watches.length === 2 && src.state === 'watching');
    const w = podRequests().watches[1]!;
    assert.equal(w.get('sendInitialEvents'), null);
    assert.ok(Number(w.get('resourceVersion')) > 0);
    const said = /does not serve the streaming watch-list.*sendInitialEvents is forbidden/;
    assert.ok(
      logs.some((l) => said.test(l)),
      logs.join(''),
    );
    assert.equal(src.status().listMode, 'cache');
    // A 410 lists from the cache again: watch-list is not asked for again.
    const since = Date.now();
    s.expireResourceVersions();
    await waitFor('relisted', () => src.status().lists === 2 && src.state === 'watching');
    const again = podRequests(since);
    assert.equal(again.consistent, 0);
    // Not resourceVersion=0 (any age): not older than what the watch saw (orch-relist.test.ts).
    const fromCache = (q: URLSearchParams) => q.get('resourceVersionMatch') === 'NotOlderThan' && !q.get('limit');
    assert.ok(again.lists.every((q) => fromCache(q) && Number(q.get('resourceVersion')) > 0));
    assert.ok(again.watches.every((q) => q.get('sendInitialEvents') === null));
  });

  it('a server that ignores sendInitialEvents (a bookmark before the end mark) is listed instead', async () => {
    await cluster();
    s.faults.ignoreWatchList = true;
    const src = source(apiFor());
    await src.synced;
    await waitFor('watching', () => src.state === 'watching');
    assert.equal(src.status().listMode, 'cache');
    assert.equal(podRequests().lists[0]!.get('resourceVersion'), '0');
    assert.ok(
      logs.some((l) => /does not serve the streaming watch-list.*initial-events-end/.test(l)),
      logs.join(''),
    );
  });

  it('resourceVersion=0 refused too: a logged fallback to consistent lists, and the agent works', async () => {
    await cluster();
    s.faults.rejectWatchList = true;
    s.faults.rejectRv0List = true;
    const src = source(apiFor());
    await src.synced;
    assert.equal(src.pods().length, 3);
    const r = podRequests();
    assert.equal(r.lists.length, 2);
    assert.equal(r.lists[1]!.get('resourceVersion'), null);
    assert.equal(r.lists[1]!.get('limit'), '500');
    assert.ok(
      logs.some((l) => /refuses lists from its watch cache.*consistent reads/.test(l)),
      logs.join(''),
    );
    s.upsertPod(pod('a-later', 'node-a'));
    await waitFor('watched', () => src.get('default', 'a-later'));
  });

  it("--orch-list-mode=consistent restores today's paginated consistent list", async () => {
    await cluster();
    const src = source(apiFor({ 'orch-list-mode': 'consistent' }));
    await src.synced;
    const r = podRequests();
    assert.equal(r.lists.length, 1);
    assert.equal(r.lists[0]!.get('resourceVersion'), null);
    assert.equal(r.lists[0]!.get('limit'), '500');
    assert.equal(r.objectsRead, 23, 'a consistent list reads every pod of the cluster');
  });

  it('a 410 reads the state again by watch-list, never by a consistent list', async () => {
    await cluster();
    const src = source(apiFor());
    await src.synced;
    await waitFor('watching', () => src.state === 'watching');
    s.expireResourceVersions();
    s.upsertPod(pod('a-after', 'node-a'));
    await waitFor('state read again', () => src.status().lists === 2 && src.get('default', 'a-after'));
    const r = podRequests();
    assert.equal(r.lists.length, 0);
    assert.equal(r.consistent, 0);
    assert.equal(r.watches.filter((q) => q.get('sendInitialEvents') === 'true').length, 2);
  });

  it('a closed watch resumes from its resourceVersion without a list, after a random part of the spread', async () => {
    await cluster();
    const src = source(apiFor(), { tuning: { reconnectSpreadMs: 400 }, random: () => 0.9 });
    await src.synced;
    await waitFor('watching', () => src.state === 'watching');
    const rv = Number(src.status().resourceVersion);
    const cut = Date.now();
    s.closeWatches();
    await waitFor('re-watched', () => podRequests().watches.length === 2);
    const resumed = s.requests.filter((r) => r.path === '/api/v1/pods').at(-1)!;
    const q = new URLSearchParams(resumed.query);
    assert.equal(q.get('sendInitialEvents'), null, 'no state read again');
    assert.ok(Number(q.get('resourceVersion')) >= rv);
    assert.equal(podRequests().lists.length, 0);
    const after = resumed.time - cut;
    assert.ok(after >= 300, `resumed ${after} ms after the cut; 0.9 of the 400 ms spread asked`);
    assert.equal(src.status().lists, 1);
  });

  it('a watch the server ended at the timeout asked for is resumed at once, not after a backoff', async () => {
    const slept: number[] = [];
    let now = 0;
    const clock = { now: () => now, sleep: async (ms: number) => void (slept.push(Math.round(ms)), (now += ms)) };
    let watches = 0;
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const refuse = () => Promise.reject(new Error('not used'));
    const api: OrchApi = {
      list: async () => ({ items: [pod('a', 'node-a')], resourceVersion: '5', continueToken: undefined }),
      async watch(_resource, q, _onEvent, done) {
        const n = ++watches;
        setImmediate(() => {
          // The first: ended by the server at the timeoutSeconds asked for; then one held open.
          if (n === 1) {
            now += q.timeoutSeconds * 1000;
            done(null);
          } else void hold.then(() => done(null));
        });
        return new AbortController();
      },
      labelPod: refuse,
      deletePod: refuse,
      createEvent: refuse,
      annotatePod: refuse,
    };
    const src = source(api, { clock, random: () => 0.5, tuning: { listMode: 'cache', reconnectSpreadMs: 400 } });
    try {
      await waitFor('two watches', () => watches === 2);
      assert.deepEqual(slept, [], 'no wait between its own timeout and the next watch');
      assert.equal(src.status().lists, 1, 'resumed, not listed again');
    } finally {
      release();
    }
  });

  it("the agent's requests wait for its rate limit (--orch-qps/--orch-burst)", async () => {
    await cluster();
    const kc = s.writeOrchconfig(path.join(dir, 'rl.json'));
    const settings = buildSettings({ orchconfig: kc, 'orch-qps': '2', 'orch-burst': '2' }, {});
    const api = orchApi(orchClientArgs(settings));
    const t0 = Date.now();
    const list = { fieldSelector: 'spec.nodeName=node-a', labelSelector: '', resourceVersion: '0' };
    for (let i = 0; i < 5; i++) await api.list('pods', list, AbortSignal.timeout(10_000));
    const times = s.requests.filter((r) => r.path === '/api/v1/pods').map((r) => r.time - t0);
    assert.equal(times.length, 5);
    // Two at once (the burst), then one each half second.
    assert.ok(times[4]! >= 1300, `5 requests within ${times[4]} ms at 2/s after a burst of 2`);
    assert.equal(orchContext(settings.orch).limiter.stats.delayed, 3);
  });

  it('honours Retry-After on 429 and 503 (a floor under the backoff)', async () => {
    await cluster();
    s.faults.status = { code: 429, retryAfterSeconds: 1, paths: /^\/api\/v1\/pods$/, count: 1 };
    const t0 = Date.now();
    const src = source(apiFor());
    await src.synced;
    const ok = s.requests.find((r) => r.path === '/api/v1/pods' && r.status === 200)!;
    assert.ok(ok.time - t0 >= 900, `retried ${ok.time - t0} ms after a 429 with Retry-After: 1`);
  });

  it('a 429 storm does not stop lookups the open watch can answer', async () => {
    await cluster();
    const src = source(apiFor());
    await src.synced;
    await waitFor('watching', () => src.state === 'watching');
    const lookups = new NodePods(src);
    s.faults.status = { code: 429, retryAfterSeconds: 1 };
    const fresh = s.upsertPod(pod('a-storm', 'node-a'));
    const answer = await lookups.lookup({ namespace: 'default', name: 'a-storm', uid: fresh.metadata!.uid! }, 1000);
    assert.ok('pod' in answer, `the pod lookup answers from the open watch: ${JSON.stringify(answer)}`);
    assert.equal(src.state, 'watching');
    delete s.faults.status;
  });

  it("the plugin's fallback GET is bounded: at most MAX_POD_GET_ATTEMPTS per pod start, jittered", async () => {
    await cluster();
    s.faults.status = { code: 503, retryAfterSeconds: 0, paths: /\/pods\/a-0$/ };
    const access = { server: new URL(s.url), token: s.token, caPem: s.caPem, insecure: false };
    const delays: number[] = [];
    const onRetry = (_a: number, _w: string, d: number) => void delays.push(d);
    const opts = { timeoutMs: 30_000, attemptTimeoutMs: 2000, onRetry };
    const err = await getPod(access, 'default', 'a-0', opts).then(
      () => null,
      (e: Error) => e,
    );
    assert.ok(err, 'fails closed');
    assert.match(err.message, /503/);
    const gets = s.requests.filter((r) => r.path === '/api/v1/namespaces/default/pods/a-0').length;
    assert.equal(gets, MAX_POD_GET_ATTEMPTS, `${gets} GETs for one pod start`);
    // No wait after the last GET: the pod start fails at once (it waited up to 2 s for nothing).
    assert.equal(delays.length, MAX_POD_GET_ATTEMPTS - 1, JSON.stringify(delays));
    // Full jitter: the waits are not the same fixed ladder on every node.
    assert.ok(
      delays.every((d) => d <= 1600),
      JSON.stringify(delays),
    );
    assert.ok(new Set(delays.map((d) => Math.round(d))).size > 1, JSON.stringify(delays));
    delete s.faults.status;
  });

  it("the plugin's single-pod GET stays a consistent read", async () => {
    await cluster();
    const access = { server: new URL(s.url), token: s.token, caPem: s.caPem, insecure: false };
    const p = await getPod(access, 'default', 'a-0', { timeoutMs: 5000, attemptTimeoutMs: 2000 });
    assert.equal(p.metadata?.name, 'a-0');
    const get = s.requests.find((r) => r.path === '/api/v1/namespaces/default/pods/a-0')!;
    assert.equal(get.query, '', 'no resourceVersion: a quorum read');
    assert.equal(get.objectsRead, 1);
  });
});

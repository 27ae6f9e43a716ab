// The agent's own watch stream (src/orch/request.ts apiWatch) as the pod
// source reads it, against a loopback HTTP server that writes the lines we choose. A line that
// is not a watch event (not JSON, or JSON without an object) ends the watch with an error, as
// client-go's stream watcher does: skipping it lost the event it stood for (a DELETED never
// replayed, since the next bookmark moved the resourceVersion past it), and an event whose
// object was null threw in the stream's 'data' handler, which crashed the agent.

import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, afterEach, before, describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { clientNodeApi, type OrchApi } from '../../src/orch/api.ts';
import { ApiError } from '../../src/orch/errors.ts';
import { realClock, type Clock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { waitFor } from '../helpers/poll.ts';

/** What the fake server writes to the watch from a resourceVersion (the stream stays open after). */
let script: Record<string, string[]> = {};
const watchesFrom: string[] = [];
/** Watches whose answer is held back (no headers): the server stalls. */
let stallWatches = false;
let openWatchRequests = 0;
let server: http.Server;
let url = '';
const sources: PodSource[] = [];

const podObj = (name: string, rv: number) => ({
  kind: 'Pod',
  apiVersion: 'v1',
  metadata: { name, namespace: 'default', uid: `uid-${name}`, resourceVersion: String(rv) },
});
const line = (type: string, object: unknown) => JSON.stringify({ type, object }) + '\n';

before(async () => {
  server = http.createServer((req, res) => {
    const q = new URL(req.url ?? '/', 'http://x').searchParams;
    if (q.get('watch') !== 'true') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: '1' }, items: [] }));
      return;
    }
    const from = q.get('resourceVersion') ?? '';
    watchesFrom.push(from);
    openWatchRequests++;
    res.on('close', () => openWatchRequests--);
    if (stallWatches) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    for (const l of script[from] ?? []) res.write(l);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

afterEach(async () => {
  await Promise.all(sources.splice(0).map((s) => s.stop()));
  server.closeAllConnections();
  watchesFrom.length = 0;
  script = {};
  stallWatches = false;
});

function source(silenceTimeoutMs: number = WATCH_DEFAULTS.silenceTimeoutMs): PodSource {
  const kc = new KubeConfig();
  kc.loadFromClusterAndUser({ name: 'c', server: url, skipTLSVerify: true }, { name: 'u' });
  const src = new PodSource(clientNodeApi(kc), null, {
    ...WATCH_DEFAULTS,
    query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
    backoff: { baseMs: 20, maxMs: 100 },
    healthyAfterMs: 60_000,
    silenceTimeoutMs,
    clock: realClock,
    logScope: 'install',
    tuning: { listMode: 'cache', startJitterMs: 0, reconnectSpreadMs: 0 },
  });
  sources.push(src);
  src.start();
  return src;
}

describe('the watch stream: a line that is not a watch event', () => {
  it('not JSON: the watch ends and resumes from the last event, so the event it stood for is not lost', async () => {
    script = {
      // a comes, then its DELETED garbled, then a bookmark past it.
      '1': [
        line('ADDED', podObj('a', 2)),
        '{"type":"DELETED","object":{"metadata":{"name":"a"\n',
        line('BOOKMARK', { metadata: { resourceVersion: '4' } }),
      ],
      // What the server replays from a's resourceVersion: its deletion.
      '2': [line('DELETED', podObj('a', 3))],
    };
    const src = source();
    const gone = () => src.get('default', 'a') === undefined && watchesFrom.includes('2');
    await waitFor('pod a gone from the cache (the DELETED replayed)', gone, {
      timeoutMs: 3000,
      context: () => `watches from: ${watchesFrom.join(', ')}; cached: ${src.pods().map((p) => p.metadata?.name)}`,
    });
    assert.deepEqual(watchesFrom.slice(0, 2), ['1', '2']);
    assert.match(src.status().lastError, /not a watch event/);
  });

  for (const [what, bad] of [
    ['an event whose object is null', line('ADDED', null)],
    ['an ERROR event whose object is null', line('ERROR', null)],
    ['an event without an object', '{"type":"MODIFIED"}\n'],
    ['a JSON array', '[]\n'],
  ] as const) {
    it(`${what}: the watch ends with an error (no crash) and resumes`, async () => {
      script = { '1': [bad] };
      const src = source();
      await waitFor('a second watch from resourceVersion 1', () => watchesFrom.filter((f) => f === '1').length >= 2, {
        timeoutMs: 3000,
        context: () => `watches from: ${watchesFrom.join(', ')}`,
      });
      assert.equal(src.get('default', 'a'), undefined);
      assert.match(src.status().lastError, /not a watch event/);
    });
  }
});

describe('a watch given up on before the server answered', () => {
  it('is cancelled: a stalled server does not collect one hung request per silence timeout', async () => {
    stallWatches = true;
    const src = source(150);
    await waitFor('four watches tried', () => watchesFrom.length >= 4, 5000);
    await waitFor('the abandoned ones closed', () => openWatchRequests <= 1, {
      timeoutMs: 1000,
      context: () => `${openWatchRequests} watch requests open at the server, ${watchesFrom.length} sent`,
    });
    await src.stop();
    await waitFor('none open after stop', () => openWatchRequests === 0, 1000);
  });
});

describe('Retry-After on a watch refused after it counted as healthy', () => {
  it('is capped at 5 minutes, as on every other path (docs/design.md "Fleet scale")', async () => {
    let watches = 0;
    const refuse = () => {
      throw new Error('not used');
    };
    const api: OrchApi = {
      list: async () => ({ items: [], resourceVersion: '1', continueToken: undefined }),
      async watch(_resource, _q, _onEvent, done) {
        watches++;
        // Refused once it lived past healthyAfterMs (a slow 429: the server's queue, our rate limit).
        setTimeout(() => done(new ApiError('watching pods', 429, 'TooManyRequests: slow down', 10 * 3600_000)), 30);
        return new AbortController();
      },
      labelPod: refuse,
      deletePod: refuse,
      createEvent: refuse,
      annotatePod: refuse,
    };
    const sleeps: number[] = [];
    const clock: Clock = { now: realClock.now, sleep: (ms, signal) => (sleeps.push(ms), realClock.sleep(1, signal)) };
    const src = new PodSource(api, null, {
      ...WATCH_DEFAULTS,
      query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
      backoff: { baseMs: 20, maxMs: 100 },
      healthyAfterMs: 10,
      clock,
      logScope: 'install',
      tuning: { listMode: 'cache', startJitterMs: 0, reconnectSpreadMs: 50 },
    });
    sources.push(src);
    src.start();
    await waitFor('three watches', () => watches >= 3, 3000);
    assert.ok(sleeps.length > 0 && sleeps.every((ms) => ms <= 5 * 60_000), `waits asked: ${sleeps.join(', ')} ms`);
  });
});

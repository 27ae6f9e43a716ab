// The pod query (the operator's selectors as typed, after this node's spec.nodeName) as the test
// API server reads it: accepted, and selecting the pods the operator meant. Apart from
// orch-selectors.test.ts because the server needs certificates (openssl): not a test:unit suite.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { orchApi } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { podQuery } from '../../src/repair/controller.ts';
import { apiRequest, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

describe('the pod query, as the test API server reads it', () => {
  let s: TestApiServer;
  before(async () => {
    s = await startTestApiServer();
    const pod = (name: string, node: string, phase: string, lbls: Record<string, string>): V1Pod => ({
      metadata: { name, namespace: 'prod', labels: lbls },
      spec: { nodeName: node, containers: [{ name: 'app', image: 'busybox' }] },
      status: { phase },
    });
    s.upsertPod(pod('web-1', 'node-a', 'Running', { app: 'web' }));
    s.upsertPod(pod('web-2', 'node-a', 'Failed', { app: 'web' }));
    s.upsertPod(pod('api-1', 'node-a', 'Running', { app: 'api', canary: 'yes' }));
    s.upsertPod(pod('db-1', 'node-a', 'Running', { app: 'db' }));
    s.upsertPod(pod('web-3', 'node-b', 'Running', { app: 'web' }));
  });
  after(() => s.close());

  it('lists the pods the typed selectors select on this node', async () => {
    const q = podQuery({
      nodeName: 'node-a',
      fieldSelectors: 'status.phase!=Failed,metadata.namespace==prod,',
      labelSelectors: 'app  in (web,api), !canary',
    });
    const query = new URLSearchParams({ fieldSelector: q.fieldSelector, labelSelector: q.labelSelector });
    const r = await apiRequest(s, 'GET', `/api/v1/pods?${query}`);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual((r.body as { items: V1Pod[] }).items.map((p) => p.metadata!.name).sort(), ['web-1']);
  });
});

// A selector the start-up check passed and the API server still refuses (an older server that
// does not know a pod field yet, e.g. spec.hostNetwork before it was selectable): the refusal is
// the query's, not a way of reading's. The watch must not fall back to a watch-cache list and
// then to consistent lists (each reads every pod of the cluster from etcd), and says once why.
// The test server refuses spec.host (the agent's check does too), standing in for such a field.
describe('a pod query the API server refuses', () => {
  let s: TestApiServer;
  let dir = '';
  const logs: string[] = [];
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-selrefused-'));
    const outputLevels = buildSettings({ log_output_level: 'all:warn' }, {}).logging.outputLevels;
    configureLogging({ asJson: false, outputLevels }, { write: (l) => void logs.push(l) });
    s = await startTestApiServer();
  });
  after(async () => {
    await s.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('is said to be the query, backs off, and never falls back to other ways of reading', async () => {
    const orchconfig = s.writeOrchconfig(path.join(dir, 'kc.json'));
    const api = orchApi(orchClientArgs(buildSettings({ orchconfig }, {})));
    const query = { fieldSelector: 'spec.nodeName=node-a,spec.host=node-a', labelSelector: '' };
    const src = new PodSource(api, null, {
      ...WATCH_DEFAULTS,
      query,
      backoff: { baseMs: 20, maxMs: 100 },
      clock: realClock,
      logScope: 'repair',
      tuning: { listMode: 'auto', startJitterMs: 0, reconnectSpreadMs: 0 },
    });
    src.start();
    try {
      await waitFor('a few refused reads', () => src.status().watchRestarts.error >= 3);
    } finally {
      await src.stop();
    }
    const reads = s.requests.filter((r) => r.path === '/api/v1/pods').map((r) => new URLSearchParams(r.query));
    const consistent = reads.filter((q) => q.get('watch') !== 'true' && (q.get('resourceVersion') ?? '') === '');
    assert.deepEqual(consistent.map(String), [], 'no consistent list');
    assert.equal(src.status().listMode, 'auto');
    const text = logs.join('');
    assert.doesNotMatch(text, /does not serve the streaming watch-list|refuses lists from its watch cache/);
    const said = /the API server refuses this pod query.*fieldSelector="spec\.nodeName=node-a,spec\.host=node-a"/;
    assert.match(text, said);
    assert.match(text, /field label not supported/);
  });
});

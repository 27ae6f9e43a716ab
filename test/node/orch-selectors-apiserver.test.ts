// The pod query (the operator's selectors as typed, after this node's spec.nodeName) as the test
// API server reads it: accepted, and selecting the pods the operator meant. Apart from
// orch-selectors.test.ts because the server needs certificates (openssl): not a test:unit suite.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { podQuery } from '../../src/repair/controller.ts';
import { apiRequest, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';

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

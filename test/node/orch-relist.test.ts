// After a 410 the pod watch reads the state again without going back in
// time. A resourceVersion=0 list is "any age": an API server whose watch cache is behind
// another's answers an older state than the agent had already seen (a pod deleted since is back
// in the cache, repair and the lookup read it). client-go's reflector relists with the last
// resourceVersion it synced, resourceVersionMatch=NotOlderThan: still from the watch cache (the
// node's pods, no etcd read), never older. resourceVersion=0 stays for the first list only.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { buildSettings } from '../../src/config/settings.ts';
import { clientNodeApi } from '../../src/orch/api.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

let dir = '';
let s: TestApiServer | undefined;
const sources: PodSource[] = [];

const pod = (name: string): V1Pod => ({
  metadata: { name, namespace: 'default' },
  spec: { nodeName: 'node-a', containers: [{ name: 'app', image: 'app' }] },
});

describe('relist after a 410', () => {
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-relist-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  afterEach(async () => {
    for (const src of sources.splice(0)) await src.stop();
    await s?.close();
  });

  it('lists not older than what the watch saw: a lagging watch cache brings no deleted pod back', async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
    s.upsertPod(pod('stays'));
    s.upsertPod(pod('deleted'));
    const kc = orchKubeConfig(
      orchClientArgs(buildSettings({ orchconfig: s.writeOrchconfig(path.join(dir, 'kc.json')) }, {})),
    );
    const back: string[] = [];
    let deleted = false;
    const src = new PodSource(
      clientNodeApi(kc),
      {
        upsert: (p) => void (deleted && p.metadata?.name === 'deleted' && back.push(p.metadata.resourceVersion ?? '')),
        remove: () => {},
      },
      {
        ...WATCH_DEFAULTS,
        query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
        backoff: { baseMs: 50, maxMs: 400 },
        healthyAfterMs: 200,
        clock: realClock,
        logScope: 'install',
        tuning: { listMode: 'cache', startJitterMs: 0, reconnectSpreadMs: 0 },
      },
    );
    sources.push(src);
    src.start();
    await src.synced;
    await waitFor('watching', () => src.state === 'watching');
    // What a replica that stops here holds in its watch cache.
    const lagging = { resourceVersion: src.status().resourceVersion, pods: s.listPods() };
    s.deletePodFromStore('default', 'deleted');
    await waitFor('the deletion seen', () => src.get('default', 'deleted') === undefined);
    deleted = true;
    const seen = Number(src.status().resourceVersion);
    s.faults.laggingCache = lagging;
    s.expireResourceVersions();
    await waitFor('the state read again', () => src.status().lists >= 2 && src.state === 'watching');
    assert.deepEqual(back, [], 'the deleted pod came back into the cache');
    assert.equal(src.get('default', 'deleted'), undefined);
    assert.ok(src.get('default', 'stays'));
    const relist = s.requests.filter((r) => r.path === '/api/v1/pods' && !/watch=true/.test(r.query)).at(-1)!;
    const q = new URLSearchParams(relist.query);
    assert.equal(q.get('resourceVersionMatch'), 'NotOlderThan');
    assert.ok(Number(q.get('resourceVersion')) >= seen, `relisted from ${q.get('resourceVersion')}, saw ${seen}`);
    assert.equal(q.get('limit'), null, 'from the watch cache');
  });
});

// A reader of the node's pod watch that throws (a bug, or a pod it cannot take) must not take
// the watch or the other readers down with it: the lookup and repair share one watch, and a throw
// inside the list replaced the cache half-way and failed the list for ever (the watch never
// became current: every lookup a miss, repair blind), and one inside a watch event escaped the
// stream's data listener and ended the agent, on every restart, while that pod exists.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { buildSettings } from '../../src/config/settings.ts';
import { clientNodeApi } from '../../src/orch/api.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const pod = (name: string): V1Pod => ({
  metadata: { name, namespace: 'default' },
  spec: { nodeName: 'node-a', containers: [{ name: 'app', image: 'app' }] },
});

describe('pod watch readers', () => {
  let dir = '';
  let s: TestApiServer;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-readers-'));
    s = await startTestApiServer({ bookmarkIntervalMs: 200 });
  });
  after(async () => {
    await s.close();
    await rm(dir, { recursive: true, force: true });
  });

  for (const mode of ['cache', 'consistent'] as const) {
    it(`a reader that throws on a pod leaves the watch current and the other readers served (${mode})`, async () => {
      s.upsertPod(pod(`a-${mode}`));
      s.upsertPod(pod(`bad-${mode}`));
      const kc = orchKubeConfig(
        orchClientArgs(buildSettings({ orchconfig: s.writeOrchconfig(path.join(dir, 'kc.json')) }, {})),
      );
      const thrower = (p: V1Pod) => {
        if (p.metadata?.name?.startsWith('bad-')) throw new RangeError('Invalid time value');
      };
      const src = new PodSource(
        clientNodeApi(kc),
        { upsert: thrower, remove: thrower },
        {
          ...WATCH_DEFAULTS,
          query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
          backoff: { baseMs: 50, maxMs: 400 },
          clock: realClock,
          logScope: 'install',
          tuning: { listMode: mode, startJitterMs: 0, reconnectSpreadMs: 0 },
        },
      );
      const seen: string[] = [];
      src.addHandler({ upsert: (p) => void seen.push(p.metadata?.name ?? ''), remove: () => {} });
      try {
        src.start();
        await waitFor('the watch current', () => src.state === 'watching', 5_000);
        assert.ok(src.get('default', `a-${mode}`), 'the cache holds the first pod');
        assert.ok(seen.includes(`a-${mode}`) && seen.includes(`bad-${mode}`), `the other reader got both: ${seen}`);
        const modified = { ...pod(`bad-${mode}`), metadata: { ...pod(`bad-${mode}`).metadata, labels: { x: '1' } } };
        s.upsertPod(modified);
        s.upsertPod(pod(`c-${mode}`));
        await waitFor('a later event delivered', () => seen.includes(`c-${mode}`), 5_000);
        assert.equal(src.state, 'watching');
      } finally {
        await src.stop();
      }
    });
  }
});

// The node's pod cache holds every pod of the node for the agent's life. managedFields (the API
// server's record of which client wrote which field, ~1-4 KB a pod) is read by no reader (repair,
// the pod lookup, ambient mode), so it is not kept; everything else is, exactly as read.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { buildSettings } from '../../src/config/settings.ts';
import { clientNodeApi } from '../../src/orch/api.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import { realClock } from '../../src/orch/limits.ts';
import { PodSource, WATCH_DEFAULTS } from '../../src/orch/podsource.ts';
import { startTestApiServer } from '../helpers/apiserver.ts';
import { waitFor } from '../helpers/poll.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const managedFields = [
  {
    manager: 'kubelet',
    operation: 'Update',
    apiVersion: 'v1',
    fieldsType: 'FieldsV1',
    fieldsV1: { 'f:status': { 'f:podIP': {} } },
  },
];

const pod = (name: string, label: string): V1Pod =>
  ({
    metadata: {
      name,
      namespace: 'default',
      uid: `uid-${name}`,
      labels: { app: label },
      annotations: { 'sidecar.mesh.io/status': '{"containers":["mesh-proxy"]}' },
      managedFields,
    },
    spec: { nodeName: 'node-a', containers: [{ name: 'app', image: 'app', ports: [{ containerPort: 80 }] }] },
    status: { phase: 'Running', podIP: '198.18.0.9' },
  }) as unknown as V1Pod;

describe('the pod cache', () => {
  for (const mode of ['cache', 'consistent'] as const) {
    it(`keeps a pod without its managedFields, listed and watched (${mode})`, async () => {
      const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-podcache-'));
      const s = await startTestApiServer({ bookmarkIntervalMs: 200 });
      try {
        s.upsertPod(pod('listed', 'a'));
        const kc = orchKubeConfig(
          orchClientArgs(buildSettings({ orchconfig: s.writeOrchconfig(path.join(dir, 'kc.json')) }, {})),
        );
        const seen: V1Pod[] = [];
        const src = new PodSource(
          clientNodeApi(kc),
          { upsert: (p) => void seen.push(p), remove: () => {} },
          {
            ...WATCH_DEFAULTS,
            query: { fieldSelector: 'spec.nodeName=node-a', labelSelector: '' },
            backoff: { baseMs: 50, maxMs: 400 },
            clock: realClock,
            logScope: 'install',
            tuning: { listMode: mode, startJitterMs: 0, reconnectSpreadMs: 0 },
          },
        );
        try {
          src.start();
          await waitFor('the watch current', () => src.state === 'watching', 5_000);
          s.upsertPod(pod('watched', 'b'));
          await waitFor('the watched pod', () => src.get('default', 'watched') !== undefined, 5_000);
          for (const name of ['listed', 'watched']) {
            const kept = src.get('default', name)!;
            const want = pod(name, name === 'listed' ? 'a' : 'b');
            assert.equal(kept.metadata!.managedFields, undefined, `${name}: managedFields kept`);
            const { managedFields: _, ...wantMeta } = want.metadata!;
            for (const [k, v] of Object.entries(wantMeta)) {
              assert.deepEqual(kept.metadata![k as keyof typeof wantMeta], v, `${name}: metadata.${k}`);
            }
            assert.ok(kept.metadata!.resourceVersion, `${name}: resourceVersion kept`);
            assert.deepEqual(kept.spec, want.spec, `${name}: spec`);
            assert.deepEqual(kept.status, want.status, `${name}: status`);
          }
          for (const p of seen) assert.equal(p.metadata!.managedFields, undefined, 'a reader got managedFields');
        } finally {
          await src.stop();
        }
      } finally {
        await s.close();
        await rm(dir, { recursive: true, force: true });
      }
    });
  }
});

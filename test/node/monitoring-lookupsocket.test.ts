// The pod lookup socket under abuse (docs/security.md "Socket paths"): the lookup protocol is one
// request per connection, so input after the first request is never parsed; a sender trickling its
// request is cut at a deadline; connections that hold every slot cannot lock the plugin out.

import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { podFromAgent } from '../../cni-plugin/orch/agentlookup.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { eventually } from '../helpers/poll.ts';
import { meshPod, tempDir } from '../helpers/plugin.ts';
import { podLookupArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

async function lookupsTotal(): Promise<number> {
  const m = registry.getSingleMetric('mesh_cni_pod_lookups_total');
  assert.ok(m);
  return (await m.get()).values.reduce((sum, v) => sum + v.value, 0);
}

/** Opens a connection, writes `data`, and resolves with everything the agent sent until it closed. */
function exchange(address: string, data: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    const s = net.createConnection(address, () => s.write(data));
    s.on('data', (c) => (got += c.toString()));
    s.on('error', reject);
    s.on('close', () => resolve(got));
    setTimeout(
      () => s.destroy(new Error(`the agent kept the connection open; got ${JSON.stringify(got)}`)),
      5_000,
    ).unref();
  });
}

describe('pod lookup socket under abuse', () => {
  const tmp = tempDir();
  const socket = () => path.join(tmp.dir, 'run/pods.sock');
  let api: TestApiServer;
  let lookup: Component;
  let uid = '';

  before(async () => {
    api = await startTestApiServer();
    const pod = meshPod('shop', 'cart-1');
    uid = api.upsertPod({ ...pod, spec: { ...pod.spec!, nodeName: 'node-1' } }).metadata?.uid ?? '';
    assert.notEqual(uid, '');
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig'));
    const settings = buildSettings({ 'pod-lookup-uds-address': socket(), orchconfig }, { NODE_NAME: 'node-1' });
    lookup = await startPodLookup(podLookupArgs(settings), { waitMs: 200, maxConnections: 4, requestTimeoutMs: 300 });
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the pod watch');
  });
  after(async () => {
    await lookup?.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  it('answers the first request of a connection and parses nothing after it', async () => {
    const before = await lookupsTotal();
    const first = JSON.stringify({ namespace: 'shop', name: 'cart-1', uid });
    const more = Array.from({ length: 500 }, (_, i) =>
      JSON.stringify({ namespace: 'shop', name: `not-here-${i}`, uid: `uid-${i}` }),
    ).join('\n');
    const reply = await exchange(socket(), `${first}\n${more}\n{junk\n`);
    const lines = reply.split('\n').filter((l) => l !== '');
    assert.equal(lines.length, 1, 'one answer a connection');
    assert.ok('pod' in (JSON.parse(lines[0]!) as object));
    assert.equal((await lookupsTotal()) - before, 1, 'the requests after the first were never looked up');
    assert.equal(
      (lookup.status() as { waiting: number }).waiting,
      0,
      'no lookup left waiting for a pod that was never asked for',
    );
  });

  it('cuts a sender that trickles its request, though it is never idle', async () => {
    const t0 = Date.now();
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection(socket());
      const drip = setInterval(() => s.write(' '), 50);
      s.on('error', () => {});
      s.resume();
      s.on('close', () => {
        clearInterval(drip);
        resolve();
      });
      setTimeout(() => {
        s.destroy();
        reject(new Error('the agent kept a sender that trickles a byte every 50 ms'));
      }, 4_000).unref();
    });
    assert.ok(Date.now() - t0 < 4_000);
  });

  it('answers the plugin while slow connections hold every slot', async () => {
    const held: net.Socket[] = [];
    const drip = setInterval(() => {
      for (const s of held) if (!s.destroyed) s.write(' ');
    }, 50);
    try {
      for (let i = 0; i < 4; i++) {
        const s = net.createConnection(socket());
        s.on('error', () => {});
        held.push(s);
        await new Promise((r) => s.once('connect', r));
      }
      const r = await podFromAgent(socket(), { namespace: 'shop', name: 'cart-1', uid }, 2000);
      assert.ok('pod' in r, JSON.stringify(r));
    } finally {
      clearInterval(drip);
      for (const s of held) s.destroy();
    }
  });
});

// The docs' example log lines are real output: every console line in README.md and docs/*.md
// is compared in shape (level, scope, message, and the field names in their order; the
// time and the values may differ) with a line the real thing prints here: the agent's log
// server printing the real plugin's record of a real ADD (bridge + mesh-cni in a netns of our
// own, the pod read from the test API server), the agent's own ControlZ change record, and its
// --vklog line of an API request (a pod label patch, as repair sends).

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { startControlz } from '../../src/monitoring/ctrlz.ts';
import { configureLogging, resetLogging } from '../../src/monitoring/logging.ts';
import { startPluginLogServer } from '../../src/monitoring/logserver.ts';
import { clientNodeApi } from '../../src/orch/api.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { captureSink, request } from '../helpers/observability.ts';
import { k8sArgs, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { waitFor } from '../helpers/poll.ts';

interface Shape {
  readonly level: string;
  readonly scope: string;
  readonly msg: string;
  readonly keys: readonly string[];
}

const CONSOLE_LINE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\t(error|warn|info|debug)\t(\w+)\t([^\t]+)(?:\t(.*))?$/;

/** A console line's shape; undefined when it is not one. Values may be bare or JSON-quoted. */
function shapeOf(line: string): Shape | undefined {
  const m = CONSOLE_LINE.exec(line.replace(/\n$/, ''));
  if (!m) return undefined;
  const keys = [...(m[4] ?? '').matchAll(/(?:^| )([^\s=]+)=(?:"(?:[^"\\]|\\.)*"|[^\s"]*)/g)].map((k) => k[1]!);
  return { level: m[1]!, scope: m[2]!, msg: m[3]!, keys };
}

/** Every console line of the docs (README.md, docs/*.md): the lines in their code blocks shaped like one. */
function readmeExamples(): { line: string; shape: Shape }[] {
  const docs = readdirSync(path.join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => path.join('docs', f));
  const text = ['README.md', ...docs].map((f) => readFileSync(path.join(ROOT, f), 'utf8')).join('\n');
  const out: { line: string; shape: Shape }[] = [];
  for (const block of text.matchAll(/^```[^\n]*\n([\s\S]*?)^```/gm)) {
    for (const line of block[1]!.split('\n')) {
      const shape = shapeOf(line);
      if (shape) out.push({ line, shape });
    }
  }
  return out;
}

describe('README example log lines are what the agent prints', () => {
  const tmp = tempDir();
  const sink = captureSink();
  let api: TestApiServer;
  let logServer: Component;
  let ctrlz: Component;
  let network: BridgeNetwork;
  let ns: Netns | undefined;
  const printed: { line: string; shape: Shape }[] = [];

  before(async () => {
    configureLogging(
      buildSettings({ log_output_level: 'default:info,cni:info,monitoring:warn', vklog: '4' }, {}).logging,
      sink,
    );
    const logUds = path.join(tmp.dir, 'run/log.sock');
    logServer = await startPluginLogServer(buildSettings({ 'log-uds-address': logUds }, {}).install.logUdsAddress);
    ctrlz = await startControlz(buildSettings({ ctrlz_address: 'localhost', ctrlz_port: '0' }, {}).ctrlz, {
      components: () => [],
    });
    api = await startTestApiServer();
    network = new BridgeNetwork('198.18.212.0/24');

    // A real ADD: bridge, then mesh-cni, whose records go to the log server above.
    const pod = api.upsertPod(meshPod('shop', 'cart-1'));
    ns = new Netns('pod');
    const chain: ChainEnv = {
      containerId: `readme${process.pid}`,
      netns: ns.path,
      ifname: 'eth0',
      args: k8sArgs(pod, `readme${process.pid}`),
    };
    const prev = await network.addPod(chain);
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    const add = await meshCni(
      'ADD',
      chain,
      pluginConfig({ cniVersion: '1.0.0', orchconfig, logUds, extra: { log_level: 'info' } }, prev),
    );
    assert.equal(add.code, 0, add.stdout + add.stderr);
    await waitFor('the plugin record printed', () => sink.lines.find((l) => l.includes('\tredirect rules applied\t')));

    // A real ControlZ change.
    const port = (ctrlz.status() as { port: number }).port;
    const r = await request(`http://localhost:${port}/api/scopes/cni`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: '{"output_level":"debug"}',
    });
    assert.equal(r.status, 200, r.body);

    // A real API request at --vklog 4.
    const kc = new KubeConfig();
    kc.loadFromFile(orchconfig);
    const cart = api.getPod('shop', 'cart-1')!;
    await clientNodeApi(kc).labelPod(cart, 'mesh.io/readme', 'yes', AbortSignal.timeout(10_000));

    for (const line of sink.lines) {
      const shape = shapeOf(line);
      if (shape) printed.push({ line: line.replace(/\n$/, ''), shape });
    }
  });
  after(async () => {
    ns?.remove();
    network?.cleanup();
    await ctrlz?.stop('SIGTERM');
    await logServer?.stop('SIGTERM');
    await api?.close();
    await resetLogging();
    tmp.remove();
  });

  it('has the redirect rules record, the ControlZ change record and a --vklog line among its examples', () => {
    const msgs = readmeExamples().map((e) => e.shape.msg);
    assert.ok(msgs.includes('redirect rules applied'), `README examples: ${JSON.stringify(msgs)}`);
    assert.ok(msgs.includes('ControlZ: changing scope levels'), `README examples: ${JSON.stringify(msgs)}`);
    assert.ok(msgs.includes('API request'), `README examples: ${JSON.stringify(msgs)}`);
  });

  it('prints every README example: same level, scope, message and field names in the same order', () => {
    for (const { line, shape } of readmeExamples()) {
      const real = printed.find((p) => p.shape.msg === shape.msg && p.shape.scope === shape.scope);
      assert.ok(
        real,
        `README example ${JSON.stringify(line)}: the agent printed no such record here; printed: ${JSON.stringify(printed.map((p) => p.line))}`,
      );
      assert.deepEqual(
        { ...shape },
        { ...real.shape },
        `README example ${JSON.stringify(line)} differs from the real line ${JSON.stringify(real.line)}`,
      );
    }
  });
});

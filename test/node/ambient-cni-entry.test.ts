// What ambient mode adds to the installer's plugin entry and to the agent's pod lookup (issue 17,
// A2): the entry carries ambient_enabled, the plugin event socket and the selectors whenever the
// agent runs ambient, whatever the template says; the lookup's hit carries the namespace's labels
// when the agent knows them, so the plugin decides without the API server.

import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { podFromAgent } from '../../cni-plugin/orch/agentlookup.ts';
import { DEFAULT_ENABLEMENT_SELECTORS, parseEnablementSelectors } from '../../cni-plugin/shared/enablement.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { DEFAULT_TEMPLATE, renderEntry } from '../../src/install/template.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { FIXTURE_VALUES } from '../helpers/install-fixtures.ts';
import { eventually } from '../helpers/poll.ts';
import { meshPod, tempDir } from '../helpers/plugin.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const AMBIENT = {
  pluginEventUdsAddress: '/var/run/mesh-cni/pluginevent.sock',
  enablementSelectors: DEFAULT_ENABLEMENT_SELECTORS,
};

describe("the plugin entry in ambient mode (installer's template)", () => {
  it('sidecar mode: the default entry has no ambient key (unchanged)', () => {
    const entry = renderEntry(DEFAULT_TEMPLATE, FIXTURE_VALUES, 'the default template');
    for (const k of ['ambient_enabled', 'pluginevent_uds_address', 'enablement_selectors']) assert.ok(!(k in entry), k);
  });

  it('ambient mode: the default entry gains the three keys, and the plugin parses the selectors back', () => {
    const entry = renderEntry(DEFAULT_TEMPLATE, { ...FIXTURE_VALUES, ambient: AMBIENT }, 'the default template');
    assert.equal(entry.ambient_enabled, true);
    assert.equal(entry.pluginevent_uds_address, '/var/run/mesh-cni/pluginevent.sock');
    assert.deepEqual(parseEnablementSelectors(entry.enablement_selectors), DEFAULT_ENABLEMENT_SELECTORS);
  });

  it("ambient mode: an operator's template without the keys, or saying false, still gets them (fail closed)", () => {
    for (const extra of ['', '"ambient_enabled": false, "pluginevent_uds_address": "/elsewhere.sock",']) {
      const template = `{ "type": "mesh-cni", ${extra} "orch": { "orchconfig": "__KUBECONFIG_FILEPATH__" } }`;
      const entry = renderEntry(template, { ...FIXTURE_VALUES, ambient: AMBIENT }, 'test');
      assert.equal(entry.ambient_enabled, true, extra);
      assert.equal(entry.pluginevent_uds_address, AMBIENT.pluginEventUdsAddress, extra);
    }
  });

  it('the placeholders can be used in a template: filled from the settings', () => {
    const template =
      '{ "type": "mesh-cni", "ambient_enabled": __AMBIENT_ENABLED__, "pluginevent_uds_address": "__PLUGINEVENT_UDS_ADDRESS__",' +
      ' "enablement_selectors": __AMBIENT_ENABLEMENT_SELECTORS__ }';
    assert.deepEqual(renderEntry(template, FIXTURE_VALUES, 't'), {
      type: 'mesh-cni',
      ambient_enabled: false,
      pluginevent_uds_address: '',
      enablement_selectors: [],
    });
  });
});

describe("the agent's pod lookup carries the namespace's labels when it knows them", () => {
  const tmp = tempDir();
  const socket = (n: string) => path.join(tmp.dir, `run/${n}.sock`);
  let api: TestApiServer;
  const lookups: Component[] = [];

  before(async () => {
    api = await startTestApiServer();
    const pod = meshPod('shop', 'cart-1');
    api.upsertPod({ ...pod, spec: { ...pod.spec!, nodeName: 'node-1' } });
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig'));
    const labels: Record<string, Record<string, string>> = { shop: { 'mesh.io/dataplane-mode': 'ambient' } };
    for (const [name, namespaceLabels] of [
      ['with', (ns: string) => labels[ns]],
      ['without', undefined],
    ] as const) {
      const settings = buildSettings({ 'pod-lookup-uds-address': socket(name), orchconfig }, { NODE_NAME: 'node-1' });
      const c = await startPodLookup(settings, { waitMs: 200, maxConnections: 8, namespaceLabels });
      lookups.push(c);
      await eventually(() => (c.status() as { state: string }).state === 'watching', 'the pod watch');
    }
  });
  after(async () => {
    for (const c of lookups) await c.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  it('a hit: the pod and its namespace labels; a namespace it does not know, or no source: the pod alone', async () => {
    const uid = api.getPod('shop', 'cart-1')!.metadata!.uid!;
    const hit = await podFromAgent(socket('with'), { namespace: 'shop', name: 'cart-1', uid }, 2000);
    assert.ok('pod' in hit, JSON.stringify(hit));
    assert.deepEqual(hit.namespaceLabels, { 'mesh.io/dataplane-mode': 'ambient' });
    const plain = await podFromAgent(socket('without'), { namespace: 'shop', name: 'cart-1', uid }, 2000);
    assert.ok('pod' in plain && plain.namespaceLabels === undefined, JSON.stringify(plain));
    const miss = await podFromAgent(socket('with'), { namespace: 'shop', name: 'cart-1', uid: 'other' }, 2000);
    assert.ok('miss' in miss);
  });
});

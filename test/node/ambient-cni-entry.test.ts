// What ambient mode adds to the installer's plugin entry and to the agent's pod lookup
// (docs/ambient.md): the entry carries ambient_enabled, the plugin event socket and the selectors
// whenever the agent runs ambient, whatever the template says; the lookup's hit carries the
// namespace's labels when the agent knows them, so the plugin decides without the API server.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { podFromAgent } from '../../cni-plugin/orch/agentlookup.ts';
import { DEFAULT_ENABLEMENT_SELECTORS, parseEnablementSelectors } from '../../cni-plugin/shared/enablement.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { DEFAULT_TEMPLATE, renderEntry } from '../../src/install/template.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { FIXTURE_VALUES } from '../helpers/install-fixtures.ts';
import { eventually } from '../helpers/poll.ts';
import { meshPod, tempDir } from '../helpers/plugin.ts';
import { installerArgs, podLookupArgs } from '../../src/partargs.ts';

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

  it("ambient mode: the entry's excluded namespaces are the agent's (--exclude-namespaces), whatever the template lists", () => {
    // The plugin skips an excluded namespace before any ambient decision, the agent decides with
    // its own list: a template excluding more started those namespaces' ambient pods unredirected
    // until the informer enrolled them; one excluding less POSTed pods the agent refused forever.
    for (const orch of ['"exclude_namespaces": ["kube-system", "shop"]', '"exclude_namespaces": []', '']) {
      const template = `{ "type": "mesh-cni", "orch": { "orchconfig": "__KUBECONFIG_FILEPATH__"${orch ? ', ' + orch : ''} } }`;
      const entry = renderEntry(template, { ...FIXTURE_VALUES, ambient: AMBIENT }, 'test');
      assert.deepEqual(
        (entry.orch as { exclude_namespaces?: unknown }).exclude_namespaces,
        FIXTURE_VALUES.excludeNamespaces,
        orch,
      );
      assert.equal((entry.orch as { orchconfig?: unknown }).orchconfig, FIXTURE_VALUES.kubeconfigFilepath, orch);
    }
    // Sidecar mode: the template's list stands, as before.
    const sidecar = renderEntry(
      '{ "type": "mesh-cni", "orch": { "exclude_namespaces": ["shop"] } }',
      FIXTURE_VALUES,
      't',
    );
    assert.deepEqual((sidecar.orch as { exclude_namespaces?: unknown }).exclude_namespaces, ['shop']);
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

describe('the installer writes the ambient keys from the settings', () => {
  /** Our entry in the bridge conflist after one installer pass with these flags. */
  async function entryWith(flags: Record<string, string>): Promise<Record<string, unknown>> {
    const tree = await makeHostTree();
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      const settings = buildSettings(
        { 'reconcile-interval': '1h', ...tree.flags, ...flags },
        { ...tree.env, NODE_NAME: 'node-1' },
      );
      const installer = new Installer(installerArgs(settings), {
        decideCleanup: async () => ({ cleanup: true, why: 'test' }),
      });
      await installer.start();
      await installer.settled();
      const conf = JSON.parse(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')) as {
        plugins: Record<string, unknown>[];
      };
      await installer.stop('SIGTERM');
      return conf.plugins.find((p) => p.type === 'mesh-cni') ?? {};
    } finally {
      await tree.remove();
    }
  }

  it('ambient on: ambient_enabled, the plugin event socket and the selectors; off: none of them', async () => {
    const on = await entryWith({
      'ambient-enabled': 'true',
      'pluginevent-uds-address': '/var/run/mesh-cni/pe.sock',
      'ambient-enablement-selector': '[{"podSelector": {"matchLabels": {"team": "a"}}}]',
    });
    assert.equal(on.ambient_enabled, true, JSON.stringify(on));
    assert.equal(on.pluginevent_uds_address, '/var/run/mesh-cni/pe.sock');
    assert.deepEqual(on.enablement_selectors, [{ podSelector: { matchLabels: { team: 'a' } } }]);
    const off = await entryWith({});
    assert.equal(off.type, 'mesh-cni');
    assert.ok(!('ambient_enabled' in off) && !('pluginevent_uds_address' in off), JSON.stringify(off));
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
      const c = await startPodLookup(podLookupArgs(settings), { waitMs: 200, maxConnections: 8, namespaceLabels });
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

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import {
  choosePrimary,
  CniConfigError,
  isOurs,
  parseCniConfig,
  standaloneConfig,
  withOurEntry,
  withoutOurEntry,
} from '../../src/install/cniconfig.ts';
import { DEFAULT_TEMPLATE, renderEntry } from '../../src/install/template.ts';
import { FIXTURE_ENTRY, FIXTURE_VALUES } from '../helpers/install-fixtures.ts';
import { ROOT } from '../helpers/cli.ts';

const FIXTURES = path.join(ROOT, 'test/node/fixtures/install');

describe('inserting our entry: fixture pairs (primary config in -> config out)', () => {
  for (const name of readdirSync(FIXTURES).sort()) {
    const files = readdirSync(path.join(FIXTURES, name));
    const input = files.find((f) => f.startsWith('input'))!;
    const expected = files.find((f) => f.startsWith('expected'));
    const inText = readFileSync(path.join(FIXTURES, name, input), 'utf8');
    it(`${name}: ${expected ? `-> ${expected}` : 'already right, nothing to write'}`, () => {
      const out = withOurEntry(inText, input, FIXTURE_ENTRY);
      if (!expected) {
        assert.equal(out, null);
        return;
      }
      assert.ok(out);
      assert.equal(out.text, readFileSync(path.join(FIXTURES, name, expected), 'utf8'));
      assert.equal(path.extname(out.fileName), '.conflist');
      if (path.extname(input) !== '.conflist') assert.equal(out.replaces, input);
      // Applying it again changes nothing: the installer never writes twice.
      assert.equal(withOurEntry(out.text, out.fileName, FIXTURE_ENTRY), null);
      // Exactly one entry of ours, last.
      const plugins = (JSON.parse(out.text) as { plugins: unknown[] }).plugins;
      assert.equal(plugins.filter((p) => isOurs(p as never)).length, 1);
      assert.deepEqual(plugins.at(-1), FIXTURE_ENTRY);
    });
    if (
      path.extname(input) === '.conflist' &&
      !(JSON.parse(inText) as { plugins: unknown[] }).plugins.some((p) => isOurs(p as never)) &&
      expected
    ) {
      it(`${name}: taking our entry out gives back the primary CNI's bytes exactly`, () => {
        const out = withOurEntry(inText, input, FIXTURE_ENTRY)!;
        assert.equal(withoutOurEntry(out.text, out.fileName), inText);
      });
    }
  }

  it('keeps the other plugins in order and every unknown field', () => {
    const inText = readFileSync(path.join(FIXTURES, 'unknown-fields/input.conflist'), 'utf8');
    const before = JSON.parse(inText) as Record<string, unknown> & { plugins: unknown[] };
    const after = JSON.parse(withOurEntry(inText, 'x.conflist', FIXTURE_ENTRY)!.text) as typeof before;
    assert.deepEqual({ ...after, plugins: after.plugins.slice(0, -1) }, before);
  });

  it('takes out every entry of ours, wherever it stands', () => {
    const inText = readFileSync(path.join(FIXTURES, 'two-entries/input.conflist'), 'utf8');
    const out = JSON.parse(withoutOurEntry(inText, 'x.conflist')!) as { plugins: { type: string }[] };
    assert.deepEqual(
      out.plugins.map((p) => p.type),
      ['bridge', 'portmap'],
    );
    assert.equal(
      withoutOurEntry(readFileSync(path.join(FIXTURES, 'bridge/input.conflist'), 'utf8'), 'x.conflist'),
      null,
    );
  });
});

describe('bad primary configs', () => {
  const cases: [string, string, RegExp][] = [
    ['10-x.conflist', '{"plugins": [', /cannot parse 10-x.conflist/],
    ['10-x.conflist', '', /cannot parse 10-x.conflist/],
    ['10-x.conflist', '[]', /not a JSON object/],
    ['10-x.conflist', '{"name":"x"}', /no "plugins" list/],
    ['10-x.conflist', '{"name":"x","plugins": []}', /"plugins" is empty/],
    ['10-x.conflist', '{"plugins": [{"type":"bridge"}]}', /needs a "name"/],
    ['10-x.conflist', '{"name":"x","plugins": [{"name":"no-type"}]}', /plugins\[0\]: no "type"/],
    ['10-x.conf', '{"name":"x","cniVersion":"1.0.0"}', /10-x.conf: no "type"/],
  ];
  for (const [file, text, re] of cases) {
    it(`${file} ${JSON.stringify(text)} -> ${re}`, () => {
      assert.throws(
        () => withOurEntry(text, file, FIXTURE_ENTRY),
        (e: unknown) => e instanceof CniConfigError && re.test(e.message),
      );
      assert.throws(() => parseCniConfig(text, file), CniConfigError);
    });
  }
});

describe('choosing the primary config as the runtime does', () => {
  const own = new Set(['ZZZ-mesh-cni-orchconfig', 'YY-mesh-cni.conflist']);
  const cases: [string[], string, string | null][] = [
    [['10-calico.conflist', '05-cilium.conflist'], '', '05-cilium.conflist'],
    [['cni.lock', 'ZZZ-mesh-cni-orchconfig', '99-loopback.conf', 'README'], '', '99-loopback.conf'],
    [['cni.lock', 'calico-kubeconfig'], '', null],
    [[], '', null],
    [['10-a.json', '10-a.conf', '10-a.conflist'], '', '10-a.conf'],
    [['B.conf', 'a.conf'], '', 'B.conf'],
    [['YY-mesh-cni.conflist', 'zz.conflist'], '', 'zz.conflist'],
    [['05-cilium.conflist', '10-calico.conflist'], '10-calico.conflist', '10-calico.conflist'],
    [['05-cilium.conflist'], '10-calico.conflist', null],
    [['10-flannel.conflist'], '10-flannel.conf', '10-flannel.conflist'],
    // And the other way round, as Istio does.
    [['10-flannel.conf'], '10-flannel.conflist', '10-flannel.conf'],
    [['10-flannel.conf', '10-flannel.conflist'], '10-flannel.conflist', '10-flannel.conflist'],
    [['10-flannel.conf', '10-flannel.conflist'], '10-flannel.conf', '10-flannel.conf'],
    [['10-flannel.json'], '10-flannel.conflist', null],
  ];
  for (const [files, confName, want] of cases) {
    it(`${JSON.stringify(files)}${confName ? ` with --cni-conf-name ${confName}` : ''} -> ${want}`, () => {
      assert.equal(choosePrimary(files, { confName, ownFiles: own }), want);
    });
  }
});

describe('the plugin entry template', () => {
  it('renders the default template with every value', () => {
    assert.deepEqual(FIXTURE_ENTRY, {
      type: 'mesh-cni',
      log_level: 'warn',
      log_uds_address: '/var/run/mesh-cni/log.sock',
      pod_lookup_uds_address: '/var/run/mesh-cni/pods.sock',
      orch: {
        orchconfig: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
        cni_bin_dir: '/opt/cni/bin',
        exclude_namespaces: ['mesh-system', 'kube-system'],
        node_name: 'node-1',
      },
    });
  });

  it('accepts comments and trailing commas in an operator template, and fills every placeholder', () => {
    const template = `{
      // operator's own template
      type: "mesh-cni", /* json5 */
      "kubeconfig": "__KUBECONFIG_FILEPATH__",
      "api": "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__",
      "node": "__KUBERNETES_NODE_NAME__", "host_ip": "__HOST_IP__",
      "dirs": ["__CNI_NET_DIR__", "__CNI_BIN_DIR__"],
      "log": ["__LOG_LEVEL__", "__LOG_UDS_ADDRESS__"],
      "exclude": __EXCLUDE_NAMESPACES__,
    }`;
    const entry = renderEntry(template, FIXTURE_VALUES, 'test');
    assert.deepEqual(entry, {
      type: 'mesh-cni',
      kubeconfig: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
      api: 'https://198.18.96.1:443',
      node: 'node-1',
      host_ip: '198.18.96.10',
      dirs: ['/etc/cni/net.d', '/opt/cni/bin'],
      log: ['warn', '/var/run/mesh-cni/log.sock'],
      exclude: ['mesh-system', 'kube-system'],
    });
    // Strict JSON out: what we write parses with JSON.parse.
    assert.deepEqual(JSON.parse(standaloneConfig(entry, 'YY-mesh-cni.conflist')).plugins[0], entry);
  });

  it('escapes values so a quote in a path cannot break the JSON', () => {
    const entry = renderEntry(DEFAULT_TEMPLATE, { ...FIXTURE_VALUES, kubeconfigFilepath: '/odd"dir\\x/cfg' }, 'test');
    assert.equal((entry.orch as { orchconfig: string }).orchconfig, '/odd"dir\\x/cfg');
  });

  const bad: [string, RegExp][] = [
    ['{ "type": "mesh-cni", ', /cannot parse the CNI network config template from t/],
    ['["mesh-cni"]', /must be a JSON object/],
    ['{ "type": "istio-cni" }', /must have "type": "mesh-cni"/],
    ['{ "type": "mesh-cni", "x": "__NOPE__" }', /unknown placeholder __NOPE__/],
    ['{ "type": "mesh-cni", "x": Infinity }', /strict JSON cannot hold/],
  ];
  for (const [template, re] of bad) {
    it(`rejects ${template}`, () => {
      assert.throws(
        () => renderEntry(template, FIXTURE_VALUES, 't'),
        (e: unknown) => e instanceof CniConfigError && re.test(e.message),
      );
    });
  }
});

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import path from 'node:path';
import { FLAGS } from '../../src/config/flags.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { runBin } from '../helpers/cli.ts';

// Settings from flags, env settings and defaults, as install-cni parses and reports them
// (docs/flags.md), on the Node.js the agent ships with.

describe('the runtime', () => {
  it('runs on Node.js 24', () => {
    assert.equal(process.versions.node.split('.')[0], '24');
  });
});

describe('settings', () => {
  it('has the documented defaults', () => {
    const s = buildSettings({}, {});
    assert.equal(s.install.cniNetDir, '/etc/cni/net.d');
    assert.equal(s.install.mountedCniNetDir, '/host/etc/cni/net.d');
    assert.equal(s.install.orchcfgFileName, 'ZZZ-mesh-cni-orchconfig');
    assert.equal(s.install.orchconfigMode, 0o600);
    assert.equal(s.install.chained, true);
    assert.equal(s.install.pluginLogLevel, 'warn');
    assert.equal(s.install.logUdsAddress, '/var/run/mesh-cni/log.sock');
    assert.equal(s.monitoring.port, 15014);
    assert.equal(s.repair.labelKey, 'cni.mesh.io/uninitialized');
    assert.equal(s.repair.labelValue, 'true');
    assert.equal(s.repair.initContainerExitCode, 126);
    assert.equal(s.repair.initContainerName, 'mesh-validation');
    assert.equal(s.repair.sidecarAnnotation, 'sidecar.mesh.io/status');
    assert.equal(s.ctrlz.address, 'localhost');
    assert.equal(s.ctrlz.port, 9876);
    assert.equal(s.logging.outputLevels.default, 'info');
    assert.equal(s.logging.stacktraceLevels.install, 'none');
    assert.deepEqual(s.logging.targets, ['stdout']);
  });

  it('takes a flag over its env setting over the default', () => {
    assert.equal(buildSettings({}, { CNI_NET_DIR: '/env/net.d' }).install.cniNetDir, '/env/net.d');
    assert.equal(
      buildSettings({ 'cni-net-dir': '/flag/net.d' }, { CNI_NET_DIR: '/env/net.d' }).install.cniNetDir,
      '/flag/net.d',
    );
    assert.equal(buildSettings({}, { CHAINED_CNI_PLUGIN: 'false' }).install.chained, false);
    assert.equal(buildSettings({ 'chained-cni-plugin': true }, { CHAINED_CNI_PLUGIN: 'false' }).install.chained, true);
    assert.equal(buildSettings({}, { ORCHCONFIG_MODE: '0400' }).install.orchconfigMode, 0o400);
    assert.equal(buildSettings({}, { MONITORING_PORT: '9000' }).monitoring.port, 9000);
    assert.equal(buildSettings({}, { REPAIR_LABEL_PODS: 'true' }).repair.labelPods, true);
  });

  it('defaults the repair node to NODE_NAME', () => {
    assert.equal(buildSettings({}, { NODE_NAME: 'node-a' }).repair.nodeName, 'node-a');
    assert.equal(buildSettings({ 'repair-node-name': 'node-b' }, { NODE_NAME: 'node-a' }).repair.nodeName, 'node-b');
  });

  it('expands all: and bare levels in --log_output_level', () => {
    const s = buildSettings({ log_output_level: 'all:warn,install:debug' }, {});
    assert.equal(s.logging.outputLevels.repair, 'warn');
    assert.equal(s.logging.outputLevels.install, 'debug');
    assert.equal(buildSettings({ log_output_level: 'debug' }, {}).logging.outputLevels.default, 'debug');
  });

  it('is frozen', () => {
    const s = buildSettings({}, {});
    assert.throws(() => {
      (s.install as { cniNetDir: string }).cniNetDir = '/x';
    }, TypeError);
  });

  const bad: [Record<string, string>, Record<string, string>, RegExp][] = [
    [{ 'monitoring-port': '70000' }, {}, /--monitoring-port.*0 to 65535/],
    [{}, { MONITORING_PORT: 'abc' }, /env MONITORING_PORT/],
    [{ 'orchconfig-mode': '1000' }, {}, /--orchconfig-mode.*0777/],
    [{ 'orchconfig-mode': '0o999' }, {}, /--orchconfig-mode/],
    [{}, { CHAINED_CNI_PLUGIN: 'yes' }, /env CHAINED_CNI_PLUGIN.*true or false/],
    [{ log_output_level: 'nope:info' }, {}, /unknown scope "nope"/],
    [{ log_output_level: 'install:loud' }, {}, /unknown level "loud"/],
    [{ 'log-level': 'verbose' }, {}, /--log-level.*none, error, warn, info, debug/],
    [{ 'cni-net-dir': 'bad\0dir' }, {}, /--cni-net-dir.*path/],
    [{ 'orchcfg-file-name': '../escape' }, {}, /--orchcfg-file-name.*plain file name/],
    // The runtime would read it as a CNI config (the token file over the primary, or first).
    [{ 'orchcfg-file-name': '10-a.conflist' }, {}, /--orchcfg-file-name.*\.conf, \.conflist or \.json/],
    [{ 'orchcfg-file-name': 'x.conf' }, {}, /--orchcfg-file-name.*CNI config extension/],
    [{}, { ORCHCFG_FILE_NAME: 'x.JSON' }, /env ORCHCFG_FILE_NAME.*CNI config extension/],
    [{ 'orchcfg-file-name': 'a/b' }, {}, /--orchcfg-file-name.*plain file name/],
    [{ 'orchcfg-file-name': '.x.mesh-tmp-1' }, {}, /--orchcfg-file-name.*temp files/],
    // A token readable or writable by anyone but its owner.
    [
      { 'orchconfig-mode': '0666' },
      {},
      /--orchconfig-mode.*readable by group or others.*--orchconfig-allow-group-other-read/,
    ],
    [{ 'orchconfig-mode': '0777' }, {}, /--orchconfig-mode/],
    [{ 'orchconfig-mode': '0644' }, {}, /--orchconfig-mode.*readable by group or others/],
    [{ 'orchconfig-mode': '0700' }, {}, /--orchconfig-mode.*execute/],
    [{ 'orchconfig-mode': '0662', 'orchconfig-allow-group-other-read': 'true' }, {}, /--orchconfig-mode.*writable/],
    [{ 'ambient-enabled': 'true' }, {}, /--ambient-enabled: needs NODE_NAME/],
    [{}, { EBPF_ENABLED: 'true' }, /eBPF redirection was removed from Istio in 1\.21/],
    [{ 'reconcile-interval': '5 parsecs' }, {}, /--reconcile-interval.*duration/],
    [{}, { RECONCILE_INTERVAL: '0' }, /env RECONCILE_INTERVAL.*at least 100ms/],
    [{ 'reconcile-interval': '600h' }, {}, /--reconcile-interval.*at most 2147483647ms/],
    [{ 'repair-broken-pod-label-key': 'bad key!' }, {}, /label key/],
    [{ 'cleanup-on-exit': 'sometimes' }, {}, /auto, always, never/],
    [{ 'skip-tls-verify': 'true', 'orch-ca-file': '/ca.crt' }, {}, /cannot be combined/],
  ];
  for (const [flags, env, re] of bad) {
    it(`rejects ${JSON.stringify({ ...flags, ...env })}`, () => {
      assert.throws(
        () => buildSettings(flags, env),
        (e: unknown) => e instanceof ConfigErrors && re.test(e.message),
      );
    });
  }

  it('takes an orchconfig name sorting before --cni-conf-name: the runtime reads only .conf, .conflist and .json', () => {
    for (const [orchcfg, conf] of [
      ['ZZZ-mesh-cni-orchconfig', 'bridge.conf'],
      ['00-orchconfig', '10-calico.conflist'],
    ]) {
      assert.equal(
        buildSettings({ 'orchcfg-file-name': orchcfg!, 'cni-conf-name': conf! }, {}).install.orchcfgFileName,
        orchcfg,
      );
    }
  });

  it('takes an orchconfig mode with group/other read only with the escape hatch', () => {
    assert.equal(
      buildSettings({ 'orchconfig-mode': '0644', 'orchconfig-allow-group-other-read': 'true' }, {}).install
        .orchconfigMode,
      0o644,
    );
    assert.equal(
      buildSettings({ 'orchconfig-mode': '416' }, { ORCHCONFIG_ALLOW_GROUP_OTHER_READ: 'true' }).install.orchconfigMode,
      0o640,
    );
    assert.equal(buildSettings({ 'orchconfig-mode': '384' }, {}).install.orchconfigMode, 0o600);
  });

  it('resolves a relative value of every path flag against the working directory', () => {
    const pathFlags = FLAGS.filter((f) => f.path !== undefined);
    assert.ok(pathFlags.length >= 10, 'the flag table marks path flags');
    for (const f of pathFlags) {
      const s = buildSettings({ [f.name]: `rel/${f.name}` }, {}, '/work/dir');
      assert.ok(
        JSON.stringify(s).includes(`"/work/dir/rel/${f.name}"`),
        `--${f.name} rel/${f.name} resolves to /work/dir/rel/${f.name}`,
      );
    }
    assert.equal(
      buildSettings({ 'cni-binaries-dir': 'dist/bin' }, {}, '/src/mesh').install.cniBinariesDir,
      '/src/mesh/dist/bin',
    );
    assert.equal(
      buildSettings({}, { CNI_BINARIES_DIR: './dist/../dist/bin/' }, '/src/mesh').install.cniBinariesDir,
      '/src/mesh/dist/bin',
    );
    assert.equal(
      buildSettings({ 'cni-binaries-dir': 'dist/bin' }, {}).install.cniBinariesDir,
      path.join(process.cwd(), 'dist/bin'),
    );
  });

  it('reports every bad value at once', () => {
    assert.throws(
      () => buildSettings({ 'monitoring-port': 'x', 'orchconfig-mode': 'y' }, {}),
      (e: unknown) => e instanceof ConfigErrors && e.errors.length === 2,
    );
  });

  it('checks the other values against the default of a bad one, and reports each bad value once', () => {
    // --chained-cni-plugin defaults to true: an owned file named to sort after the primary's is
    // wrong whatever the operator meant by "maybe", so both are reported, not only the first.
    const flags = {
      'chained-cni-plugin': 'maybe',
      'mesh-owned-cni-config': 'true',
      'cni-conf-name': '05-primary.conflist',
      'mesh-owned-cni-config-filename': '10-ours.conflist',
    };
    assert.throws(
      () => buildSettings(flags, {}),
      (e: unknown) =>
        e instanceof ConfigErrors &&
        assert.deepEqual(
          e.errors.map((x) => x.flag),
          ['--chained-cni-plugin', '--mesh-owned-cni-config-filename'],
        ) === undefined,
    );
    // A bad value read while another flag is parsed (the mode's escape hatch) is reported once.
    assert.throws(
      () => buildSettings({ 'orchconfig-allow-group-other-read': 'x', 'orchconfig-mode': 'y' }, {}),
      (e: unknown) => e instanceof ConfigErrors && e.errors.length === 2,
    );
  });
});

describe('install-cni CLI', () => {
  it('exits 2 with one line per bad value, before touching anything', async () => {
    const r = await runBin('install-cni', ['--monitoring-port', '99999', '--log_output_level', 'x:y'], {
      MOUNTED_CNI_NET_DIR: '/nonexistent/should-not-be-created',
    });
    assert.equal(r.code, 2);
    const lines = r.stderr.trim().split('\n');
    assert.equal(lines.length, 2, r.stderr);
    assert.match(r.stderr, /--monitoring-port/);
    assert.match(r.stderr, /--log_output_level/);
  });

  it('exits 2 on an unknown flag', async () => {
    const r = await runBin('install-cni', ['--no-such-flag']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /unknown option '--no-such-flag'/);
  });

  it('prints its version as json and yaml', async () => {
    const json = await runBin('install-cni', ['version', '-o', 'json']);
    assert.equal(json.code, 0, json.stderr);
    const info = JSON.parse(json.stdout) as { version: string; gitCommit: string; nodeVersion: string };
    assert.match(info.version, /^\d+\.\d+\.\d+/);
    assert.match(info.nodeVersion, /^v24\./);
    assert.notEqual(info.gitCommit, '');
    const yaml = await runBin('install-cni', ['version', '-o', 'yaml']);
    assert.match(yaml.stdout, /^version: /m);
    const short = await runBin('install-cni', ['version', '--short']);
    assert.equal(short.stdout.trim(), info.version);
  });
});

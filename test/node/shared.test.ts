// cni-plugin/shared/: what the agent and the plugin both use, one copy. These tests hold the two
// sides to it: the entry the installer writes is the one the plugin parses, every level the agent
// takes for --log-level the plugin takes as log_level, and the plugin's bundles, built from their
// entry points, pull in nothing from src/ (the agent) or node_modules.

import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import * as esbuild from 'esbuild';
import { UdsLog } from '../../cni-plugin/log/udslog.ts';
import { parseConfig } from '../../cni-plugin/cni/protocol.ts';
import { statusMessage } from '../../cni-plugin/shared/apistatus.ts';
import { durationMs } from '../../cni-plugin/shared/duration.ts';
import { LEVEL_RANK, LOG_LEVELS } from '../../cni-plugin/shared/loglevels.ts';
import { PLUGIN_TYPE } from '../../cni-plugin/shared/netconf.ts';
import { describeParseError, parseErrorDetail } from '../../cni-plugin/shared/parseerror.ts';
import { PLUGIN_LOG_MAX_LINE, PLUGIN_LOG_SCOPE } from '../../cni-plugin/shared/pluginlog.ts';
import { ConfigError, parseDuration } from '../../src/config/parse.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { DEFAULT_TEMPLATE, renderEntry } from '../../src/install/template.ts';
import { parsePluginLine } from '../../src/monitoring/pluginrecord.ts';
import { FIXTURE_VALUES } from '../helpers/install-fixtures.ts';
import { ROOT } from '../helpers/cli.ts';
import { tempDir } from '../helpers/plugin.ts';

const PREV = { cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '198.18.0.5/24', interface: 0 }] };

describe('our entry: what install-cni writes is what the plugin reads', () => {
  it('the default template, rendered, parses to the values it was rendered from', () => {
    const entry = renderEntry(DEFAULT_TEMPLATE, FIXTURE_VALUES, 'the default template');
    const config = parseConfig(
      JSON.stringify({ cniVersion: '1.0.0', name: 'k8s-pod-network', ...entry, prevResult: PREV }),
      'ADD',
    );
    assert.equal(config.type, PLUGIN_TYPE);
    assert.equal(config.logLevel, FIXTURE_VALUES.logLevel);
    assert.equal(config.logUdsAddress, FIXTURE_VALUES.logUdsAddress);
    assert.equal(config.podLookupUdsAddress, FIXTURE_VALUES.podLookupUdsAddress);
    assert.equal(config.orchconfig, FIXTURE_VALUES.kubeconfigFilepath);
    assert.equal(config.cniBinDir, FIXTURE_VALUES.cniBinDir);
    assert.deepEqual(config.excludeNamespaces, FIXTURE_VALUES.excludeNamespaces);
    assert.equal(config.nodeName, FIXTURE_VALUES.nodeName);
  });

  it('every level --log-level takes is a log_level the plugin takes, and only those', () => {
    for (const level of LOG_LEVELS) {
      const s = buildSettings({ 'log-level': level }, {});
      const entry = renderEntry(DEFAULT_TEMPLATE, { ...FIXTURE_VALUES, logLevel: s.install.pluginLogLevel }, 'test');
      assert.equal(parseConfig(JSON.stringify({ cniVersion: '1.0.0', ...entry }), 'DEL').logLevel, level);
    }
    assert.throws(() => buildSettings({ 'log-level': 'trace' }, {}), /log-level/);
    assert.throws(
      () => parseConfig(JSON.stringify({ cniVersion: '1.0.0', type: PLUGIN_TYPE, log_level: 'trace' }), 'DEL'),
      /log_level "trace"/,
    );
    assert.deepEqual(
      LOG_LEVELS.map((l) => LEVEL_RANK[l]),
      [0, 1, 2, 3, 4],
    );
  });
});

describe('the plugin log socket: the plugin writes PluginLogRecord lines the agent reads', () => {
  const tmp = tempDir();
  after(() => tmp.remove());

  it('every field, each line within PLUGIN_LOG_MAX_LINE, a longer record cut and marked', async () => {
    const address = path.join(tmp.dir, 'log.sock');
    let text = '';
    let received!: Promise<void>;
    await new Promise<void>((listening) => {
      received = new Promise<void>((resolve) => {
        const server = net.createServer((s) => {
          s.setEncoding('utf8');
          s.on('data', (d: string) => (text += d));
          s.on('end', () => server.close(() => resolve()));
        });
        server.listen(address, listening);
      });
    });
    const log = new UdsLog(
      address,
      'debug',
      { command: 'ADD', containerID: 'c0ffee', pod: { namespace: 'shop', name: 'cart-1' } },
      'none',
    );
    log.info('rules in place', { attempt: 1 });
    log.warn('a long one', { detail: 'x'.repeat(PLUGIN_LOG_MAX_LINE) });
    await log.flush(2000);
    await received;
    const lines = text.split('\n').filter((l) => l !== '');
    assert.equal(lines.length, 2);
    for (const line of lines) assert.ok(Buffer.byteLength(line) <= PLUGIN_LOG_MAX_LINE, `${line.length}`);
    const [first, second] = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(Object.keys(first!).sort(), [
      'attempt',
      'command',
      'containerID',
      'level',
      'msg',
      'pod',
      'scope',
      'time',
    ]);
    assert.equal(first!.scope, PLUGIN_LOG_SCOPE);
    assert.match(String(first!.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.equal(second!.truncated, true);
    assert.equal(second!.detail, undefined);
    for (const line of lines) {
      const r = parsePluginLine(line);
      assert.ok(r.ok, line.slice(0, 80));
      assert.equal(r.entry.fields.pod, 'shop/cart-1');
    }
  });
});

describe("durations: one grammar for the agent's flags and mesh-validation", () => {
  const cases: [string, number | null][] = [
    ['500ms', 500],
    ['5s', 5000],
    ['1m30s', 90_000],
    ['1.5s', 1500],
    ['2h', 7_200_000],
    ['100us', 0.1],
    [' 3s ', 3000],
    ['0', 0],
    ['', null],
    ['5', null],
    ['soon', null],
    ['5s x', null],
    ['-1s', null],
    ['1d', null],
  ];
  for (const [text, ms] of cases) {
    it(`${JSON.stringify(text)} -> ${ms}`, () => {
      assert.equal(durationMs(text), ms);
      if (ms === null) assert.throws(() => parseDuration('--flag', text), ConfigError);
      else assert.equal(parseDuration('--flag', text), ms);
    });
  }
});

describe('API Status text', () => {
  const cases: [string, string][] = [
    [
      '{"kind":"Status","reason":"Forbidden","message":"pods \\"p\\" is forbidden"}',
      'Forbidden: pods "p" is forbidden',
    ],
    ['{"kind":"Status","message":"only a message"}', 'only a message'],
    ['{"kind":"Status"}', ''],
    ['<html>502 Bad Gateway eyJhbGciOi</html>', ''],
    ['null', ''],
    ['"a string"', ''],
  ];
  for (const [body, text] of cases)
    it(JSON.stringify(body.slice(0, 30)), () => assert.equal(statusMessage(body), text));
});

describe('parse errors: one wording, never the text', () => {
  const secret = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0';
  for (const [text, detail] of [
    [secret, 'unexpected character'],
    ['', 'unexpected end of JSON input'],
    [`{"users": [{"token": "${secret}"}]`, /^expected ',' or '\}' after property value at line 1 column \d+$/],
  ] as const) {
    it(JSON.stringify(text.slice(0, 20)), () => {
      let e: unknown;
      try {
        JSON.parse(text);
      } catch (err) {
        e = err;
      }
      const said = parseErrorDetail(e, text);
      if (typeof detail === 'string') assert.equal(said, detail);
      else assert.match(said, detail);
      assert.equal(describeParseError(e, text, 'JSON'), `not valid JSON (${said})`);
      assert.ok(!said.includes('eyJ'), said);
    });
  }
});

describe("the plugin's bundles", () => {
  for (const entry of ['cni-plugin/main.ts', 'cni-plugin/validation-main.ts']) {
    it(`${entry} pulls in only cni-plugin/ files and node: built-ins`, async () => {
      const r = await esbuild.build({
        entryPoints: [path.join(ROOT, entry)],
        bundle: true,
        platform: 'node',
        format: 'cjs',
        write: false,
        metafile: true,
        logLevel: 'silent',
      });
      const inputs = Object.keys(r.metafile.inputs);
      assert.ok(
        inputs.some((f) => f.startsWith('cni-plugin/shared/')),
        'uses cni-plugin/shared/',
      );
      assert.deepEqual(
        inputs.filter((f) => !f.startsWith('cni-plugin/')),
        [],
      );
      const external = Object.values(r.metafile.outputs).flatMap((o) =>
        o.imports.filter((i) => i.external).map((i) => i.path),
      );
      assert.deepEqual(
        external.filter((p) => !p.startsWith('node:')),
        [],
      );
    });
  }
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { ConfigErrors } from '../../src/config/parse.ts';
import { buildSettings, type LoggingSettings } from '../../src/config/settings.ts';
import {
  closeLogging,
  configureLogging,
  klogV,
  logRecord,
  scope,
  scopeLevels,
  setScopeLevel,
  setStacktraceLevel,
} from '../../src/monitoring/logging.ts';
import { captureSink } from '../helpers/observability.ts';
import { waitFor } from '../helpers/poll.ts';
import { ROOT, runBin } from '../helpers/cli.ts';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'mcni-obs-log-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

const settings = (flags: Record<string, string> = {}): LoggingSettings => buildSettings(flags, {}).logging;
const ISO = '\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z';

describe('console and JSON format', () => {
  it('prints the stable console line: time, level, scope, message, key=value fields', () => {
    const sink = captureSink();
    configureLogging(settings(), sink);
    scope('install').info('wrote config', {
      file: '/etc/cni/net.d/10-x.conflist',
      plugins: 3,
      note: 'two words',
      empty: '',
    });
    assert.match(
      sink.text(),
      new RegExp(
        `^${ISO}\\tinfo\\tinstall\\twrote config\\tfile=/etc/cni/net.d/10-x.conflist plugins=3 note="two words" empty=""\\n$`,
      ),
    );
  });

  it('keeps one record on one line whatever the message holds', () => {
    const sink = captureSink();
    configureLogging(settings(), sink);
    scope('cni').warn('evil\nfake\tline\u001b[31m', { 'k\ney': 'a\nb' });
    assert.equal(sink.lines.length, 1);
    const cols = sink.lines[0]!.trimEnd().split('\t');
    assert.equal(cols.length, 5);
    assert.equal(cols[3], 'evil\\nfake\\tline\\u001b[31m');
    assert.equal(cols[4], '"k\\ney"="a\\nb"');
  });

  it('emits one JSON object a line with --log_as_json', () => {
    const sink = captureSink();
    configureLogging(settings({ log_as_json: 'true' }), sink);
    scope('repair').warn('pod repaired', { pod: 'ns/p', error: new Error('boom') });
    const rec = JSON.parse(sink.text()) as Record<string, unknown>;
    assert.equal(rec.level, 'warn');
    assert.equal(rec.scope, 'repair');
    assert.equal(rec.msg, 'pod repaired');
    assert.equal(rec.pod, 'ns/p');
    assert.match(String(rec.time), new RegExp(`^${ISO}$`));
    assert.equal((rec.error as { message: string }).message, 'boom');
  });
});

describe('levels', () => {
  it('filters per scope and takes a new level at once', () => {
    const sink = captureSink();
    configureLogging(settings({ log_output_level: 'all:warn,install:debug' }), sink);
    scope('install').debug('d1');
    scope('repair').info('hidden');
    scope('repair').warn('w1');
    assert.equal(scope('repair').enabled('info'), false);
    setScopeLevel('repair', 'debug');
    scope('repair').debug('d2');
    setScopeLevel('install', 'none');
    scope('install').error('hidden too');
    assert.deepEqual(
      sink.lines.map((l) => l.trimEnd().split('\t')[3]),
      ['d1', 'w1', 'd2'],
    );
    assert.equal(scopeLevels().repair, 'debug');
  });

  it('adds the caller for the scopes of --log_caller', () => {
    const sink = captureSink();
    configureLogging(settings({ log_caller: 'install' }), sink);
    scope('install').info('with caller');
    scope('repair').info('without');
    assert.match(sink.lines[0]!, /\tcaller=test\/node\/logging\.test\.ts:\d+\n$/);
    assert.doesNotMatch(sink.lines[1]!, /caller=/);
  });

  it('attaches a stack at and above the --log_stacktrace_level of the scope', () => {
    const sink = captureSink();
    configureLogging(settings({ log_as_json: 'true', log_stacktrace_level: 'install:warn' }), sink);
    scope('install').error('e');
    scope('install').warn('w');
    scope('install').info('i');
    scope('repair').error('other scope');
    const recs = sink.lines.map((l) => JSON.parse(l) as { msg: string; stack?: string });
    assert.match(recs[0]!.stack ?? '', /logging\.test\.ts:\d+/);
    assert.match(recs[1]!.stack ?? '', /logging\.test\.ts/);
    assert.equal(recs[2]!.stack, undefined);
    assert.equal(recs[3]!.stack, undefined);
    setStacktraceLevel('install', 'none');
    scope('install').error('e2');
    assert.equal((JSON.parse(sink.lines[4]!) as { stack?: string }).stack, undefined);
  });

  it('maps --vklog to the verbosity of klog messages', () => {
    configureLogging(settings({ vklog: '2' }), captureSink());
    assert.equal(klogV(0).enabled, true);
    assert.equal(klogV(2).enabled, true);
    assert.equal(klogV(3).enabled, false);
    configureLogging(settings({ vklog: '9', log_output_level: 'klog:warn' }), captureSink());
    assert.equal(klogV(1).enabled, false, 'the klog scope level still applies');
  });

  it('logs a foreign record with its own time, subject to its scope level', () => {
    const sink = captureSink();
    configureLogging(settings({ log_output_level: 'cni:info' }), sink);
    logRecord('cni', 'info', 'from plugin', { pod: 'ns/p' }, '2026-01-02T03:04:05.678Z');
    logRecord('cni', 'debug', 'filtered', {});
    assert.equal(sink.text(), '2026-01-02T03:04:05.678Z\tinfo\tcni\tfrom plugin\tpod=ns/p\n');
  });
});

describe('log targets and rotation', () => {
  it('writes every record to each --log_target file', async () => {
    const a = path.join(tmp, 'a', 'agent.log');
    const b = path.join(tmp, 'b.log');
    configureLogging(settings({ log_target: `${a},${b}` }));
    scope('default').info('to files', { n: 1 });
    await closeLogging();
    for (const f of [a, b]) assert.match(readFileSync(f, 'utf8'), /\tinfo\tdefault\tto files\tn=1\n$/);
  });

  it('keeps running when a log file cannot be written (full disk): says so once, logs on elsewhere', () => {
    const code = [
      "import { buildSettings } from './src/config/settings.ts';",
      "import { configureLogging, scope } from './src/monitoring/logging.ts';",
      "configureLogging(buildSettings({ log_target: 'stdout,/dev/full' }, {}).logging);",
      "for (let i = 0; i < 3; i++) scope('install').info('line ' + i);",
      "setTimeout(() => process.stdout.write('alive\\n'), 50);",
    ].join('\n');
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /\tinfo\tinstall\tline 2\n/);
    assert.match(r.stdout, /alive\n$/);
    assert.equal(r.stderr.match(/log target \/dev\/full failed: .*ENOSPC/g)?.length, 1, r.stderr);
  });

  it('writes to stdout or stderr as --log_target says', () => {
    const code = [
      "import { buildSettings } from './src/config/settings.ts';",
      "import { configureLogging, scope } from './src/monitoring/logging.ts';",
      'configureLogging(buildSettings({ log_target: process.argv[1] }, {}).logging);',
      "scope('default').info('hello');",
    ].join('\n');
    for (const target of ['stdout', 'stderr']) {
      const r = spawnSync(process.execPath, ['--input-type=module', '-e', code, target], {
        cwd: ROOT,
        encoding: 'utf8',
        timeout: 30_000,
      });
      assert.equal(r.status, 0, r.stderr);
      assert.match(target === 'stdout' ? r.stdout : r.stderr, /\tinfo\tdefault\thello\n/);
      assert.equal(target === 'stdout' ? r.stderr : r.stdout, '');
    }
  });

  it('rotates --log_rotate by size and keeps --log_rotate_max_backups files', async () => {
    const dir = path.join(tmp, 'rot');
    const file = path.join(dir, 'agent.log');
    configureLogging(
      settings({
        log_target: path.join(tmp, 'ignored.log'),
        log_rotate: file,
        log_rotate_max_size: '1',
        log_rotate_max_backups: '2',
      }),
    );
    const filler = 'x'.repeat(1000);
    for (let i = 0; i < 4500; i++) scope('default').info('fill', { i, filler });
    await closeLogging();
    const rotated = await waitFor('rotated files', () => {
      const r = readdirSync(dir).filter((f) => f.startsWith('agent.log.') && !f.endsWith('.txt'));
      return r.length >= 2 ? r : undefined;
    });
    assert.ok(rotated.length <= 2, `kept ${rotated.join(', ')}`);
    for (const f of rotated) assert.match(f, /^agent\.log\.\d{8}-\d{6}\.\d+$/);
    assert.ok(statSync(file).size <= 1024 * 1024 + 2048);
    assert.match(readFileSync(file, 'utf8'), /\tfill\ti=4499 /);
  });

  it('says which target cannot be opened', () => {
    const notADir = path.join(tmp, 'plain-file');
    writeFileSync(notADir, '');
    assert.throws(
      () => configureLogging(settings({ log_target: `stdout,${notADir}/x.log` })),
      (e: Error) =>
        e instanceof ConfigErrors &&
        e.message ===
          `invalid value "${notADir}/x.log" for --log_target: cannot open it (EEXIST); give stdout, stderr or a writable file path`,
    );
  });
});

describe('logging flag errors', () => {
  const bad: [Record<string, string>, RegExp][] = [
    [{ log_output_level: 'instal:debug' }, /--log_output_level.*unknown scope "instal"; scopes are all, ambient, cni/],
    [
      { log_output_level: 'install:verbose' },
      /--log_output_level.*unknown level "verbose" for scope install; levels are none, error, warn, info, debug/,
    ],
    [{ log_stacktrace_level: 'default:loud' }, /--log_stacktrace_level.*unknown level "loud"/],
    [{ log_caller: 'install,nope' }, /--log_caller.*unknown scope "nope"/],
    [{ log_as_json: 'maybe' }, /--log_as_json.*true or false/],
    [{ log_rotate_max_size: '0' }, /--log_rotate_max_size.*whole number from 1/],
    [{ log_rotate_max_age: '-1' }, /--log_rotate_max_age.*whole number from 0/],
    [{ log_rotate_max_backups: 'many' }, /--log_rotate_max_backups.*whole number/],
    [{ log_target: ',' }, /--log_target.*stdout, stderr or file paths/],
    [{ vklog: '11' }, /--vklog.*0 to 10/],
    [{ ctrlz_port: '65536' }, /--ctrlz_port.*0 to 65535/],
  ];
  for (const [flags, message] of bad) {
    it(`rejects ${JSON.stringify(flags)}`, () => {
      assert.throws(
        () => buildSettings(flags, {}),
        (e: unknown) => e instanceof ConfigErrors && message.test(e.message),
      );
    });
  }

  it('rejects a --log_target it cannot open with exit 2 and one line', async () => {
    const notADir = path.join(tmp, 'plain-file-2');
    writeFileSync(notADir, '');
    const r = await runBin('install-cni', [
      '--log_target',
      `${notADir}/agent.log`,
      '--monitoring-port',
      '0',
      '--ctrlz_port',
      '0',
      '--log-uds-address',
      path.join(tmp, 'uds', 'log.sock'),
    ]);
    assert.equal(r.code, 2, r.stderr);
    assert.equal(
      r.stderr,
      `install-cni: invalid value "${notADir}/agent.log" for --log_target: cannot open it (EEXIST); give stdout, stderr or a writable file path\n`,
    );
  });

  it('rejects bad logging flags on the command line with exit 2 before starting', async () => {
    const r = await runBin('install-cni', ['--log_output_level', 'install:loud', '--vklog', 'x']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /install-cni: invalid value "install:loud" for --log_output_level: unknown level "loud"/);
    assert.match(r.stderr, /install-cni: invalid value "x" for --vklog/);
    assert.equal(r.stdout, '');
  });
});

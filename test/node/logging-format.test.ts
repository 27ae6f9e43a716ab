// The exact bytes of both output formats for every kind of field value (docs/observability.md
// "Logs"): the console line is written directly now, no longer parsed back from pino's JSON, and
// must stay what it was. The expected lines were taken from the round-trip implementation.
// Deliberate changes: a console field NAME that is not bare (blank, quote, `=`, `\`, control
// character) is JSON-quoted like a value, so a sender cannot forge a field (`x pod` printed bare
// read as ` pod=`); in JSON, field names that are array indices ("1") come before "time" (marked
// below).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging, klogV, logRecord, resetLogging, scope } from '../../src/monitoring/logging.ts';
import { captureSink } from '../helpers/observability.ts';

const T = '2026-01-02T03:04:05.678Z';

function values(): [string, Record<string, unknown>][] {
  const err = new Error('boom');
  err.stack = 'Error: boom\n    at somewhere (x.ts:1:2)';
  const circular: Record<string, unknown> = { a: 1 };
  circular.self = circular;
  return [
    [
      'strings',
      {
        bare: 'a/b:c',
        space: 'two words',
        quote: 'say "hi"',
        eq: 'a=b',
        bs: 'a\\b',
        empty: '',
        uni: 'héllo',
        ctl: 'a\nb\u0007',
        tab: 'a\tb',
      },
    ],
    ['numbers', { n: 3, negzero: -0, f: 1.5, big: 1e21, nan: NaN, inf: Infinity, ninf: -Infinity }],
    [
      'others',
      {
        t: true,
        f: false,
        nul: null,
        undef: undefined,
        fn: () => 1,
        sym: Symbol('s'),
        arr: [4, 'a b', null],
        obj: { a: { b: 1 }, u: undefined },
        date: new Date(0),
      },
    ],
    ['errors', { error: err, err, cause: err, notErr: { message: 'x' } }],
    ['error not error', { error: 'just text', err: 5 }],
    ['bigint', { b: 10n }],
    // JSON.stringify throws on these: pino's safe serializer writes them (keys sorted).
    ['bigint inside', { o: { z: 1, a: 2n } }],
    ['circular', { c: circular }],
    // A value that cannot be serialized at all: said so, the record still written (never a throw).
    [
      'unserializable',
      {
        bad: {
          toJSON: () => {
            throw new Error('no');
          },
        },
        ok: 1,
      },
    ],
    ['key order', { b: 1, 2: 2, a: 3, 1: 4 }],
    ['message \u0000\n\t\u001b[31m\u007f end', {}],
  ];
}

// pino's words for it, kept.
const UNSERIALIZABLE = '[unable to serialize, circular reference is too complex to analyze]';
const ERR = '{"type":"Error","message":"boom","stack":"Error: boom\\n    at somewhere (x.ts:1:2)"}';

describe('console format, byte for byte', () => {
  it('prints every kind of value as it always has', () => {
    const sink = captureSink();
    configureLogging(buildSettings({ log_output_level: 'cni:debug' }, {}).logging, sink);
    for (const [msg, fields] of values()) logRecord('cni', 'warn', msg, fields, T);
    assert.deepEqual(sink.lines, [
      `${T}\twarn\tcni\tstrings\tbare=a/b:c space="two words" quote="say \\"hi\\"" eq="a=b" bs="a\\\\b" empty="" ` +
        'uni=héllo ctl="a\\nb\\u0007" tab="a\\tb"\n',
      `${T}\twarn\tcni\tnumbers\tn=3 negzero=0 f=1.5 big=1e+21 nan=null inf=null ninf=null\n`,
      `${T}\twarn\tcni\tothers\tt=true f=false nul=null arr=[4,"a b",null] obj={"a":{"b":1}} ` +
        'date=1970-01-01T00:00:00.000Z\n',
      `${T}\twarn\tcni\terrors\terror=${ERR} err=${ERR} cause={} notErr={"message":"x"}\n`,
      `${T}\twarn\tcni\terror not error\terror="just text" err=5\n`,
      `${T}\twarn\tcni\tbigint\tb=10\n`,
      `${T}\twarn\tcni\tbigint inside\to={"a":2,"z":1}\n`,
      `${T}\twarn\tcni\tcircular\tc={"a":1,"self":"[Circular]"}\n`,
      `${T}\twarn\tcni\tunserializable\tbad="${UNSERIALIZABLE}" ok=1\n`,
      `${T}\twarn\tcni\tkey order\t1=4 2=2 b=1 a=3\n`,
      `${T}\twarn\tcni\tmessage \\u0000\\n\\t\\u001b[31m\\u007f end\n`,
    ]);
  });

  it('quotes a field name that is not bare, so no name can forge another field', () => {
    const sink = captureSink();
    configureLogging(buildSettings({}, {}).logging, sink);
    const fields = { pod: 'ns/real', 'x pod': 'kube-system/forged', 'a=b': 1, 'q"': 2, 'k\ney': 3, é: 4 };
    Object.assign(fields, { 'd\u007f': 5 });
    logRecord('cni', 'info', 'm', fields, T);
    // DEL escaped in a name as it always was (JSON leaves it raw).
    const kv = 'pod=ns/real "x pod"=kube-system/forged "a=b"=1 "q\\""=2 "k\\ney"=3 é=4 "d\\u007f"=5';
    assert.equal(sink.text(), `${T}\tinfo\tcni\tm\t${kv}\n`);
    assert.equal(sink.text().match(/(?:^|[ \t])pod=/g)?.length, 1);
  });

  it("puts caller first and stack last, and the record's own scope, time and level win", () => {
    const sink = captureSink();
    configureLogging(buildSettings({ log_caller: 'install', log_stacktrace_level: 'install:warn' }, {}).logging, sink);
    scope('install').warn('w', { a: 1, scope: 'forged', msg: 'forged' });
    const line = sink.lines[0]!;
    const [time, ...rest] = line.split('\t');
    assert.match(time!, /^\d{4}-\d\d-\d\dT[\d:.]+Z$/);
    assert.deepEqual(rest.slice(0, 3), ['warn', 'install', 'w']);
    const here = 'test\\/node\\/logging-format\\.test\\.ts';
    assert.match(rest[3]!, new RegExp(`^caller=${here}:\\d+ a=1 stack="[^\\n]*${here}[^\\n]*"\\n$`));
  });
});

describe('JSON format, byte for byte', () => {
  it('orders the keys level, time, caller, fields, scope, stack, msg', () => {
    const sink = captureSink();
    const flags = { log_as_json: 'true', log_caller: 'install', log_stacktrace_level: 'install:warn' };
    configureLogging(buildSettings(flags, {}).logging, sink);
    scope('install').warn('w', { a: 1 });
    const rec = JSON.parse(sink.text()) as Record<string, string>;
    assert.equal(Object.keys(rec).join(','), 'level,time,caller,a,scope,stack,msg');
    assert.match(rec.caller!, /^test\/node\/logging-format\.test\.ts:\d+$/);
  });

  it('writes every kind of value as it always has', () => {
    const sink = captureSink();
    configureLogging(buildSettings({ log_as_json: 'true', log_output_level: 'cni:debug' }, {}).logging, sink);
    for (const [msg, fields] of values()) logRecord('cni', 'warn', msg, fields, T);
    const head = `{"level":"warn","time":"${T}"`;
    assert.deepEqual(sink.lines, [
      `${head},"bare":"a/b:c","space":"two words","quote":"say \\"hi\\"","eq":"a=b","bs":"a\\\\b","empty":"",` +
        '"uni":"héllo","ctl":"a\\nb\\u0007","tab":"a\\tb","scope":"cni","msg":"strings"}\n',
      `${head},"n":3,"negzero":0,"f":1.5,"big":1e+21,"nan":null,"inf":null,"ninf":null,` +
        '"scope":"cni","msg":"numbers"}\n',
      `${head},"t":true,"f":false,"nul":null,"arr":[4,"a b",null],"obj":{"a":{"b":1}},` +
        '"date":"1970-01-01T00:00:00.000Z","scope":"cni","msg":"others"}\n',
      `${head},"error":${ERR},"err":${ERR},"cause":{},"notErr":{"message":"x"},"scope":"cni","msg":"errors"}\n`,
      `${head},"error":"just text","err":5,"scope":"cni","msg":"error not error"}\n`,
      `${head},"b":10,"scope":"cni","msg":"bigint"}\n`,
      `${head},"o":{"a":2,"z":1},"scope":"cni","msg":"bigint inside"}\n`,
      `${head},"c":{"a":1,"self":"[Circular]"},"scope":"cni","msg":"circular"}\n`,
      `${head},"bad":"${UNSERIALIZABLE}","ok":1,"scope":"cni","msg":"unserializable"}\n`,
      // The one difference in JSON: names that are array indices come before "time" (JS orders
      // an object's index keys first; the time is now a key of the record, not pino's stamp).
      `{"level":"warn","1":4,"2":2,"time":"${T}","b":1,"a":3,"scope":"cni","msg":"key order"}\n`,
      // DEL escaped (pino leaves it raw), the same JSON.
      `${head},"scope":"cni","msg":"message \\u0000\\n\\t\\u001b[31m\\u007f end"}\n`,
    ]);
  });

  it("stamps the agent's own records with the time they were logged", () => {
    const sink = captureSink();
    configureLogging(buildSettings({ log_as_json: 'true' }, {}).logging, sink);
    const before = Date.now();
    scope('default').info('now');
    const rec = JSON.parse(sink.text()) as { time: string };
    assert.ok(Date.parse(rec.time) >= before - 1 && Date.parse(rec.time) <= Date.now(), rec.time);
    assert.equal(Object.keys(rec).join(','), 'level,time,scope,msg');
  });
});

// C1 controls (U+0080-U+009F: 8-bit CSI U+009B, OSC U+009D, NEL U+0085) and the
// Unicode line separators are control characters too. A pod's annotation value reaches a plugin
// record (AnnotationError quotes it with JSON.stringify, which leaves them raw); printed raw, a
// terminal reading C1 controls (xterm) runs the escape sequence, and NEL starts a forged record.
describe('C1 controls and line separators from a sender', () => {
  const hostile = 'a\u009b2J\u0085\u009d52;c;eA==\u0007\u2028\u2029\u007fz';
  const escaped = 'a\\u009b2J\\u0085\\u009d52;c;eA==\\u0007\\u2028\\u2029\\u007fz';
  const RAW = /[\u007f-\u009f\u2028\u2029]/;

  it('are escaped in the console line: message, names and values, bare, quoted or in an object', () => {
    const sink = captureSink();
    configureLogging(buildSettings({}, {}).logging, sink);
    logRecord(
      'cni',
      'info',
      `m ${hostile}`,
      { bare: 'x\u0085y', quoted: hostile, [`k\u009b`]: 1, obj: { v: hostile } },
      T,
    );
    const line = sink.text();
    assert.doesNotMatch(line, RAW, JSON.stringify(line));
    assert.equal(
      line,
      `${T}\tinfo\tcni\tm ${escaped}\tbare="x\\u0085y" quoted="${escaped}" "k\\u009b"=1 ` + `obj={"v":"${escaped}"}\n`,
    );
  });

  it('are escaped in a JSON line, which reads back the same', () => {
    const sink = captureSink();
    configureLogging(buildSettings({ log_as_json: 'true' }, {}).logging, sink);
    logRecord('cni', 'info', hostile, { v: hostile, [`k\u0085`]: hostile }, T);
    const line = sink.text();
    assert.doesNotMatch(line, RAW, JSON.stringify(line));
    const rec = JSON.parse(line) as Record<string, string>;
    assert.deepEqual([rec.msg, rec.v, rec['k\u0085']], [hostile, hostile, hostile]);
  });
});

describe('resetLogging', () => {
  it('puts back the defaults: console format, every scope at info, stdout', async () => {
    const sink = captureSink();
    const flags = { log_as_json: 'true', log_output_level: 'all:none', vklog: '5' };
    configureLogging(buildSettings(flags, {}).logging, sink);
    await resetLogging();
    assert.equal(scope('repair').enabled('info'), true);
    assert.equal(scope('repair').enabled('debug'), false);
    assert.equal(klogV(1).enabled, false);
    scope('default').warn('to stdout, not the sink');
    assert.equal(sink.lines.length, 0);
  });
});

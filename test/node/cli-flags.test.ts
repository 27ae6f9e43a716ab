// install-cni's command line as an operator meets it: `--help` grouped and wrapped to the
// terminal, and every bad flag value reported in one run, as bad env settings are.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FLAGS } from '../../src/config/flags.ts';
import { runBin } from '../helpers/cli.ts';

const GROUPS = ['Install', 'Plugin', 'Repair', 'Ambient', 'Monitoring', 'Logging'];

async function help(columns: string): Promise<string> {
  const r = await runBin('install-cni', ['--help'], { COLUMNS: columns });
  assert.equal(r.code, 0, r.stderr);
  return r.stdout;
}

const longest = (text: string) => Math.max(...text.split('\n').map((l) => l.length));

describe('install-cni --help', () => {
  it('fits 80 columns (COLUMNS=80) and has the six groups, in order', async () => {
    const text = await help('80');
    const over = text.split('\n').filter((l) => l.length > 80);
    assert.deepEqual(over, [], 'lines over 80 columns');
    const headings = text.split('\n').filter((l) => /^[A-Z][a-z]+ flags:$/.test(l));
    assert.deepEqual(
      headings,
      GROUPS.map((g) => `${g} flags:`),
    );
    for (const f of FLAGS) assert.ok(text.includes(`--${f.name} `) || text.includes(`--${f.name}\n`), f.name);
  });

  it('uses the width of a wider terminal, one line per short flag', async () => {
    const text = await help('200');
    assert.ok(longest(text) <= 200, `longest line ${longest(text)}`);
    assert.match(text, /^ {2}--repair-qps <int> +Client-side rate limit of repair actions.*\[env REPAIR_QPS\]/m);
  });

  it('keeps each flag to a short sentence; the long text stays in the table for the reference', () => {
    // One sentence: it ends with a period and has no other sentence end (a period then a blank).
    const oneSentence = (s: string) => s.endsWith('.') && !/\.\s/.test(s.replace(/\b(e\.g|i\.e)\./g, ''));
    const long = FLAGS.filter((f) => f.help.length > 100 || !oneSentence(f.help));
    assert.deepEqual(
      long.map((f) => `${f.name}: ${f.help}`),
      [],
    );
    assert.ok(FLAGS.some((f) => f.details !== undefined));
  });

  it('says --repair-enabled alone only reports', async () => {
    assert.match(FLAGS.find((f) => f.name === 'repair-enabled')!.help, /report only/i);
    assert.match((await help('80')).replace(/\s+/g, ' '), /--repair-enabled \[bool\] [^-]*report only/i);
  });

  it('says what an empty --repair-node-name really means: NODE_NAME, all nodes only without it', () => {
    const f = FLAGS.find((x) => x.name === 'repair-node-name')!;
    assert.match(`${f.help} ${f.details ?? ''}`, /NODE_NAME/);
    assert.doesNotMatch(f.help, /empty: all nodes/);
  });
});

describe('install-cni bad flag values', () => {
  it('are all reported in one run, exit 2', async () => {
    const r = await runBin('install-cni', ['--cleanup-on-exit', 'sometimes', '--monitoring-port', '99999'], {
      MOUNTED_CNI_NET_DIR: '/nonexistent/should-not-be-created',
    });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--cleanup-on-exit.*auto, always, never/);
    assert.match(r.stderr, /--monitoring-port.*0 to 65535/);
  });

  it('are reported with bad env settings and bad names, one line each', async () => {
    const r = await runBin(
      'install-cni',
      ['--repair-init-container-name', 'Bad_Name', '--repair-sidecar-annotation', '!!', '--log-level=loud'],
      { REPAIR_NODE_NAME: 'UPPER_case' },
    );
    assert.equal(r.code, 2);
    const lines = r.stderr.trim().split('\n');
    assert.equal(lines.length, 4, r.stderr);
    assert.match(r.stderr, /--repair-init-container-name: .*DNS-1123 label/);
    assert.match(r.stderr, /--repair-sidecar-annotation: .*qualified name/);
    assert.match(r.stderr, /env REPAIR_NODE_NAME: .*DNS-1123 subdomain/);
    assert.match(r.stderr, /--log-level/);
  });
});

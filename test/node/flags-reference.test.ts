// The flag reference an operator reads, docs/flags.md, is what the flag table gives: every flag
// with its env setting, default and help, the long text where a flag has one, and the log scopes.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { FLAGS_DOC, flagsReference } from '../../scripts/flags-doc.ts';
import { FLAGS, LOG_SCOPES } from '../../src/config/flags.ts';

describe('the flag reference', () => {
  it('docs/flags.md is what scripts/flags-doc.ts writes from the code', () => {
    const written = readFileSync(FLAGS_DOC, 'utf8').split('\n');
    const wanted = flagsReference().split('\n');
    const at = wanted.findIndex((l, i) => written[i] !== l);
    assert.ok(
      at < 0 && written.length === wanted.length,
      `docs/flags.md is stale (run \`node scripts/flags-doc.ts\`); line ${at + 1} is\n` +
        `${written[at] ?? '(none)'}\nwhere the code gives\n${wanted[at] ?? '(none)'}`,
    );
  });

  it('names every flag, its env setting, and every log scope', () => {
    const doc = flagsReference();
    const missing = [
      ...FLAGS.flatMap((f) => [`\`--${f.name}\``, ...(f.env ? [`\`${f.env}\``] : [])]),
      ...LOG_SCOPES.map((s) => `- \`${s}\``),
    ].filter((s) => !doc.includes(s));
    assert.deepEqual(missing, []);
  });
});

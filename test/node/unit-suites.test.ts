// The list of suites `npm run test:unit` runs (test/unit-suites.ts) names real suites, once each.
// That they need no root or Debian package is proven by scripts/test-unit-proof.sh (README, "Set-up").

import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import { describe, it } from 'node:test';
import { UNIT_SUITES } from '../unit-suites.ts';

const dir = new URL('./', import.meta.url);

describe('the test:unit list', () => {
  it('names suites that exist in test/node, each once, in order', () => {
    const missing = UNIT_SUITES.filter((n) => !existsSync(new URL(`${n}.test.ts`, dir)));
    assert.deepEqual(missing, [], 'listed in test/unit-suites.ts but no test/node/<name>.test.ts');
    assert.deepEqual(UNIT_SUITES, [...new Set(UNIT_SUITES)].sort());
  });

  it('is a part of the suites npm test runs, this one included', () => {
    const all = readdirSync(dir)
      .filter((f) => f.endsWith('.test.ts'))
      .map((f) => f.slice(0, -'.test.ts'.length));
    assert.ok(UNIT_SUITES.includes('unit-suites'));
    assert.ok(UNIT_SUITES.length < all.length, 'some suites need root: npm test runs those');
  });
});

// src/podnetns/'s import zone (eslint.config.js PODNETNS_SELF): Node built-ins, its own files,
// the agent's logger, its concurrency primitives, the file-kind leaf and the one run result type
// (cni-plugin/redirect/iptables.ts), nothing else; repair and ambient both import it, so it must
// not pull in the API client, the installer or repair. Snippets linted as if placed in the folder (nothing is
// written), as test/node/lint-zones.test.ts does for the other zones.

import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ESLint } from 'eslint';
import { ROOT } from '../helpers/cli.ts';

const eslint = new ESLint({ cwd: ROOT });
const ZONE_RULES = new Set(['no-restricted-imports', 'no-restricted-syntax']);

async function zoneMessages(code: string): Promise<string[]> {
  const [result] = await eslint.lintText(code, { filePath: path.join(ROOT, 'src/podnetns/zz-probe.ts') });
  assert.ok(result);
  assert.deepEqual(
    result.messages.filter((m) => m.fatal),
    [],
  );
  return result.messages.filter((m) => m.ruleId !== null && ZONE_RULES.has(m.ruleId)).map((m) => m.message);
}

const REFUSED =
  /src\/podnetns\/ imports only node: built-ins, its own files, \.\.\/monitoring\/logging\.ts, \.\.\/concurrency\.ts, \.\.\/filekind\.ts and \.\.\/\.\.\/cni-plugin\/redirect\/iptables\.ts/;

// [the import, refused?]
const CASES: [string, boolean][] = [
  ["import fs from 'node:fs';", false],
  ["import { openNetns } from './held.ts';", false],
  ["import { createLogger } from '../monitoring/logging.ts';", false],
  ["import { mapBounded } from '../concurrency.ts';", false],
  ["import { fileKind } from '../filekind.ts';", false],
  ["import type { RunResult } from '../../cni-plugin/redirect/iptables.ts';", false],
  ["import { x } from '../../cni-plugin/redirect/nft.ts';", true],
  ["import { x } from '../concurrency/other.ts';", true],
  ["import { OrchApi } from '../orch/api.ts';", true],
  ["import { x } from '../repair/controller.ts';", true],
  ["import { x } from '../install/installer.ts';", true],
  ["import { x } from '../../src/orch/api.ts';", true],
  ["import { x } from '../monitoring/metrics.ts';", true],
  ["import { x } from '../config/settings.ts';", true],
  ["import { isObject } from '../../cni-plugin/shared/json.ts';", true],
  ["import fs from 'fs';", true],
  ["import pino from 'pino';", true],
  ["import { x } from './sub/deeper.ts';", true],
  ["const m = () => import('../repair/controller.ts');", true],
];

describe('the src/podnetns/ import zone', () => {
  for (const [code, refused] of CASES) {
    it(`${refused ? 'refuses' : 'allows'} ${code}`, async () => {
      const messages = await zoneMessages(code);
      if (refused)
        assert.ok(
          messages.some((m) => REFUSED.test(m)),
          messages.join('\n') || 'nothing said',
        );
      else assert.deepEqual(messages, []);
    });
  }
  it('the module as it is passes its zone', async () => {
    const results = await eslint.lintFiles([path.join(ROOT, 'src/podnetns')]);
    const zone = results.flatMap((r) => r.messages.filter((m) => m.ruleId !== null && ZONE_RULES.has(m.ruleId)));
    assert.deepEqual(zone, []);
  });
});

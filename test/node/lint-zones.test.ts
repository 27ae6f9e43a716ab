// The import directions are a lint rule, not a convention: eslint.config.js's zones
// are run here on small snippets placed, by file name only, in each folder (nothing is written),
// so a zone that stops biting (a glob or a pattern gone wrong) fails this test, not a review.
// Then the tree itself is linted with only those rules.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ESLint } from 'eslint';
import { ROOT } from '../helpers/cli.ts';

// require() is refused everywhere (typescript-eslint's recommended no-require-imports), so no zone
// needs its own ban for it; it counts here so that a config losing that rule fails this test.
const ZONE_RULES = new Set(['no-restricted-imports', 'no-restricted-syntax', '@typescript-eslint/no-require-imports']);
const eslint = new ESLint({ cwd: ROOT });

/** The zone messages for `code` as if it were the file `file` (relative to the repo). */
async function zoneMessages(file: string, code: string): Promise<string[]> {
  const [result] = await eslint.lintText(code, { filePath: path.join(ROOT, file) });
  assert.ok(result, file);
  const fatal = result.messages.filter((m) => m.fatal);
  assert.deepEqual(fatal, [], `${file} did not parse`);
  return result.messages.filter((m) => m.ruleId !== null && ZONE_RULES.has(m.ruleId)).map((m) => m.message);
}

// [file placed in the zone, import it makes, what the refusal says (null: allowed)]
const CASES: [string, string, RegExp | null][] = [
  // The plugin ships alone: nothing from src/, statically or lazily.
  [
    'cni-plugin/orch/zz-probe.ts',
    "import { x } from '../../src/config/settings.ts';",
    /cni-plugin\/ imports nothing from src\//,
  ],
  ['cni-plugin/zz-probe.ts', "export { x } from '../src/orch/api.ts';", /cni-plugin\/ imports nothing from src\//],
  ['cni-plugin/zz-probe.ts', "const m = () => import('../src/agent.ts');", /cni-plugin\/ imports nothing from src\//],
  ['cni-plugin/zz-probe.ts', 'const m = (p: string) => import(p);', /literal path/],
  ['cni-plugin/orch/zz-probe.ts', "import { isObject } from '../shared/json.ts';", null],
  ['cni-plugin/zz-probe.ts', "const m = () => import('./netns/iptables.ts');", null],
  // cni-plugin/shared/: node: built-ins and itself only.
  [
    'cni-plugin/shared/zz-probe.ts',
    "import { PodLike } from '../redirect/spec.ts';",
    /cni-plugin\/shared\/ imports only node: built-ins and its own files/,
  ],
  [
    'cni-plugin/shared/zz-probe.ts',
    "import fs from 'fs';",
    /cni-plugin\/shared\/ imports only node: built-ins and its own files/,
  ],
  [
    'cni-plugin/shared/zz-probe.ts',
    "import JSON5 from 'json5';",
    /cni-plugin\/shared\/ imports only node: built-ins and its own files/,
  ],
  [
    'cni-plugin/shared/zz-probe.ts',
    "import { x } from '../../src/config/parse.ts';",
    /cni-plugin\/ imports nothing from src\//,
  ],
  ['cni-plugin/shared/zz-probe.ts', "import fs from 'node:fs';\nimport { LOG_LEVELS } from './loglevels.ts';", null],
  // The agent takes from the plugin's folder only what is shared.
  [
    'src/install/zz-probe.ts',
    "import { getPod } from '../../cni-plugin/orch/podclient.ts';",
    /src\/ imports from cni-plugin\/ only cni-plugin\/shared\//,
  ],
  [
    'src/zz-probe.ts',
    "import { parseConfig } from '../cni-plugin/cni/protocol.ts';",
    /src\/ imports from cni-plugin\/ only cni-plugin\/shared\//,
  ],
  ['src/install/zz-probe.ts', "import { isObject } from '../../cni-plugin/shared/json.ts';", null],
  // ...and the rule builder (in-place repair builds the plugin's rules), which stays pure.
  ['src/repair/zz-probe.ts', "import { specForPod } from '../../cni-plugin/redirect/spec.ts';", null],
  [
    'src/repair/zz-probe.ts',
    "import { byPath } from '../../cni-plugin/netns/iptables.ts';",
    /src\/ imports from cni-plugin\/ only cni-plugin\/shared\/ and cni-plugin\/redirect\//,
  ],
  ['cni-plugin/redirect/zz-probe.ts', "import { PROXY_PORT } from './constants.ts';", null],
  ['cni-plugin/redirect/zz-probe.ts', "import { durationMs } from '../shared/duration.ts';", null],
  [
    'cni-plugin/redirect/zz-probe.ts',
    "import { exec } from '../netns/exec.ts';",
    /cni-plugin\/redirect\/ imports only its own files and cni-plugin\/shared\//,
  ],
  [
    'cni-plugin/redirect/zz-probe.ts',
    "import { spawn } from 'node:child_process';",
    /cni-plugin\/redirect\/ imports only its own files and cni-plugin\/shared\//,
  ],
  [
    'cni-plugin/redirect/zz-probe.ts',
    "const m = () => import('../../src/agent.ts');",
    /cni-plugin\/ imports nothing from src\//,
  ],
  // Inside the agent.
  [
    'src/orch/zz-probe.ts',
    "import { Installer } from '../install/installer.ts';",
    /src\/orch\/ does not import src\/install\//,
  ],
  ['src/orch/zz-probe.ts', "import { getPod } from '../../cni-plugin/orch/podclient.ts';", /only cni-plugin\/shared\//],
  ['src/orch/zz-probe.ts', "import { ApiError } from './errors.ts';", null],
  [
    'src/config/zz-probe.ts',
    "import { parseSelector } from '../orch/selectors.ts';",
    /src\/config\/ does not import src\/orch\//,
  ],
  ['src/config/zz-probe.ts', "import { durationMs } from '../../cni-plugin/shared/duration.ts';", null],
  // Settings are built from flags and env before anything is installed: the file-name rules they
  // check against live in src/config/cnifiles.ts, which the installer imports.
  [
    'src/config/zz-probe.ts',
    "import { TEMP_MARKER } from '../install/atomicfile.ts';",
    /src\/config\/ does not import src\/install\//,
  ],
  ['src/install/zz-probe.ts', "import { byteOrder } from '../config/cnifiles.ts';", null],
  [
    'src/monitoring/zz-probe.ts',
    "import { program } from '../cmd/program.ts';",
    /src\/monitoring\/ does not import src\/cmd\//,
  ],
  ['src/monitoring/zz-probe.ts', "import { registry } from './metrics.ts';", null],
  // Ambient mode is handed its own slice of the settings, never the whole.
  [
    'src/ambient/zz-probe.ts',
    "import type { Settings } from '../config/settings.ts';",
    /src\/ambient\/ takes AmbientArgs/,
  ],
  ['src/ambient/zz-probe.ts', "const m = () => import('../config/settings.ts');", /src\/ambient\/ takes AmbientArgs/],
  ['src/ambient/zz-probe.ts', "import type { AmbientSettings } from '../config/settings.ts';", null],
  [
    'src/monitoring/zz-probe.ts',
    "import type { Settings } from '../config/settings.ts';",
    /takes the settings it reads/,
  ],
  ['src/node/zz-probe.ts', "import { type Settings } from '../config/settings.ts';", /takes the settings it reads/],
  ['src/monitoring/zz-probe.ts', "import type { LoggingSettings } from '../config/settings.ts';", null],
  // So are the installer's parts, the API client, repair and the stop's bound: the whole Settings
  // stops at the wiring (src/agent.ts, src/partargs.ts), which cuts each part its own slice.
  ['src/install/zz-probe.ts', "import type { Settings } from '../config/settings.ts';", /takes the settings it reads/],
  ['src/orch/zz-probe.ts', "import { type Settings } from '../config/settings.ts';", /takes the settings it reads/],
  ['src/repair/zz-probe.ts', "import type { Settings } from '../config/settings.ts';", /takes the settings it reads/],
  ['src/zz-probe.ts', "import type { Settings } from './config/settings.ts';", /takes the settings it reads/],
  ['src/cmd/zz-probe.ts', "import type { Settings } from '../config/settings.ts';", /takes the settings it reads/],
  ['src/install/zz-probe.ts', "import type { InstallSettings } from '../config/settings.ts';", null],
  ['src/repair/zz-probe.ts', "import type { RepairSettings } from '../config/settings.ts';", null],
  ['src/cmd/zz-probe.ts', "import { buildSettings } from '../config/settings.ts';", null],
  ['src/partargs.ts', "import type { Settings } from './config/settings.ts';", null],
  ['src/agent.ts', "import type { Settings } from './config/settings.ts';", null],
  // src/node/ is handed what it needs by the agent.
  [
    'src/node/zz-probe.ts',
    "import { decideCleanup } from '../install/uninstall.ts';",
    /src\/node\/ does not import src\/install\//,
  ],
  ['src/node/zz-probe.ts', "const m = () => import('../repair/index.ts');", /src\/node\/ does not import/],
  ['src/node/zz-probe.ts', "import { apiRequest } from '../orch/request.ts';", null],
  // src/podnetns/ stands on Node built-ins and the agent's leaf modules alone: the file-kind
  // names it shares with the installer live in src/filekind.ts, not in src/install/.
  ['src/podnetns/zz-probe.ts', "import { fileKind } from '../filekind.ts';", null],
  ['src/podnetns/zz-probe.ts', "import { Limit } from '../concurrency.ts';", null],
  [
    'src/podnetns/zz-probe.ts',
    "import { openRegular } from '../install/safefile.ts';",
    /src\/podnetns\/ imports only node: built-ins/,
  ],
  ['src/podnetns/zz-probe.ts', "import { apiRequest } from '../orch/request.ts';", /src\/podnetns\/ imports only/],
  // require(), in any zone.
  ['cni-plugin/zz-probe.ts', "const m = require('../src/agent.ts');", /require\(\)/],
  ['src/orch/zz-probe.ts', "const m = require('../install/installer.ts');", /require\(\)/],
  // A path the zones' patterns cannot see through (a detour by .., ./.., //) is refused as such.
  ['src/orch/zz-probe.ts', "import { Installer } from './../install/installer.ts';", /normalized/],
  ['src/orch/zz-probe.ts', "export { Installer } from '../orch/../install/installer.ts';", /normalized/],
  ['src/config/zz-probe.ts', "const m = () => import('..//orch/api.ts');", /normalized/],
  ['src/monitoring/zz-probe.ts', "import { program } from './../cmd/program.ts';", /normalized/],
  ['src/zz-probe.ts', "import { getPod } from '../cni-plugin/shared/../orch/podclient.ts';", /normalized/],
  ['cni-plugin/zz-probe.ts', "import { x } from './../src/config/settings.ts';", /imports nothing from src\//],
  ['cni-plugin/zz-probe.ts', "import { x } from './shared/./json.ts';", /normalized/],
  ['src/install/zz-probe.ts', "import { y } from '../.hidden.ts';", null],
  // Directions that are allowed the other way.
  ['src/install/zz-probe.ts', "import { apiRequest } from '../orch/request.ts';", null],
  ['src/cmd/zz-probe.ts', "import { scope } from '../monitoring/logging.ts';", null],
];

describe('import zones (eslint.config.js)', () => {
  for (const [file, code, refused] of CASES) {
    it(`${file}: ${code.split('\n').at(-1)} ${refused ? 'is refused' : 'is allowed'}`, async () => {
      const messages = await zoneMessages(file, code);
      if (refused === null) assert.deepEqual(messages, []);
      else
        assert.ok(
          messages.some((m) => refused.test(m)),
          `expected ${refused} in ${JSON.stringify(messages)}`,
        );
    });
  }

  it('the tree keeps to them', async () => {
    const results = await eslint.lintFiles(['src/**/*.ts', 'cni-plugin/**/*.ts']);
    const broken = results.flatMap((r) =>
      r.messages
        .filter((m) => m.ruleId !== null && ZONE_RULES.has(m.ruleId))
        .map((m) => `${path.relative(ROOT, r.filePath)}:${m.line}: ${m.message}`),
    );
    assert.deepEqual(broken, []);
  });
});

// Every import, type-only ones too, as written in the source: a relative path is an edge of the
// graph between the tree's own files.
const IMPORT = /(?:^|\n)\s*(?:import|export)\b[^;'"]*?\bfrom\s*'(\.[^']+)'|\bimport\(\s*'(\.[^']+)'\s*\)/g;

function sourceFiles(dir: string): string[] {
  return readdirSync(path.join(ROOT, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => path.relative(ROOT, path.join(e.parentPath, e.name)));
}

/** Each file's imports of the tree's own files, as paths relative to the repo. */
function importGraph(files: readonly string[]): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const text = readFileSync(path.join(ROOT, file), 'utf8');
    const targets = [...text.matchAll(IMPORT)].map((m) => path.join(path.dirname(file), m[1] ?? m[2] ?? ''));
    graph.set(file, targets);
  }
  return graph;
}

/** One import circle per strongly connected set of files, as the path round it; none: []. */
function circles(graph: Map<string, string[]>): string[][] {
  const found: string[][] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (file: string): void => {
    state.set(file, 'open');
    stack.push(file);
    for (const next of graph.get(file) ?? []) {
      if (!graph.has(next)) continue;
      if (state.get(next) === 'open') found.push([...stack.slice(stack.indexOf(next)), next]);
      else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const file of [...graph.keys()].sort()) if (!state.has(file)) visit(file);
  return found;
}

describe('import circles', () => {
  it('finds a circle through a type-only import', () => {
    const graph = importGraph([]);
    graph.set('src/a.ts', ['src/b.ts']);
    graph.set('src/b.ts', ['src/a.ts']);
    graph.set('src/c.ts', ['src/a.ts']);
    assert.deepEqual(circles(graph), [['src/a.ts', 'src/b.ts', 'src/a.ts']]);
    const [line] = [..."import type { Json } from './cniconfig.ts';".matchAll(IMPORT)];
    assert.equal(line?.[1], './cniconfig.ts');
  });

  it('the tree has none: each module can be read (and loaded) after what it imports', () => {
    const graph = importGraph([...sourceFiles('src'), ...sourceFiles('cni-plugin')]);
    assert.ok(graph.size > 50, `found only ${graph.size} source files`);
    assert.deepEqual(circles(graph), []);
  });
});

// npm run test:unit [-- node --test options]: the suites of test/unit-suites.ts, those that run
// anywhere (no root, no Debian packages), in one `node --test` run as `npm test` runs them all.

import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { UNIT_SUITES } from '../test/unit-suites.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const files = UNIT_SUITES.map((name) => path.join('test', 'node', `${name}.test.ts`));
const args = ['--test', '--test-reporter=spec', ...process.argv.slice(2), ...files];
const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
process.exit(r.status ?? 1);

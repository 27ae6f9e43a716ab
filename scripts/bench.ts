// npm run bench [-- name...]: runs every scripts/bench/<name>.bench.ts (or the ones named), one
// after the other so they do not disturb each other, each printing its own table.

import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'bench');
const all = readdirSync(dir)
  .filter((f) => f.endsWith('.bench.ts'))
  .sort();
const wanted = process.argv.slice(2);
const chosen = wanted.length === 0 ? all : all.filter((f) => wanted.includes(f.replace(/\.bench\.ts$/, '')));
if (chosen.length === 0) {
  console.error(
    `bench: nothing matches ${wanted.join(', ')}; have ${all.map((f) => f.replace(/\.bench\.ts$/, '')).join(', ')}`,
  );
  process.exit(2);
}
let failed = 0;
for (const f of chosen) {
  console.log(`\n=== ${f.replace(/\.bench\.ts$/, '')} ===`);
  const r = spawnSync(process.execPath, [path.join(dir, f)], { stdio: 'inherit' });
  if (r.status !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);

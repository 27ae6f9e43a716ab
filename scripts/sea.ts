// Node 24 single executable applications for the binaries that run on the node itself, where no
// Node.js is installed: dist/bin/mesh-cni (run by the container runtime) and
// dist/mesh-validation (the pods' init container). install-cni copies every file of
// --cni-binaries-dir (dist/bin in dev) into the host's CNI bin dir, so only the plugin is there.
//
// Steps (nodejs.org/api/single-executable-applications.html): a preparation blob from the
// bundle (`node --experimental-sea-config`), a copy of this node binary, the blob injected with
// postject under the SEA fuse. The mode was measured by `npm run bench -- plugin` before it
// compared runtimes instead (scripts/plugin-runtime.ts; the plugin's default is now Bun):
//   plain     the bundle's source only
//   codecache V8 code cache of the bundle (useCodeCache)
//   snapshot  a V8 startup snapshot taken after the bundle's top level ran (useSnapshot)
// A stamp (hash of bundle + mode + node binary) skips the slow copy+inject when nothing changed.

import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

export const SEA_MODES = ['plain', 'codecache', 'snapshot'] as const;
export type SeaMode = (typeof SEA_MODES)[number];
/** The default, from the plugin benchmark (see docs/plugin.md, "The plugin executable"): fastest spawn-to-exit. */
export const DEFAULT_SEA_MODE: SeaMode = 'codecache';
const FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';

export interface SeaOptions {
  readonly root: string;
  /** Bundle (CJS, built-ins only). */
  readonly main: string;
  readonly out: string;
  readonly mode: SeaMode;
}

/** Builds one executable; returns false when the stamp says it is already up to date. */
export function buildSea(o: SeaOptions): boolean {
  const node = process.execPath;
  const nodeStat = statSync(node);
  const stamp = createHash('sha256')
    .update(readFileSync(o.main))
    .update(o.mode)
    .update(`${node}:${nodeStat.size}:${nodeStat.mtimeMs}`)
    .digest('hex');
  return buildOnce(o.root, o.out, stamp, (tmp, work) => {
    const name = path.basename(o.out);
    const blob = path.join(work, `${name}.blob`);
    const config = path.join(work, `${name}.sea.json`);
    writeFileSync(
      config,
      JSON.stringify({
        main: o.main,
        output: blob,
        disableExperimentalSEAWarning: true,
        useCodeCache: o.mode === 'codecache',
        useSnapshot: o.mode === 'snapshot',
      }),
    );
    execFileSync(node, ['--experimental-sea-config', config], { stdio: ['ignore', 'ignore', 'pipe'] });
    copyFileSync(node, tmp);
    const postject = createRequire(import.meta.url).resolve('postject/dist/cli.js');
    execFileSync(node, [postject, tmp, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', FUSE], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
  });
}

/**
 * Builds `out` with `make(tmp, work)` unless the stamp of its inputs is unchanged since the last
 * build: false when nothing was built. Never writes into the executable in place, since a
 * runtime may be running it (ETXTBSY): `make` writes a temp file that replaces it by rename.
 */
export function buildOnce(
  root: string,
  out: string,
  stamp: string,
  make: (tmp: string, work: string) => void,
): boolean {
  const work = path.join(root, 'dist', '.sea');
  mkdirSync(work, { recursive: true });
  mkdirSync(path.dirname(out), { recursive: true });
  const stampFile = path.join(work, `${path.basename(out)}.stamp`);
  if (existsSync(out) && existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp) return false;
  const tmp = `${out}.tmp-${process.pid}`;
  try {
    make(tmp, work);
    chmodSync(tmp, 0o755);
    renameSync(tmp, out);
  } finally {
    rmSync(tmp, { force: true });
  }
  writeFileSync(stampFile, stamp);
  return true;
}

export function seaModeFrom(value: string | undefined): SeaMode {
  if (value === undefined || value === '') return DEFAULT_SEA_MODE;
  if (!(SEA_MODES as readonly string[]).includes(value))
    throw new Error(`MESH_SEA_MODE=${value}: expected ${SEA_MODES.join(', ')}`);
  return value as SeaMode;
}

// The agent bundle's V8 code cache (Node's module compile cache), made by the build and shipped
// in the image beside the bundle, so the agent does not parse and compile its 1.4 MB of
// JavaScript at every start (docs/design.md "Start-up time").
//
// The cache is code the agent runs: whoever can write it runs code as the agent (root, with the
// host's CNI dirs). So it is made here, at build time, and shipped read-only in the image, which
// runs with a read-only root file system: nobody on the node writes it. It is never put in a
// host path or a volume (a pod or a user on the node could write there). Node takes an entry only
// for the same source, Node version and V8 flags (else it compiles as before, and cannot save
// into the read-only dir, silently): a stale or missing cache costs time, never correctness.
//
// Portable (NODE_COMPILE_CACHE_PORTABLE=1): entries are keyed by the bundle's path relative to
// the cache dir, so the cache made in dist/ serves /opt/mesh-cni/install-cni.js in the image,
// where scripts/image.sh copies dist/compile-cache and sets the same two variables.

import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';

/** The cache dir's name, beside the bundle (dist/compile-cache, /opt/mesh-cni/compile-cache). */
export const COMPILE_CACHE_DIR = 'compile-cache';

/** The environment that has Node use the cache beside `bundle` (the image sets the same). */
export function compileCacheEnv(bundle: string): Record<string, string> {
  return {
    NODE_COMPILE_CACHE: path.join(path.dirname(bundle), COMPILE_CACHE_DIR),
    NODE_COMPILE_CACHE_PORTABLE: '1',
  };
}

/**
 * Makes the cache for `bundle` afresh with this Node (the image's): one `version` run, which
 * compiles the whole bundle (Node keeps what V8 compiled eagerly, whatever the command runs).
 */
export function makeCompileCache(bundle: string): void {
  const env = compileCacheEnv(bundle);
  rmSync(env.NODE_COMPILE_CACHE!, { recursive: true, force: true });
  const r = spawnSync(process.execPath, [bundle, 'version', '--short'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
    encoding: 'utf8',
  });
  if (r.status !== 0)
    throw new Error(`compile cache: ${bundle} version failed (${r.status ?? r.signal}): ${r.stderr.trim()}`);
  // Node keeps a dir per user (<version>-<arch>-<V8 tag>-<uid>), and the agent runs as root: a
  // build by another user makes root's too (the entries do not depend on the user).
  const uid = process.getuid?.() ?? 0;
  if (uid === 0) return;
  for (const dir of readdirSync(env.NODE_COMPILE_CACHE!)) {
    if (dir.endsWith(`-${uid}`))
      cpSync(
        path.join(env.NODE_COMPILE_CACHE!, dir),
        path.join(env.NODE_COMPILE_CACHE!, `${dir.slice(0, -`${uid}`.length)}0`),
        {
          recursive: true,
        },
      );
  }
}

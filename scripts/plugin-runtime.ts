// The runtime inside the shipped executables (dist/bin/mesh-cni, dist/mesh-validation) is a
// build choice; the bundle (dist/*.cjs, one TypeScript source) is the same for each:
//   node-sea  a Node 24 single executable application with a V8 code cache (scripts/sea.ts)
//   bun       `bun build --compile --bytecode --minify` of the bundle, with the Bun of
//             node_modules (@oven/bun-linux-x64, pinned exactly: the build stays offline)
//             Its CPU floor is x86-64 with SSE4.2 (Nehalem): Bun 1.4.5 ships one x86-64 binary
//             that picks its AVX2 code at run time; @oven/bun-linux-x64-baseline 1.4.5 is an
//             alias holding the same file (same sha256), so there is no other build to pick.
//             Node runs on any x86-64 (plugin-build.test.ts runs both under qemu CPU models).
// Chosen by MESH_PLUGIN_RUNTIME; the default is the one `npm run bench -- plugin` measured
// fastest with every shipped-executable test green (docs/plugin.md "mesh-cni: the CNI plugin", "The plugin
// executable").
// Deno was looked at too: its npm package `deno` fetches its binary from a postinstall script
// (@deno/linux-x64-glibc holds it without one), but `deno compile` downloads its `denort`
// runtime from the network at build time (here: a DNS error), and no npm package holds denort,
// so it cannot build offline: not a candidate.

import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { buildOnce, buildSea, type SeaMode } from './sea.ts';

export const PLUGIN_RUNTIMES = ['node-sea', 'bun'] as const;
export type PluginRuntime = (typeof PLUGIN_RUNTIMES)[number];
export const DEFAULT_PLUGIN_RUNTIME: PluginRuntime = 'bun';

/**
 * mesh-validation stays on Node: Bun reports a connect() that fails with ENETUNREACH as
 * ECONNREFUSED, and the probe moves on to the pod's other address family only on an unreachable
 * one (an IPv6-only pod would be failed on its IPv4 probe). validation.test.ts, run on the
 * shipped executable by plugin-shipped.test.ts, fails on a Bun build of it.
 */
export const DEFAULT_VALIDATION_RUNTIME: PluginRuntime = 'node-sea';

export function pluginRuntimeFrom(
  value: string | undefined,
  variable = 'MESH_PLUGIN_RUNTIME',
  fallback: PluginRuntime = DEFAULT_PLUGIN_RUNTIME,
): PluginRuntime {
  if (value === undefined || value === '') return fallback;
  if (!(PLUGIN_RUNTIMES as readonly string[]).includes(value))
    throw new Error(`${variable}=${value}: expected one of ${PLUGIN_RUNTIMES.join(', ')}`);
  return value as PluginRuntime;
}

/** The Bun binary of node_modules (no install script: the package is the binary). */
export function bunBinary(root: string): string {
  const bin = path.join(root, 'node_modules/@oven/bun-linux-x64/bin/bun');
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run npm ci (devDependency @oven/bun-linux-x64)`);
  return bin;
}

export interface ExecutableOptions {
  readonly root: string;
  /** The bundle (CJS, built-ins only). */
  readonly main: string;
  readonly out: string;
  readonly runtime: PluginRuntime;
  /** node-sea only. */
  readonly seaMode: SeaMode;
}

/** Builds one executable; returns false when its stamp says it is up to date. */
export function buildExecutable(o: ExecutableOptions): boolean {
  if (o.runtime === 'node-sea') return buildSea({ root: o.root, main: o.main, out: o.out, mode: o.seaMode });
  return buildBun(o);
}

/**
 * `bun build` flags beyond --compile. Bun's executables by default also read .env and bunfig.toml
 * from the working directory: a plugin run by root in whatever directory the runtime has must not
 * (plugin-shipped test). --compile-jit-policy scales JavaScriptCore's tier-up thresholds: a
 * plugin call runs a few ms of JavaScript, which the JIT never pays back, and its compiler
 * threads are started and joined on every call; at this scale nothing is compiled, which saved
 * ~0.4-0.8 ms of CPU per VERSION and ~1 ms per ADD (docs/plugin.md "mesh-cni: the CNI plugin", "The plugin
 * executable").
 */
export const BUN_BUILD_FLAGS: readonly string[] = [
  '--bytecode',
  '--minify',
  '--no-compile-autoload-dotenv',
  '--no-compile-autoload-bunfig',
  '--compile-jit-policy=1000000',
];

function buildBun(o: ExecutableOptions): boolean {
  const bun = bunBinary(o.root);
  const bunStat = statSync(bun);
  const stamp = createHash('sha256')
    .update(readFileSync(o.main))
    .update('bun')
    .update(BUN_BUILD_FLAGS.join(' '))
    .update(`${bun}:${bunStat.size}:${bunStat.mtimeMs}`)
    .digest('hex');
  // No --target: the executable embeds the very Bun that builds it (another target is a download).
  return buildOnce(o.root, o.out, stamp, (tmp, work) => {
    execFileSync(bun, ['build', '--compile', ...BUN_BUILD_FLAGS, o.main, '--outfile', tmp], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '/root',
        BUN_INSTALL_CACHE_DIR: path.join(work, 'bun-cache'),
        DO_NOT_TRACK: '1',
      },
    });
  });
}

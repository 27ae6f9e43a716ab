// Compiles the agent's one native addon, src/ambient/native/seqpacket.c (SOCK_SEQPACKET and
// SCM_RIGHTS for the ztunnel socket), into dist/native/seqpacket.node with the machine's C
// compiler: no node-gyp, no install script. It is C against N-API, whose headers come from the
// node-api-headers devDependency, so one build loads in any Node of the engines range; uv.h is
// libuv's (Debian libuv1-dev, ABI-stable within libuv 1.x). The napi_* and uv_* symbols are left
// undefined and resolve from the node process at load time.
//
// Like make: nothing is done when the output is newer than the source and the headers, and was
// built by the same command; otherwise it is compiled to a temp file and renamed in, so a
// concurrent build or a failed one never leaves a half-written addon. The plugin's bundles never
// include it.

import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';

export interface NativeBuild {
  /** The repository root (node_modules/node-api-headers is looked up there). */
  readonly root: string;
  /** Default <root>/src/ambient/native/seqpacket.c. */
  readonly source?: string;
  /** Default <root>/dist/native/seqpacket.node. */
  readonly out?: string;
  /** The C compiler; default $CC or cc. */
  readonly cc?: string;
}

const HOW_TO_GET =
  'the agent addon needs a C compiler, libc headers and uv.h: ' +
  'bash scripts/setup-host.sh installs them (Debian: apt-get install gcc libc6-dev libuv1-dev)';

/** The compiler command line, without the output file (the stamp compares it). */
function command(cc: string, headers: string, source: string): string[] {
  return [cc, '-shared', '-fPIC', '-O2', '-Wall', '-Wextra', '-Werror', '-std=gnu11', `-I${headers}`, source];
}

/** Builds the addon when it is missing or out of date. Returns whether it compiled. */
export function buildNative(opts: NativeBuild): boolean {
  const source = opts.source ?? path.join(opts.root, 'src/ambient/native/seqpacket.c');
  const out = opts.out ?? path.join(opts.root, 'dist/native/seqpacket.node');
  // The environment is a build input here, as MESH_PLUGIN_RUNTIME is for build.ts.
  const cc = opts.cc ?? (process.env.CC || 'cc');
  const headers = path.join(opts.root, 'node_modules/node-api-headers/include');
  if (!existsSync(path.join(headers, 'node_api.h')))
    throw new Error(`native: ${headers}/node_api.h is missing: run npm ci (node-api-headers is a devDependency)`);

  const argv = command(cc, headers, source);
  const stamp = `${out}.cmd`;
  // The inputs: the source and the N-API headers (an upgrade of node-api-headers rebuilds).
  const inputsTime = Math.max(
    ...[source, 'node_api.h', 'js_native_api.h', 'js_native_api_types.h', 'node_api_types.h'].map(
      (f) => statSync(path.resolve(headers, f)).mtimeMs,
    ),
  );
  if (upToDate(out, stamp, inputsTime, argv.join(' '))) return false;

  mkdirSync(path.dirname(out), { recursive: true });
  const tmp = `${out}.${process.pid}.tmp`;
  const [bin, ...args] = argv as [string, ...string[]];
  const r = spawnSync(bin, [...args, '-o', tmp], { encoding: 'utf8', stdio: ['ignore', 'inherit', 'pipe'] });
  if (r.error) {
    const code = (r.error as NodeJS.ErrnoException).code;
    throw new Error(
      code === 'ENOENT'
        ? `native: no C compiler: ${cc} is not on PATH; ${HOW_TO_GET}`
        : `native: cannot run ${cc}: ${r.error.message}; ${HOW_TO_GET}`,
    );
  }
  if (r.status !== 0) {
    rmSync(tmp, { force: true });
    throw new Error(
      `native: ${cc} failed (exit ${r.status ?? r.signal}) compiling ${source}; ${HOW_TO_GET}:\n${r.stderr.trim()}`,
    );
  }
  renameSync(tmp, out);
  writeFileSync(stamp, `${argv.join(' ')}\n`);
  return true;
}

function upToDate(out: string, stamp: string, inputsTime: number, cmd: string): boolean {
  try {
    return statSync(out).mtimeMs >= inputsTime && readFileSync(stamp, 'utf8') === `${cmd}\n`;
  } catch {
    return false;
  }
}

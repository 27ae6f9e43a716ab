// Build information for `version`: the package version, the git commit and the Node.js version.
// A bundle built by scripts/build.ts has them baked in (esbuild define); running from source
// asks git once.

import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

declare const __MESH_BUILD_INFO__: { version: string; gitCommit: string; buildTime: string } | undefined;

export interface BuildInfo {
  readonly version: string;
  readonly gitCommit: string;
  readonly gitTreeState: 'clean' | 'dirty' | 'unknown';
  readonly buildTime: string;
  readonly nodeVersion: string;
  readonly platform: string;
}

function fromSource(): Omit<BuildInfo, 'nodeVersion' | 'platform'> {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
  const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string };
  const git = (...args: string[]) =>
    execFileSync('git', args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  let gitCommit = 'unknown';
  let gitTreeState: BuildInfo['gitTreeState'] = 'unknown';
  try {
    gitCommit = git('rev-parse', 'HEAD');
    gitTreeState = git('status', '--porcelain', '--untracked-files=no') === '' ? 'clean' : 'dirty';
  } catch {
    // Not a git checkout (an unpacked tarball): say so rather than fail.
  }
  return { version: pkg.version, gitCommit, gitTreeState, buildTime: 'unknown' };
}

let known: BuildInfo | undefined;

/** Worked out once per process: from source it runs git, and /metrics and ControlZ ask often. */
export function buildInfo(): BuildInfo {
  if (known) return known;
  const baked = typeof __MESH_BUILD_INFO__ === 'undefined' ? undefined : __MESH_BUILD_INFO__;
  const base = baked ? { ...baked, gitTreeState: 'clean' as const } : fromSource();
  known = { ...base, nodeVersion: process.version, platform: `${process.platform}/${process.arch}` };
  return known;
}

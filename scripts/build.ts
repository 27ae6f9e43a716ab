// Builds the shipped artefacts into dist/ with esbuild:
//   dist/install-cni.js      the agent, one ESM bundle (needs Node 24 in the image)
//   dist/mesh-cni.cjs         the CNI plugin, one bundle of built-ins only
//   dist/mesh-validation.cjs  the validation init container
//   dist/compile-cache/       the agent bundle's V8 code cache (scripts/compile-cache.ts)
// Build info (version, git commit) is baked in so `version` needs no git at run time.

import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';
import { seaModeFrom } from './sea.ts';
import { buildExecutable, DEFAULT_VALIDATION_RUNTIME, pluginRuntimeFrom } from './plugin-runtime.ts';
import { bundleOptions } from './bundle-options.ts';
import { COMPILE_CACHE_DIR, makeCompileCache } from './compile-cache.ts';
import { buildNative } from './native.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string };
let gitCommit = 'unknown';
try {
  gitCommit = execFileSync('git', ['rev-parse', 'HEAD'], {
    cwd: root,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
  }).trim();
} catch {
  // building from a tarball
}
const buildInfo = { version: pkg.version, gitCommit, buildTime: new Date().toISOString() };

interface Entry {
  readonly in: string;
  readonly out: string;
  /** The plugin runs once per pod: built-ins only, CommonJS for the single executable. */
  readonly format: 'esm' | 'cjs';
}

const entries: Entry[] = [
  { in: 'src/cmd/install-cni-main.ts', out: 'dist/install-cni.js', format: 'esm' },
  { in: 'cni-plugin/main.ts', out: 'dist/mesh-cni.cjs', format: 'cjs' },
  { in: 'cni-plugin/validation-main.ts', out: 'dist/mesh-validation.cjs', format: 'cjs' },
];

for (const e of entries) {
  const result = await esbuild.build({
    ...bundleOptions(e.format, buildInfo),
    entryPoints: [path.join(root, e.in)],
    outfile: path.join(root, e.out),
  });
  // Warnings (an import that will always be undefined, a require that cannot be bundled) are
  // failures on the node at run time: fail the build instead.
  if (result.warnings.length > 0)
    throw new Error(`build: ${e.out}: ${result.warnings.length} esbuild warning(s), printed above`);
}
console.log(`build: ${entries.map((e) => e.out).join(', ')}`);

// The agent bundle's code cache (scripts/compile-cache.ts), made with this Node, which the image
// ships: the agent's start skips compiling the bundle.
makeCompileCache(path.join(root, 'dist/install-cni.js'));
console.log(`build: dist/${COMPILE_CACHE_DIR}`);

// The agent's native addon (SOCK_SEQPACKET + SCM_RIGHTS for ztunnel), compiled with cc when its
// C source changed; never in the plugin's bundles. MESH_NATIVE=0 skips it (npm run test:unit:
// its suites do not load it, and it runs where there is no compiler).
if (process.env.MESH_NATIVE === '0') console.log('build: dist/native/seqpacket.node skipped (MESH_NATIVE=0)');
else console.log(`build: dist/native/seqpacket.node${buildNative({ root }) ? '' : ' (up to date)'}`);

// Single executables for the node (no Node.js there): dist/bin/mesh-cni, dist/mesh-validation.
// Their runtime is a build choice (scripts/plugin-runtime.ts), the bundle is the same:
// MESH_PLUGIN_RUNTIME=node-sea|bun for the plugin, MESH_VALIDATION_RUNTIME for mesh-validation;
// MESH_SEA_MODE=plain|codecache|snapshot the node-sea mode; MESH_SEA=0 skips them.
if (process.env.MESH_SEA !== '0') {
  const seaMode = seaModeFrom(process.env.MESH_SEA_MODE);
  const executables = [
    ['dist/mesh-cni.cjs', 'dist/bin/mesh-cni', pluginRuntimeFrom(process.env.MESH_PLUGIN_RUNTIME)],
    [
      'dist/mesh-validation.cjs',
      'dist/mesh-validation',
      pluginRuntimeFrom(process.env.MESH_VALIDATION_RUNTIME, 'MESH_VALIDATION_RUNTIME', DEFAULT_VALIDATION_RUNTIME),
    ],
  ] as const;
  for (const [bundle, exe, runtime] of executables) {
    const built = buildExecutable({ root, main: path.join(root, bundle), out: path.join(root, exe), runtime, seaMode });
    console.log(
      `build: ${exe} (${runtime === 'node-sea' ? `node-sea, ${seaMode}` : runtime}${built ? '' : ', up to date'})`,
    );
  }
}

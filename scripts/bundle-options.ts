// The esbuild options of the shipped bundles, shared by scripts/build.ts (dist/) and the
// benchmarks that must measure exactly what ships.

import type { BuildOptions } from 'esbuild';
import { builtinsByRequire } from './builtins-by-require.ts';
import { asciiSource } from './ascii-source.ts';
import { lazyModules } from './lazy-modules.ts';
import { slimClientNode } from './slim-client-node.ts';

export interface BuildInfo {
  readonly version: string;
  readonly gitCommit: string;
  readonly buildTime: string;
}

/** esm: the agent (Node 24 in the image); cjs: the plugin and validation, built-ins only, for the single executables. */
export function bundleOptions(format: 'esm' | 'cjs', buildInfo: BuildInfo): BuildOptions {
  return {
    bundle: true,
    platform: 'node',
    target: 'node24',
    format,
    minify: false,
    sourcemap: false,
    legalComments: 'none',
    banner:
      format === 'esm'
        ? {
            js: "#!/usr/bin/env node\nimport { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);",
          }
        : { js: '#!/usr/bin/env node' },
    define: { __MESH_BUILD_INFO__: JSON.stringify(buildInfo) },
    // whatwg-url (under client-node's node-fetch) requires Node's deprecated built-in punycode,
    // which prints a DEP0040 warning at every agent start; the userland package is the same code.
    alias: { punycode: 'punycode/' },
    // The agent: only the parts of client-node it runs (see slim-client-node.ts), built-ins
    // loaded without an ESM facade (see builtins-by-require.ts), and what only some paths use
    // loaded on first use (see lazy-modules.ts), its source one byte a character in V8's heap
    // (see ascii-source.ts).
    plugins: format === 'esm' ? [slimClientNode(), builtinsByRequire(), lazyModules(), asciiSource()] : [],
    logLevel: 'warning',
  };
}

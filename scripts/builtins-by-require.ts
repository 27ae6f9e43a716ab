// An esbuild plugin for the agent bundle: Node's built-in modules that the bundle imports are
// loaded with require() (the banner's createRequire), not as ES modules.
//
// An ES import of a built-in makes Node build an ESM facade for it, which reads every export
// once. node:http's exports include getters that load the whole of undici (WebSocket,
// EventSource and friends), so `import http from 'node:http'` costs ~15-30 ms of the agent's
// start before anything runs, for a client the agent never uses (docs/design.md "Start-up time").
// require() hands back the module object as it is, and its getters run only if read.
//
// Each built-in becomes a one-line CommonJS module of the bundle (`module.exports =
// require(...)`): esbuild then reads its names as properties, as for any CommonJS dependency, so
// default, named and namespace imports all behave as before.

import { isBuiltin } from 'node:module';
import type { Plugin } from 'esbuild';

export function builtinsByRequire(): Plugin {
  return {
    name: 'builtins-by-require',
    setup(build) {
      build.onResolve({ filter: /^[a-z_/:]+$/ }, (a) =>
        // Only ES imports: the require() inside the stub (kind require-call) stays external.
        a.kind === 'import-statement' && isBuiltin(a.path)
          ? { path: a.path, namespace: 'builtin-by-require' }
          : undefined,
      );
      build.onLoad({ filter: /.*/, namespace: 'builtin-by-require' }, (a) => ({
        loader: 'js',
        contents: `module.exports = require(${JSON.stringify(a.path)});\n`,
      }));
    },
  };
}

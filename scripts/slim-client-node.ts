// An esbuild plugin for the agent bundle: the parts of @kubernetes/client-node a node agent never
// runs stay out of it, so they cost no memory on every node.
//
// The agent uses client-node's KubeConfig (dist/config.js) and Watch (dist/watch.js) directly.
// Still, config.js imports the whole generated client (gen/index.js: every API class and model)
// for two names used only by makeApiClient, and modules for auth and proxies the agent does not
// use. Measured by `node scripts/footprint.ts 250 5` (RSS of the bundled agent, 250 pods watched).
//
//   gen/index.js (from config.js)  -> gen/configuration.js + gen/servers.js, the two names it uses
//   openid-client                  the legacy `oidc` auth-provider
//   jsonpath-plus                  the legacy `azure` / `gcp` auth-providers
//   socks-proxy-agent              a socks5:// proxy-url
//   whatwg-url                     node-fetch's URL fallback for Node < 10 (it uses Node's URL)
//
// The left-out modules load as stubs exporting the names client-node uses, each throwing, when
// used, an error saying which kubeconfig feature is not available (token, tokenFile, client
// certificates, exec credentials and HTTP(S) proxies all work). After a client-node upgrade:
// importing more from gen/index.js in config.js fails the build ("No matching export"), and
// test/node/agent-bundle.test.ts checks that the stubs export every name client-node uses.

import path from 'node:path';
import type { Plugin } from 'esbuild';

/** Module -> what needs it, and the names client-node (or node-fetch) imports from it. */
export const LEFT_OUT: Readonly<Record<string, { readonly what: string; readonly names: readonly string[] }>> = {
  'openid-client': { what: 'the oidc auth-provider', names: ['discovery', 'refreshTokenGrant'] },
  'jsonpath-plus': { what: 'the azure and gcp auth-providers', names: ['JSONPath'] },
  'socks-proxy-agent': { what: 'a socks proxy-url', names: ['SocksProxyAgent'] },
  'whatwg-url': { what: 'the URL polyfill for Node < 10', names: ['URL'] },
};

function stub(module: string): string {
  const { what, names } = LEFT_OUT[module]!;
  const message = `mesh-cni's agent is built without ${module} (${what}); use a token, tokenFile, client certificate or exec credentials in the orchconfig`;
  // A plain function: some are called with \`new\`.
  return `function leftOut() { throw new Error(${JSON.stringify(message)}); }\n${names.map((n) => `export const ${n} = leftOut;`).join('\n')}\n`;
}

const GEN_SHIM = `
export { createConfiguration } from './configuration.js';
export { ServerConfiguration } from './servers.js';
`;

export function slimClientNode(): Plugin {
  const names = Object.keys(LEFT_OUT)
    .map((n) => n.replace(/[-/]/g, '\\$&'))
    .join('|');
  return {
    name: 'slim-client-node',
    setup(build) {
      build.onResolve({ filter: new RegExp(`^(${names})$`) }, (a) => ({ path: a.path, namespace: 'left-out' }));
      build.onLoad({ filter: /.*/, namespace: 'left-out' }, (a) => ({ loader: 'js', contents: stub(a.path) }));
      build.onResolve({ filter: /^\.\/gen\/index\.js$/ }, (a) => {
        if (!a.importer.endsWith(path.join('@kubernetes', 'client-node', 'dist', 'config.js'))) return undefined;
        return { path: path.join(path.dirname(a.importer), 'gen', 'slim-index.js'), namespace: 'gen-shim' };
      });
      build.onLoad({ filter: /.*/, namespace: 'gen-shim' }, (a) => ({
        loader: 'js',
        contents: GEN_SHIM,
        resolveDir: path.dirname(a.path),
      }));
    },
  };
}

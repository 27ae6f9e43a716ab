// An esbuild plugin for the agent bundle: packages that only some paths of the agent use are
// loaded when first used, not at every start (docs/design.md "Start-up time").
//
// Every module of an ESM bundle is evaluated before the agent's first line runs. The two YAML
// parsers are not needed on the way to ready: `yaml` reads --ambient-enablement-selector and
// writes `version -o yaml`; `js-yaml` reads a kubeconfig file (--orchconfig), which in-cluster
// config does not. Their importers get a stand-in with the same names, whose functions load the
// package (esbuild's require(): the package stays in the bundle, its evaluation waits) on the
// first call and hand it on. An import of any other name fails the build ("No matching export"):
// add it below.

import type { Plugin } from 'esbuild';

/** Package -> what needs it, the named imports and the default export's members its importers use. */
export const LAZY: Readonly<
  Record<
    string,
    { readonly what: string; readonly names: readonly string[]; readonly defaultMembers: readonly string[] }
  >
> = {
  yaml: { what: '--ambient-enablement-selector, version -o yaml', names: ['parse', 'stringify'], defaultMembers: [] },
  'js-yaml': { what: "client-node's kubeconfig file parsing", names: [], defaultMembers: ['load'] },
};

function standIn(module: string): string {
  const { names, defaultMembers } = LAZY[module]!;
  const call = (name: string) => `(...args) => load().${name}(...args)`;
  return [
    `let real;`,
    `const load = () => (real ??= require(${JSON.stringify(module)}));`,
    ...names.map((n) => `export const ${n} = ${call(n)};`),
    ...(defaultMembers.length > 0
      ? [`export default { ${defaultMembers.map((m) => `${m}: ${call(m)}`).join(', ')} };`]
      : []),
  ].join('\n');
}

export function lazyModules(): Plugin {
  const names = Object.keys(LAZY)
    .map((n) => n.replace(/[-/]/g, '\\$&'))
    .join('|');
  return {
    name: 'lazy-modules',
    setup(build) {
      // ES imports only: the stand-in's own require() resolves to the package as usual.
      build.onResolve({ filter: new RegExp(`^(${names})$`) }, (a) =>
        a.kind === 'import-statement' ? { path: a.path, namespace: 'lazy', pluginData: a.resolveDir } : undefined,
      );
      build.onLoad({ filter: /.*/, namespace: 'lazy' }, (a) => ({
        loader: 'js',
        contents: standIn(a.path),
        resolveDir: a.pluginData as string,
      }));
    },
  };
}

// What the shipped agent bundle costs at start-up, as structure (speed is the install benchmark's,
// `npm run bench -- install`, PARTS=ready): the bundle is built here with the shipped options
// (scripts/bundle-options.ts), each package of scripts/lazy-modules.ts marking when it is
// evaluated, then
//  - run to ready, where it must not have loaded undici (an ES import of node:http builds an
//    ESM facade that reads every export, and some of node:http's load all of undici, which the
//    agent never uses: scripts/builtins-by-require.ts), nor evaluated the packages only some
//    paths use (scripts/lazy-modules.ts), which must still load when used;
//  - its code cache made as the build makes it (scripts/compile-cache.ts), moved with the bundle
//    to another dir as the image does, and taken there: Node writes nothing new into it.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as esbuild from 'esbuild';
import type { Plugin } from 'esbuild';
import { bundleOptions } from '../../scripts/bundle-options.ts';
import { LAZY } from '../../scripts/lazy-modules.ts';
import { compileCacheEnv, makeCompileCache } from '../../scripts/compile-cache.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor } from '../helpers/hosttree.ts';
import { waitFor } from '../helpers/poll.ts';

const defer = cleanupAfterEach();
let buildDir = '';

/** A dir holding the agent bundle as the build makes it, with the package.json that makes it ESM. */
function bundleDir(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-bundle-'));
  writeFileSync(path.join(dir, 'package.json'), '{"type":"module"}\n');
  return dir;
}

/** The packages of LAZY, each pushing its name onto globalThis.__meshEvaluated when evaluated. */
function markEvaluation(): Plugin {
  const files = new Map<string, string>();
  return {
    name: 'mark-evaluation',
    setup(build) {
      build.onResolve({ filter: /.*/ }, async (a) => {
        if (!Object.hasOwn(LAZY, a.path) || a.pluginData === 'marked') return undefined;
        const r = await build.resolve(a.path, { kind: a.kind, resolveDir: a.resolveDir, pluginData: 'marked' });
        files.set(r.path, a.path);
        return r;
      });
      build.onLoad({ filter: /\.m?js$/ }, async (a) => {
        const name = files.get(a.path);
        if (name === undefined) return undefined;
        const text = await fs.readFile(a.path, 'utf8');
        return {
          contents: `(globalThis.__meshEvaluated ??= []).push(${JSON.stringify(name)});\n${text}`,
          loader: 'js',
        };
      });
    },
  };
}

before(async () => {
  buildDir = bundleDir();
  const options = bundleOptions('esm', { version: 'test', gitCommit: 'test', buildTime: new Date(0).toISOString() });
  const result = await esbuild.build({
    ...options,
    plugins: [...(options.plugins ?? []), markEvaluation()],
    entryPoints: [path.join(ROOT, 'src/cmd/install-cni-main.ts')],
    outfile: path.join(buildDir, 'install-cni.js'),
  });
  assert.deepEqual(result.warnings, []);
});
after(() => fs.rm(buildDir, { recursive: true, force: true }));

/** Every file of a dir tree with its size and mtime: what changed in it. */
function listing(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .map((f) => path.join(dir, f))
    .filter((f) => statSync(f).isFile())
    .map((f) => `${path.relative(dir, f)} ${statSync(f).size} ${statSync(f).mtimeMs}`)
    .sort();
}

/** The built bundle alone in a dir of its own, removed after the test. */
function copyOfBundle(): string {
  const dir = bundleDir();
  defer(() => fs.rm(dir, { recursive: true, force: true }));
  cpSync(path.join(buildDir, 'install-cni.js'), path.join(dir, 'install-cni.js'));
  return dir;
}

/**
 * Runs `version` on `bundle` with the code cache beside it, as the image does: whether Node took
 * the cache. A miss (another path, user, Node or flags) or a rejected entry is compiled and
 * written anew, so the cache dir changes.
 */
function cacheTaken(bundle: string): boolean {
  const env = compileCacheEnv(bundle);
  const before = listing(env.NODE_COMPILE_CACHE!);
  assert.notDeepEqual(before, [], 'no cache was made');
  const r = spawnSync(process.execPath, [bundle, 'version', '--short'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.stringify(listing(env.NODE_COMPILE_CACHE!)) === JSON.stringify(before);
}

describe('the agent bundle at start-up', () => {
  it('gets ready without loading undici, or the packages only some paths use', async () => {
    const tree = await makeHostTreeFor(defer);
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const out = path.join(tree.root, 'modules.json');
    // Writes the built-in modules loaded so far when asked (SIGUSR2, which the agent leaves alone).
    const hook = path.join(tree.root, 'modules-hook.cjs');
    await fs.writeFile(
      hook,
      `process.on('SIGUSR2', () => require('node:fs').writeFileSync(${JSON.stringify(out)}, JSON.stringify({ builtins: process.moduleLoadList, evaluated: globalThis.__meshEvaluated ?? [] })));\n`,
    );
    const args = Object.entries({
      ...tree.flags,
      'monitoring-port': '0',
      ctrlz_port: '0',
      log_as_json: 'true',
      log_output_level: 'default:info',
      'cleanup-on-exit': 'never',
    }).map(([k, v]) => `--${k}=${v}`);
    const child = spawn(process.execPath, ['--require', hook, path.join(buildDir, 'install-cni.js'), ...args], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...tree.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    defer(async () => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await exited;
      }
    });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const context = () => `stderr: ${stderr}\nstdout: ${stdout.slice(-2000)}`;
    const port = await waitFor(
      'the monitoring server',
      () => {
        if (child.exitCode !== null) throw new Error(`the agent exited (${child.exitCode}): ${context()}`);
        const line = stdout
          .split('\n')
          .slice(0, -1)
          .find((l) => l.includes('"msg":"monitoring server listening"'));
        return line ? (JSON.parse(line) as { port: number }).port : undefined;
      },
      { timeoutMs: 30_000, context },
    );
    await waitFor('/readyz 200', async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200, {
      timeoutMs: 30_000,
      context,
    });
    child.kill('SIGUSR2');
    const { builtins, evaluated } = await waitFor('the list of loaded modules', () =>
      existsSync(out)
        ? (JSON.parse(readFileSync(out, 'utf8')) as { builtins: string[]; evaluated: string[] })
        : undefined,
    );
    assert.ok(builtins.includes('NativeModule http'), 'the list is of this agent (node:http is loaded)');
    assert.deepEqual(
      builtins.filter((m) => m.includes('undici')),
      [],
      'undici was loaded on the way to ready: is a built-in imported as an ES module (an ESM facade)?',
    );
    assert.deepEqual(evaluated, [], 'evaluated on the way to ready, though only some paths use it');
  });

  it('loads a package only some paths use when one does (version -o yaml)', () => {
    const hook = path.join(buildDir, 'evaluated-hook.cjs');
    writeFileSync(
      hook,
      `process.on('exit', () => process.stderr.write(JSON.stringify(globalThis.__meshEvaluated ?? [])));\n`,
    );
    const r = spawnSync(
      process.execPath,
      ['--require', hook, path.join(buildDir, 'install-cni.js'), 'version', '-o', 'yaml'],
      {
        encoding: 'utf8',
      },
    );
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^version: test$/m);
    assert.ok(
      (JSON.parse(r.stderr) as string[]).includes('yaml'),
      'yaml was not marked evaluated though used: the marks do not work, and the test above proves nothing',
    );
  });

  it('its code cache, made as the build makes it, is taken where the image puts it, beside the bundle', () => {
    const made = copyOfBundle();
    makeCompileCache(path.join(made, 'install-cni.js'));
    const image = mkdtempSync(path.join(os.tmpdir(), 'mcni-image-'));
    defer(() => fs.rm(image, { recursive: true, force: true }));
    cpSync(made, image, { recursive: true });
    assert.equal(cacheTaken(path.join(image, 'install-cni.js')), true, 'the cache was not taken: Node wrote to it');
  });

  it("its code cache made by a build run as another user serves root, the agent's user", () => {
    // The build need not run as root; Node keeps a cache dir per user.
    const made = copyOfBundle();
    chmodSync(made, 0o777);
    const make = `import { makeCompileCache } from ${JSON.stringify(path.join(ROOT, 'scripts/compile-cache.ts'))};
makeCompileCache(${JSON.stringify(path.join(made, 'install-cni.js'))});`;
    const r = spawnSync('runuser', ['-u', 'nobody', '--', process.execPath, '--input-type=module', '-e', make], {
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(cacheTaken(path.join(made, 'install-cni.js')), true, 'root found no cache of its own: Node wrote one');
  });
});

// The shipped plugin: the bundles require nothing but node: built-ins (no client library, no
// node_modules at run time), and the single executables run with no Node.js on PATH, built by
// every runtime scripts/plugin-runtime.ts offers from the same bundle.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildExecutable, PLUGIN_RUNTIMES } from '../../scripts/plugin-runtime.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns, run } from '../helpers/netns.ts';
import { pluginConfig, tempDir } from '../helpers/plugin.ts';

const BUNDLES = ['dist/mesh-cni.cjs', 'dist/mesh-validation.cjs'];
const SEAS = ['dist/bin/mesh-cni', 'dist/mesh-validation'];

describe('plugin build', () => {
  const tmp = tempDir();
  before(() => {
    // Builds (or finds up to date) the bundles and the executables.
    const r = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], { encoding: 'utf8', cwd: ROOT });
    assert.equal(r.status, 0, r.stderr);
  });
  after(() => tmp.remove());

  for (const b of BUNDLES) {
    it(`${b} requires only node: built-ins`, () => {
      const src = readFileSync(path.join(ROOT, b), 'utf8');
      const required = [
        ...src.matchAll(
          /\brequire\(\s*["'`]([^"'`]+)["'`]\s*\)|\bimport\(\s*["'`]([^"'`]+)["'`]\s*\)|\bfrom\s+["'`]([^"'`]+)["'`]/g,
        ),
      ].map((m) => m[1] ?? m[2] ?? m[3]!);
      assert.ok(required.length > 0, 'found the requires');
      const notBuiltin = required.filter((m) => !m.startsWith('node:') || !builtinModules.includes(m.slice(5)));
      assert.deepEqual(notBuiltin, [], `${b} must only require node: built-ins`);
      assert.doesNotMatch(src, /@kubernetes\/client-node|node_modules/);
    });
  }

  it('the executables run VERSION with no node on PATH', () => {
    for (const exe of SEAS) assert.ok(existsSync(path.join(ROOT, exe)), exe);
    const r = spawnSync(path.join(ROOT, 'dist/bin/mesh-cni'), [], {
      env: { PATH: tmp.dir, CNI_COMMAND: 'VERSION' },
      input: '{"cniVersion":"0.4.0"}',
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), {
      cniVersion: '0.4.0',
      supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'],
    });
    const v = spawnSync(path.join(ROOT, 'dist/mesh-validation'), ['--help'], {
      env: { PATH: tmp.dir },
      encoding: 'utf8',
    });
    assert.equal(v.status, 0, v.stderr);
    assert.match(v.stdout, /Usage: mesh-validation/);
  });

  it('builds the plugin with every runtime from the same bundle; each answers VERSION with no node on PATH', () => {
    for (const runtime of PLUGIN_RUNTIMES) {
      const out = path.join(tmp.dir, `mesh-cni-${runtime}`);
      buildExecutable({ root: ROOT, main: path.join(ROOT, 'dist/mesh-cni.cjs'), out, runtime, seaMode: 'codecache' });
      const r = spawnSync(out, [], {
        env: { PATH: tmp.dir, CNI_COMMAND: 'VERSION' },
        input: '{"cniVersion":"1.1.0"}',
        encoding: 'utf8',
      });
      assert.equal(r.status, 0, `${runtime}: ${r.stderr}`);
      assert.equal(JSON.parse(r.stdout).cniVersion, '1.1.0', runtime);
    }
    const bad = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], {
      encoding: 'utf8',
      cwd: ROOT,
      env: { ...process.env, MESH_PLUGIN_RUNTIME: 'deno' },
    });
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /MESH_PLUGIN_RUNTIME=deno: expected one of node-sea, bun/);
  });

  // The CPU floor (docs/plugin.md, "The plugin executable"): Bun 1.4.5 ships one x86-64 binary, built for
  // Nehalem (SSE4.2, no AVX) with its AVX2 code picked at run time (@oven/bun-linux-x64-baseline
  // is an alias holding the same file); Node runs on any x86-64. qemu's user-mode emulator runs
  // each runtime's plugin on a CPU model without the newer features, as an old or a masked
  // virtual CPU would: it raises SIGILL on an instruction the model lacks.
  const QEMU = '/usr/bin/qemu-x86_64';
  const noQemu =
    process.arch !== 'x64'
      ? 'an x86-64 host only'
      : existsSync(QEMU)
        ? false
        : `${QEMU} is missing: apt-get install qemu-user`;
  it(
    'every runtime runs VERSION and ADD on a CPU without AVX or AVX2 (qemu -cpu Nehalem); below SSE4.2 (qemu64) only node-sea',
    { skip: noQemu },
    async () => {
      const ns = new Netns('cpu');
      try {
        const prev = {
          cniVersion: '1.1.0',
          interfaces: [{ name: 'eth0', sandbox: ns.path }],
          ips: [{ address: '198.18.9.10/24', interface: 0 }],
        };
        const add = JSON.stringify(pluginConfig({ cniVersion: '1.1.0', orchconfig: path.join(tmp.dir, 'none') }, prev));
        const addEnv = {
          PATH: tmp.dir,
          CNI_COMMAND: 'ADD',
          CNI_CONTAINERID: 'cpu1',
          CNI_NETNS: ns.path,
          CNI_IFNAME: 'eth0',
          CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns',
        };
        for (const runtime of PLUGIN_RUNTIMES) {
          const out = path.join(tmp.dir, `mesh-cni-${runtime}`);
          buildExecutable({
            root: ROOT,
            main: path.join(ROOT, 'dist/mesh-cni.cjs'),
            out,
            runtime,
            seaMode: 'codecache',
          });
          const version = spawnSync(QEMU, ['-cpu', 'Nehalem', out], {
            env: { PATH: tmp.dir, CNI_COMMAND: 'VERSION' },
            input: '{"cniVersion":"1.1.0"}',
            encoding: 'utf8',
          });
          assert.equal(version.status, 0, `${runtime} on Nehalem: ${version.signal ?? ''} ${version.stderr}`);
          assert.equal(JSON.parse(version.stdout).cniVersion, '1.1.0', runtime);
          const added = await run(QEMU, ['-cpu', 'Nehalem', out], { env: addEnv, input: add });
          assert.equal(added.code, 0, `${runtime} on Nehalem: ${added.stdout}${added.stderr}`);
          assert.deepEqual(JSON.parse(added.stdout), prev, runtime);
          // The floor is real, and the emulator enforces the model: Bun needs SSE4.2.
          const old = spawnSync(QEMU, ['-cpu', 'qemu64', out], {
            env: { PATH: tmp.dir, CNI_COMMAND: 'VERSION' },
            input: '{"cniVersion":"1.1.0"}',
            encoding: 'utf8',
          });
          if (runtime === 'bun')
            assert.equal(old.signal, 'SIGILL', `bun on qemu64 (no SSE4.2): ${old.status} ${old.stderr}`);
          else assert.equal(old.status, 0, `${runtime} on qemu64: ${old.signal ?? ''} ${old.stderr}`);
        }
      } finally {
        ns.remove();
      }
    },
  );

  it('the executable passes prevResult through for a skipped pod and errors cleanly, no node on PATH', async () => {
    const ns = new Netns('sea');
    try {
      const prev = {
        cniVersion: '1.1.0',
        interfaces: [{ name: 'eth0', sandbox: ns.path }],
        ips: [{ address: '198.18.9.9/24', interface: 0 }],
      };
      const env = {
        PATH: tmp.dir,
        CNI_COMMAND: 'ADD',
        CNI_CONTAINERID: 'sea1',
        CNI_NETNS: ns.path,
        CNI_IFNAME: 'eth0',
        CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns',
      };
      const conf = pluginConfig({ cniVersion: '1.1.0', orchconfig: path.join(tmp.dir, 'none') }, prev);
      const ok = await run(path.join(ROOT, 'dist/bin/mesh-cni'), [], { env, input: JSON.stringify(conf) });
      assert.equal(ok.code, 0, ok.stdout + ok.stderr);
      assert.deepEqual(JSON.parse(ok.stdout), prev);
      const bad = await run(path.join(ROOT, 'dist/bin/mesh-cni'), [], { env, input: 'nope' });
      assert.equal(bad.code, 1);
      assert.equal(JSON.parse(bad.stdout).code, 6);
    } finally {
      ns.remove();
    }
  });
});

// Every plugin and mesh-validation end-to-end test, run again against the shipped executables
// (dist/bin/mesh-cni, dist/mesh-validation) whichever runtime built them (the
// runtime is a build choice, MESH_PLUGIN_RUNTIME), on a PATH with no Node.js on it: the host's
// tools linked one by one into a temp dir, node and its launchers left out. Then what a
// runtime could change and the sources under Node never show: a .env or bunfig.toml in the
// working directory, a log socket that never accepts or never reads, SIGTERM mid-ADD.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { cniEnv, Netns, run } from '../helpers/netns.ts';

const EXE = path.join(ROOT, 'dist/bin/mesh-cni');
const built = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], { encoding: 'utf8', cwd: ROOT });
assert.equal(built.status, 0, built.stderr);
const runtime = /dist\/bin\/mesh-cni \(([^,)]+)/.exec(built.stdout)?.[1] ?? 'unknown';

// A PATH with every host tool but Node.js (and what needs it).
const NODE_LAUNCHERS = /^(node|nodejs|npm|npx|corepack|bun|bunx|deno)$/;
const noNodeBin = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-nonode-'));
process.on('exit', () => rmSync(noNodeBin, { recursive: true, force: true }));
for (const dir of ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']) {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    continue;
  }
  for (const name of names) {
    if (NODE_LAUNCHERS.test(name) || existsSync(path.join(noNodeBin, name))) continue;
    symlinkSync(path.join(dir, name), path.join(noNodeBin, name));
  }
}
process.env.PATH = noNodeBin;
process.env.MESH_TEST_SHIPPED = '1';
console.log(`plugin-shipped: ${EXE} (${runtime}), PATH without node: ${noNodeBin}`);

// The suites themselves, now driving the executables (test/helpers/plugin.ts reads the flag
// when first loaded: here, never by a static import of this file).
const { k8sArgs, meshPod, pluginConfig, tempDir } = await import('../helpers/plugin.ts');
await import('./plugin.test.ts');
await import('./validation.test.ts');

describe(`the shipped mesh-cni (${runtime}): what its runtime could change`, () => {
  const tmp = tempDir();
  let api: TestApiServer;
  before(async () => {
    api = await startTestApiServer();
  });
  after(async () => {
    await api?.close();
    tmp.remove();
  });

  it('runs with no node anywhere on PATH', () => {
    const r = spawnSync('sh', ['-c', 'command -v node || echo none'], { encoding: 'utf8', env: { PATH: noNodeBin } });
    assert.equal(r.stdout.trim(), 'none');
  });

  it('reads no .env or bunfig.toml from its working directory', () => {
    const dir = path.join(tmp.dir, 'cwd');
    spawnSync('mkdir', ['-p', dir]);
    const marker = path.join(tmp.dir, 'preloaded');
    writeFileSync(path.join(dir, '.env'), 'CNI_COMMAND=VERSION\nNODE_OPTIONS=--require=./pre.js\n');
    writeFileSync(path.join(dir, 'bunfig.toml'), 'preload = ["./pre.js"]\n');
    writeFileSync(path.join(dir, 'pre.js'), `require('fs').writeFileSync(${JSON.stringify(marker)}, 'ran');\n`);
    const r = spawnSync(EXE, [], {
      cwd: dir,
      encoding: 'utf8',
      env: { PATH: noNodeBin },
      input: '{"cniVersion":"1.0.0"}',
    });
    assert.equal(r.status, 1, r.stdout + r.stderr);
    assert.equal(JSON.parse(r.stdout).code, 4, 'CNI_COMMAND came from nowhere but the environment');
    assert.match(JSON.parse(r.stdout).msg, /CNI_COMMAND is not set/);
    assert.equal(existsSync(marker), false, 'no preload ran');
  });

  for (const server of ['never accepts', 'accepts and never reads'] as const) {
    it(`answers ADD when the log socket ${server}`, async () => {
      const sock = path.join(tmp.dir, `log-${server.length}.sock`);
      // python3 holds the socket: listen(1) and, for "never accepts", two connections of its own
      // filling the backlog; else one accept and no read, ever.
      const script =
        server === 'never accepts'
          ? 'import socket,sys,time\ns=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen(1)\nc=[socket.socket(socket.AF_UNIX) for _ in range(2)]\n[x.setblocking(False) for x in c]\nfor x in c:\n  try: x.connect(sys.argv[1])\n  except OSError: pass\nprint("up",flush=True);time.sleep(60)'
          : 'import socket,sys,time\ns=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen(8)\nprint("up",flush=True)\nc=s.accept()\ntime.sleep(60)';
      const holder = spawn('/usr/bin/python3', ['-c', script, sock], { stdio: ['ignore', 'pipe', 'inherit'] });
      try {
        await once(holder.stdout, 'data');
        const ns = new Netns('ship');
        try {
          const chain = {
            containerId: 'ship1',
            netns: ns.path,
            ifname: 'eth0',
            args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns;K8S_POD_UID=u1',
          };
          const prev = {
            cniVersion: '1.0.0',
            interfaces: [{ name: 'eth0', sandbox: ns.path }],
            ips: [{ address: '198.18.6.2/24', interface: 0 }],
          };
          const conf = pluginConfig(
            {
              cniVersion: '1.0.0',
              orchconfig: path.join(tmp.dir, 'none'),
              logUds: sock,
              extra: { log_level: 'debug' },
            },
            prev,
          );
          // Not a speed check: a plugin stuck on its log socket is killed and fails here.
          const r = await run(EXE, [], { env: cniEnv('ADD', chain), input: JSON.stringify(conf), timeoutMs: 10_000 });
          assert.equal(r.code, 0, r.stdout + r.stderr);
          assert.deepEqual(JSON.parse(r.stdout), prev);
        } finally {
          ns.remove();
        }
      } finally {
        holder.kill('SIGKILL');
      }
    });
  }

  // A parent that ignores SIGTERM (a shell's background job, nohup) passes that on: Node resets
  // every inherited disposition at start, Bun keeps an ignored one, and a Bun plugin then ran on.
  const sigtermCase = (parent: string) =>
    `dies of SIGTERM mid-ADD (${parent}) without answering success, and leaves no rules`;
  for (const parent of ['as is', 'ignored by its parent'] as const)
    it(sigtermCase(parent), async () => {
      const pod = api.upsertPod(meshPod('shop', 'slow'));
      const ns = new Netns('ship');
      try {
        const id = parent === 'as is' ? 'ship2' : 'ship3';
        const chain = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
        const prev = {
          cniVersion: '1.0.0',
          interfaces: [{ name: 'eth0', sandbox: ns.path }],
          ips: [{ address: '198.18.6.3/24', interface: 0 }],
        };
        const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig'));
        api.faults.delayMs = 5000;
        const argv = parent === 'as is' ? [EXE] : ['sh', '-c', 'trap "" TERM; exec "$0"', EXE];
        const child = spawn(argv[0]!, argv.slice(1), { env: cniEnv('ADD', chain), stdio: ['pipe', 'pipe', 'pipe'] });
        let stdout = '';
        child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
        child.stdin.end(
          JSON.stringify(
            pluginConfig(
              {
                cniVersion: '1.0.0',
                orchconfig,
                extra: { pod_lookup_timeout_ms: 8000, pod_lookup_attempt_timeout_ms: 8000 },
              },
              prev,
            ),
          ),
        );
        await new Promise((r) => setTimeout(r, 500));
        child.kill('SIGTERM');
        const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
        assert.ok(signal === 'SIGTERM' || (code !== null && code !== 0), `exit ${code} ${signal}`);
        assert.doesNotMatch(stdout, /"ips"/, 'no success result');
        assert.doesNotMatch(ns.exec(['iptables-nft-save', '-t', 'nat']), /MESH_/);
      } finally {
        delete api.faults.delayMs;
        ns.remove();
      }
    });
});

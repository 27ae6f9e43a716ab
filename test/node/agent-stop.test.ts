// Stopping install-cni with real signals, as the kubelet, a runtime that repeats its TERM, or a
// Ctrl-C under `npm start` (the terminal's SIGINT to the process group plus npm's forwarded one)
// send them: a second signal during the stop is absorbed, and the node ends exactly as one clean
// stop leaves it. A stdout whose reader went away (`| head -c 100`) neither crashes the agent nor
// cuts its stop short. Run against the sources and the shipped bundle (dist/install-cni.js).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import type { V1DaemonSet } from '@kubernetes/client-node';
import { spawnAgent, type AgentEntry, type AgentProcess } from '../helpers/agent.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor, type HostTree } from '../helpers/hosttree.ts';
import { ROOT } from '../helpers/cli.ts';
import { startSandbox } from '../helpers/sandbox.ts';
import { eventually } from '../helpers/poll.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { buildSettings, type RawFlags } from '../../src/config/settings.ts';
import { stopBound } from '../../src/stopbound.ts';
import { stopBoundArgs } from '../../src/partargs.ts';

const defer = cleanupAfterEach();

const ENTRIES: readonly AgentEntry[] = ['source', 'bundle'];

async function installedTree(): Promise<HostTree> {
  const t = await makeHostTreeFor(defer);
  await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  return t;
}

function agent(t: HostTree, cleanup: string, entry: AgentEntry): AgentProcess {
  const a = spawnAgent(t, { 'cleanup-on-exit': cleanup }, {}, entry);
  defer(() => a.stop('SIGKILL'));
  return a;
}

/** What a stop leaves on the node, paths made relative to the tree: dirs, file kinds, contents. */
async function nodeState(t: HostTree): Promise<Record<string, string>> {
  const state: Record<string, string> = {};
  for (const dir of [t.netDir, t.binDir, path.join(t.root, 'run')]) {
    const names = (await fs.readdir(dir).catch(() => [] as string[])).sort();
    for (const name of names) {
      const file = path.join(dir, name);
      const st = await fs.lstat(file);
      const key = path.relative(t.root, file);
      state[key] = st.isSocket()
        ? 'socket'
        : st.isFile()
          ? readFileSync(file, 'utf8').replaceAll(t.root, '<root>')
          : `kind ${st.mode.toString(8)}`;
    }
  }
  return state;
}

async function ready(a: AgentProcess): Promise<void> {
  await a.waitForLog((r) => r.msg === 'install-cni started', 'started', 20_000);
  await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready', 20_000);
}

/** One signal, then a second once the agent is stopping (the first one is being acted on). */
async function stopTwice(a: AgentProcess, first: NodeJS.Signals, second: NodeJS.Signals): Promise<number | string> {
  a.child.kill(first);
  await a.waitForLog((r) => r.msg === 'stopping', 'stopping');
  a.child.kill(second);
  return a.stop(first);
}

describe('install-cni stops cleanly, every time', () => {
  for (const entry of ENTRIES) {
    for (const cleanup of ['always', 'never']) {
      it(`${entry}, --cleanup-on-exit=${cleanup}: two SIGINTs, two SIGTERMs, leave the node as one SIGINT does, exit 0`, async () => {
        const single = await installedTree();
        const a = agent(single, cleanup, entry);
        await ready(a);
        assert.equal(await a.stop('SIGINT'), 0);
        const expected = await nodeState(single);
        // The outcome the flag asks for, so the comparisons below compare the right thing.
        const hasEntry = Object.values(expected).some((v) => v.includes('"mesh-cni"'));
        assert.equal(hasEntry, cleanup === 'never', 'our entry is in the primary only when kept');
        assert.equal('host/etc/cni/net.d/ZZZ-mesh-cni-orchconfig' in expected, cleanup === 'never');
        assert.ok('host/opt/cni/bin/mesh-cni' in expected, 'the binary stays either way');

        // The second signal once the agent says it is stopping: with the default action back in
        // place it would end the process part way (exit 130, the node half done).
        for (const [first, second] of [
          ['SIGINT', 'SIGINT'],
          ['SIGTERM', 'SIGTERM'],
        ] as const) {
          const t = await installedTree();
          const b = agent(t, cleanup, entry);
          await ready(b);
          assert.equal(await stopTwice(b, first, second), 0, `${first} then ${second}: exit code; ${b.stderr()}`);
          assert.deepEqual(await nodeState(t), expected, `${first} then ${second}: node state`);
        }
        // Both arriving while the process is held (SIGSTOP), handled in one go on SIGCONT: the
        // second is handled while the stop has only just begun, every time.
        const t = await installedTree();
        const b = agent(t, cleanup, entry);
        await ready(b);
        for (const sig of ['SIGSTOP', 'SIGTERM', 'SIGINT', 'SIGCONT'] as const) b.child.kill(sig);
        assert.equal(await b.stop('SIGTERM'), 0, `SIGTERM and SIGINT at once: exit code; ${b.stderr()}`);
        assert.deepEqual(await nodeState(t), expected, 'SIGTERM and SIGINT at once: node state');
        assert.ok(
          b.logs.some((r) => r.msg === 'already stopping; the stop runs to its end'),
          `the second signal is said and absorbed: ${JSON.stringify(b.logs.slice(-8))}`,
        );
      });
    }

    it(`${entry}: a stdout closed by its reader (| head -c 100) neither crashes the agent nor cuts its stop`, async () => {
      const t = await installedTree();
      const logFile = path.join(t.root, 'agent.log');
      const args = Object.entries({
        'monitoring-port': '0',
        ctrlz_port: '0',
        log_as_json: 'true',
        log_target: `stdout,${logFile}`,
        'cleanup-on-exit': 'always',
        ...t.flags,
      }).map(([k, v]) => `--${k}=${v}`);
      const script = path.join(ROOT, entry === 'source' ? 'bin/install-cni.js' : 'dist/install-cni.js');
      const child = spawn(process.execPath, [script, ...args], {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...t.env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      defer(async () => void child.kill('SIGKILL'));
      const exited = new Promise<number | string>((resolve) =>
        child.on('exit', (code, sig) => resolve(code ?? sig ?? 'unknown')),
      );
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      // As `head -c 100`: the first bytes read, then the pipe closed; every later line meets EPIPE.
      child.stdout.once('data', () => child.stdout.destroy());
      const logged = () => {
        try {
          return readFileSync(logFile, 'utf8');
        } catch {
          return '';
        }
      };
      await eventually(
        () => {
          if (child.exitCode !== null) throw new Error(`exited ${child.exitCode}: ${stderr}`);
          return /mesh-cni is installed and ready/.test(logged()) && /install-cni started/.test(logged());
        },
        'ready (its log file says so)',
        20_000,
      );
      assert.equal(readFileSync(`/proc/${child.pid}/comm`, 'utf8').trim(), 'install-cni', 'its name in ps and top');
      child.kill('SIGTERM');
      assert.equal(await exited, 0, stderr);
      assert.doesNotMatch(stderr, /Unhandled|uncaught|^\s+at /im, 'no crash');
      assert.match(stderr, /^install-cni: writing to stdout failed \(write EPIPE\); its log lines are dropped$/m);
      assert.match(logged(), /uninstalling mesh-cni from this node/);
      assert.deepEqual(await fs.readdir(t.netDir), ['10-bridge.conflist']);
      assert.equal(readFileSync(path.join(t.netDir, '10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
      const state = await nodeState(t);
      assert.deepEqual(
        Object.keys(state).filter((k) => state[k] === 'socket'),
        [],
        'no socket left',
      );
    });
  }

  // `npm start` runs scripts/sandbox.ts under npm and sh, all in the terminal's process group: a
  // Ctrl-C is a SIGINT to each of them. Sent here to a group of its own, twice, the second once
  // the agent says it is stopping; npm's own build step is left out (npm exec, not npm start).
  it("npm start's sandbox: Ctrl-C twice to the process group uninstalls as once does", async () => {
    const sandbox = await startSandbox(
      defer,
      'npm',
      [
        'exec',
        '--offline',
        '--',
        'node',
        'scripts/sandbox.ts',
        '--monitoring-port=0',
        '--ctrlz_port=0',
        '--log_as_json',
        '--cleanup-on-exit=always',
      ],
      { env: () => ({ PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? ''}` }) },
    );
    const { dir, group, out } = sandbox;
    await eventually(
      () => /"msg":"mesh-cni is installed and ready"/.test(out()),
      `the sandbox ready: ${sandbox.err()}`,
      30_000,
    );
    await eventually(() => /"msg":"install-cni started"/.test(out()), 'started');
    const netDir = path.join(dir, 'host/etc/cni/net.d');
    assert.deepEqual((await fs.readdir(netDir)).sort(), ['10-bridge.conflist', 'ZZZ-mesh-cni-orchconfig']);
    const agentPid = (await fs.readdir('/proc'))
      .filter((p) => /^\d+$/.test(p))
      .find((p) => {
        try {
          return (
            readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'install-cni' &&
            readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1]!.split(' ')[3] === String(group)
          );
        } catch {
          return false;
        }
      });
    assert.ok(agentPid, 'the agent shows as install-cni in its process group');
    process.kill(-group, 'SIGINT');
    await eventually(() => /"msg":"stopping"/.test(out()), 'stopping');
    try {
      process.kill(-group, 'SIGINT');
    } catch {
      // the whole group is gone already
    }
    await sandbox.closed;
    assert.doesNotMatch(out(), /"msg":"the stop did not finish/);
    assert.match(out(), /"msg":"uninstalling mesh-cni from this node"/);
    assert.deepEqual(await fs.readdir(netDir), ['10-bridge.conflist']);
    assert.doesNotMatch(readFileSync(path.join(netDir, '10-bridge.conflist'), 'utf8'), /mesh-cni/);
    assert.deepEqual(await fs.readdir(path.join(dir, 'host/opt/cni/bin')), ['mesh-cni']);
    assert.equal(
      (await fs.readdir(path.join(dir, 'run/mesh-cni'))).filter((n) => n.endsWith('.sock')).length,
      0,
      'no socket left',
    );
  });

  // A SIGKILL (or the stop's deadline) can end an uninstall after any one of its writes. The
  // plugin needs its orchconfig (with a token that expires within the hour) for as long as any
  // config the runtime reads names it: so every config goes first, the orchconfig after them, and
  // the binary stays (DELs of pods started meanwhile). Stopped anywhere, no pod start finds our
  // entry without what it needs; a new agent, or the next uninstall, finishes the job.
  for (const owned of ['false', 'true']) {
    it(`uninstall order (--mesh-owned-cni-config=${owned}): configs first, the orchconfig last, the binary kept`, async () => {
      const t = await installedTree();
      const a = spawnAgent(t, { 'cleanup-on-exit': 'always', 'mesh-owned-cni-config': owned });
      defer(() => a.stop('SIGKILL'));
      await ready(a);
      assert.equal(await a.stop('SIGTERM'), 0);
      const done = a.logs.filter((r) => (r.msg === 'removed' || r.msg === 'restored') && r.scope === 'install');
      const kinds = done.map((r) => r.kind);
      assert.ok(kinds.includes('cni_config') && kinds.at(-1) === 'orchconfig', `order: ${JSON.stringify(done)}`);
      assert.equal(kinds.filter((k) => k === 'orchconfig').length, 1);
      assert.deepEqual(await fs.readdir(t.binDir), ['mesh-cni']);
    });
  }

  it('the DaemonSet gives the stop longer than its worst case, with every part on', () => {
    const text = readFileSync(path.join(ROOT, 'deploy/daemonset.yaml'), 'utf8');
    const ds = parseAllDocuments(text)
      .map((d) => d.toJS() as V1DaemonSet)
      .find((o) => o?.kind === 'DaemonSet')!;
    const grace = ds.spec!.template.spec!.terminationGracePeriodSeconds ?? 30;
    const flags: RawFlags = {
      'ambient-enabled': 'true',
      'node-readiness-condition': 'example.com/MeshCNIReady',
      'repair-enabled': 'true',
    } as unknown as RawFlags;
    const env = { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443', NODE_NAME: 'n' };
    const bound = stopBound(stopBoundArgs(buildSettings(flags, env)));
    assert.ok(bound.ambient > 0 && bound.nodeReadiness > 0 && bound.repair > 0, 'every part counted');
    assert.ok(
      grace * 1000 > bound.totalMs,
      `grace ${grace} s is not longer than the stop's worst case ${bound.totalMs} ms`,
    );
    assert.match(text, new RegExp(`${Math.ceil(bound.totalMs / 1000)} s`), 'the comment says the bound');
  });
});

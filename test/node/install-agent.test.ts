// install-cni as a process: readiness over HTTP, real SIGTERM and SIGKILL, and the uninstall
// vs upgrade decision against the test API server.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';

const defer = cleanupAfterEach();

const tree = (): Promise<HostTree> => makeHostTreeFor(defer);

function agent(t: HostTree, flags: Record<string, string> = {}, env: Record<string, string> = {}): AgentProcess {
  const a = spawnAgent(t, flags, env);
  defer(() => a.stop('SIGKILL'));
  return a;
}

const plugins = (file: string) =>
  (JSON.parse(readFileSync(file, 'utf8')) as { plugins: { type: string }[] }).plugins.map((p) => p.type);

describe('install-cni process', () => {
  it('serves /readyz 503 with the reason until installed, then 200 and mesh_cni_install_ready 1', async () => {
    const t = await tree();
    const a = agent(t);
    await a.waitForLog(
      (r) => typeof r.msg === 'string' && r.msg.startsWith('waiting for a primary CNI config'),
      'waiting',
    );
    const notReady = await a.get('/readyz');
    assert.equal(notReady.status, 503);
    assert.match(notReady.body, /waiting for a primary CNI config/);
    assert.equal((await a.get('/healthz')).status, 200);
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    assert.equal((await a.get('/readyz')).status, 200);
    assert.match((await a.get('/metrics')).body, /^mesh_cni_install_ready 1$/m);
  });

  it('SIGTERM removes our entry and orchconfig, keeps the binary (for DELs of pods started meanwhile), leaves the primary byte for byte, exits 0', async () => {
    const t = await tree();
    const primary = path.join(t.netDir, '10-bridge.conflist');
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    const a = agent(t);
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    assert.deepEqual(plugins(primary), ['bridge', 'mesh-cni']);
    assert.equal(await a.stop('SIGTERM'), 0);
    assert.equal(readFileSync(primary, 'utf8'), BRIDGE_CONFLIST);
    assert.deepEqual(await fs.readdir(t.netDir), ['10-bridge.conflist']);
    assert.deepEqual(await fs.readdir(t.binDir), ['mesh-cni']);
  });

  // An upgrade that changes the entry: a run that leaves everything, then one with another log
  // level that uninstalls; the uninstall put the first run's entry back.
  it('never/warn, then always/debug and SIGTERM: the primary is given back with no entry of ours', async () => {
    const t = await tree();
    const primary = path.join(t.netDir, '10-bridge.conflist');
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    for (const [cleanup, level] of [
      ['never', 'warn'],
      ['always', 'debug'],
    ]) {
      const a = agent(t, { 'cleanup-on-exit': cleanup!, 'log-level': level! });
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', `ready (${cleanup})`);
      assert.equal(await a.stop('SIGTERM'), 0);
    }
    assert.equal(readFileSync(primary, 'utf8'), BRIDGE_CONFLIST);
  });

  // Files passed over are named in /readyz also while ready (by name and reason).
  it('names the files it passed over in /readyz, ready or not, never with their contents', async () => {
    const t = await tree();
    await fs.writeFile(path.join(t.netDir, '00-notes.conf'), 'token-like-secret-text\n');
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const a = agent(t);
    // Ready once every part has started (ControlZ comes after the installer).
    await eventually(async () => (await a.get('/readyz')).status === 200, 'ready');
    const r = await a.get('/readyz');
    assert.match(r.body, /^ready\n/);
    assert.match(r.body, /^note: passed over .*\/00-notes.conf, as the runtime would: not valid JSON/m);
    assert.doesNotMatch(r.body, /token-like-secret-text/);
    // And in ControlZ's installer status.
    const listening = await a.waitForLog((l) => l.msg === 'ControlZ listening', 'ControlZ up');
    const res = await fetch(`http://127.0.0.1:${String(listening.port)}/api/components`);
    const text = await res.text();
    const install = (
      JSON.parse(text) as { name: string; status: { skipped: { file: string; reason: string }[] } }[]
    ).find((c) => c.name === 'install');
    assert.deepEqual(
      install?.status.skipped.map((k) => k.file),
      ['00-notes.conf'],
    );
    assert.match(install.status.skipped[0]!.reason, /^not valid JSON/);
    assert.doesNotMatch(text, /token-like-secret-text/);
  });

  it('SIGKILL at any moment leaves only whole config files, and a restart finishes the job', async () => {
    const t = await tree();
    const primary = path.join(t.netDir, '10-bridge.conflist');
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    for (let round = 0; round < 6; round++) {
      const a = agent(t);
      await a.waitForLog(
        (r) => r.msg === 'mesh-cni is installed and ready' || (r.msg === 'wrote' && r.kind === 'cni_config'),
        'installed',
      );
      // The primary CNI keeps rewriting its file (atomically, as well-behaved CNIs do) while we
      // restore our entry; the kill lands somewhere in the middle.
      const stopAt = Date.now() + 5 + round * 7;
      while (Date.now() < stopAt) {
        await fs.writeFile(`${primary}.new`, BRIDGE_CONFLIST);
        await fs.rename(`${primary}.new`, primary);
      }
      assert.equal(await a.stop('SIGKILL'), 'SIGKILL');
      for (const name of await fs.readdir(t.netDir)) {
        if (/\.(conf|conflist|json)$/.test(name)) {
          assert.doesNotThrow(
            () => JSON.parse(readFileSync(path.join(t.netDir, name), 'utf8')),
            `${name} is whole after SIGKILL in round ${round}`,
          );
        }
      }
      const orchconfig = path.join(t.netDir, 'ZZZ-mesh-cni-orchconfig');
      assert.doesNotThrow(() => JSON.parse(readFileSync(orchconfig, 'utf8')), 'orchconfig is whole');
      assert.equal(
        readFileSync(path.join(t.binDir, 'mesh-cni'), 'utf8'),
        readFileSync(path.join(t.binariesDir, 'mesh-cni'), 'utf8'),
      );
    }
    const a = agent(t);
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready after the kills');
    assert.deepEqual(plugins(primary), ['bridge', 'mesh-cni']);
    assert.deepEqual(
      (await fs.readdir(t.netDir)).filter((n) => n.includes('.mesh-tmp-')),
      [],
      'temp files of killed runs removed',
    );
    assert.equal(await a.stop('SIGTERM'), 0);
    assert.equal(readFileSync(primary, 'utf8'), BRIDGE_CONFLIST);
  });

  describe('--cleanup-on-exit=auto', () => {
    async function withApi(): Promise<{ api: TestApiServer; t: HostTree; env: Record<string, string> }> {
      const api = await startTestApiServer();
      defer(() => api.close());
      const t = await tree();
      await t.rotate({ token: api.token, 'ca.crt': api.caPem });
      await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      api.upsertDaemonSet({ metadata: { name: 'mesh-cni-node', namespace: 'mesh-system' } });
      api.upsertPod({
        metadata: {
          name: 'mesh-cni-node-abcde',
          namespace: 'mesh-system',
          ownerReferences: [
            { apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'mesh-cni-node', uid: 'u1', controller: true },
          ],
        },
        spec: { nodeName: 'node-1', containers: [{ name: 'install-cni' }] },
      });
      api.upsertNode({ metadata: { name: 'node-1' } });
      const env = {
        KUBERNETES_SERVICE_HOST: api.host,
        KUBERNETES_SERVICE_PORT: String(api.port),
        POD_NAME: 'mesh-cni-node-abcde',
        POD_NAMESPACE: 'mesh-system',
      };
      return { api, t, env };
    }

    it('keeps entry, orchconfig and binary when our DaemonSet still exists (restart or upgrade)', async () => {
      const { t, env } = await withApi();
      const a = agent(t, { 'cleanup-on-exit': 'auto' }, env);
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
      assert.equal(await a.stop('SIGTERM'), 0);
      const said = a.logs.find((r) => r.msg === 'leaving mesh-cni installed');
      assert.match(String(said?.why), /DaemonSet mesh-system\/mesh-cni-node still exists/);
      assert.deepEqual(plugins(path.join(t.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
      assert.ok((await fs.readdir(t.netDir)).includes('ZZZ-mesh-cni-orchconfig'));
      assert.deepEqual(await fs.readdir(t.binDir), ['mesh-cni']);
    });

    it('cleans up when our DaemonSet is gone (uninstall)', async () => {
      const { api, t, env } = await withApi();
      const a = agent(t, { 'cleanup-on-exit': 'auto' }, env);
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
      api.deleteDaemonSetFromStore('mesh-system', 'mesh-cni-node');
      assert.equal(await a.stop('SIGTERM'), 0);
      assert.match(
        String(a.logs.find((r) => r.msg === 'uninstalling mesh-cni from this node')?.why),
        /is gone: uninstall/,
      );
      assert.equal(readFileSync(path.join(t.netDir, '10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
    });

    // A restart during a control-plane outage: without an answer nothing says this is an
    // uninstall, and taking the entry away would let every pod started before the next agent is
    // ready start without the plugin.
    it('keeps entry, orchconfig and binary when the API server cannot be asked (asked again until the deadline)', async () => {
      const { api, t, env } = await withApi();
      const a = agent(t, { 'cleanup-on-exit': 'auto' }, env);
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
      await api.stop();
      assert.equal(await a.stop('SIGTERM', 30_000), 0);
      const said = a.logs.find(
        (r) => r.msg === 'cannot tell whether this stop is an uninstall: keeping mesh-cni on this node',
      );
      assert.equal(said?.reason, 'unreachable');
      assert.match(String(said?.why), /cannot ask the API server .*gave up after \d+ attempts/);
      assert.ok(a.logs.some((r) => r.msg === 'leaving mesh-cni installed'));
      assert.deepEqual(plugins(path.join(t.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
      assert.ok((await fs.readdir(t.netDir)).includes('ZZZ-mesh-cni-orchconfig'));
      assert.deepEqual(await fs.readdir(t.binDir), ['mesh-cni']);
    });
  });
});

describe('install-cni process against hostile files in the net dir', () => {
  it('a FIFO named like a config turns /readyz 503 naming it, and SIGTERM still exits 0', async () => {
    const t = await tree();
    const primary = path.join(t.netDir, '10-bridge.conflist');
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    const a = agent(t);
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    const fifo = path.join(t.netDir, '00-x.conflist');
    execFileSync('mkfifo', [fifo]);
    defer(async () => {
      // Releases a reader stuck in open() (the bug this test is about), so the process can go.
      try {
        closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // No reader.
      }
    });
    await eventually(
      async () => {
        const r = await a.get('/readyz');
        return r.status === 503 && r.body.includes('00-x.conflist is a FIFO');
      },
      '/readyz 503 naming the FIFO',
      5000,
    );
    // The primary CNI rewrites its file meanwhile: passes still run, so the entry comes back.
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    assert.equal(await a.stop('SIGTERM', 8000), 0);
  });

  it('a plugin token file that is a FIFO is refused by name, and SIGTERM still exits 0', async () => {
    const t = await tree();
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const tokenFile = t.flags['plugin-token-file']!;
    await fs.rm(tokenFile);
    execFileSync('mkfifo', [tokenFile]);
    defer(async () => {
      try {
        closeSync(openSync(tokenFile, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // No reader.
      }
    });
    const a = agent(t);
    await eventually(
      async () => {
        const r = await a.get('/readyz').catch(() => ({ status: 0, body: '' }));
        return r.status === 503 && r.body.includes('plugin-token is a FIFO, not a regular file');
      },
      '/readyz 503 naming the FIFO token file',
      8000,
    );
    assert.equal(await a.stop('SIGTERM', 8000), 0);
  });
});

// mesh-validation in real netns: after bridge + mesh-cni it exits 0; in a pod netns the plugin
// never touched it exits 126 with a termination message, also when a real TCP listener answers
// at the probe address (the connection succeeds, but not through the redirect).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BridgeNetwork, Netns, run, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, meshCni, meshPod, MESH_VALIDATION_ARGV, pluginConfig, tempDir } from '../helpers/plugin.ts';

function validate(ns: Netns, args: string[]) {
  return run('ip', ['netns', 'exec', ns.name, ...MESH_VALIDATION_ARGV, ...args], { timeoutMs: 20_000 });
}

describe('mesh-validation', () => {
  let api: TestApiServer;
  let network: BridgeNetwork;
  const tmp = tempDir();
  const namespaces: Netns[] = [];
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    network = new BridgeNetwork('198.18.2.0/24');
  });
  after(async () => {
    for (const ns of namespaces) ns.remove();
    network?.cleanup();
    await api?.close();
    tmp.remove();
  });

  async function sandbox(): Promise<{ ns: Netns; chain: ChainEnv; prev: Record<string, unknown> }> {
    const ns = new Netns('val');
    namespaces.push(ns);
    const pod = api.upsertPod(meshPod('shop', `v${++n}`));
    const id = `val${process.pid}x${n}`;
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
    return { ns, chain, prev: await network.addPod(chain) };
  }

  it('exits 0 in a pod netns mesh-cni set up', async () => {
    const { ns, chain, prev } = await sandbox();
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig'));
    const add = await meshCni('ADD', chain, pluginConfig({ cniVersion: '1.0.0', orchconfig }, prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    const r = await validate(ns, ['--probe-timeout', '3s']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /redirect works: a connection to 192\.0\.2\.6:15002 arrived at the local listener/);
  });

  it("waits for the probe port while another check holds it (the agent's in-place proof in the same netns)", async () => {
    // The repair controller proves an in-place repair by running this check in the pod's netns;
    // kubelet may restart the pod's own mesh-validation meanwhile. A listen that fails with
    // EADDRINUSE then exited 126: a new failed run, read as "the repair did not hold" (label or
    // delete of a pod just repaired). The port is free again in well under the probe timeout.
    const { ns, chain, prev } = await sandbox();
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'orchconfig-busy'));
    const add = await meshCni('ADD', chain, pluginConfig({ cniVersion: '1.0.0', orchconfig }, prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    const holder = spawn(
      'ip',
      [
        'netns',
        'exec',
        ns.name,
        process.execPath,
        '-e',
        "const s=require('net').createServer().listen(15002,'127.0.0.1',()=>{console.log('up');setTimeout(()=>s.close(),700)})",
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    after(() => holder.kill());
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('holder did not start')), 10_000);
      holder.stdout.once('data', () => {
        clearTimeout(t);
        resolve();
      });
    });
    const r = await validate(ns, ['--probe-timeout', '3s']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /redirect works/);
  });

  it('exits 126 with a termination message when the plugin never ran, even with a real listener at the probe address', async () => {
    const { ns } = await sandbox();
    // A real server where the probe connects: without the redirect the connection reaches it.
    ns.exec(['ip', 'addr', 'add', '192.0.2.6/32', 'dev', 'lo']);
    const listener = spawn(
      'ip',
      [
        'netns',
        'exec',
        ns.name,
        process.execPath,
        '-e',
        "require('net').createServer((c)=>c.end('hi')).listen(15002,'192.0.2.6',()=>console.log('up'))",
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    after(() => listener.kill());
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('listener did not start')), 10_000);
      listener.stdout.once('data', () => {
        clearTimeout(t);
        resolve();
      });
    });
    const term = path.join(tmp.dir, 'termination-log');
    writeFileSync(term, '');
    const r = await validate(ns, ['--probe-timeout', '1s', '--termination-log', term]);
    assert.equal(r.code, 126, r.stdout + r.stderr);
    assert.match(r.stderr, /connected to 192\.0\.2\.6:15002 but the connection never reached the local listener/);
    assert.match(readFileSync(term, 'utf8'), /^mesh-validation: redirect check failed: .*the pod must be recreated\.$/);
  });

  it('exits 126 when the probe is refused by the network or goes nowhere, and 2 on a bad flag', async () => {
    const { ns } = await sandbox();
    // The (fake) node has no route to the probe address: ICMP unreachable.
    const unreachable = await validate(ns, [
      '--probe-timeout',
      '2s',
      '--termination-log',
      path.join(tmp.dir, 'absent', 'log'),
    ]);
    assert.equal(unreachable.code, 126, unreachable.stdout + unreachable.stderr);
    assert.match(unreachable.stderr, /connecting to 192\.0\.2\.6:15002 failed: E(NET|HOST)UNREACH/);
    // Now the node forwards it to a neighbour that never answers: the SYN vanishes.
    network.host.exec(['ip', 'route', 'replace', '192.0.2.0/24', 'via', '198.18.2.250']);
    const r = await validate(ns, ['--probe-timeout', '500ms']);
    assert.equal(r.code, 126, r.stdout + r.stderr);
    assert.match(r.stderr, /no connection to 192\.0\.2\.6:15002 within 500 ms/);
    const bad = await validate(ns, ['--probe-timeout', 'soon']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /expected a duration/);
    // Longer than a Node timer holds (about 24.8 days): it would fire at once and say "not
    // redirected" (126) of a pod that is. Hours are a unit now, so 600h is easy to write.
    const long = await validate(ns, ['--probe-timeout', '600h']);
    assert.equal(long.code, 2, long.stdout + long.stderr);
    assert.match(long.stderr, /--probe-timeout "600h": must be at most/);
  });
});

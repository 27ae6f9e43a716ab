// The observability parts inside the real install-cni process: metrics, readiness, the plugin
// log socket and ControlZ, over real sockets. The installer may or may not be ready here (the
// tree has no primary CNI config): this test only needs the agent to run.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { UdsLog } from '../../cni-plugin/log/udslog.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { promtoolProblems, request } from '../helpers/observability.ts';

describe('observability in the running agent', () => {
  let tree: HostTree;
  let agent: AgentProcess;
  let sock: string;
  let ctrlz: string;
  before(async () => {
    tree = await makeHostTree();
    sock = path.join(tree.root, 'run/mesh-cni/log.sock');
    agent = spawnAgent(tree, { 'log-uds-address': sock, log_output_level: 'default:info,cni:info,monitoring:info' });
    const rec = await agent.waitForLog((r) => r.msg === 'ControlZ listening', 'ControlZ', 30_000);
    ctrlz = `http://localhost:${rec.port as number}`;
  });
  after(async () => {
    await agent?.stop('SIGTERM');
    await tree?.remove();
  });

  const pluginSays = async (level: 'debug' | 'info', msg: string) => {
    const client = new UdsLog(
      sock,
      'debug',
      { command: 'ADD', containerID: 'cid-1', pod: { namespace: 'default', name: 'web-0' } },
      'none',
    );
    client.log(level, msg);
    await client.flush(2000);
  };

  it('answers /healthz, and /readyz with 200 or 503 and reasons', async () => {
    assert.equal((await agent.get('/healthz')).status, 200);
    const ready = await agent.get('/readyz');
    assert.ok(
      ready.status === 200 || (ready.status === 503 && /^not ready:\n- /.test(ready.body)),
      `${ready.status} ${ready.body}`,
    );
  });

  it("serves every part's metrics, clean for promtool", async () => {
    const m = await agent.get('/metrics');
    assert.equal(m.status, 200);
    for (const name of [
      'mesh_cni_build_info',
      'mesh_cni_plugin_log_lines_received_total',
      'mesh_cni_plugin_log_connections_total',
      'process_resident_memory_bytes',
    ]) {
      assert.match(m.body, new RegExp(`^${name}[{ ]`, 'm'), name);
    }
    assert.equal(await promtoolProblems(m.body), '');
  });

  it('prints plugin records in scope cni and follows a level change made through ControlZ', async () => {
    await pluginSays('debug', 'before the change');
    await pluginSays('info', 'marker one');
    await agent.waitForLog((r) => r.msg === 'marker one', 'the info record');
    assert.equal(
      agent.logs.some((r) => r.msg === 'before the change'),
      false,
    );
    const line = agent.logs.find((r) => r.msg === 'marker one')!;
    assert.equal(line.scope, 'cni');
    assert.equal(line.pod, 'default/web-0');
    assert.equal(line.containerID, 'cid-1');

    const put = await request(`${ctrlz}/api/scopes/cni`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: '{"output_level":"debug"}',
    });
    assert.equal(put.status, 200, put.body);
    await pluginSays('debug', 'after the change');
    const rec = await agent.waitForLog((r) => r.msg === 'after the change', 'the debug record');
    assert.equal(rec.level, 'debug');
  });

  it('shows the installer in ControlZ', async () => {
    const r = await request(`${ctrlz}/api/components`);
    const names = (JSON.parse(r.body) as { name: string }[]).map((c) => c.name);
    assert.ok(names.includes('plugin-log-server') && names.includes('ctrlz'), names.join(','));
    assert.ok(names.length >= 4, names.join(','));
  });

  it('removes the plugin log socket when it stops', async () => {
    assert.ok(existsSync(sock));
    assert.equal(await agent.stop('SIGTERM'), 0, agent.stderr());
    assert.equal(existsSync(sock), false);
  });
});

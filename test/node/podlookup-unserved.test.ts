// When the agent cannot serve pod lookups, its log says what the plugin then does, and the
// plugin's own client does just that: a path the plugin refuses (another user could answer there)
// fails each ADD that asks it with CNI error 11; a path with nothing the plugin refuses is a miss,
// and the plugin reads the pod from the API server.

import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { podFromAgent } from '../../cni-plugin/orch/agentlookup.ts';
import { CniError, CNI_ERROR } from '../../cni-plugin/cni/errors.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { captureSink } from '../helpers/observability.ts';
import { tempDir } from '../helpers/plugin.ts';
import { podLookupArgs } from '../../src/partargs.ts';

const sink = captureSink();
configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:info' }, {}).logging.outputLevels },
  sink,
);

describe('the pod lookup socket the agent cannot serve', () => {
  const tmp = tempDir();
  let api: TestApiServer;
  let n = 0;
  before(async () => {
    api = await startTestApiServer();
    chmodSync(tmp.dir, 0o755);
  });
  after(async () => {
    await api?.close();
    tmp.remove();
  });

  /** Starts the lookup on `sock`; the message of the error it logged. */
  async function unserved(sock: string): Promise<string> {
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, `orchconfig-${++n}`));
    const before = sink.lines.length;
    const c = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': sock, orchconfig }, { NODE_NAME: 'node-1' })),
    );
    await c.stop('SIGTERM');
    assert.equal((c.status() as { enabled?: boolean }).enabled, false, 'the lookup is off');
    const logged = sink.lines
      .slice(before)
      .map((l) => JSON.parse(l) as { level: number; msg: string })
      .filter((r) => r.msg.startsWith('cannot serve pod lookups'));
    assert.equal(logged.length, 1, sink.lines.slice(before).join(''));
    return logged[0]!.msg;
  }

  const ask = (sock: string) => podFromAgent(sock, { namespace: 'shop', name: 'cart-1', uid: 'u-1' }, 500);

  const refused: [string, () => string][] = [
    [
      'in a dir another user can write',
      () => {
        const d = path.join(tmp.dir, `open-${++n}`);
        mkdirSync(d);
        chmodSync(d, 0o777);
        return path.join(d, 'pods.sock');
      },
    ],
    [
      'where a regular file is',
      () => {
        const d = path.join(tmp.dir, `file-${++n}`);
        mkdirSync(d);
        writeFileSync(path.join(d, 'pods.sock'), '');
        return path.join(d, 'pods.sock');
      },
    ],
  ];
  for (const [where, make] of refused) {
    it(`${where}: the log says ADDs fail with code 11, as the plugin's client does`, async () => {
      const sock = make();
      const msg = await unserved(sock);
      assert.match(msg, /the plugin refuses that path too/);
      assert.match(msg, /CNI error 11/);
      assert.doesNotMatch(msg, /from the API server/);
      await assert.rejects(ask(sock), (e: unknown) => e instanceof CniError && e.code === CNI_ERROR.TRY_AGAIN_LATER);
    });
  }

  it('a path too long to bind: the log says the plugin reads pods from the API server, as its client does', async () => {
    const d = path.join(tmp.dir, `long-${++n}`);
    mkdirSync(d);
    const sock = path.join(d, `${'p'.repeat(120)}.sock`);
    const msg = await unserved(sock);
    assert.match(msg, /the plugin reads pods from the API server/);
    assert.doesNotMatch(msg, /CNI error 11/);
    const answer = await ask(sock);
    assert.ok('miss' in answer, JSON.stringify(answer));
  });
});

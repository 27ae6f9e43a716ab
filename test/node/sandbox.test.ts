// `npm start` (scripts/sandbox.ts) as a developer runs it: with no flags of ours, it builds its
// throw-away tree, becomes ready (/readyz 200), and a Ctrl-C takes mesh-cni out of the tree's CNI
// configs again (the binary stays, as on a node). As root and as an unprivileged user: the sandbox
// needs no root. Run in a temp dir (MESH_SANDBOX_DIR), metrics and ControlZ on free ports.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ROOT } from '../helpers/cli.ts';
import { waitFor } from '../helpers/poll.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { startSandbox } from '../helpers/sandbox.ts';

const defer = cleanupAfterEach();

const NOBODY = 65534;

/** Why uid `uid` cannot run the sandbox from this checkout (a repo under /root, say), or null. */
function unreadableBy(uid: number): string | null {
  const r = spawnSync(
    process.execPath,
    ['-e', 'require("fs").accessSync(process.argv[1], require("fs").constants.R_OK)', 'dist/bin/mesh-cni'],
    { cwd: ROOT, uid, gid: uid, encoding: 'utf8' },
  );
  return r.status === 0 ? null : `uid ${uid} cannot read ${ROOT}/dist/bin/mesh-cni: ${r.stderr || r.error}`;
}

async function runSandbox(uid: number | undefined): Promise<void> {
  const { dir, group, out, exited, context } = await startSandbox(
    defer,
    process.execPath,
    ['scripts/sandbox.ts', '--monitoring-port=0', '--ctrlz_port=0', '--log_as_json'],
    { uid, env: (home) => ({ HOME: home }) },
  );

  const port = await waitFor(
    'the monitoring port',
    () => /"port":(\d+),[^\n]*"msg":"monitoring server listening"/.exec(out())?.[1],
    {
      timeoutMs: 30_000,
      context,
    },
  );
  const last = await waitFor(
    '/readyz 200',
    async () => {
      const r = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => null);
      return r?.status === 200 ? await r.text() : false;
    },
    { timeoutMs: 30_000, everyMs: 100, context },
  );
  assert.match(last, /ready/);
  const netDir = path.join(dir, 'host/etc/cni/net.d');
  assert.deepEqual((await fs.readdir(netDir)).sort(), ['10-bridge.conflist', 'ZZZ-mesh-cni-orchconfig']);
  assert.match(readFileSync(path.join(netDir, '10-bridge.conflist'), 'utf8'), /"type": ?"mesh-cni"/);

  process.kill(-group, 'SIGINT'); // the terminal's Ctrl-C
  assert.equal(await exited, 0, context());
  assert.match(out(), /"msg":"uninstalling mesh-cni from this node"/, context());
  assert.deepEqual(await fs.readdir(netDir), ['10-bridge.conflist']);
  assert.doesNotMatch(readFileSync(path.join(netDir, '10-bridge.conflist'), 'utf8'), /mesh-cni/);
  assert.deepEqual(await fs.readdir(path.join(dir, 'host/opt/cni/bin')), ['mesh-cni']);
  assert.deepEqual(
    (await fs.readdir(path.join(dir, 'run/mesh-cni'))).filter((n) => n.endsWith('.sock')),
    [],
    'no socket left',
  );
}

describe("npm start's sandbox", () => {
  it('becomes ready, and Ctrl-C takes mesh-cni out of the sandbox again', async () => {
    await runSandbox(undefined);
  });

  it('does so as an unprivileged user too', async (t) => {
    if (process.getuid?.() !== 0) return t.skip('needs root to run as another user');
    const why = unreadableBy(NOBODY);
    if (why) return t.skip(why);
    await runSandbox(NOBODY);
  });
});

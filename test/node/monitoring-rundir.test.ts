// The run dir holding the agent's sockets: docs/security.md says 0600 sockets in a 0750 dir, but
// the DaemonSet's hostPath (DirectoryOrCreate) makes /var/run/mesh-cni 0755 before the agent
// starts. listenUnix tightens a root-owned real dir it finds, and leaves a link (a shared dir it
// refuses: test/node/socket-trust.test.ts).

import assert from 'node:assert/strict';
import { lstatSync, mkdirSync, statSync, symlinkSync } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { listenUnix } from '../../src/monitoring/unixsocket.ts';
import { tempDir } from '../helpers/plugin.ts';

describe("the run dir of the agent's sockets", () => {
  const tmp = tempDir();
  after(() => tmp.remove());

  async function serveIn(dir: string): Promise<void> {
    const close = await listenUnix(
      net.createServer((s) => s.destroy()),
      path.join(dir, 'test.sock'),
      'test',
      '--test-socket',
      { maxConnections: 4 },
    );
    await close();
  }

  it('is made 0750 when it exists 0755 (as the hostPath DirectoryOrCreate leaves it)', async () => {
    const dir = path.join(tmp.dir, 'run-existing');
    mkdirSync(dir);
    await fs.chmod(dir, 0o755);
    await serveIn(dir);
    assert.equal(statSync(dir).mode & 0o7777, 0o750);
  });

  it('is made 0750 when the agent makes it', async () => {
    const dir = path.join(tmp.dir, 'run-new');
    await serveIn(dir);
    assert.equal(statSync(dir).mode & 0o7777, 0o750);
  });

  it("a link to a dir is not followed to change that dir's mode", async () => {
    const real = path.join(tmp.dir, 'elsewhere');
    mkdirSync(real);
    await fs.chmod(real, 0o755);
    const link = path.join(tmp.dir, 'run-link');
    symlinkSync(real, link);
    await serveIn(link);
    assert.equal(statSync(real).mode & 0o7777, 0o755);
    assert.ok(lstatSync(link).isSymbolicLink());
  });

  it('a shared dir (sticky, writable by all: /tmp) is refused, and left as it is', async () => {
    const dir = path.join(tmp.dir, 'shared');
    mkdirSync(dir);
    await fs.chmod(dir, 0o1777);
    await assert.rejects(serveIn(dir), /is a shared directory \(sticky/);
    assert.equal(statSync(dir).mode & 0o7777, 0o1777);
  });
});

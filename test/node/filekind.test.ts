// src/filekind.ts against real files: the one name each kind of file has in the agent's refusals,
// whether the installer's safe reads or the pod-netns module say it, from a number or a bigint mode.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { constants } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { fileKind } from '../../src/filekind.ts';

const defer = cleanupAfterEach();

describe('fileKind', () => {
  it('names each kind of file lstat finds, from a number mode and a bigint mode alike', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-filekind-'));
    defer(() => fs.rm(dir, { recursive: true, force: true }));
    await fs.writeFile(path.join(dir, 'file'), '');
    execFileSync('mkfifo', [path.join(dir, 'fifo')]);
    await fs.symlink('file', path.join(dir, 'link'));
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(path.join(dir, 'sock'), resolve));
    defer(() => new Promise((resolve) => server.close(resolve)));
    const cases: [string, string][] = [
      [path.join(dir, 'file'), 'a regular file'],
      [dir, 'a directory'],
      [path.join(dir, 'fifo'), 'a FIFO'],
      ['/dev/null', 'a character device'],
      [path.join(dir, 'sock'), 'a socket'],
      [path.join(dir, 'link'), 'a symbolic link'],
    ];
    for (const [file, kind] of cases) {
      assert.equal(fileKind((await fs.lstat(file)).mode), kind, file);
      assert.equal(fileKind((await fs.lstat(file, { bigint: true })).mode), kind, `${file} (bigint)`);
    }
  });

  it('names a block device, and a mode of no kind it knows without guessing', () => {
    assert.equal(fileKind(constants.S_IFBLK | 0o660), 'a block device');
    assert.equal(fileKind(0o644), 'a file of an unknown kind');
  });
});

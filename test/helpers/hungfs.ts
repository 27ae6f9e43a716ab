// A file system the kernel hangs on: a FUSE mount whose /dev/fuse fd this process holds and never
// reads, so every call on a path under it (stat, open) waits in the kernel for a daemon that
// never answers, as on a node whose FUSE daemon or NFS server is stuck. release() closes the
// fd: the kernel aborts the connection, every waiting call returns ENOTCONN, and the mount goes.
// Root, /dev/fuse.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, rmdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export class HungMount {
  readonly dir: string;
  #fuse: number;

  constructor() {
    this.dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-hungfs-'));
    this.#fuse = openSync('/dev/fuse', constants.O_RDWR);
    // -i: the kernel's fuse type itself, no mount.fuse helper; fd=3 is the child's copy of ours.
    const r = spawnSync(
      'mount',
      ['-i', '-t', 'fuse', '-o', 'fd=3,rootmode=40000,user_id=0,group_id=0', 'mcni-hung', this.dir],
      { stdio: ['ignore', 'pipe', 'pipe', this.#fuse], encoding: 'utf8' },
    );
    if (r.status !== 0) {
      this.release();
      assert.fail(`cannot mount a FUSE file system on ${this.dir}: ${r.stderr}`);
    }
  }

  /** A path under the mount: any call on it hangs until release(). */
  path(name: string): string {
    return path.join(this.dir, name);
  }

  /** Idempotent: lets every hung call go (ENOTCONN), unmounts, removes the dir. */
  release(): void {
    if (this.#fuse < 0) return;
    closeSync(this.#fuse);
    this.#fuse = -1;
    spawnSync('umount', ['-l', this.dir]);
    try {
      rmdirSync(this.dir);
    } catch {
      /* still busy: umount -l detaches it; the empty dir is left in the temp dir */
    }
  }
}

// File-system faults under the installer: a read-only and a full net dir (real tmpfs mounts).

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, constants, openSync, readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { writeFileAtomic } from '../../src/install/atomicfile.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const mount = (...args: string[]) => execFileSync('mount', args, { stdio: 'pipe' });

async function withTmpfsNetDir(
  size: string,
  body: (ctx: { installer: Installer; netDir: string }) => Promise<void>,
): Promise<void> {
  const tree = await makeHostTree();
  mount('-t', 'tmpfs', '-o', `size=${size},mode=0755`, 'mcni-test', tree.netDir);
  const installer = new Installer(
    installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
    {
      decideCleanup: async () => ({ cleanup: false, why: 'test' }),
    },
  );
  try {
    await body({ installer, netDir: tree.netDir });
  } finally {
    await installer.stop('SIGTERM').catch(() => {});
    try {
      execFileSync('umount', [tree.netDir], { stdio: 'pipe' });
    } catch {
      execFileSync('umount', ['-l', tree.netDir], { stdio: 'pipe' });
    }
    await tree.remove();
  }
}

const tempFiles = async (dir: string) => (await fs.readdir(dir)).filter((n) => n.includes('.mesh-tmp-'));

describe('installer on a faulty file system', () => {
  it('read-only net dir: clear error, not ready, primary untouched; recovers when writable', async () => {
    await withTmpfsNetDir('1m', async ({ installer, netDir }) => {
      const file = path.join(netDir, '10-bridge.conflist');
      await fs.writeFile(file, BRIDGE_CONFLIST);
      mount('-o', 'remount,ro', netDir);
      await installer.start();
      await installer.settled();
      const reasons = installer.notReadyReasons().join('\n');
      assert.match(reasons, /cannot write orchconfig .*ZZZ-mesh-cni-orchconfig: EROFS/);
      // No orchconfig could be written, so no entry is put in that the plugin could not use.
      assert.match(reasons, /not adding our entry to the CNI config until .*ZZZ-mesh-cni-orchconfig is in place/);
      assert.equal(readFileSync(file, 'utf8'), BRIDGE_CONFLIST);
      mount('-o', 'remount,rw', netDir);
      // No change event comes from a remount: the retry backoff must bring it back.
      await eventually(() => installer.notReadyReasons().length === 0, 'ready after remount rw', 10_000);
      assert.match(readFileSync(file, 'utf8'), /"mesh-cni"/);
    });
  });

  it('read-only bin dir: the error is said once, however many passes retry it', async () => {
    const tree = await makeHostTree();
    const lines: string[] = [];
    configureLogging(
      { asJson: true, outputLevels: buildSettings({ log_output_level: 'install:error' }, {}).logging.outputLevels },
      { write: (l) => void lines.push(l) },
    );
    mount('-t', 'tmpfs', '-o', 'size=1m,ro', 'mcni-test', tree.binDir);
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      },
    );
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await installer.start();
      for (let i = 0; i < 4; i++) {
        installer.schedule('periodic');
        await installer.settled();
      }
      assert.match(installer.notReadyReasons().join('\n'), /cannot install mesh-cni into .*EROFS/);
      assert.equal(lines.filter((l) => l.includes('cannot install mesh-cni')).length, 1, lines.join(''));
    } finally {
      await installer.stop('SIGTERM');
      configureLogging(
        { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
        { write: () => {} },
      );
      execFileSync('umount', [tree.binDir], { stdio: 'pipe' });
      await tree.remove();
    }
  });

  it('full net dir: clear error, original intact, no temp file left; recovers when space frees up', async () => {
    await withTmpfsNetDir('64k', async ({ installer, netDir }) => {
      const file = path.join(netDir, '10-bridge.conflist');
      await fs.writeFile(file, BRIDGE_CONFLIST);
      const filler = path.join(netDir, 'filler');
      try {
        await fs.writeFile(filler, Buffer.alloc(1024 * 1024));
      } catch {
        // ENOSPC: exactly what we want, the dir is full now.
      }
      await installer.start();
      await installer.settled();
      assert.match(installer.notReadyReasons().join('\n'), /ENOSPC/);
      assert.equal(readFileSync(file, 'utf8'), BRIDGE_CONFLIST);
      assert.deepEqual(await tempFiles(netDir), []);
      await fs.rm(filler);
      await eventually(() => installer.notReadyReasons().length === 0, 'ready after space freed', 10_000);
      assert.match(readFileSync(file, 'utf8'), /"mesh-cni"/);
      assert.deepEqual(await tempFiles(netDir), []);
    });
  });
});

describe('atomic writes', () => {
  it('leave the target as it was, and no temp file, when the text went stale meanwhile', async () => {
    const tree = await makeHostTree();
    try {
      const file = path.join(tree.netDir, '10-x.conflist');
      await fs.writeFile(file, 'theirs, newer');
      const replaced = await writeFileAtomic(file, 'ours, from the older text', {
        mode: 0o644,
        beforeRename: async () => false,
      });
      assert.equal(replaced, false);
      assert.equal(readFileSync(file, 'utf8'), 'theirs, newer');
      assert.deepEqual(await tempFiles(tree.netDir), []);
      assert.equal(await writeFileAtomic(file, 'ours', { mode: 0o600, beforeRename: async () => true }), true);
      assert.equal(readFileSync(file, 'utf8'), 'ours');
    } finally {
      await tree.remove();
    }
  });
});

/** Resolves with what `p` gives, or rejects after `ms` saying what did not finish. */
async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>(
    (_r, reject) => (timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms)),
  );
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A reader blocked in open() of a FIFO returns once a writer opens and closes it. */
function unblockFifo(file: string): void {
  try {
    // Non-blocking: ENXIO when no reader waits, which is the case once the fix is in.
    closeSync(openSync(file, constants.O_WRONLY | constants.O_NONBLOCK));
  } catch {
    // No reader was waiting, or the file is gone.
  }
}

describe('installer reads only regular files of bounded size', () => {
  const everything = (installer: Installer) =>
    `${installer.notReadyReasons().join('\n')}\n${JSON.stringify(installer.status())}`;

  type Tree = Awaited<ReturnType<typeof makeHostTree>>;
  async function withInstaller(
    flags: (tree: Tree) => Record<string, string>,
    prepare: (tree: Tree) => Promise<string[]>,
    body: (installer: Installer, tree: Tree) => Promise<void>,
  ): Promise<void> {
    const tree = await makeHostTree();
    const fifos: string[] = [];
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags, ...flags(tree) }, tree.env)),
      { decideCleanup: async () => ({ cleanup: true, why: 'test' }) },
    );
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      fifos.push(...(await prepare(tree)));
      await within(installer.start(), 5000, 'the first reconcile pass');
      await body(installer, tree);
      await within(installer.stop('SIGTERM'), 5000, 'stop');
    } finally {
      for (const f of fifos) unblockFifo(f);
      await installer.stop('SIGTERM').catch(() => {});
      await tree.remove();
    }
  }

  it('a FIFO named like a config is refused, by name and kind, and the pass finishes', async () => {
    await withInstaller(
      () => ({}),
      async (tree) => {
        const fifo = path.join(tree.netDir, '00-x.conflist');
        execFileSync('mkfifo', [fifo]);
        return [fifo];
      },
      async (installer, tree) => {
        assert.match(everything(installer), /00-x\.conflist is a FIFO, not a regular file/);
        // Gone again: the next pass installs as usual.
        await fs.rm(path.join(tree.netDir, '00-x.conflist'));
        await eventually(() => installer.notReadyReasons().length === 0, 'ready once the FIFO is gone');
        assert.match(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8'), /"mesh-cni"/);
      },
    );
  });

  it('a link to /dev/zero named like a config is refused without reading it', async () => {
    await withInstaller(
      () => ({}),
      async (tree) => {
        await fs.symlink('/dev/zero', path.join(tree.netDir, '00-zero.conflist'));
        return [];
      },
      async (installer) => {
        assert.match(everything(installer), /00-zero\.conflist is a character device, not a regular file/);
      },
    );
  });

  it('a config over 1 MiB is refused with its size, not read', async () => {
    await withInstaller(
      () => ({}),
      async (tree) => {
        const big = path.join(tree.netDir, '00-big.conflist');
        await fs.writeFile(
          big,
          `{"cniVersion":"1.0.0","name":"big","plugins":[{"type":"bridge","pad":"${'x'.repeat(50 * 1024 * 1024)}"}]}`,
        );
        return [];
      },
      async (installer) => {
        assert.match(everything(installer), /00-big\.conflist is 50\.0 MiB, over the 1 MiB limit/);
        assert.doesNotMatch(everything(installer), /xxxx/);
      },
    );
  });

  it('a token that is a FIFO: not ready with the reason, nothing written', async () => {
    await withInstaller(
      () => ({}),
      async (tree) => {
        const token = path.join(tree.saDir, '..data', 'token');
        await fs.rm(token);
        execFileSync('mkfifo', [token]);
        return [token];
      },
      async (installer, tree) => {
        assert.match(installer.notReadyReasons().join('\n'), /token is a FIFO, not a regular file/);
        assert.equal(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
      },
    );
  });

  it('a CA that is a link to /dev/zero is refused', async () => {
    await withInstaller(
      () => ({}),
      async (tree) => {
        const ca = path.join(tree.saDir, '..data', 'ca.crt');
        await fs.rm(ca);
        await fs.symlink('/dev/zero', ca);
        return [];
      },
      async (installer) => {
        assert.match(installer.notReadyReasons().join('\n'), /ca\.crt is a character device, not a regular file/);
      },
    );
  });

  it('a template file that is a FIFO is refused', async () => {
    await withInstaller(
      (tree) => ({ 'cni-network-config-file': path.join(tree.root, 'template.json') }),
      async (tree) => {
        const template = path.join(tree.root, 'template.json');
        execFileSync('mkfifo', [template]);
        return [template];
      },
      async (installer) => {
        assert.match(installer.notReadyReasons().join('\n'), /template\.json is a FIFO, not a regular file/);
      },
    );
  });
});

describe('binaries are read only when needed', () => {
  // The installer reads an installed binary only to compare it with its source (binaries.ts,
  // counted in binaryCompares), and the source only to compare or to copy it (a copy is a write:
  // a new inode). The count is the installer's own: an earlier version of this test watched
  // atimes on a strictatime tmpfs, which see every reader on the machine: CI once saw the
  // installed file read 3.3 ms after our rename, a read we could not reproduce or attribute.
  it('the pass our own write triggers reads neither binary; a restart compares once and writes nothing', async () => {
    const tree = await makeHostTree();
    const src = path.join(tree.binariesDir, 'mesh-cni');
    const dest = path.join(tree.binDir, 'mesh-cni');
    const settings = buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env);
    const installers: Installer[] = [];
    const run = async () => {
      const installer = new Installer(installerArgs(settings), {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      });
      installers.push(installer);
      await installer.start();
      await installer.settled();
      return installer;
    };
    try {
      await fs.writeFile(src, randomBytes(4 * 1024 * 1024), { mode: 0o755 });
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      const first = await run();
      assert.deepEqual(first.notReadyReasons(), []);
      assert.ok(readFileSync(dest).equals(readFileSync(src)));
      const ino = statSync(dest).ino;
      // The pass our own write's watch event brought (settled() waited for it), and more.
      assert.equal(first.binaryCompares, 0, 'the installed binary was read after we wrote it');
      for (let i = 0; i < 3; i++) {
        first.schedule('periodic');
        await first.settled();
      }
      assert.equal(first.binaryCompares, 0, 'the installed binary was read again after we wrote it');
      assert.equal(statSync(dest).ino, ino, 'nor copied again');
      await first.stop('SIGTERM');

      // A restart (a new process): what is installed is of unknown identity, compared once.
      const second = await run();
      assert.deepEqual(second.notReadyReasons(), []);
      assert.equal(statSync(dest).ino, ino, 'an identical binary is not written again');
      assert.equal(second.binaryCompares, 1, 'compared once at start-up');
      second.schedule('periodic');
      await second.settled();
      assert.equal(second.binaryCompares, 1, 'and not again');

      // Changed in place with the same size: a new identity, so compared, found different, replaced.
      const bytes = readFileSync(dest);
      bytes[100] = bytes[100]! ^ 0xff;
      await fs.writeFile(dest, bytes);
      second.schedule('periodic');
      await second.settled();
      assert.ok(readFileSync(dest).equals(readFileSync(src)), 'a changed binary is put back');
    } finally {
      for (const i of installers) await i.stop('SIGTERM').catch(() => {});
      await tree.remove();
    }
  });
});

describe('stale temp files at start-up', () => {
  it('a directory or a link to one named like our temp is left as it is, logged once; start-up goes on', async () => {
    const tree = await makeHostTree();
    const lines: string[] = [];
    configureLogging(
      { asJson: true, outputLevels: buildSettings({ log_output_level: 'install:info' }, {}).logging.outputLevels },
      { write: (l) => void lines.push(l) },
    );
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'test' }),
      },
    );
    const outside = await fs.mkdtemp(path.join(tree.root, 'outside-'));
    try {
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      // Planted under names our temp files have: a directory with a file in it, a link to a
      // directory elsewhere (never followed), and a real stale temp of ours (removed).
      const plantedDir = path.join(tree.netDir, '.10-bridge.conflist.mesh-tmp-1-aaaaaaaa');
      await fs.mkdir(plantedDir);
      await fs.writeFile(path.join(plantedDir, 'keep'), 'x');
      await fs.writeFile(path.join(outside, 'keep'), 'y');
      const plantedLink = path.join(tree.binDir, '.mesh-cni.mesh-tmp-1-bbbbbbbb');
      await fs.symlink(outside, plantedLink);
      const plantedBinDir = path.join(tree.binDir, '.mesh-cni.mesh-tmp-1-cccccccc');
      await fs.mkdir(plantedBinDir);
      const staleTemp = path.join(tree.netDir, '.10-bridge.conflist.mesh-tmp-1-dddddddd');
      await fs.writeFile(staleTemp, 'half written');

      await within(installer.start(), 5000, 'start');
      await installer.settled();
      assert.deepEqual(installer.notReadyReasons(), []);
      assert.match(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8'), /"mesh-cni"/);
      // The directories and what they hold are untouched; the link alone is removed, not its target.
      assert.equal(readFileSync(path.join(plantedDir, 'keep'), 'utf8'), 'x');
      assert.ok(statSync(plantedBinDir).isDirectory());
      await assert.rejects(fs.lstat(plantedLink), { code: 'ENOENT' });
      assert.equal(readFileSync(path.join(outside, 'keep'), 'utf8'), 'y');
      await assert.rejects(fs.lstat(staleTemp), { code: 'ENOENT' });
      const said = lines.filter((l) => l.includes('not a file of ours'));
      assert.equal(said.length, 2, lines.join(''));
      assert.match(said.join(''), /mesh-tmp-1-aaaaaaaa/);
      assert.match(said.join(''), /mesh-tmp-1-cccccccc/);
    } finally {
      await installer.stop('SIGTERM').catch(() => {});
      configureLogging(
        { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
        { write: () => {} },
      );
      await tree.remove();
    }
  });
});

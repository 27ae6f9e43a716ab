// A net-dir writer racing the agent (docs/security.md "Security: the trust model"): a primary
// that is a symbolic link is edited where it points, but only in a directory no net-dir writer can
// swap: the net dir itself, or a root-owned directory outside it that only root may write, held
// open by fd from the check until the rename. A directory made inside the net dir could be swapped
// (renameat2 RENAME_EXCHANGE) for a link to the CNI binaries dir between the check and the write,
// and the root agent would then overwrite a binary with the attacker's JSON.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { InstallPass } from '../../src/install/pass.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const defer = cleanupAfterEach();

// Exchanges two paths, over and over, until killed: the attacker's half of the race.
const EXCHANGER_C = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/fs.h>
int main(int argc, char **argv) {
  if (argc != 3) return 2;
  for (;;) if (syscall(SYS_renameat2, AT_FDCWD, argv[1], AT_FDCWD, argv[2], RENAME_EXCHANGE) != 0) { perror("renameat2"); return 1; }
}
`;

const VICTIM = '\x7fELF stand-in for a CNI binary\n';
const WITH_OURS = JSON.stringify(
  { cniVersion: '1.0.0', name: 'planted', plugins: [{ type: 'bridge' }, { type: 'mesh-cni' }] },
  null,
  1,
);

async function tree(): Promise<HostTree> {
  const t = await makeHostTree();
  defer(() => t.remove());
  await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  await fs.writeFile(path.join(t.binDir, 'host-local'), VICTIM, { mode: 0o755 });
  return t;
}

function installPass(t: HostTree): InstallPass {
  const s = buildSettings({ 'reconcile-interval': '1h', ...t.flags }, t.env);
  return new InstallPass(s.install, s.env);
}

describe('a link in the net dir is written through only into a directory no net-dir writer can swap', () => {
  it('never writes the target of a link into a directory swapped for a link to the bin dir (3 s of swaps)', async () => {
    const t = await tree();
    const net = t.netDir;
    const exe = path.join(t.root, 'exchanger');
    await fs.writeFile(`${exe}.c`, EXCHANGER_C);
    execFileSync('cc', ['-O2', '-o', exe, `${exe}.c`]);
    // d/host-local holds a conflist with our entry: taking it out writes through the link.
    await fs.mkdir(path.join(net, 'd'));
    await fs.writeFile(path.join(net, 'd', 'host-local'), WITH_OURS);
    await fs.symlink(path.relative(net, t.binDir), path.join(net, 'dlink'));
    await fs.symlink('d/host-local', path.join(net, '99-z.conflist'));
    const r = installPass(t);
    await r.run().catch(() => {});
    const dir = await fs.open(path.join(net, 'd'), 'r');
    defer(() => dir.close());
    const swapper = spawn(exe, [path.join(net, 'd'), path.join(net, 'dlink')], { stdio: 'ignore' });
    defer(async () => swapper.kill('SIGKILL'));
    const until = Date.now() + 3000;
    let passes = 0;
    while (Date.now() < until) {
      // The planted file is put back through the held fd, wherever its dir is now.
      await fs.writeFile(`/proc/self/fd/${dir.fd}/host-local`, WITH_OURS);
      await r.run().catch(() => {});
      passes++;
      assert.equal(
        readFileSync(path.join(t.binDir, 'host-local'), 'utf8'),
        VICTIM,
        `the binary was overwritten after ${passes} passes`,
      );
    }
    swapper.kill('SIGKILL');
    assert.equal(statSync(path.join(t.binDir, 'host-local')).mode & 0o7777, 0o755);
    assert.ok(passes > 10, `only ${passes} passes`);
  });

  it('a link into a directory inside the net dir is not written through, and says so', async () => {
    const t = await tree();
    await fs.mkdir(path.join(t.netDir, 'd'));
    await fs.writeFile(path.join(t.netDir, 'd', 'x.conflist'), WITH_OURS);
    await fs.symlink('d/x.conflist', path.join(t.netDir, '99-z.conflist'));
    const out = await installPass(t).run();
    assert.equal(readFileSync(path.join(t.netDir, 'd', 'x.conflist'), 'utf8'), WITH_OURS);
    assert.match(out.notReady.join('\n'), /inside the net dir/);
  });

  it('a link into a directory others may write is not written through', async () => {
    const t = await tree();
    const open = path.join(t.root, 'host/var/lib/shared');
    await fs.mkdir(open, { recursive: true });
    await fs.chmod(open, 0o777);
    await fs.writeFile(path.join(open, 'x.conflist'), WITH_OURS);
    await fs.symlink(path.join(open, 'x.conflist'), path.join(t.netDir, '99-z.conflist'));
    const out = await installPass(t).run();
    assert.equal(readFileSync(path.join(open, 'x.conflist'), 'utf8'), WITH_OURS);
    assert.match(out.notReady.join('\n'), /writable by group or others/);
  });

  it('a primary linked into a root-only directory outside the net dir is still edited there (11.4)', async () => {
    const t = await tree();
    await fs.rm(path.join(t.netDir, '10-bridge.conflist'));
    const vendor = path.join(t.root, 'host/var/lib/vendor');
    await fs.mkdir(vendor, { recursive: true, mode: 0o755 });
    await fs.writeFile(path.join(vendor, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await fs.symlink(path.join(vendor, '10-bridge.conflist'), path.join(t.netDir, '10-bridge.conflist'));
    const out = await installPass(t).run();
    assert.deepEqual(out.notReady, []);
    assert.ok((await fs.lstat(path.join(t.netDir, '10-bridge.conflist'))).isSymbolicLink());
    assert.match(readFileSync(path.join(vendor, '10-bridge.conflist'), 'utf8'), /mesh-cni/);
  });
});

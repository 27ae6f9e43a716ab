// The reference's own cases (Istio's install-cni tests and libcni's config loading), each as a
// fixture of ours: test/node/fixtures/install-conformance/<case>/ holds the net dir before
// (in/, plus later/ for files that appear after the first pass), case.json (flags, the
// reference case, whether the node ends up ready), and the net dir after install (out/) and
// after uninstall (clean/). README.md there maps every reference case to its fixture.
// test/node/fixtures/libcni/<case>/ holds one config file and the verdict libcni would give;
// test/node/fixtures/orchconfig/<case>/ what the orchconfig is made from and the orchconfig.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { libcniVerdict } from '../../src/install/cniconfig.ts';
import { Installer } from '../../src/install/installer.ts';
import { renderOrchconfig, type OrchconfigInput } from '../../src/install/orchconfig.ts';
import { ROOT } from '../helpers/cli.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { dirFiles, runConformanceCase, type ConformanceCase } from '../helpers/install-fixtures.ts';
import { installerArgs } from '../../src/partargs.ts';

const CONFORMANCE = path.join(ROOT, 'test/node/fixtures/install-conformance');
const LIBCNI = path.join(ROOT, 'test/node/fixtures/libcni');
const ORCHCONFIG = path.join(ROOT, 'test/node/fixtures/orchconfig');

describe('install-cni on the reference cases (net dir in -> out after install -> clean after uninstall)', () => {
  for (const name of readdirSync(CONFORMANCE)
    .filter((n) => !n.includes('.'))
    .sort()) {
    const dir = path.join(CONFORMANCE, name);
    const c = JSON.parse(readFileSync(path.join(dir, 'case.json'), 'utf8')) as ConformanceCase;
    it(`${name} (${c.reference})`, async () => {
      const run = await runConformanceCase(dir);
      if (c.ready) assert.deepEqual(run.notReady, [], 'ready');
      else assert.match(run.notReady.join('\n'), new RegExp(c.reason ?? '.'), 'not ready, with the reason');
      assert.deepEqual(run.installed, dirFiles(path.join(dir, 'out')), 'the net dir after install');
      assert.deepEqual(run.uninstalled, dirFiles(path.join(dir, 'clean')), 'the net dir after uninstall');
    });
  }
});

describe('which files libcni loads (one file in -> verdict out)', () => {
  for (const name of readdirSync(LIBCNI)
    .filter((n) => !n.includes('.'))
    .sort()) {
    const dir = path.join(LIBCNI, name);
    const input = readdirSync(dir).find((f) => f.startsWith('input'))!;
    it(`${name}: ${input}`, () => {
      // `note`: why, for a deliberate difference; not part of the verdict.
      const expected = JSON.parse(readFileSync(path.join(dir, 'expected.json'), 'utf8')) as Record<string, unknown>;
      delete expected.note;
      assert.deepEqual(libcniVerdict(readFileSync(path.join(dir, input), 'utf8'), input), expected);
    });
  }
});

describe("a conflist's <name>/ plugin dir, read as libcni reads it (links git cannot carry)", () => {
  // libcni's ConfFiles: a missing dir adds no plugins; any other error fails the load. An error
  // every reader gets (a link loop) passes the file over, as the runtime does.
  const POD_LIST = '{ "cniVersion": "1.0.0", "name": "pods", "plugins": [{ "type": "bridge", "bridge": "podbr8" }] }\n';
  async function run(link: string): Promise<{ ready: boolean; notes: string; withEntry: string[] }> {
    const tree = await makeHostTree();
    try {
      await fs.writeFile(path.join(tree.netDir, '00-pods.conflist'), POD_LIST);
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await fs.symlink(link, path.join(tree.netDir, 'pods'));
      const installer = new Installer(
        installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
        {
          decideCleanup: async () => ({ cleanup: true, why: 'test' }),
        },
      );
      try {
        await installer.start();
        await installer.settled();
        const withEntry: string[] = [];
        for (const n of ['00-pods.conflist', '10-bridge.conflist'])
          if ((await fs.readFile(path.join(tree.netDir, n), 'utf8')).includes('"mesh-cni"')) withEntry.push(n);
        return { ready: installer.notReadyReasons().length === 0, notes: installer.notes().join('\n'), withEntry };
      } finally {
        await installer.stop('SIGTERM');
      }
    } finally {
      await tree.remove();
    }
  }

  it('a link loop (ELOOP): libcni fails the load, so the file is passed over', async () => {
    const r = await run('pods');
    assert.deepEqual(r, { ready: true, notes: r.notes, withEntry: ['10-bridge.conflist'] });
    assert.match(
      r.notes,
      /passed over .*00-pods\.conflist.*the directory its "name" names, where libcni looks .*ELOOP/,
    );
  });

  it('a dangling link (ENOENT): no more plugins, the file is the primary', async () => {
    const r = await run('gone');
    assert.deepEqual({ ready: r.ready, withEntry: r.withEntry }, { ready: true, withEntry: ['00-pods.conflist'] });
  });
});

describe('the orchconfig (what it is made from in -> orchconfig out)', () => {
  for (const name of readdirSync(ORCHCONFIG).sort()) {
    it(name, () => {
      const input = JSON.parse(readFileSync(path.join(ORCHCONFIG, name, 'input.json'), 'utf8')) as OrchconfigInput;
      assert.equal(renderOrchconfig(input), readFileSync(path.join(ORCHCONFIG, name, 'expected.json'), 'utf8'));
    });
  }
});

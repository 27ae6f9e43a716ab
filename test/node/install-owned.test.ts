// --mesh-owned-cni-config: our own config file, sorting before the primary CNI's, which is never
// edited. The generation from every primary shape (fixtures), the planner's cases, and the real
// reconcile pass on a temp net dir: following the primary, keeping ours when it is gone, a file
// sorting before ours, uninstall, and switching modes in either direction.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterEach, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { isOurs, withoutOurEntry } from '../../src/install/cniconfig.ts';
import { Installer } from '../../src/install/installer.ts';
import { ownedMode, ownedText, planOwned, PRIMARY_GONE_GRACE_MS, shadowedBy } from '../../src/install/owned.ts';
import { InstallPass } from '../../src/install/pass.ts';
import type { PluginTokenSource } from '../../src/install/tokenrequest.ts';
import { ROOT } from '../helpers/cli.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { FIXTURE_ENTRY } from '../helpers/install-fixtures.ts';
import { runtimeView } from '../helpers/runtime-view.ts';
import { installerArgs } from '../../src/partargs.ts';

const FIXTURES = path.join(ROOT, 'test/node/fixtures/install-owned');
const OWNED = '02-mesh-cni.conflist';
const types = (text: string) => (JSON.parse(text) as { plugins: { type: string }[] }).plugins.map((p) => p.type);

describe('owned config: generated from every primary shape (fixtures: primary in -> our file out)', () => {
  for (const name of readdirSync(FIXTURES)
    .filter((n) => statSync(path.join(FIXTURES, n)).isDirectory())
    .sort()) {
    const dir = path.join(FIXTURES, name);
    const input = readdirSync(dir).find((f) => f.startsWith('input'))!;
    const inText = readFileSync(path.join(dir, input), 'utf8');
    it(`${name}: ${input} -> expected.conflist`, () => {
      const out = ownedText(inText, input, FIXTURE_ENTRY);
      assert.equal(out, readFileSync(path.join(dir, 'expected.conflist'), 'utf8'));
      // Exactly one entry of ours, last; the rest is the primary's chain in its order.
      const plugins = (JSON.parse(out) as { plugins: unknown[] }).plugins;
      assert.equal(plugins.filter((p) => isOurs(p as never)).length, 1);
      assert.deepEqual(plugins.at(-1), FIXTURE_ENTRY);
      const primary = JSON.parse(inText) as { plugins?: unknown[] };
      assert.deepEqual(
        plugins.slice(0, -1),
        (primary.plugins ?? [primary]).filter((p) => !isOurs(p as never)),
      );
      // Made again from our own output, it is the same: a pass that finds it right writes nothing.
      assert.equal(ownedText(out, OWNED, FIXTURE_ENTRY), out);
    });
    if (
      input.endsWith('.conflist') &&
      !(JSON.parse(inText) as { plugins: unknown[] }).plugins.some((p) => isOurs(p as never))
    ) {
      it(`${name}: every byte of the primary's is kept (ours without our entry is the primary)`, () => {
        assert.equal(withoutOurEntry(ownedText(inText, input, FIXTURE_ENTRY), OWNED), inText);
      });
    }
  }
});

describe('owned config: mode and plan', () => {
  it("is 0600, or the primary's mode when that gives fewer rights", () => {
    for (const [primary, ours] of [
      [0o644, 0o600],
      [0o600, 0o600],
      [0o640, 0o600],
      [0o400, 0o400],
      [0o444, 0o400],
      [0o100644, 0o600],
      [0o200, 0o200],
    ] as const) {
      assert.equal(ownedMode(primary), ours, `primary ${primary.toString(8)}`);
    }
  });

  const primary = { name: '10-bridge.conflist', text: BRIDGE_CONFLIST, mode: 0o644 };
  const made = ownedText(BRIDGE_CONFLIST, primary.name, FIXTURE_ENTRY);
  const cases: [string, Parameters<typeof planOwned>[0], string, RegExp | null][] = [
    ['no primary, no file of ours: wait', { ownedName: OWNED, primary: null, current: null }, 'wait', null],
    ['primary, no file of ours: write', { ownedName: OWNED, primary, current: null }, 'write', null],
    ['ours is right: keep', { ownedName: OWNED, primary, current: { text: made, mode: 0o100600 } }, 'keep', null],
    [
      'ours right but 0644: write (mode)',
      { ownedName: OWNED, primary, current: { text: made, mode: 0o644 } },
      'write',
      null,
    ],
    [
      'the primary changed: write',
      {
        ownedName: OWNED,
        primary: { ...primary, text: BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br1') },
        current: { text: made, mode: 0o600 },
      },
      'write',
      null,
    ],
    [
      'the primary is gone: keep ours, say why',
      { ownedName: OWNED, primary: null, current: { text: made, mode: 0o600 }, madeFrom: '10-bridge.conflist' },
      'keep',
      /primary CNI config 10-bridge.conflist our 02-mesh-cni.conflist was made from is gone .*keeping ours/,
    ],
    [
      'a primary sorting before ours: shadowed, a note',
      { ownedName: OWNED, primary: { ...primary, name: '01-first.conflist' }, current: null },
      'shadowed',
      /01-first.conflist .* sorts before our 02-mesh-cni.conflist, so the runtime reads it, not ours; our entry is spliced into it/,
    ],
  ];
  for (const [what, state, action, reason] of cases) {
    it(what, () => {
      const plan = planOwned(state, FIXTURE_ENTRY, '/n');
      assert.equal(plan.action, action);
      // Shadowed: the runtime reads a file our entry is spliced into: a note, still ready.
      if (plan.action === 'shadowed') assert.match(plan.note, reason!);
      if (reason && plan.action !== 'shadowed') assert.match(plan.notReady.join('\n'), reason);
      else assert.deepEqual(plan.notReady, []);
      if (plan.action === 'write') assert.equal(plan.mode, 0o600);
    });
  }

  it('names the configs sorting before ours that the runtime reads instead', () => {
    assert.equal(shadowedBy([], OWNED, '/n'), null);
    assert.match(
      shadowedBy(['00-multi.conf'], OWNED, '/n')!,
      /^00-multi.conf in \/n sorts before our 02-mesh-cni.conflist, so the runtime reads it, not ours, and pods may start without mesh-cni/,
    );
    assert.match(
      shadowedBy(['00-a.conf', '01-b.conflist'], OWNED, '/n')!,
      /^00-a.conf, 01-b.conflist in \/n sort before our 02-mesh-cni.conflist, so the runtime reads the first of them/,
    );
  });
});

describe('owned config: settings', () => {
  const refused = (flags: Record<string, string>, re: RegExp) =>
    assert.throws(
      () => buildSettings(flags, {}),
      (e: unknown) => e instanceof ConfigErrors && re.test(e.message),
    );
  it('takes MESH_OWNED_CNI_CONFIG and the file name, and refuses names it cannot use', () => {
    const s = buildSettings({}, { MESH_OWNED_CNI_CONFIG: 'true', MESH_OWNED_CNI_CONFIG_FILENAME: '01-ours.conflist' });
    assert.equal(s.install.meshOwnedCniConfig, true);
    assert.equal(s.install.meshOwnedCniConfigFilename, '01-ours.conflist');
    assert.equal(buildSettings({}, {}).install.meshOwnedCniConfigFilename, OWNED);
    // Off by default (docs/installer.md: "Owned config": the gaps left before it can be); one flag away.
    assert.equal(buildSettings({}, {}).install.meshOwnedCniConfig, false);
    assert.equal(buildSettings({ 'mesh-owned-cni-config': 'true' }, {}).install.meshOwnedCniConfig, true);
    refused({ 'mesh-owned-cni-config-filename': '02-mesh.conf' }, /expected a .conflist name/);
    refused({ 'mesh-owned-cni-config-filename': 'a/02.conflist' }, /plain file name/);
    refused({ 'mesh-owned-cni-config-filename': '.02.conflist' }, /must not start with a dot/);
    refused(
      {
        'mesh-owned-cni-config': 'true',
        'cni-conf-name': '01-calico.conflist',
        'mesh-owned-cni-config-filename': '02-mesh-cni.conflist',
      },
      /does not sort before --cni-conf-name 01-calico.conflist, .*; name it so that it sorts first \(byte order\), such as 01-calico-mesh-cni.conflist/,
    );
  });

  it('with --cni-conf-name sorting before the default name, and no name given, ours is named after it so that it sorts first', () => {
    // Primary names like Calico's 00-calico.conflist or 01-calico.conflist (Istio's own tests use
    // such) were refused at start: the default 02-mesh-cni.conflist sorts after them.
    for (const [primary, ours] of [
      ['00-calico.conflist', '00-calico-mesh-cni.conflist'],
      ['01-net.conf', '01-net-mesh-cni.conflist'],
      ['01-net.json', '01-net-mesh-cni.conflist'],
    ] as const) {
      const s = buildSettings({ 'mesh-owned-cni-config': 'true', 'cni-conf-name': primary }, {}).install;
      assert.equal(s.meshOwnedCniConfigFilename, ours, primary);
      assert.ok(ours < primary, `${ours} sorts before ${primary}`);
      // The same name without the mode, so a switch between the modes finds (and removes) ours.
      assert.equal(buildSettings({ 'cni-conf-name': primary }, {}).install.meshOwnedCniConfigFilename, ours);
    }
    // A primary name after the default keeps the default.
    assert.equal(
      buildSettings({ 'mesh-owned-cni-config': 'true', 'cni-conf-name': '10-calico.conflist' }, {}).install
        .meshOwnedCniConfigFilename,
      OWNED,
    );
    // Byte order (UTF-8), as libcni sorts, not UTF-16 code units: U+10000 sorts after U+FF61.
    assert.equal(
      buildSettings(
        {
          'mesh-owned-cni-config': 'true',
          'cni-conf-name': '0\u{10000}.conflist',
          'mesh-owned-cni-config-filename': '0\u{FF61}.conflist',
        },
        {},
      ).install.meshOwnedCniConfigFilename,
      '0\u{FF61}.conflist',
    );
    assert.throws(
      () =>
        buildSettings(
          {
            'mesh-owned-cni-config': 'true',
            'cni-conf-name': '0\u{FF61}.conflist',
            'mesh-owned-cni-config-filename': '0\u{10000}.conflist',
          },
          {},
        ),
      /does not sort before/,
    );
    // A name given (flag or env) is taken as given, and refused if it does not sort first.
    assert.throws(
      () =>
        buildSettings(
          { 'mesh-owned-cni-config': 'true', 'cni-conf-name': '00-calico.conflist' },
          { MESH_OWNED_CNI_CONFIG_FILENAME: '02-mesh-cni.conflist' },
        ),
      /does not sort before --cni-conf-name 00-calico.conflist/,
    );
  });
});

describe('owned config: the reconcile pass on a real net dir', () => {
  const trees: HostTree[] = [];
  afterEach(async () => {
    for (const t of trees.splice(0)) await t.remove();
  });

  async function setup(
    flags: Record<string, string> = {},
    files: Record<string, string> = { '10-bridge.conflist': BRIDGE_CONFLIST },
  ) {
    const tree = await makeHostTree();
    trees.push(tree);
    for (const [name, text] of Object.entries(files))
      await fs.writeFile(path.join(tree.netDir, name), text, { mode: 0o644 });
    const make = (extra: Record<string, string> = {}) =>
      new InstallPass(
        buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true', ...flags, ...extra }, tree.env).install,
        buildSettings({}, tree.env).env,
      );
    return { tree, net: (n: string) => path.join(tree.netDir, n), make };
  }

  it('writes ours (0600) before the primary, never touches the primary, and the runtime reads ours', async () => {
    const { tree, net, make } = await setup();
    const r = make();
    const out = await r.run();
    assert.deepEqual(out.notReady, []);
    assert.equal(out.primary, OWNED);
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
    assert.deepEqual(types(readFileSync(net(OWNED), 'utf8')), ['bridge', 'mesh-cni']);
    assert.equal(statSync(net(OWNED)).mode & 0o7777, 0o600);
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
    // Nothing to do the second time.
    assert.deepEqual((await r.run()).writes, []);
  });

  it("takes the primary's mode when it is stricter", async () => {
    const { net, make } = await setup();
    await fs.chmod(net('10-bridge.conflist'), 0o400);
    await make().run();
    assert.equal(statSync(net(OWNED)).mode & 0o7777, 0o400);
  });

  it('makes ours again when the primary changes, and follows a new primary that takes first place', async () => {
    const { tree, net, make } = await setup();
    const r = make();
    await r.run();
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.replace('"bridge",', '"bridge", "mtu": 1400,'));
    await r.run();
    assert.equal(
      readFileSync(net(OWNED), 'utf8'),
      ownedText(
        readFileSync(net('10-bridge.conflist'), 'utf8'),
        '10-bridge.conflist',
        (JSON.parse(readFileSync(net(OWNED), 'utf8')) as { plugins: never[] }).plugins.at(-1)!,
      ),
    );
    const ptp =
      '{"cniVersion":"1.0.0","name":"ptp-net","type":"ptp","ipam":{"type":"host-local","subnet":"198.18.125.0/24"}}\n';
    await fs.writeFile(net('05-ptp.conf'), ptp);
    const out = await r.run();
    assert.deepEqual(out.notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 1, chain: ['ptp', 'mesh-cni'] });
    assert.equal(readFileSync(net('05-ptp.conf'), 'utf8'), ptp);
    assert.equal(
      readFileSync(net('10-bridge.conflist'), 'utf8'),
      BRIDGE_CONFLIST.replace('"bridge",', '"bridge", "mtu": 1400,'),
    );
  });

  it('keeps ours when the primary is gone, not ready, saying why; made again when it is back', async () => {
    const { tree, net, make } = await setup();
    const r = make();
    await r.run();
    const ours = readFileSync(net(OWNED), 'utf8');
    await fs.rm(net('10-bridge.conflist'));
    const out = await r.run();
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours);
    assert.match(
      out.notReady.join('\n'),
      /primary CNI config 10-bridge.conflist our 02-mesh-cni.conflist was made from is gone from .*keeping ours as it is/,
    );
    assert.deepEqual(runtimeView(tree.netDir).chain, ['bridge', 'mesh-cni']);
    // A restarted agent knows the name from the record beside ours.
    assert.match(
      (await make().run()).notReady.join('\n'),
      /primary CNI config 10-bridge.conflist our 02-mesh-cni.conflist was made from is gone/,
    );
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST);
    assert.deepEqual((await r.run()).notReady, []);
  });

  it("a config sorting before ours (Multus's 00-multus.conf): our entry goes into it, ready, with a note on /readyz", async () => {
    const { tree, net, make } = await setup();
    const r = make();
    await r.run();
    const early =
      '{"cniVersion":"1.0.0","name":"early","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"198.18.126.0/24"}}]}\n';
    await fs.writeFile(net('01-early.conflist'), early);
    const out = await r.run();
    // The runtime reads a file with our entry: ready (a rollout on such nodes must not stall),
    // and said as a note, for the window a rewrite of that file opens.
    assert.deepEqual(out.notReady, []);
    assert.match(
      (out.notes ?? []).join('\n'),
      /01-early.conflist in .* sorts before our 02-mesh-cni.conflist, so the runtime reads it, not ours; our entry is spliced into it/,
    );
    // Fail closed: the file the runtime reads has our entry, once.
    assert.deepEqual(runtimeView(tree.netDir), { file: '01-early.conflist', entries: 1, chain: ['ptp', 'mesh-cni'] });
    await fs.rm(net('01-early.conflist'));
    const back = await r.run();
    assert.deepEqual(back.notReady, []);
    assert.deepEqual(back.notes ?? [], []);
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
  });

  it('the note of a config sorting before ours reaches /readyz through the installer, which stays ready', async () => {
    const { tree } = await setup(
      {},
      {
        '10-bridge.conflist': BRIDGE_CONFLIST,
        '00-multus.conf':
          '{"cniVersion":"1.0.0","name":"multus-net","type":"ptp","ipam":{"type":"host-local","subnet":"198.18.122.0/24"}}\n',
      },
    );
    const s = buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true', 'reconcile-interval': '1h' }, tree.env);
    const inst = new Installer(installerArgs(s), { decideCleanup: async () => ({ cleanup: true, why: 'test' }) });
    await inst.start();
    try {
      await inst.settled();
      assert.deepEqual(inst.notReadyReasons(), []);
      // A .conf the splice made a .conflist, as without the owned file.
      assert.match(inst.notes().join('\n'), /00-multus.conflist in .* sorts before our 02-mesh-cni.conflist/);
      assert.equal(runtimeView(tree.netDir).entries, 1);
    } finally {
      await inst.stop('SIGTERM');
    }
  });

  it('with --cni-conf-name, another config sorting before ours is reported on /readyz', async () => {
    const { installerFor } = {
      installerFor: async (t: HostTree) => {
        const s = buildSettings(
          {
            ...t.flags,
            'mesh-owned-cni-config': 'true',
            'cni-conf-name': '10-bridge.conflist',
            'reconcile-interval': '1h',
          },
          t.env,
        );
        const inst = new Installer(installerArgs(s), { decideCleanup: async () => ({ cleanup: true, why: 'test' }) });
        await inst.start();
        await inst.settled();
        return inst;
      },
    };
    const { tree } = await setup(
      {},
      {
        '10-bridge.conflist': BRIDGE_CONFLIST,
        '00-multi.conf': '{"cniVersion":"1.0.0","name":"multi","type":"ptp"}\n',
      },
    );
    const inst = await installerFor(tree);
    try {
      assert.match(
        inst.notReadyReasons().join('\n'),
        /00-multi.conf in .* sorts before our 02-mesh-cni.conflist, so the runtime reads it, not ours/,
      );
      assert.equal(inst.status().ownedConfig, OWNED, 'ControlZ shows the owned file');
      // Pods may start without mesh-cni: an error, said as one.
      assert.match(
        (inst.status().errors as string[]).join('\n'),
        /00-multi.conf .* sorts before our 02-mesh-cni.conflist/,
      );
    } finally {
      await inst.stop('SIGTERM');
    }
  });

  it('with --cni-conf-name 00-calico.conflist (before our default name): ours is 00-calico-mesh-cni.conflist, read by the runtime; uninstall removes it', async () => {
    const { tree, net, make } = await setup(
      { 'cni-conf-name': '00-calico.conflist' },
      { '00-calico.conflist': BRIDGE_CONFLIST },
    );
    const r = make();
    assert.deepEqual((await r.run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), {
      file: '00-calico-mesh-cni.conflist',
      entries: 1,
      chain: ['bridge', 'mesh-cni'],
    });
    assert.equal(readFileSync(net('00-calico.conflist'), 'utf8'), BRIDGE_CONFLIST);
    // Switched to the splice with the same --cni-conf-name: ours found by the same name, removed.
    assert.deepEqual((await make({ 'mesh-owned-cni-config': 'false' }).run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), {
      file: '00-calico.conflist',
      entries: 1,
      chain: ['bridge', 'mesh-cni'],
    });
    assert.ok(!(await fs.readdir(tree.netDir)).includes('00-calico-mesh-cni.conflist'));
    await make().run();
    await make().cleanup();
    assert.equal(readFileSync(net('00-calico.conflist'), 'utf8'), BRIDGE_CONFLIST);
    assert.ok(!(await fs.readdir(tree.netDir)).some((n) => n.includes('mesh-cni.conflist')));
  });

  it('uninstall removes ours; the primary was never touched', async () => {
    const { tree, net, make } = await setup();
    const r = make();
    await r.run();
    const writes = await r.cleanup();
    assert.ok(writes.some((w) => w.file === net(OWNED) && w.action === 'remove'));
    assert.deepEqual((await fs.readdir(tree.netDir)).sort(), ['10-bridge.conflist']);
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
  });

  it('a restart or upgrade (--cleanup-on-exit auto: our DaemonSet still there) leaves ours in place; the next agent writes nothing', async () => {
    const { tree, net } = await setup();
    const settings = buildSettings(
      { ...tree.flags, 'mesh-owned-cni-config': 'true', 'reconcile-interval': '1h' },
      tree.env,
    );
    const first = new Installer(installerArgs(settings), {
      decideCleanup: async () => ({ cleanup: false, why: 'DaemonSet still exists' }),
    });
    await first.start();
    await first.settled();
    const ours = readFileSync(net(OWNED), 'utf8');
    await first.stop('SIGTERM');
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours);
    const next = new InstallPass(settings.install, settings.env);
    const out = await next.run();
    assert.deepEqual(out.notReady, []);
    assert.deepEqual(
      out.writes.filter((w) => w.kind === 'cni_config'),
      [],
    );
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
  });

  it('standalone mode (--chained-cni-plugin=false) leaves no owned file behind', async () => {
    const { tree, net, make } = await setup();
    await make().run();
    await make({ 'chained-cni-plugin': 'false' }).run();
    assert.deepEqual((await fs.readdir(tree.netDir)).filter((n) => n.endsWith('.conflist')).sort(), [
      '10-bridge.conflist',
      'YY-mesh-cni.conflist',
    ]);
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
  });

  it('switching modes either way leaves one entry in the file the runtime reads and no stale owned file', async () => {
    for (const primaryName of ['10-bridge.conflist', '10-ptp.conf']) {
      const ptp =
        '{"cniVersion":"1.0.0","name":"ptp-net","type":"ptp","ipam":{"type":"host-local","subnet":"198.18.127.0/24"}}\n';
      const primaryText = primaryName.endsWith('.conf') ? ptp : BRIDGE_CONFLIST;
      const { tree, net, make } = await setup({}, { [primaryName]: primaryText });
      // Spliced first (an agent of before), then owned: the primary gets its bytes back.
      await make({ 'mesh-owned-cni-config': 'false' }).run();
      assert.equal(runtimeView(tree.netDir).entries, 1);
      const owned = make();
      assert.deepEqual((await owned.run()).notReady, []);
      // A .conf made a .conflist by the splice is given back as the .conf: a second pass then
      // makes ours from it.
      await owned.run();
      assert.deepEqual(runtimeView(tree.netDir), {
        file: OWNED,
        entries: 1,
        chain: [primaryName.endsWith('.conf') ? 'ptp' : 'bridge', 'mesh-cni'],
      });
      assert.equal(readFileSync(net(primaryName), 'utf8'), primaryText);
      assert.deepEqual(
        (await fs.readdir(tree.netDir)).filter((n) => n.endsWith('.conf') || n.endsWith('.conflist')).sort(),
        [OWNED, primaryName],
      );
      // And back: the entry into the primary first, then ours removed.
      const spliced = make({ 'mesh-owned-cni-config': 'false' });
      const out = await spliced.run();
      assert.deepEqual(out.notReady, []);
      assert.ok(!(await fs.readdir(tree.netDir)).includes(OWNED), 'no stale owned file');
      assert.equal(runtimeView(tree.netDir).entries, 1);
      const removed = out.writes.findIndex((w) => w.file === net(OWNED));
      const spliceWrite = out.writes.findIndex((w) => w.action === 'write' && w.kind === 'cni_config');
      assert.ok(spliceWrite >= 0 && spliceWrite < removed, 'the entry was in the primary before ours went');
    }
  });
});

// Files at our names that we did not write, and leftovers of our own (docs/installer.md
// "install-cni: the installer", Owned config). Each test was seen failing before its fix.
describe('owned config: files at our names that we did not write', () => {
  const trees: HostTree[] = [];
  afterEach(async () => {
    for (const t of trees.splice(0)) await t.remove();
  });
  async function setup(files: Record<string, string>) {
    const tree = await makeHostTree();
    trees.push(tree);
    for (const [name, text] of Object.entries(files))
      await fs.writeFile(path.join(tree.netDir, name), text, { mode: 0o644 });
    const make = (extra: Record<string, string> = {}) =>
      new InstallPass(
        buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true', ...extra }, tree.env).install,
        buildSettings({}, tree.env).env,
      );
    return { tree, net: (n: string) => path.join(tree.netDir, n), make };
  }
  const reasons = (out: { problems: readonly { reason: string }[] }) => out.problems.map((p) => p.reason);

  it('with the splice, a copy of the primary left at our owned name (no entry of ours) that sorts first: config_shadowed, never ready', async () => {
    // A rollback to a version without the owned file, or a run after a rename, leaves this.
    // Not a copy of any config there now (the primary changed since): not known as ours.
    const stale = BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br9');
    assert.notEqual(stale, BRIDGE_CONFLIST);
    const { tree, net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST, [OWNED]: stale });
    const r = make({ 'mesh-owned-cni-config': 'false' });
    for (let i = 0; i < 2; i++) {
      const out = await r.run();
      assert.ok(reasons(out).includes('config_shadowed'), `pass ${i}: ${out.notReady.join('; ')}`);
      assert.match(
        out.notReady.join('\n'),
        /02-mesh-cni.conflist in .* holds no entry of ours and sorts before 10-bridge.conflist, so the runtime reads it/,
      );
    }
    // Not ours to remove: it stays, and so does the reason.
    assert.equal(readFileSync(net(OWNED), 'utf8'), stale);
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 0, chain: ['bridge'] });
    // Once it is gone, ready.
    await fs.rm(net(OWNED));
    assert.deepEqual((await r.run()).notReady, []);
  });

  it('a rollback copy (ours with our entry taken out by a version without the owned file) is known by its record and content: removed with the splice, made ours again when owned', async () => {
    // The owned agent wrote ours and its record; a version without the owned file took our entry
    // out of it (its splice or uninstall), leaving a byte-exact copy of the primary.
    const { tree, net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST });
    assert.deepEqual((await make().run()).notReady, []);
    const rollback = async () =>
      await fs.writeFile(net(OWNED), withoutOurEntry(readFileSync(net(OWNED), 'utf8'), OWNED)!);
    await rollback();
    assert.equal(readFileSync(net(OWNED), 'utf8'), BRIDGE_CONFLIST);
    // With the splice: a copy of a config that is still there loses nothing when removed.
    const spliced = await make({ 'mesh-owned-cni-config': 'false' }).run();
    assert.deepEqual(spliced.notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), {
      file: '10-bridge.conflist',
      entries: 1,
      chain: ['bridge', 'mesh-cni'],
    });
    assert.deepEqual(
      (await fs.readdir(tree.netDir)).filter((n) => n.includes(OWNED)),
      [],
      'the copy and its record gone',
    );
    // Owned: the copy at our name is made ours again (not file_refused).
    await make().run();
    await rollback();
    const owned = await make().run();
    assert.deepEqual(owned.notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), { file: OWNED, entries: 1, chain: ['bridge', 'mesh-cni'] });
  });

  it('a rollback copy of a primary that changed since: still config_shadowed, the reason naming our record and what to remove', async () => {
    const { net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST });
    await make().run();
    await fs.writeFile(net(OWNED), withoutOurEntry(readFileSync(net(OWNED), 'utf8'), OWNED)!);
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br5'));
    const out = await make({ 'mesh-owned-cni-config': 'false' }).run();
    assert.ok(reasons(out).includes('config_shadowed'), out.notReady.join('; '));
    assert.match(
      out.notReady.join('\n'),
      /our record .02-mesh-cni.conflist.mesh-from says ours was made from 10-bridge.conflist, but it is no copy of 10-bridge.conflist as that is now \(the primary changed since\?\): remove 02-mesh-cni.conflist and .02-mesh-cni.conflist.mesh-from/,
    );
  });
  it('owned: a rollback copy of a primary that changed since at the owned name: file_refused, the reason naming our record', async () => {
    const { net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST });
    await make().run();
    await fs.writeFile(net(OWNED), withoutOurEntry(readFileSync(net(OWNED), 'utf8'), OWNED)!);
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br5'));
    const out = await make().run();
    assert.ok(reasons(out).includes('file_refused'), out.notReady.join('; '));
    assert.match(
      out.notReady.join('\n'),
      /our record .02-mesh-cni.conflist.mesh-from says ours was made from 10-bridge.conflist, but it is no copy of 10-bridge.conflist as that is now/,
    );
  });

  it('with the splice, our owned file that holds our entry is no shadow (it is removed once the primary has the entry)', async () => {
    const { make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST });
    await make().run();
    const out = await make({ 'mesh-owned-cni-config': 'false' }).run();
    assert.deepEqual(out.notReady, []);
  });

  it('owned: another of our names sorting before the file we write, without an entry of ours: config_shadowed', async () => {
    // Standalone mode's YY-mesh-cni.conflist left behind, our owned name after it.
    // Not a copy of a config there now (a byte-exact one is removed: it loses nothing).
    const { net, make } = await setup({
      'ZZ-bridge.conflist': BRIDGE_CONFLIST,
      'YY-mesh-cni.conflist': BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br9'),
    });
    const out = await make({ 'mesh-owned-cni-config-filename': 'YZ-mesh.conflist' }).run();
    assert.ok(reasons(out).includes('config_shadowed'), out.notReady.join('; '));
    assert.match(
      out.notReady.join('\n'),
      /YY-mesh-cni.conflist in .* holds no entry of ours and sorts before YZ-mesh.conflist/,
    );
    await fs.writeFile(net('YY-mesh-cni.conflist'), BRIDGE_CONFLIST);
    assert.deepEqual((await make({ 'mesh-owned-cni-config-filename': 'YZ-mesh.conflist' }).run()).notReady, []);
    assert.ok(!(await fs.readdir(path.dirname(net('x')))).includes('YY-mesh-cni.conflist'));
  });

  it('owned: a file at the owned name that holds no entry of ours is refused (file_refused), never overwritten nor removed on uninstall', async () => {
    const foreign =
      '{"cniVersion":"1.0.0","name":"someone-else","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"198.18.124.0/24"}}]}\n';
    const { net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST, [OWNED]: foreign });
    const r = make();
    const out = await r.run();
    assert.ok(reasons(out).includes('file_refused'), out.notReady.join('; '));
    assert.match(out.notReady.join('\n'), /02-mesh-cni.conflist in .* holds no entry of ours/);
    assert.equal(readFileSync(net(OWNED), 'utf8'), foreign);
    await r.cleanup();
    assert.equal(readFileSync(net(OWNED), 'utf8'), foreign, 'not removed on uninstall');
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
  });

  it("owned: the owned name equal to the primary's name: that file is refused, never overwritten with another network", async () => {
    const ptp =
      '{"cniVersion":"1.0.0","name":"ptp-net","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"198.18.123.0/24"}}]}\n';
    const { net, make } = await setup({ '10-bridge.conflist': BRIDGE_CONFLIST, '20-ptp.conflist': ptp });
    const r = make({ 'mesh-owned-cni-config-filename': '10-bridge.conflist' });
    const out = await r.run();
    assert.ok(reasons(out).includes('file_refused'), out.notReady.join('; '));
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
    assert.equal(readFileSync(net('20-ptp.conflist'), 'utf8'), ptp);
    await r.cleanup();
    assert.equal(readFileSync(net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
  });
});

describe('owned config: the primary ours was made from, unloadable or just gone', () => {
  const trees: HostTree[] = [];
  afterEach(async () => {
    for (const t of trees.splice(0)) await t.remove();
  });
  const ptp =
    '{"cniVersion":"1.0.0","name":"ptp-net","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"198.18.121.0/24"}}]}\n';
  async function setup() {
    const tree = await makeHostTree();
    trees.push(tree);
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await fs.writeFile(path.join(tree.netDir, '20-ptp.conflist'), ptp);
    const r = new InstallPass(
      buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true' }, tree.env).install,
      buildSettings({}, tree.env).env,
    );
    assert.deepEqual((await r.run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir).chain, ['bridge', 'mesh-cni']);
    return { tree, r, net: (n: string) => path.join(tree.netDir, n) };
  }

  it('caught half-written: ours kept, not ready; the file after it is not followed', async () => {
    const { tree, r, net } = await setup();
    const ours = readFileSync(net(OWNED), 'utf8');
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.slice(0, 40));
    const out = await r.run();
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours, 'ours not made from 20-ptp.conflist');
    assert.match(
      out.notReady.join('\n'),
      /10-bridge.conflist our 02-mesh-cni.conflist was made from cannot be loaded now .*keeping ours as it is/,
    );
    assert.deepEqual(runtimeView(tree.netDir).chain, ['bridge', 'mesh-cni']);
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST);
    assert.deepEqual((await r.run()).notReady, []);
    // One that sorts before it is followed, as the runtime would read it.
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.slice(0, 40));
    await fs.writeFile(net('05-ptp.conflist'), ptp);
    assert.deepEqual((await r.run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir).chain, ['ptp', 'mesh-cni']);
  });

  it('an agent restarted meanwhile knows which file ours was made from (a hidden record beside ours)', async () => {
    const { tree, net } = await setup();
    const restarted = () =>
      new InstallPass(
        buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true' }, tree.env).install,
        buildSettings({}, tree.env).env,
      );
    const ours = readFileSync(net(OWNED), 'utf8');
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.slice(0, 40));
    assert.match(
      (await restarted().run()).notReady.join('\n'),
      /10-bridge.conflist our 02-mesh-cni.conflist was made from cannot be loaded now/,
    );
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours);
    await fs.rm(net('10-bridge.conflist'));
    assert.match(
      (await restarted().run()).notReady.join('\n'),
      /10-bridge.conflist our 02-mesh-cni.conflist was made from is gone/,
    );
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours);
    // Uninstall leaves nothing of ours, the record neither.
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST);
    await restarted().cleanup();
    assert.deepEqual((await fs.readdir(tree.netDir)).sort(), ['10-bridge.conflist', '20-ptp.conflist']);
  });

  it('just gone: ours kept, not ready, for a grace period; then the next file is followed', async () => {
    const { tree, r, net } = await setup();
    const ours = readFileSync(net(OWNED), 'utf8');
    await fs.rm(net('10-bridge.conflist'));
    const out = await r.run();
    assert.equal(readFileSync(net(OWNED), 'utf8'), ours, 'ours not made from 20-ptp.conflist at once');
    assert.match(
      out.notReady.join('\n'),
      /10-bridge.conflist our 02-mesh-cni.conflist was made from is gone .*keeping ours as it is/,
    );
    // Back within the grace period (a primary CNI that deletes, then writes): made from it again.
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST);
    assert.deepEqual((await r.run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir).chain, ['bridge', 'mesh-cni']);
    // Gone for good: after the grace period the next file is the primary.
    await fs.rm(net('10-bridge.conflist'));
    assert.notDeepEqual((await r.run()).notReady, []);
    await new Promise((resolve) => setTimeout(resolve, PRIMARY_GONE_GRACE_MS + 100));
    assert.deepEqual((await r.run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir).chain, ['ptp', 'mesh-cni']);
  });

  it("counts the grace from when the pass saw it gone, not from the pass's start (a slow orchconfig step before)", async () => {
    const t = await makeHostTree();
    trees.push(t);
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    // A token source that can hold the pass before the net dir is read, as a slow step there
    // (a binary copied on upgrade, a loaded disk) would.
    let holdMs = 0;
    const token: PluginTokenSource = {
      current: async () => {
        if (holdMs > 0) await new Promise((resolve) => setTimeout(resolve, holdMs));
        return { token: 'plugin-token-1' };
      },
      onChange: () => {},
    };
    const s = buildSettings({ ...t.flags, 'mesh-owned-cni-config': 'true' }, t.env);
    const r = new InstallPass(s.install, s.env, token);
    assert.deepEqual((await r.run()).notReady, []);
    assert.equal(runtimeView(t.netDir).file, OWNED);
    const ours = await fs.readFile(path.join(t.netDir, OWNED), 'utf8');

    // The primary CNI deletes its file to write it again; another config sorts after it.
    await fs.rm(path.join(t.netDir, '10-bridge.conflist'));
    await fs.writeFile(path.join(t.netDir, '20-other.conflist'), BRIDGE_CONFLIST.replace('bridge-net', 'other-net'));
    holdMs = PRIMARY_GONE_GRACE_MS + 300;
    const first = await r.run();
    assert.match(first.notReady.join('\n'), /is gone from/, 'held on the pass that saw it gone');
    holdMs = 0;
    // The very next pass, a moment after the dir was read: well within the grace.
    const next = await r.run();
    assert.match(next.notReady.join('\n'), /is gone from/, 'still held within the grace');
    assert.equal(await fs.readFile(path.join(t.netDir, OWNED), 'utf8'), ours, 'ours kept as it was');
  });
});

describe('owned config: a copy of ours left under an earlier --mesh-owned-cni-config-filename', () => {
  const trees: HostTree[] = [];
  afterEach(async () => {
    for (const t of trees.splice(0)) await t.remove();
  });
  async function setup() {
    const tree = await makeHostTree();
    trees.push(tree);
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const make = (extra: Record<string, string> = {}) =>
      new InstallPass(
        buildSettings({ ...tree.flags, 'mesh-owned-cni-config': 'true', ...extra }, tree.env).install,
        buildSettings({}, tree.env).env,
      );
    // The agent of before wrote its owned file under another name, then was restarted with this one.
    assert.deepEqual((await make({ 'mesh-owned-cni-config-filename': '05-mesh-old.conflist' }).run()).notReady, []);
    return { tree, make, net: (n: string) => path.join(tree.netDir, n) };
  }
  const reasons = (out: { problems: readonly { reason: string }[] }) => out.problems.map((p) => p.reason);

  it('owned mode, left by an agent before the hidden record: not taken for the primary silently (a change of the primary would never reach pods): config_shadowed', async () => {
    const { make, net } = await setup();
    await fs.rm(net('.05-mesh-old.conflist.mesh-from'));
    const old = readFileSync(net('05-mesh-old.conflist'), 'utf8');
    const out = await make().run();
    assert.ok(reasons(out).includes('config_shadowed'), out.notReady.join('; '));
    assert.match(out.notReady.join('\n'), /05-mesh-old.conflist in .* is a copy of 10-bridge.conflist with our entry/);
    assert.equal(readFileSync(net('05-mesh-old.conflist'), 'utf8'), old, 'left as it is');
  });

  it('known as ours by its hidden record, for good: removed once ours is in place, even after the primary changed (owned mode)', async () => {
    const { tree, make, net } = await setup();
    // The primary changes while the agent is stopped: the copy is no longer what we would make.
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br7'));
    const out = await make().run();
    assert.deepEqual(out.notReady, []);
    assert.deepEqual(runtimeView(tree.netDir).file, OWNED);
    assert.match(readFileSync(net(OWNED), 'utf8'), /mcni-br7/, 'ours made from the primary as it is now');
    assert.deepEqual(
      (await fs.readdir(tree.netDir)).filter((n) => n.includes('05-mesh-old')),
      [],
      'the old file and its record gone',
    );
    assert.ok(out.writes.some((w) => w.file === net('05-mesh-old.conflist') && w.action === 'remove'));
  });

  it('known as ours by its hidden record: removed with the splice once the primary holds our entry, and on uninstall', async () => {
    const { tree, make, net } = await setup();
    await fs.writeFile(net('10-bridge.conflist'), BRIDGE_CONFLIST.replace('mcni-br0', 'mcni-br7'));
    assert.deepEqual((await make({ 'mesh-owned-cni-config': 'false' }).run()).notReady, []);
    assert.deepEqual(runtimeView(tree.netDir), {
      file: '10-bridge.conflist',
      entries: 1,
      chain: ['bridge', 'mesh-cni'],
    });
    assert.deepEqual(
      (await fs.readdir(tree.netDir)).filter((n) => n.includes('05-mesh-old')),
      [],
    );
    // Uninstall, with the old file back (another rename while stopped): gone too.
    const again = await setup();
    await make().cleanup();
    await again.make().cleanup();
    assert.deepEqual((await fs.readdir(again.tree.netDir)).sort(), ['10-bridge.conflist']);
    assert.equal(readFileSync(again.net('10-bridge.conflist'), 'utf8'), BRIDGE_CONFLIST);
  });

  it('with the splice, left by an agent before the hidden record: config_shadowed too', async () => {
    const { make, net } = await setup();
    await fs.rm(net('.05-mesh-old.conflist.mesh-from'));
    const out = await make({ 'mesh-owned-cni-config': 'false' }).run();
    assert.ok(reasons(out).includes('config_shadowed'), out.notReady.join('; '));
  });
});

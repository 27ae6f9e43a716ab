// The installer against a real directory tree: what it writes, how it keeps it in place, and
// that it never fights another writer.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { after, afterEach, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { BRIDGE_CONFLIST, makeHostTree, SAMPLE_CA, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { installerArgs } from '../../src/partargs.ts';

const logLines: string[] = [];
configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:debug' }, {}).logging.outputLevels },
  { write: (l) => void logLines.push(l) },
);

const running: { installer: Installer; tree: HostTree }[] = [];

type Flags = Record<string, string> | ((t: HostTree) => Record<string, string>);

async function startInstaller(
  flags: Flags = {},
  env: Record<string, string> = {},
  prepare?: (t: HostTree) => Promise<void>,
) {
  const tree = await makeHostTree();
  if (prepare) await prepare(tree);
  const extra = typeof flags === 'function' ? flags(tree) : flags;
  const settings = buildSettings({ 'reconcile-interval': '1h', ...tree.flags, ...extra }, { ...tree.env, ...env });
  const installer = new Installer(installerArgs(settings), {
    decideCleanup: async () => ({ cleanup: true, why: 'test' }),
  });
  running.push({ installer, tree });
  await installer.start();
  await installer.settled();
  return { installer, tree, settings };
}

afterEach(async () => {
  for (const { installer, tree } of running.splice(0)) {
    await installer.stop('SIGTERM').catch(() => {});
    await tree.remove();
  }
});
after(() => configureLogging({ asJson: false, outputLevels: buildSettings({}, {}).logging.outputLevels }));

const read = (f: string) => readFileSync(f, 'utf8');
const plugins = (f: string) => (JSON.parse(read(f)) as { plugins: { type: string }[] }).plugins.map((p) => p.type);
async function metric(name: string, labels = ''): Promise<number> {
  const text = await registry.metrics();
  const line = text
    .split('\n')
    .find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `) || (labels === '' && l.startsWith(`${name} `)));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

describe('installer', () => {
  it('installs the binary, the orchconfig and our entry, and is ready', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.equal(await metric('mesh_cni_install_ready'), 1);

    const bin = path.join(tree.binDir, 'mesh-cni');
    assert.equal(read(bin), read(path.join(tree.binariesDir, 'mesh-cni')));
    assert.equal(statSync(bin).mode & 0o777, 0o755);

    const orchconfig = path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig');
    assert.equal(statSync(orchconfig).mode & 0o777, 0o600);
    const kc = JSON.parse(read(orchconfig)) as {
      clusters: { cluster: Record<string, unknown> }[];
      users: { user: { token: string } }[];
    };
    assert.equal(kc.clusters[0]!.cluster.server, 'https://198.18.96.1:443');
    assert.equal(
      Buffer.from(kc.clusters[0]!.cluster['certificate-authority-data'] as string, 'base64').toString(),
      SAMPLE_CA,
    );
    assert.equal(kc.users[0]!.user.token, 'token-1');

    assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
    const entry = (
      JSON.parse(read(path.join(tree.netDir, '10-bridge.conflist'))) as { plugins: Record<string, unknown>[] }
    ).plugins[1]!;
    assert.deepEqual(entry.orch, {
      orchconfig: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
      cni_bin_dir: '/opt/cni/bin',
      exclude_namespaces: ['mesh-system', 'kube-system'],
      node_name: 'node-1',
    });
    assert.equal(installer.status().primaryConfig, '10-bridge.conflist');
  });

  it('writes an IPv6 API server in brackets, and skip-tls-verify instead of a CA', async () => {
    const { tree } = await startInstaller({ 'skip-tls-verify': 'true' }, { KUBERNETES_SERVICE_HOST: 'fd00:198:18::1' });
    const kc = JSON.parse(read(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig'))) as {
      clusters: { cluster: Record<string, unknown> }[];
    };
    assert.deepEqual(kc.clusters[0]!.cluster, {
      server: 'https://[fd00:198:18::1]:443',
      'insecure-skip-tls-verify': true,
    });
  });

  it('honours --orchconfig-mode and --orchcfg-file-name', async () => {
    const { tree } = await startInstaller({
      'orchconfig-mode': '416',
      'orchconfig-allow-group-other-read': 'true',
      'orchcfg-file-name': 'my-orchconfig',
    });
    assert.equal(statSync(path.join(tree.netDir, 'my-orchconfig')).mode & 0o777, 0o640);
  });

  it('waits, not ready, without error spam, until a primary config appears', async () => {
    const before = logLines.length;
    const { installer, tree } = await startInstaller();
    assert.match(installer.notReadyReasons().join('\n'), /waiting for a primary CNI config/);
    for (let i = 0; i < 5; i++) installer.schedule('periodic');
    await installer.settled();
    const said = logLines.slice(before).filter((l) => l.includes('waiting for a primary CNI config'));
    assert.equal(said.length, 1, 'said once');
    assert.ok(
      said.every((l) => JSON.parse(l).level === 'info'),
      'not an error',
    );

    await fs.writeFile(path.join(tree.netDir, 'cni.lock'), '');
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await eventually(() => installer.notReadyReasons().length === 0, 'ready after the primary appeared');
    assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
    assert.equal(read(path.join(tree.netDir, 'cni.lock')), '');
  });

  it('restores our entry each time the primary CNI rewrites its file, one write per rewrite', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    const file = path.join(tree.netDir, '10-bridge.conflist');
    const writesBefore = await metric('mesh_cni_install_writes_total', 'kind="cni_config",action="write"');
    const rewrites = 20;
    for (let i = 0; i < rewrites; i++) {
      await fs.writeFile(file, BRIDGE_CONFLIST); // in place, as many CNIs do
      await eventually(() => plugins(file).includes('mesh-cni'), `entry restored after rewrite ${i}`);
    }
    // Let every watch event drain: no further writes may follow (no loop with the other writer).
    await new Promise((r) => setTimeout(r, 300));
    await installer.settled();
    const writes = (await metric('mesh_cni_install_writes_total', 'kind="cni_config",action="write"')) - writesBefore;
    assert.equal(writes, rewrites);
  });

  it('moves our entry when a new file takes first place, giving the old file back as it was', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    const cilium =
      '{\n\t"cniVersion": "0.3.1",\n\t"name": "cilium",\n\t"plugins": [\n\t\t{\n\t\t\t"type": "cilium-cni"\n\t\t}\n\t]\n}\n';
    await fs.writeFile(path.join(tree.netDir, '05-cilium.conflist'), cilium);
    await eventually(
      () => plugins(path.join(tree.netDir, '05-cilium.conflist')).includes('mesh-cni'),
      'entry in the new first file',
    );
    await installer.settled();
    assert.equal(read(path.join(tree.netDir, '10-bridge.conflist')), BRIDGE_CONFLIST);
    assert.equal(installer.status().primaryConfig, '05-cilium.conflist');
  });

  it('makes a .conf a .conflist, and gives the .conf back byte for byte on cleanup', async () => {
    const conf = '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}\n';
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-flannel.conf'), conf, { mode: 0o640 }),
    );
    assert.deepEqual(await fs.readdir(tree.netDir).then((n) => n.filter((x) => x.startsWith('10-'))), [
      '10-flannel.conflist',
    ]);
    assert.deepEqual(plugins(path.join(tree.netDir, '10-flannel.conflist')), ['flannel', 'mesh-cni']);
    assert.equal(statSync(path.join(tree.netDir, '10-flannel.conflist')).mode & 0o777, 0o640);
    await installer.stop('SIGTERM');
    assert.deepEqual((await fs.readdir(tree.netDir)).sort(), ['10-flannel.conf']);
    assert.equal(read(path.join(tree.netDir, '10-flannel.conf')), conf);
    assert.equal(statSync(path.join(tree.netDir, '10-flannel.conf')).mode & 0o777, 0o640);
  });

  it('gives the .conf back on an uninstall that comes after restarts (upgrades) of the agent', async () => {
    const conf = '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}\n';
    const tree = await makeHostTree();
    try {
      await fs.writeFile(path.join(tree.netDir, '10-flannel.conf'), conf, { mode: 0o640 });
      const settings = buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env);
      for (const [run, cleanup] of [
        [1, false],
        [2, false],
        [3, true],
      ] as const) {
        const installer = new Installer(installerArgs(settings), {
          decideCleanup: async () => ({ cleanup, why: `run ${run}` }),
        });
        await installer.start();
        assert.deepEqual(plugins(path.join(tree.netDir, '10-flannel.conflist')), ['flannel', 'mesh-cni'], `run ${run}`);
        await installer.stop('SIGTERM');
      }
      assert.deepEqual((await fs.readdir(tree.netDir)).sort(), ['10-flannel.conf']);
      assert.equal(read(path.join(tree.netDir, '10-flannel.conf')), conf);
      assert.equal(statSync(path.join(tree.netDir, '10-flannel.conf')).mode & 0o777, 0o640);
    } finally {
      await tree.remove();
    }
  });

  // An upgrade: the second run replaced the first run's entry (another log level) and recorded
  // the file *with* that entry as the original, so the uninstall put an entry of ours back.
  for (const [what, name, initial] of [
    ['a conflist', '10-bridge.conflist', BRIDGE_CONFLIST],
    ['a .conf made a .conflist', '10-flannel.conf', '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}\n'],
  ] as const) {
    it(`an uninstall after a run with another entry gives back ${what} with no entry of ours`, async () => {
      const tree = await makeHostTree();
      try {
        await fs.writeFile(path.join(tree.netDir, name), initial);
        for (const [level, cleanup] of [
          ['warn', false],
          ['debug', true],
        ] as const) {
          const settings = buildSettings(
            {
              'reconcile-interval': '1h',
              'log-level': level,
              'cleanup-on-exit': cleanup ? 'always' : 'never',
              ...tree.flags,
            },
            tree.env,
          );
          const installer = new Installer(installerArgs(settings), {
            decideCleanup: async () => ({ cleanup, why: `log level ${level}` }),
          });
          await installer.start();
          const conflist = path.join(tree.netDir, name.replace(/\.conf$/, '.conflist'));
          const entry = (JSON.parse(read(conflist)) as { plugins: Record<string, unknown>[] }).plugins.at(-1);
          assert.equal(entry?.log_level, level);
          await installer.stop('SIGTERM');
        }
        assert.equal(read(path.join(tree.netDir, name)), initial);
        assert.deepEqual(
          (await fs.readdir(tree.netDir)).filter((n) => n !== name),
          [],
        );
      } finally {
        await tree.remove();
      }
    });
  }

  it('on cleanup leaves the primary exactly as the primary CNI wrote it, removes the orchconfig and keeps the binary', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    await installer.stop('SIGTERM');
    assert.equal(read(path.join(tree.netDir, '10-bridge.conflist')), BRIDGE_CONFLIST);
    assert.deepEqual(await fs.readdir(tree.netDir), ['10-bridge.conflist']);
    // Pods started while we were installed run mesh-cni on DEL from the runtime's
    // cached config; without the binary their DEL stops there and their IP leases leak.
    assert.deepEqual(await fs.readdir(tree.binDir), ['mesh-cni']);
    assert.equal(read(path.join(tree.binDir, 'mesh-cni')), read(path.join(tree.binariesDir, 'mesh-cni')));
  });

  it('leaves everything in place when the decision is a restart', async () => {
    const tree = await makeHostTree();
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const installer = new Installer(
      installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env)),
      {
        decideCleanup: async () => ({ cleanup: false, why: 'upgrade' }),
      },
    );
    try {
      await installer.start();
      await installer.stop('SIGTERM');
      assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
      assert.ok(statSync(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')).isFile());
      assert.ok(statSync(path.join(tree.binDir, 'mesh-cni')).isFile());
    } finally {
      await tree.remove();
    }
  });

  it('rewrites the orchconfig when the token rotates by a ..data swap, and when the CA changes', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    const orchconfig = path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig');
    await tree.rotate({ token: 'token-2' });
    // The periodic reconcile is an hour away: only the watch can do this.
    await eventually(() => read(orchconfig).includes('"token-2"'), 'orchconfig with the rotated token', 3000);
    const ca2 = SAMPLE_CA.replace('dummy', 'rotated');
    await tree.rotate({ 'ca.crt': ca2 });
    await eventually(
      () => read(orchconfig).includes(Buffer.from(ca2).toString('base64')),
      'orchconfig with the new CA',
      3000,
    );
    await installer.settled();
    assert.equal(statSync(orchconfig).mode & 0o777, 0o600);
  });

  it('is not ready, with a clear reason, while the token file is missing', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) => {
      await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await fs.rm(path.join(t.saDir, 'token'));
    });
    assert.match(installer.notReadyReasons().join('\n'), /service-account token .*token is missing/);
    assert.equal(await fs.stat(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')).catch(() => null), null);
    await fs.symlink('..data/token', path.join(tree.saDir, 'token'));
    await eventually(() => installer.notReadyReasons().length === 0, 'ready once the token is back');
  });

  it('counts each pass once in mesh_cni_installs_total: not_ready, success (written or found), first problem', async () => {
    const results = ['success', 'not_ready', 'token_missing'] as const;
    const counts = async () => {
      const out: Record<string, number> = { passes: 0 };
      for (const t of ['startup', 'net_dir', 'bin_dir', 'token', 'ca', 'template', 'periodic', 'retry'])
        out.passes! += await metric('mesh_cni_install_reconciles_total', `trigger="${t}"`);
      out.installs = 0;
      for (const r of (await registry.metrics()).matchAll(/^mesh_cni_installs_total\{result="\w+"\} (\d+)$/gm))
        out.installs += Number(r[1]);
      for (const r of results) out[r] = await metric('mesh_cni_installs_total', `result="${r}"`);
      return out;
    };
    const delta = (a: Record<string, number>, b: Record<string, number>) =>
      Object.fromEntries(Object.keys(b).map((k) => [k, b[k]! - a[k]!]));
    let before = await counts();

    // No primary CNI config: waiting, not an error.
    const { installer, tree } = await startInstaller();
    let d = delta(before, await counts());
    assert.ok(d.not_ready! >= 1 && d.success === 0, JSON.stringify(d));
    assert.equal(d.installs, d.passes, 'every pass counted once');

    // Written: the pass that put our entry in; found: a pass with nothing to write.
    before = await counts();
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await eventually(() => installer.notReadyReasons().length === 0, 'ready after the primary appeared');
    await installer.settled();
    const written = await counts();
    assert.ok(delta(before, written).success! >= 1, JSON.stringify(delta(before, written)));
    installer.schedule('periodic');
    await installer.settled();
    d = delta(written, await counts());
    assert.ok(d.success! >= 1 && d.not_ready === 0, JSON.stringify(d));
    assert.equal(d.installs, d.passes, 'every pass counted once');

    // A problem: the pass counts as its first problem's reason, never as a success.
    before = await counts();
    await fs.rm(path.join(tree.saDir, 'token'));
    await eventually(() => /token is missing/.test(installer.notReadyReasons().join('\n')), 'the token missed');
    await installer.settled();
    d = delta(before, await counts());
    assert.ok(d.token_missing! >= 1 && d.success === 0, JSON.stringify(d));
    await fs.symlink('..data/token', path.join(tree.saDir, 'token'));
    await eventually(() => installer.notReadyReasons().length === 0, 'ready once the token is back');
  });

  it('leaves a malformed primary untouched, says so once, and inserts once it is fixed', async () => {
    const broken = '{ "cniVersion": "1.0.0", "plugins": [ { "type": "bridge" }, ';
    const before = logLines.length;
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), broken),
    );
    const file = path.join(tree.netDir, '10-bridge.conflist');
    installer.schedule('periodic');
    await installer.settled();
    assert.equal(read(file), broken);
    assert.match(
      installer.notReadyReasons().join('\n'),
      /passed over, as the runtime would: 10-bridge.conflist: not valid JSON/,
    );
    const errors = logLines.slice(before).filter((l) => l.includes('10-bridge.conflist: not valid JSON'));
    assert.equal(errors.length, 1);
    assert.equal(JSON.parse(errors[0]!).level, 'error');
    await fs.writeFile(file, BRIDGE_CONFLIST);
    await eventually(() => installer.notReadyReasons().length === 0, 'ready after the fix');
    assert.deepEqual(plugins(file), ['bridge', 'mesh-cni']);
  });

  it('rejects a primary with no type and a bad template without touching the primary', async () => {
    const noType = '{"cniVersion":"1.0.0","name":"x"}';
    const { installer, tree } = await startInstaller(
      { 'cni-network-config': '{ "type": "mesh-cni", ' },
      {},
      async (t) => fs.writeFile(path.join(t.netDir, '10-x.conf'), noType),
    );
    assert.match(
      installer.notReadyReasons().join('\n'),
      /cannot parse the CNI network config template from --cni-network-config/,
    );
    assert.equal(read(path.join(tree.netDir, '10-x.conf')), noType);
  });

  it('takes the template from a file with comments, and re-reads it when it changes', async () => {
    const tpl = (t: HostTree) => path.join(t.root, 'config/template.json5');
    const { installer, tree } = await startInstaller(
      (t) => ({ 'cni-network-config-file': tpl(t) }),
      {},
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        await fs.mkdir(path.dirname(tpl(t)));
        await fs.writeFile(
          tpl(t),
          '{ // the operator\'s own\n type: "mesh-cni", log_level: "__LOG_LEVEL__", version: 1, }\n',
        );
      },
    );
    const entry = () =>
      (
        JSON.parse(read(path.join(tree.netDir, '10-bridge.conflist'))) as { plugins: Record<string, unknown>[] }
      ).plugins.at(-1);
    assert.deepEqual(entry(), { type: 'mesh-cni', log_level: 'warn', version: 1 });
    await fs.writeFile(tpl(tree), '{ type: "mesh-cni", version: 2 /* changed */ }');
    await eventually(() => entry()?.version === 2, 'entry from the changed template', 3000);
    await installer.settled();
    assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
  });

  it('adds no entry the runtime could not run: not before the plugin binary and the orchconfig are there', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) => {
      await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await fs.rm(path.join(t.binariesDir, 'mesh-cni'));
      await fs.rm(path.join(t.saDir, 'token'));
    });
    const file = path.join(tree.netDir, '10-bridge.conflist');
    const reasons = installer.notReadyReasons().join('\n');
    assert.match(reasons, /no binaries to install/);
    assert.match(
      reasons,
      /not adding our entry to the CNI config until .*mesh-cni and .*ZZZ-mesh-cni-orchconfig are in place/,
    );
    assert.equal(read(file), BRIDGE_CONFLIST, 'primary untouched');
    await fs.writeFile(path.join(tree.binariesDir, 'mesh-cni'), '#!/bin/sh\necho v2\n', { mode: 0o755 });
    installer.schedule('periodic');
    await installer.settled();
    assert.equal(read(file), BRIDGE_CONFLIST, 'still untouched without the orchconfig');
    assert.match(installer.notReadyReasons().join('\n'), /until .*ZZZ-mesh-cni-orchconfig is in place/);
    await fs.symlink('..data/token', path.join(tree.saDir, 'token'));
    await eventually(() => installer.notReadyReasons().length === 0, 'ready once both are there');
    assert.deepEqual(plugins(file), ['bridge', 'mesh-cni']);
  });

  // The runtime (libcni, as CRI-O reads the dir) skips files it cannot load and
  // takes the first one it can; so do we, and say which we skipped and why.
  for (const [what, first, firstText] of [
    ['a non-JSON file', '00-notes.conf', 'this is no JSON\n'],
    ['a conflist with no name', '00-noname.conflist', '{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}\n'],
    [
      'a conflist with no plugins',
      '00-noplugins.conflist',
      '{"cniVersion":"1.0.0","name":"x","plugin":[{"type":"bridge"}]}\n',
    ],
    ['a .conf with no type', '00-notype.conf', '{"cniVersion":"1.0.0","name":"x"}\n'],
    ['a top-level array', '00-array.conflist', '[]\n'],
    ['an empty object', '00-empty.conf', '{}\n'],
  ] as const) {
    it(`skips ${what} first in the dir, as the runtime does, and says so`, async () => {
      const { installer, tree } = await startInstaller({}, {}, async (t) => {
        await fs.writeFile(path.join(t.netDir, first), firstText);
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      });
      assert.deepEqual(installer.notReadyReasons(), []);
      assert.equal(installer.status().primaryConfig, '10-bridge.conflist');
      assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
      assert.equal(read(path.join(tree.netDir, first)), firstText, 'the skipped file is left alone');
      const skipped = installer.status().skipped as { file: string; reason: string }[];
      assert.deepEqual(
        skipped.map((s) => s.file),
        [first],
      );
      assert.ok(
        !skipped[0]!.reason.includes(firstText.trim()),
        `no file contents in the reason: ${skipped[0]!.reason}`,
      );
    });
  }

  // libcni appends the plugin .conf files of a <network name>/ dir after a conflist's own list
  // (NetworkConfFromFile): an entry of ours in the list would not run last, so no install.
  it('refuses a conflist whose plugins go on in a <name>/ dir, and does not pass it over', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) => {
      await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      await fs.mkdir(path.join(t.netDir, 'bridge-net'));
      await fs.writeFile(path.join(t.netDir, 'bridge-net/tuning.conf'), '{"type":"tuning"}');
      await fs.writeFile(path.join(t.netDir, '20-other.conflist'), BRIDGE_CONFLIST.replace('bridge-net', 'other'));
    });
    assert.match(
      installer.notReadyReasons().join('\n'),
      /10-bridge.conflist .* takes 1 more plugin config\(s\) from the directory its "name" names after its own list/,
    );
    assert.equal(read(path.join(tree.netDir, '10-bridge.conflist')), BRIDGE_CONFLIST);
    assert.deepEqual(plugins(path.join(tree.netDir, '20-other.conflist')), ['bridge']);
  });

  it('with only files the runtime would skip, waits and names each with its reason', async () => {
    const { installer } = await startInstaller({}, {}, async (t) => {
      await fs.writeFile(path.join(t.netDir, '00-notes.conf'), 'secret-token-like-text');
      await fs.writeFile(path.join(t.netDir, '10-noname.conflist'), '{"plugins":[{"type":"bridge"}]}');
    });
    const reasons = installer.notReadyReasons().join('\n');
    assert.match(reasons, /waiting for a primary CNI config the runtime can load/);
    assert.match(reasons, /00-notes.conf: not valid JSON/);
    assert.match(reasons, /10-noname.conflist: .*"name"/);
    assert.doesNotMatch(reasons, /secret-token-like-text/);
  });

  // --cni-conf-name X.conflist takes X.conf and the other way round, as Istio does;
  // our own uninstall turns X.conflist back into X.conf, so the next install must find it.
  it('--cni-conf-name X.conflist falls back to X.conf, also after our uninstall gave the .conf back', async () => {
    const conf = '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}\n';
    const tree = await makeHostTree();
    try {
      await fs.writeFile(path.join(tree.netDir, '10-flannel.conf'), conf);
      const run = async (confName: string, check: () => void) => {
        const installer = new Installer(
          installerArgs(
            buildSettings({ 'reconcile-interval': '1h', 'cni-conf-name': confName, ...tree.flags }, tree.env),
          ),
          { decideCleanup: async () => ({ cleanup: true, why: 'test' }) },
        );
        try {
          await installer.start();
          assert.deepEqual(installer.notReadyReasons(), [], confName);
          check();
        } finally {
          await installer.stop('SIGTERM');
        }
      };
      for (const confName of ['10-flannel.conflist', '10-flannel.conflist', '10-flannel.conf']) {
        await run(confName, () =>
          assert.deepEqual(plugins(path.join(tree.netDir, '10-flannel.conflist')), ['flannel', 'mesh-cni']),
        );
        assert.equal(read(path.join(tree.netDir, '10-flannel.conf')), conf);
      }
      await fs.rm(path.join(tree.netDir, '10-flannel.conf'));
      await fs.writeFile(path.join(tree.netDir, '10-other.conflist'), BRIDGE_CONFLIST);
      await run('10-other.conf', () =>
        assert.deepEqual(plugins(path.join(tree.netDir, '10-other.conflist')), ['bridge', 'mesh-cni']),
      );
    } finally {
      await tree.remove();
    }
  });

  // A .conf name promises a single-plugin config (type at the top), which is what a
  // runtime reads from a .conf; a conflist body there is skipped or rejected.
  it('standalone mode with a .conf name writes a single-plugin config', async () => {
    const { installer, tree } = await startInstaller({
      'chained-cni-plugin': 'false',
      'cni-conf-name': 'YY-user-defined.conf',
    });
    const own = JSON.parse(read(path.join(tree.netDir, 'YY-user-defined.conf'))) as Record<string, unknown>;
    assert.equal(own.type, 'mesh-cni');
    assert.equal(own.name, 'mesh-cni');
    assert.equal(own.plugins, undefined);
    assert.deepEqual(installer.notReadyReasons(), []);
    await installer.stop('SIGTERM');
    assert.deepEqual(
      (await fs.readdir(tree.netDir)).filter((n) => n.endsWith('.conf')),
      [],
    );
  });

  // A primary that is a symbolic link (some CNIs keep their config elsewhere and
  // link it into the net dir) is edited where it points, and stays a link, also on uninstall.
  it('edits a symlinked primary in its target, atomically, and keeps the link, also on uninstall', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) => {
      await fs.mkdir(path.join(t.root, 'host/etc/cni/vendor'));
      await fs.writeFile(path.join(t.root, 'host/etc/cni/vendor/10-bridge.conflist'), BRIDGE_CONFLIST, { mode: 0o640 });
      await fs.symlink('../vendor/10-bridge.conflist', path.join(t.netDir, '10-bridge.conflist'));
    });
    const link = path.join(tree.netDir, '10-bridge.conflist');
    const target = path.join(tree.root, 'host/etc/cni/vendor/10-bridge.conflist');
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.ok((await fs.lstat(link)).isSymbolicLink(), 'still a link');
    assert.equal(await fs.readlink(link), '../vendor/10-bridge.conflist');
    assert.deepEqual(plugins(target), ['bridge', 'mesh-cni']);
    assert.equal(statSync(target).mode & 0o777, 0o640);
    assert.deepEqual(
      await fs.readdir(path.dirname(target)),
      ['10-bridge.conflist'],
      'no temp file left beside the target',
    );
    // The primary CNI updates its file where it keeps it: our entry comes back there.
    const updated = BRIDGE_CONFLIST.replace('bridge-net', 'bridge-net-2');
    await fs.writeFile(target, updated);
    installer.schedule('periodic');
    await installer.settled();
    assert.ok((await fs.lstat(link)).isSymbolicLink());
    assert.deepEqual(plugins(target), ['bridge', 'mesh-cni']);
    await installer.stop('SIGTERM');
    assert.ok((await fs.lstat(link)).isSymbolicLink(), 'a link after uninstall');
    assert.equal(read(target), updated, 'the target as the primary CNI last wrote it');
  });

  it('gives a symlinked .conf back as the link after making it a .conflist', async () => {
    const conf = '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}\n';
    const { installer, tree } = await startInstaller({}, {}, async (t) => {
      await fs.mkdir(path.join(t.root, 'host/etc/cni/vendor'));
      await fs.writeFile(path.join(t.root, 'host/etc/cni/vendor/10-flannel.conf'), conf);
      await fs.symlink('../vendor/10-flannel.conf', path.join(t.netDir, '10-flannel.conf'));
    });
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.deepEqual(plugins(path.join(tree.netDir, '10-flannel.conflist')), ['flannel', 'mesh-cni']);
    assert.equal(
      await fs.lstat(path.join(tree.netDir, '10-flannel.conf')).catch(() => null),
      null,
      "the .conf link is out of the runtime's way",
    );
    await installer.stop('SIGTERM');
    assert.equal(await fs.readlink(path.join(tree.netDir, '10-flannel.conf')), '../vendor/10-flannel.conf');
    assert.equal(read(path.join(tree.root, 'host/etc/cni/vendor/10-flannel.conf')), conf);
    assert.deepEqual((await fs.readdir(tree.netDir)).sort(), ['10-flannel.conf']);
  });

  it('standalone mode writes our own conflist', async () => {
    const { tree } = await startInstaller({ 'chained-cni-plugin': 'false' });
    const own = JSON.parse(read(path.join(tree.netDir, 'YY-mesh-cni.conflist'))) as {
      name: string;
      plugins: { type: string }[];
    };
    assert.equal(own.name, 'mesh-cni');
    assert.deepEqual(
      own.plugins.map((p) => p.type),
      ['mesh-cni'],
    );
  });

  it('repairs the net dir deleted and recreated', async () => {
    const { installer, tree } = await startInstaller({}, {}, async (t) =>
      fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST),
    );
    await fs.rm(tree.netDir, { recursive: true, maxRetries: 20, retryDelay: 10 });
    installer.schedule('periodic');
    await installer.settled();
    assert.match(installer.notReadyReasons().join('\n'), /does not exist/);
    await fs.mkdir(tree.netDir);
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    installer.schedule('periodic'); // a pass notices the new dir and re-arms the watch
    await eventually(() => installer.notReadyReasons().length === 0, 'ready again');
    assert.deepEqual(plugins(path.join(tree.netDir, '10-bridge.conflist')), ['bridge', 'mesh-cni']);
    // And the new watch works: a rewrite is repaired without a periodic pass.
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    await eventually(
      () => plugins(path.join(tree.netDir, '10-bridge.conflist')).includes('mesh-cni'),
      'repaired through the new watch',
    );
  });

  it('replaces a binary that a running process is executing (no ETXTBSY)', async () => {
    const { installer, tree } = await startInstaller();
    const bin = path.join(tree.binDir, 'mesh-cni');
    await fs.copyFile('/bin/sleep', bin);
    const child = spawn(bin, ['30'], { stdio: 'ignore' });
    try {
      await eventually(() => child.pid !== undefined, 'sleep running');
      await new Promise((r) => setTimeout(r, 50));
      installer.schedule('bin_dir');
      await installer.settled();
      assert.equal(read(bin), read(path.join(tree.binariesDir, 'mesh-cni')));
      assert.equal(child.exitCode, null, 'the running binary was not disturbed');
    } finally {
      child.kill();
    }
  });
});

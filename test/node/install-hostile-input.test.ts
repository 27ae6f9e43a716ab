// The installer given settings or files that would hurt the node if taken as they come: a
// binaries dir holding more than our binaries, files whose contents (a token) must never show up
// in a readiness reason; and an orchconfig name that sorts before the primary config, which is
// taken (the runtime never reads it as a config).

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { lstatSync, readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterEach, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { fileTokenSource } from '../../src/install/tokenrequest.ts';
import { unsignedJwt } from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { installerArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const running: { installer: Installer; tree: HostTree }[] = [];
afterEach(async () => {
  for (const { installer, tree } of running.splice(0)) {
    await installer.stop('SIGTERM').catch(() => {});
    await tree.remove();
  }
});

async function start(
  flags: (t: HostTree) => Record<string, string>,
  prepare: (t: HostTree) => Promise<void>,
): Promise<{ installer: Installer; tree: HostTree }> {
  const tree = await makeHostTree();
  await prepare(tree);
  const installer = new Installer(
    installerArgs(buildSettings({ 'reconcile-interval': '1h', ...tree.flags, ...flags(tree) }, tree.env)),
    { decideCleanup: async () => ({ cleanup: true, why: 'test' }) },
  );
  running.push({ installer, tree });
  await installer.start();
  await installer.settled();
  return { installer, tree };
}

const everything = (installer: Installer) =>
  `${installer.notReadyReasons().join('\n')}\n${JSON.stringify(installer.status())}`;
const SECRET = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLWRvLW5vdC1sZWFr.sig';

describe('binaries: only the ones we ship, never through a link', () => {
  it('copies mesh-cni only, however many other files the binaries dir holds (--cni-binaries-dir /etc)', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        await fs.writeFile(path.join(t.binariesDir, 'shadow'), 'root:$6$secret:19000:0:99999:7:::\n', { mode: 0o600 });
        await fs.symlink('/etc/hostname', path.join(t.binariesDir, 'hostname'));
      },
    );
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.deepEqual(await fs.readdir(tree.binDir), ['mesh-cni']);
  });

  it('refuses a mesh-cni that is a link (it could point anywhere on the image or host)', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        await fs.rm(path.join(t.binariesDir, 'mesh-cni'));
        await fs.symlink('/etc/hostname', path.join(t.binariesDir, 'mesh-cni'));
      },
    );
    assert.match(installer.notReadyReasons().join('\n'), /mesh-cni is a symbolic link/);
    assert.deepEqual(await fs.readdir(tree.binDir), []);
  });

  it('replaces a FIFO or link planted where our binary goes, without reading or following it', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        await fs.symlink('/dev/zero', path.join(t.binDir, 'mesh-cni'));
      },
    );
    assert.deepEqual(installer.notReadyReasons(), []);
    const st = await fs.lstat(path.join(tree.binDir, 'mesh-cni'));
    assert.ok(st.isFile());
    assert.equal(
      readFileSync(path.join(tree.binDir, 'mesh-cni'), 'utf8'),
      readFileSync(path.join(tree.binariesDir, 'mesh-cni'), 'utf8'),
    );
  });
});

describe('the orchconfig name against the primary found at run time', () => {
  // No rule: the runtime reads only names ending .conf, .conflist or .json (libcni's ConfFiles),
  // which the orchconfig's may not, so where it sorts protects nothing.
  const BRIDGE_CONF = `${JSON.stringify({ cniVersion: '0.3.1', name: 'bridge-net', type: 'bridge', bridge: 'mcni-br0' }, null, 2)}\n`;
  for (const [primary, text, conflist] of [
    ['bridge.conf', BRIDGE_CONF, 'bridge.conflist'],
    ['calico.conflist', BRIDGE_CONFLIST, 'calico.conflist'],
  ] as const) {
    it(`installs with the default ZZZ-mesh-cni-orchconfig beside ${primary}, which sorts after it`, async () => {
      const { installer, tree } = await start(
        () => ({}),
        async (t) => {
          await fs.writeFile(path.join(t.netDir, primary), text);
        },
      );
      assert.deepEqual(installer.notReadyReasons(), []);
      assert.equal(statSync(path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig')).mode & 0o7777, 0o600);
      const written = JSON.parse(readFileSync(path.join(tree.netDir, conflist), 'utf8')) as {
        plugins: { type: string; orch?: { orchconfig?: string } }[];
      };
      assert.deepEqual(
        written.plugins.map((p) => p.type),
        ['bridge', 'mesh-cni'],
      );
      assert.equal(written.plugins[1]!.orch?.orchconfig, '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig');
      assert.ok(statSync(path.join(tree.binDir, 'mesh-cni')).isFile());
    });
  }

  it('installs with a name that sorts before every config (05-mesh-orchconfig beside 10-bridge.conflist)', async () => {
    const { installer, tree } = await start(
      () => ({ 'orchcfg-file-name': '05-mesh-orchconfig' }),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      },
    );
    assert.deepEqual(installer.notReadyReasons(), []);
    assert.ok(statSync(path.join(tree.netDir, '05-mesh-orchconfig')).isFile());
    assert.match(readFileSync(path.join(tree.netDir, '10-bridge.conflist'), 'utf8'), /"type": "mesh-cni"/);
  });
});

describe('reasons name files and errors, never contents', () => {
  it('an unparseable primary holding a token', async () => {
    const { installer } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), SECRET);
      },
    );
    const said = everything(installer);
    assert.match(said, /10-bridge\.conflist: not valid JSON/);
    assert.doesNotMatch(said, /eyJ|c2Vj|sig/);
  });

  it('an unparseable primary with the token after a valid start', async () => {
    const { installer } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), `{"cniVersion": "1.0.0", "name": ${SECRET}}`);
      },
    );
    const said = everything(installer);
    assert.match(said, /10-bridge\.conflist: not valid JSON/);
    assert.doesNotMatch(said, /eyJ|c2Vj|cniVersion/);
  });

  it('a template file holding a token (--cni-network-config-file pointed at the wrong file)', async () => {
    const { installer } = await start(
      (t) => ({ 'cni-network-config-file': path.join(t.root, 'token-by-mistake') }),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        await fs.writeFile(path.join(t.root, 'token-by-mistake'), SECRET);
      },
    );
    const said = everything(installer);
    assert.match(
      said,
      /cannot parse the CNI network config template from .*token-by-mistake: not valid JSON5 \(invalid character at line 1 column 1\)/,
    );
    assert.doesNotMatch(said, /eyJ|'e'/);
  });
});

describe('the net dir is writable by others: nothing found there steers a write elsewhere', () => {
  const evil = `${JSON.stringify({ cniVersion: '0.3.1', name: 'evil', plugins: [{ type: 'bridge' }, { type: 'mesh-cni' }] })}\n`;
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  async function plant(tree: HostTree, record: object): Promise<string> {
    const victim = path.join(tree.binDir, 'victim');
    await fs.writeFile(victim, 'ORIGINAL BINARY\n', { mode: 0o755 });
    await fs.writeFile(path.join(tree.netDir, '.99-evil.conflist.mesh-original'), JSON.stringify(record));
    await fs.writeFile(path.join(tree.netDir, '99-evil.conflist'), evil);
    return victim;
  }
  async function pass(installer: Installer): Promise<void> {
    installer.schedule('periodic');
    await installer.settled();
  }

  it('a planted record naming another file (a link to a binary) is not followed: the victim keeps its bytes and mode', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      },
    );
    const victim = await plant(tree, {
      name: '50-x.conf',
      text: '#!/bin/sh\necho pwned\n',
      written: sha(evil),
      mode: 0o755,
      uid: 0,
      gid: 0,
    });
    await fs.symlink(victim, path.join(tree.netDir, '50-x.conf'));
    await pass(installer);
    assert.equal(readFileSync(victim, 'utf8'), 'ORIGINAL BINARY\n');
    assert.equal(statSync(victim).mode & 0o7777, 0o755);
    // The planted conflist is handled as any other file holding our entry: the entry taken out.
    assert.doesNotMatch(readFileSync(path.join(tree.netDir, '99-evil.conflist'), 'utf8'), /mesh-cni/);
    assert.ok(lstatSync(path.join(tree.netDir, '50-x.conf')).isSymbolicLink());
  });

  it('a record naming the .conf of its conflist is given back in the net dir itself, never through a link, and never executable', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      },
    );
    const conf = `${JSON.stringify({ cniVersion: '0.3.1', name: 'evil', type: 'bridge' })}\n`;
    const victim = await plant(tree, {
      name: '99-evil.conf',
      text: conf,
      written: sha(evil),
      mode: 0o6777,
      uid: 12345,
      gid: 12345,
    });
    await fs.symlink(victim, path.join(tree.netDir, '99-evil.conf'));
    await pass(installer);
    assert.equal(readFileSync(victim, 'utf8'), 'ORIGINAL BINARY\n');
    assert.equal(statSync(victim).mode & 0o7777, 0o755);
    const back = lstatSync(path.join(tree.netDir, '99-evil.conf'));
    assert.ok(back.isFile(), 'the planted link is replaced by a regular file');
    assert.equal(readFileSync(path.join(tree.netDir, '99-evil.conf'), 'utf8'), conf);
    assert.equal(back.mode & 0o7777, 0o644);
    // Not the owner the record names: the owner of the conflist it replaces (root here).
    assert.equal(back.uid, 0);
  });

  it('the orchconfig replaced by a link to a file with its bytes: the link is replaced, the file it points to is not chmodded', async () => {
    const { installer, tree } = await start(
      () => ({}),
      async (t) => {
        await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      },
    );
    const orchconfig = path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig');
    const elsewhere = path.join(tree.root, 'elsewhere');
    await fs.writeFile(elsewhere, readFileSync(orchconfig), { mode: 0o644 });
    await fs.chmod(elsewhere, 0o644);
    await fs.rm(orchconfig);
    await fs.symlink(elsewhere, orchconfig);
    await pass(installer);
    assert.equal(statSync(elsewhere).mode & 0o7777, 0o644);
    const st = lstatSync(orchconfig);
    assert.ok(st.isFile());
    assert.equal(st.mode & 0o7777, 0o600);
  });
});

describe('an orchconfig from before the plugin had a token of its own', () => {
  /** Installer with the plugin's token not to be had (minting failing: the file source, file gone). */
  async function startWithoutPluginToken(
    orchconfigText: (tree: HostTree) => string,
    agentToken?: string,
  ): Promise<{ installer: Installer; tree: HostTree; orchconfig: string }> {
    const tree = await makeHostTree();
    if (agentToken !== undefined) await tree.rotate({ token: agentToken });
    await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const orchconfig = path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig');
    await fs.writeFile(orchconfig, orchconfigText(tree), { mode: 0o600 });
    await fs.rm(path.join(tree.root, 'plugin-token'));
    const settings = buildSettings({ 'reconcile-interval': '1h', ...tree.flags }, tree.env);
    const pluginToken = fileTokenSource(path.join(tree.root, 'plugin-token'), path.join(tree.saDir, 'token'));
    const installer = new Installer(installerArgs(settings), {
      decideCleanup: async () => ({ cleanup: true, why: 'test' }),
      pluginToken,
    });
    running.push({ installer, tree });
    await installer.start();
    await installer.settled();
    return { installer, tree, orchconfig };
  }
  const preFix = (token: string) =>
    `${JSON.stringify({ apiVersion: 'v1', kind: 'Config', users: [{ name: 'mesh-cni', user: { token } }] }, null, 2)}\n`;

  it("one holding the agent's own token is removed while no plugin token can be had (the plugin then fails closed)", async () => {
    const { installer, orchconfig } = await startWithoutPluginToken(() => preFix('token-1'));
    assert.match(installer.notReadyReasons().join('\n'), /plugin's token file .* cannot be read: ENOENT/);
    assert.equal(await fs.stat(orchconfig).catch(() => null), null, "the agent's token is off the node's disk");
  });

  // Tokens as the kubelet projects them: each agent pod gets its own, of the agent's account.
  const agentPodToken = (pod: string) =>
    unsignedJwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni', 'kubernetes.io': { pod: { name: pod } } });

  it("one holding the previous agent pod's token (the agent's account, other bytes: an upgrade) is removed", async () => {
    const { installer, orchconfig } = await startWithoutPluginToken(
      () => preFix(agentPodToken('mesh-cni-old')),
      agentPodToken('mesh-cni-new'),
    );
    assert.match(installer.notReadyReasons().join('\n'), /plugin's token file .* cannot be read: ENOENT/);
    assert.equal(
      await fs.stat(orchconfig).catch(() => null),
      null,
      "the agent's account's token is off the node's disk",
    );
  });

  it("one holding a token of the plugin's account (an earlier one, maybe still valid) is left", async () => {
    const earlier = preFix(unsignedJwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni-plugin' }));
    const { orchconfig } = await startWithoutPluginToken(() => earlier, agentPodToken('mesh-cni-new'));
    assert.equal(readFileSync(orchconfig, 'utf8'), earlier);
  });

  it("a file of another shape at the orchconfig's name (another tool's kubeconfig) is left, whatever token it names", async () => {
    const foreign = [
      'apiVersion: v1',
      'kind: Config',
      'users:',
      '- name: other-tool',
      `  user: { token: ${agentPodToken('mesh-cni-old')} }`,
      '',
    ].join('\n');
    const { orchconfig } = await startWithoutPluginToken(() => foreign, agentPodToken('mesh-cni-new'));
    assert.equal(readFileSync(orchconfig, 'utf8'), foreign);
  });

  it('one holding another token (an earlier plugin token) is left until a new one comes', async () => {
    const { installer, orchconfig } = await startWithoutPluginToken(() => preFix('plugin-token-0'));
    assert.match(installer.notReadyReasons().join('\n'), /plugin's token file .* cannot be read: ENOENT/);
    assert.equal(readFileSync(orchconfig, 'utf8'), preFix('plugin-token-0'));
  });
});

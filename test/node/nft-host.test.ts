// The native nftables backend's selection (docs/plugin.md "Native nftables"): --native-nftables
// auto|true|false and the node's nft and kernel, checked once at start. The decision is a pure
// function over the facts (table tests); the probe runs stub nft programs from a temp dir and
// this machine's own nft. The running agent with the choice: nft-backend.test.ts.

import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import {
  decideBackend,
  hostProblems,
  parseNftVersion,
  parseTableList,
  versionAtLeast,
  type NftHostFacts,
} from '../../src/install/nfthost.ts';
import { probeNftHost } from '../../src/install/nftprobe.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { runBin } from '../helpers/cli.ts';

const defer = cleanupAfterEach();

/** A host that can: nft 1.0.6 with JSON, nf_tables answering, no tables yet. */
const CAPABLE: NftHostFacts = {
  nftPath: '/usr/sbin/nft',
  nftVersion: '1.0.6',
  nftError: null,
  jsonError: null,
  tables: [],
  tablesError: null,
  legacyTables: [],
};
const KUBE_PROXY_NFT: NftHostFacts = { ...CAPABLE, tables: ['ip kube-proxy', 'ip6 kube-proxy', 'ip mangle'] };
const MISSING: NftHostFacts = {
  ...CAPABLE,
  nftPath: null,
  nftVersion: null,
  nftError: 'nft is not in /usr/sbin, /sbin',
  jsonError: null,
  tables: null,
  tablesError: null,
};
const OLD: NftHostFacts = { ...KUBE_PROXY_NFT, nftVersion: '0.9.8' };
const NO_JSON: NftHostFacts = { ...KUBE_PROXY_NFT, jsonError: 'Error: JSON support not compiled-in' };
const NO_KERNEL: NftHostFacts = { ...CAPABLE, tables: null, tablesError: 'Error: Protocol not supported' };

describe('the redirect backend, from --native-nftables and the host (pure)', () => {
  const FIX = /install nftables >= 1\.0\.1 built with JSON support .*or set --native-nftables=false/;
  const cases: [string, 'auto' | 'true' | 'false', NftHostFacts | null, 'nftables' | 'iptables', RegExp, boolean][] = [
    ['false: iptables, no probe needed', 'false', null, 'iptables', /--native-nftables=false/, false],
    ['false: iptables even on a host that can', 'false', KUBE_PROXY_NFT, 'iptables', /--native-nftables=false/, false],
    ['true on a host that can', 'true', CAPABLE, 'nftables', /nft 1\.0\.6 .*JSON/, false],
    ['true without nft: not ready', 'true', MISSING, 'nftables', /nft is not in/, true],
    ['true with nft 0.9.8: not ready', 'true', OLD, 'nftables', /nft 0\.9\.8 .* older than 1\.0\.1/, true],
    ['true with nft without JSON: not ready', 'true', NO_JSON, 'nftables', /JSON support not compiled-in/, true],
    ['true where nf_tables does not answer: not ready', 'true', NO_KERNEL, 'nftables', /Protocol not supported/, true],
    ['auto with kube-proxy in nftables mode', 'auto', KUBE_PROXY_NFT, 'nftables', /kube-proxy/, false],
    [
      'auto with kube-proxy in an inet table',
      'auto',
      { ...CAPABLE, tables: ['inet kube-proxy'] },
      'nftables',
      /inet kube-proxy/,
      false,
    ],
    [
      'auto on a firewall of nftables alone',
      'auto',
      { ...CAPABLE, tables: ['inet filter', 'inet firewalld'] },
      'nftables',
      /nftables alone/,
      false,
    ],
    [
      'auto with iptables-nft tables',
      'auto',
      { ...CAPABLE, tables: ['inet filter', 'ip filter', 'ip nat'] },
      'iptables',
      /iptables-nft tables: ip filter, ip nat/,
      false,
    ],
    [
      'auto with legacy iptables tables',
      'auto',
      { ...CAPABLE, tables: ['inet filter'], legacyTables: ['nat', 'filter'] },
      'iptables',
      /legacy iptables tables: nat, filter/,
      false,
    ],
    ['auto on a node with no tables at all', 'auto', CAPABLE, 'iptables', /no kube-proxy nftables table/, false],
    ['auto where nft is missing', 'auto', MISSING, 'iptables', /cannot run native nftables: nft is not in/, false],
    ['auto with nft 0.9.8, even with kube-proxy', 'auto', OLD, 'iptables', /older than 1\.0\.1/, false],
    ['auto with nft without JSON', 'auto', NO_JSON, 'iptables', /JSON/, false],
  ];
  for (const [name, mode, facts, backend, why, notReady] of cases) {
    it(name, () => {
      const c = decideBackend(mode, facts);
      assert.equal(c.backend, backend, c.why);
      assert.match(c.why, why);
      if (notReady) {
        assert.match(c.notReady ?? '', /^--native-nftables=true, but this node cannot run native nftables: /);
        assert.match(c.notReady ?? '', why);
        assert.match(c.notReady ?? '', FIX);
      } else assert.equal(c.notReady, null);
    });
  }

  it('true or auto without facts (no probe ran) is a bug, not a choice', () => {
    assert.throws(() => decideBackend('true', null), /internal/);
    assert.throws(() => decideBackend('auto', null), /internal/);
  });

  it('lists every problem of a host at once', () => {
    const p = hostProblems({ ...OLD, jsonError: 'no JSON', tables: null, tablesError: 'EPERM' });
    assert.equal(p.length, 3, p.join('\n'));
  });

  it('reads the version nft prints, and compares versions as numbers', () => {
    assert.equal(parseNftVersion('nftables v1.0.6 (Lester Gooch #5)\n'), '1.0.6');
    assert.equal(parseNftVersion('nftables v0.9.8 (E.D.S.)'), '0.9.8');
    assert.equal(parseNftVersion('nftables v1.1 (Commodore Bullmoose)'), '1.1.0');
    assert.equal(parseNftVersion('nftables v1.0.10 (x)'), '1.0.10');
    assert.equal(parseNftVersion('Usage: nft [ options ]'), null);
    assert.equal(parseNftVersion(''), null);
    assert.equal(versionAtLeast('1.0.1', '1.0.1'), true);
    assert.equal(versionAtLeast('1.0.10', '1.0.1'), true);
    assert.equal(versionAtLeast('1.1.0', '1.0.1'), true);
    assert.equal(versionAtLeast('1.0.0', '1.0.1'), false);
    assert.equal(versionAtLeast('0.9.8', '1.0.1'), false);
  });

  it('reads `nft list tables` as family and name', () => {
    assert.deepEqual(parseTableList('table ip kube-proxy\ntable ip6 kube-proxy\n\ntable inet filter\n'), [
      'ip kube-proxy',
      'ip6 kube-proxy',
      'inet filter',
    ]);
    assert.deepEqual(parseTableList('# Warning: table ip nat is managed by iptables-nft\ngarbage\n'), []);
  });
});

/** A dir holding one `nft` stub with this shell body; removed after the test. */
async function stubDir(body: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mesh-cni-nft-'));
  defer(() => rm(dir, { recursive: true, force: true }));
  const nft = path.join(dir, 'nft');
  await writeFile(nft, `#!/bin/sh\n${body}\n`);
  await chmod(nft, 0o755);
  return dir;
}

/** A /proc/net stand-in with no legacy iptables tables. */
async function procNet(legacy: string[] = []): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mesh-cni-procnet-'));
  defer(() => rm(dir, { recursive: true, force: true }));
  await writeFile(path.join(dir, 'ip_tables_names'), legacy.map((t) => `${t}\n`).join(''));
  await writeFile(path.join(dir, 'ip6_tables_names'), '');
  return dir;
}

/** An nft of `version` whose `-j` and `list tables` answer as given. */
const nftLike = (version: string, json: string, tables: string) =>
  [
    'case "$*" in',
    `  --version) echo "nftables v${version} (stub)" ;;`,
    `  "-j list tables") ${json} ;;`,
    `  "list tables") ${tables} ;;`,
    '  *) echo "unexpected: $*" >&2; exit 64 ;;',
    'esac',
  ].join('\n');
const JSON_OK = `echo '{"nftables": [{"metainfo": {"version": "x", "json_schema_version": 1}}]}'`;

describe('probing the host for nft', () => {
  it('finds no nft: not capable, and says where it looked', async () => {
    const empty = await stubDir('exit 0');
    await rm(path.join(empty, 'nft'));
    const f = await probeNftHost({ dirs: [empty], procNet: await procNet() });
    assert.equal(f.nftPath, null);
    assert.match(hostProblems(f).join('; '), new RegExp(`no nft in ${empty}`));
  });

  it('nft v0.9.8: too old', async () => {
    const dir = await stubDir(nftLike('0.9.8', JSON_OK, 'echo "table ip kube-proxy"'));
    const f = await probeNftHost({ dirs: [dir], procNet: await procNet() });
    assert.equal(f.nftVersion, '0.9.8');
    assert.match(hostProblems(f).join('; '), /nft 0\.9\.8 .* older than 1\.0\.1/);
    assert.equal(decideBackend('auto', f).backend, 'iptables');
  });

  it('an nft built without JSON, whose -j fails: not capable', async () => {
    const noJson = 'echo "Error: JSON support not compiled-in" >&2; exit 1';
    const dir = await stubDir(nftLike('1.0.6', noJson, 'echo "table ip kube-proxy"'));
    const f = await probeNftHost({ dirs: [dir], procNet: await procNet() });
    assert.equal(f.nftVersion, '1.0.6');
    assert.match(f.jsonError ?? '', /JSON support not compiled-in/);
    assert.equal(hostProblems(f).length, 1, hostProblems(f).join('; '));
  });

  it('an nft that hangs is killed at its time limit and counts as not capable', async () => {
    const dir = await stubDir('exec sleep 600');
    const f = await probeNftHost({ dirs: [dir], procNet: await procNet(), timeoutMs: 300 });
    assert.equal(f.nftVersion, null);
    assert.match(f.nftError ?? '', /did not finish within 300 ms/);
    assert.equal(decideBackend('true', f).notReady !== null, true);
  });

  it('an nft that crashes with SIGSEGV counts as not capable', async () => {
    const dir = await stubDir('kill -SEGV $$');
    const f = await probeNftHost({ dirs: [dir], procNet: await procNet() });
    assert.equal(f.nftVersion, null);
    assert.match(f.nftError ?? '', /killed by a signal/);
    assert.equal(decideBackend('auto', f).backend, 'iptables');
  });

  it("a capable nft with kube-proxy's table, and legacy tables read from /proc/net", async () => {
    const dir = await stubDir(nftLike('1.0.6', JSON_OK, 'printf "table ip kube-proxy\\ntable ip filter\\n"'));
    const f = await probeNftHost({ dirs: [dir], procNet: await procNet(['nat']) });
    assert.deepEqual(hostProblems(f), []);
    assert.deepEqual(f.tables, ['ip kube-proxy', 'ip filter']);
    assert.deepEqual(f.legacyTables, ['nat']);
    assert.equal(decideBackend('auto', f).backend, 'nftables');
  });

  it("this machine's nft (Debian's, >= 1.0.1 with JSON) and kernel are capable", async () => {
    const f = await probeNftHost({ dirs: ['/usr/sbin'] });
    assert.deepEqual(hostProblems(f), [], JSON.stringify(f));
    assert.equal(f.nftPath, '/usr/sbin/nft');
    assert.ok(versionAtLeast(f.nftVersion!, '1.0.1'), f.nftVersion!);
    assert.equal(decideBackend('true', f).notReady, null);
  });
});

describe('--native-nftables', () => {
  it('takes auto, true or false (Istio spellings of booleans too), default false, from the flag or NATIVE_NFTABLES', () => {
    assert.equal(buildSettings({}, {}).install.nativeNftables, 'false');
    assert.equal(buildSettings({ 'native-nftables': 'auto' }, {}).install.nativeNftables, 'auto');
    assert.equal(buildSettings({}, { NATIVE_NFTABLES: 'true' }).install.nativeNftables, 'true');
    assert.equal(buildSettings({}, { NATIVE_NFTABLES: 'True' }).install.nativeNftables, 'true');
    assert.equal(buildSettings({}, { NATIVE_NFTABLES: '0' }).install.nativeNftables, 'false');
    assert.throws(
      () => buildSettings({ 'native-nftables': 'maybe' }, {}),
      /invalid value "maybe" for --native-nftables: expected auto, true or false/,
    );
    assert.throws(() => buildSettings({}, { NATIVE_NFTABLES: 'nft' }), /invalid value "nft" for env NATIVE_NFTABLES/);
  });

  it('the agent refuses to start with a malformed --native-nftables, saying which values it takes', async () => {
    const r = await runBin('install-cni', ['--native-nftables=yes-please']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /invalid value "yes-please" for --native-nftables: expected auto, true or false/);
  });
});

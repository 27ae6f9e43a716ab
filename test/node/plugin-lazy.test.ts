// The short calls do only their own work (docs/design.md "Start-up time"): which of our modules and
// which Node built-ins each call loads, seen from inside the process.
//   - from source: a module hook records every cni-plugin/ file Node loads;
//   - from the shipped bundle (dist/mesh-cni.cjs, what every executable runs): the built-ins
//     required, so esbuild's lazy initializers are checked to really skip the work.
// VERSION loads no command code; an excluded-namespace ADD no lookup, flavour or iptables code;
// DEL of a gone netns neither the log socket nor the commands; DEL with the netns there no lookup.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ROOT } from '../helpers/cli.ts';
import { cniEnv, Netns, run, type ChainEnv } from '../helpers/netns.ts';
import { pluginConfig, tempDir } from '../helpers/plugin.ts';

// Preloaded into the plugin's process: at exit, writes what was loaded to $MESH_TEST_LOADED.
const RECORD_HOOK = `
import { registerHooks } from 'node:module';
import { writeFileSync } from 'node:fs';
const ours = [];
const builtinsBefore = new Set(process.moduleLoadList);
registerHooks({ load(url, context, next) { if (url.includes('/cni-plugin/')) ours.push(url.slice(url.indexOf('/cni-plugin/') + 1)); return next(url, context); } });
process.on('exit', () => writeFileSync(process.env.MESH_TEST_LOADED, JSON.stringify({ ours, builtins: process.moduleLoadList.filter((m) => !builtinsBefore.has(m) && m.startsWith('NativeModule ') && !m.startsWith('NativeModule internal/')).map((m) => m.slice(13)) })));
`;

const LOOKUP = ['cni-plugin/orch/agentlookup.ts', 'cni-plugin/orch/podclient.ts'];
const RULES = [
  'cni-plugin/netns/iptables.ts',
  'cni-plugin/netns/exec.ts',
  'cni-plugin/netns/flavourcache.ts',
  'cni-plugin/redirect/rules.ts',
  'cni-plugin/redirect/iptables.ts',
];
const COMMANDS = ['cni-plugin/plugin.ts', 'cni-plugin/log/udslog.ts'];
const SPAWN_AND_TLS = ['child_process', 'https', 'tls', 'http'];

interface Loaded {
  readonly ours: string[];
  readonly builtins: string[];
}

describe('mesh-cni short calls load only what they use', () => {
  const tmp = tempDir();
  let hook: string;
  before(() => {
    const r = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], {
      encoding: 'utf8',
      cwd: ROOT,
      env: { ...process.env, MESH_SEA: '0' },
    });
    assert.equal(r.status, 0, r.stderr);
    hook = path.join(tmp.dir, 'record.mjs');
    writeFileSync(hook, RECORD_HOOK);
  });
  after(() => tmp.remove());

  /** Runs one call from source (`bin/mesh-cni.js`) or the bundle, with the recording hook. */
  async function call(
    from: 'source' | 'bundle',
    command: string,
    chain: ChainEnv,
    stdin: unknown,
  ): Promise<{ code: number | null; stdout: string; loaded: Loaded }> {
    const out = path.join(tmp.dir, `loaded-${from}-${command}-${Date.now()}.json`);
    const entry = from === 'source' ? path.join(ROOT, 'bin/mesh-cni.js') : path.join(ROOT, 'dist/mesh-cni.cjs');
    const r = await run(process.execPath, ['--import', hook, entry], {
      env: cniEnv(command, chain, { MESH_TEST_LOADED: out }),
      input: JSON.stringify(stdin),
    });
    return { code: r.code, stdout: r.stdout + r.stderr, loaded: JSON.parse(readFileSync(out, 'utf8')) as Loaded };
  }

  const none = (loaded: readonly string[], banned: readonly string[]) => loaded.filter((m) => banned.includes(m));
  const conf = (extra: Record<string, unknown> = {}) =>
    pluginConfig(
      { cniVersion: '1.0.0', orchconfig: path.join(tmp.dir, 'no-orchconfig'), extra },
      { cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '198.18.7.2/24', interface: 0 }] },
    );

  for (const from of ['source', 'bundle'] as const) {
    it(`VERSION (${from}): none of the command, lookup or rules code, and no built-in beyond what Node starts with`, async () => {
      const r = await call(
        from,
        'VERSION',
        { containerId: '', netns: '', ifname: '', args: '' },
        { cniVersion: '1.0.0' },
      );
      assert.equal(r.code, 0, r.stdout);
      assert.deepEqual(none(r.loaded.ours, [...COMMANDS, ...LOOKUP, ...RULES]), []);
      assert.deepEqual(
        r.loaded.builtins,
        [],
        'VERSION needs no built-in Node has not loaded at start (node:net, node:v8, node:tty, streams...)',
      );
    });

    it(`ADD of a pod in an excluded namespace (${from}): no lookup, flavour or iptables code, no spawn, no TLS`, async () => {
      const ns = new Netns('lazy');
      try {
        const chain = {
          containerId: 'lazy1',
          netns: ns.path,
          ifname: 'eth0',
          args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns;K8S_POD_UID=u1',
        };
        const r = await call(
          from,
          'ADD',
          chain,
          conf({ iptables_flavour: 'auto', pod_lookup_uds_address: path.join(tmp.dir, 'pods.sock') }),
        );
        assert.equal(r.code, 0, r.stdout);
        assert.deepEqual(none(r.loaded.ours, [...LOOKUP, ...RULES]), []);
        assert.deepEqual(none(r.loaded.builtins, SPAWN_AND_TLS), []);
      } finally {
        ns.remove();
      }
    });

    it(`DEL of a netns that is gone (${from}): answers, loading neither the log socket nor the commands`, async () => {
      const chain = {
        containerId: 'lazy2',
        netns: `/run/netns/mcni-plg-${process.pid}-gone`,
        ifname: 'eth0',
        args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME=web;K8S_POD_UID=u2',
      };
      const r = await call(from, 'DEL', chain, conf({ log_uds_address: path.join(tmp.dir, 'log.sock') }));
      assert.equal(r.code, 0, r.stdout);
      assert.equal(r.stdout, '');
      assert.deepEqual(none(r.loaded.ours, [...COMMANDS, ...LOOKUP, ...RULES]), []);
      assert.deepEqual(none(r.loaded.builtins, ['net', ...SPAWN_AND_TLS]), []);
    });

    it(`DEL with the netns there (${from}): removes our rules with no lookup and no TLS`, async () => {
      const ns = new Netns('lazy');
      try {
        const chain = {
          containerId: 'lazy3',
          netns: ns.path,
          ifname: 'eth0',
          args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME=web;K8S_POD_UID=u3',
        };
        const r = await call(from, 'DEL', chain, conf({ pod_lookup_uds_address: path.join(tmp.dir, 'pods.sock') }));
        assert.equal(r.code, 0, r.stdout);
        assert.deepEqual(none(r.loaded.ours, LOOKUP), []);
        assert.ok(
          r.loaded.ours.length === 0 || r.loaded.ours.includes('cni-plugin/netns/iptables.ts'),
          'the iptables code runs',
        );
        assert.deepEqual(none(r.loaded.builtins, ['https', 'tls', 'http']), []);
      } finally {
        ns.remove();
      }
    });
  }
});

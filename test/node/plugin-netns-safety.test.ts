// What mesh-cni may touch (docs/security.md "Security: the trust model"): only the netns of the pod
// it was called for, and there only its own chains and its one jump from each builtin chain. -
// Rules someone else put in the pod netns (another chained plugin, the pod itself), in every
//   table, survive our ADD, a second ADD and our DEL, on both iptables flavours; CHECK still
//   passes with them there.
// - A CNI_NETNS that is the plugin's own netns or PID 1's is refused for ADD, CHECK and DEL.
//   Those cases run the plugin inside throwaway netns (and, for PID 1, a throwaway PID
//   namespace): were the guard missing, only those would change, never this machine's netns.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { notAPodNetns } from '../../cni-plugin/netns/guard.ts';
import { applyRules, diffRules, parseRules, removeRules, restore, save } from '../../cni-plugin/netns/iptables.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../cni-plugin/redirect/spec.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BridgeNetwork, cniEnv, Netns, run, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { eventually } from '../helpers/poll.ts';
import { podLookupArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const FLAVOURS = ['nft', 'legacy'] as const;
type Flavour = (typeof FLAVOURS)[number];

/**
 * Rules of others in every table, builtin chains and chains of their own, as another chained
 * plugin or a pod's NET_ADMIN init container would leave them.
 */
const FOREIGN_RULES = `*filter
:FOREIGN_FILTER - [0:0]
-A INPUT -p tcp -m tcp --dport 2222 -j DROP
-A OUTPUT -j FOREIGN_FILTER
-A FOREIGN_FILTER -p udp -m udp --dport 9 -j ACCEPT
COMMIT
*nat
:FOREIGN_NAT - [0:0]
-A PREROUTING -p udp -j FOREIGN_NAT
-A OUTPUT -p udp -m udp --dport 5353 -j RETURN
-A POSTROUTING -o eth0 -j MASQUERADE
-A FOREIGN_NAT -p udp -m udp --dport 7 -j RETURN
COMMIT
*mangle
:FOREIGN_MANGLE - [0:0]
-A PREROUTING -j FOREIGN_MANGLE
-A OUTPUT -p udp -j MARK --set-xmark 0x7/0xffffffff
-A FOREIGN_MANGLE -p udp -m udp --dport 7 -j RETURN
COMMIT
*raw
:FOREIGN_RAW - [0:0]
-A PREROUTING -p udp -m udp --dport 7 -j FOREIGN_RAW
-A OUTPUT -p udp -m udp --dport 7 -j CT --notrack
-A FOREIGN_RAW -j RETURN
COMMIT
`;

/** iptables-save without its comments and counters: what a rule set is. */
function rulesOf(ns: Netns, flavour: Flavour, family: 4 | 6 = 4): string[] {
  const bin = `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-save`;
  return ns
    .exec([bin])
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ''));
}

const withoutOurs = (lines: string[]) => lines.filter((l) => !l.includes('MESH_'));

/** A pod the agent's watch has, so the plugin needs no route to the API server (the throwaway netns has none). */
function nodePod(ns: string, name: string, annotations: Record<string, string> = {}, env: Record<string, string> = {}) {
  const pod = meshPod(ns, name, annotations);
  const containers = pod.spec!.containers.map((c) =>
    c.name === 'mesh-proxy' ? { ...c, env: Object.entries(env).map(([n, value]) => ({ name: n, value })) } : c,
  );
  return { ...pod, spec: { ...pod.spec!, containers, nodeName: 'node-1' } };
}

describe('mesh-cni leaves rules that are not its own alone', () => {
  const tmp = tempDir();
  let api: TestApiServer;
  let network: BridgeNetwork;
  let orchconfig: string;
  const pods: Netns[] = [];
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    network = new BridgeNetwork('198.18.7.0/24');
  });
  after(async () => {
    for (const p of pods) p.remove();
    network?.cleanup();
    await api?.close();
    tmp.remove();
  });

  for (const flavour of FLAVOURS) {
    it(`${flavour}: foreign rules in filter, nat, mangle and raw survive ADD, a second ADD, CHECK and DEL`, async () => {
      // TPROXY with DNS capture: our chains in nat, mangle and raw.
      const pod = api.upsertPod(
        nodePod(
          'shop',
          `foreign-${flavour}`,
          { 'sidecar.mesh.io/interceptionMode': 'TPROXY' },
          { MESH_META_DNS_CAPTURE: 'true' },
        ),
      );
      const ns = new Netns('pod');
      pods.push(ns);
      const chain: ChainEnv = {
        containerId: `ctr${process.pid}f${++n}`,
        netns: ns.path,
        ifname: 'eth0',
        args: k8sArgs(pod, `ctr${process.pid}f${n}`),
      };
      const prev = await network.addPod(chain);
      ns.exec([`iptables-${flavour}-restore`], FOREIGN_RULES);
      const theirs = rulesOf(ns, flavour);
      assert.ok(theirs.includes('-A FOREIGN_NAT -p udp -m udp --dport 7 -j RETURN'), theirs.join('\n'));
      const stdin = pluginConfig({ cniVersion: '1.0.0', orchconfig, extra: { iptables_flavour: flavour } }, prev);

      for (const step of ['ADD', 'second ADD']) {
        const add = await meshCni('ADD', chain, stdin);
        assert.equal(add.code, 0, `${step}: ${add.stdout}${add.stderr}`);
        const now = rulesOf(ns, flavour);
        assert.deepEqual(
          withoutOurs(now),
          theirs,
          `${step}: every foreign rule and chain is still there, unchanged and in order`,
        );
        for (const [table, builtin] of [
          ['nat', 'OUTPUT'],
          ['mangle', 'PREROUTING'],
          ['mangle', 'OUTPUT'],
          ['raw', 'OUTPUT'],
          ['raw', 'PREROUTING'],
        ]) {
          const section = ns
            .exec([`iptables-${flavour}-save`, '-t', table!])
            .split('\n')
            .filter((l) => l.startsWith(`-A ${builtin} `));
          assert.equal(
            section.filter((l) => l === `-A ${builtin} -j MESH_${builtin}`).length,
            1,
            `${step}: one jump of ours in ${table} ${builtin}`,
          );
          assert.equal(
            section[0],
            `-A ${builtin} -j MESH_${builtin}`,
            `${step}: our jump comes first in ${table} ${builtin}`,
          );
        }
      }

      const check = await meshCni('CHECK', chain, stdin);
      assert.equal(check.code, 0, `CHECK with foreign rules there: ${check.stdout}${check.stderr}`);

      const del = await meshCni('DEL', chain, stdin);
      assert.equal(del.code, 0, del.stdout + del.stderr);
      assert.deepEqual(rulesOf(ns, flavour), theirs, 'DEL takes out exactly what ADD put in');
    });
  }
});

describe("mesh-cni refuses a netns that is not a pod's", () => {
  const tmp = tempDir();
  const socket = () => path.join(tmp.dir, 'run/pods.sock');
  let api: TestApiServer;
  let lookup: Component;
  const spaces: Netns[] = [];
  const MARKER = '-A OUTPUT -p udp -m udp --dport 9 -j RETURN';

  before(async () => {
    api = await startTestApiServer();
    const orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'agent-orchconfig'));
    lookup = await startPodLookup(
      podLookupArgs(buildSettings({ 'pod-lookup-uds-address': socket(), orchconfig }, { NODE_NAME: 'node-1' })),
    );
    await eventually(() => (lookup.status() as { state: string }).state === 'watching', 'the pod watch');
  });
  after(async () => {
    for (const s of spaces) s.remove();
    await lookup?.stop('SIGTERM');
    await api?.close();
    tmp.remove();
  });

  /** A throwaway netns with a foreign rule and (for DEL) a chain of ours in it: what must stay. */
  function throwaway(tag: string): Netns {
    const ns = new Netns(tag);
    spaces.push(ns);
    ns.exec(
      ['iptables-nft-restore', '--noflush'],
      `*nat\n:MESH_OUTPUT - [0:0]\n${MARKER}\n-A OUTPUT -j MESH_OUTPUT\n-A MESH_OUTPUT -p tcp -j RETURN\nCOMMIT\n`,
    );
    return ns;
  }

  function stdin() {
    const prev = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: 'x' }],
      ips: [{ address: '198.18.8.5/24', interface: 0 }],
    };
    return pluginConfig(
      {
        cniVersion: '1.0.0',
        orchconfig: path.join(tmp.dir, 'no-orchconfig'),
        extra: { pod_lookup_uds_address: socket() },
      },
      prev,
    );
  }

  /** Runs the plugin with argv prefixed (netns / pid namespace entry), as a runtime would run it. */
  async function plugin(command: string, cniNetns: string, prefix: readonly string[]) {
    const pod = api.upsertPod(nodePod('shop', 'hostile'));
    const chain: ChainEnv = {
      containerId: `ctr${process.pid}h`,
      netns: cniNetns,
      ifname: 'eth0',
      args: k8sArgs(pod, `ctr${process.pid}h`),
    };
    return run(prefix[0]!, [...prefix.slice(1), ...MESH_CNI_SOURCE], {
      env: cniEnv(command, chain),
      input: JSON.stringify(stdin()),
    });
  }

  it('a CNI_NETNS that is no netns (a FIFO, a directory, a plain file): ADD and CHECK refused with code 4 saying what it is; DEL has nothing to do', async () => {
    const dir = mkdtempSync(path.join(tmp.dir, 'not-netns-'));
    const fifo = path.join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    const directory = path.join(dir, 'dir');
    mkdirSync(directory);
    // What a runtime's netns file is once unmounted: an empty file.
    const file = path.join(dir, 'unmounted');
    writeFileSync(file, '');
    for (const [cniNetns, kind] of [
      [fifo, 'a FIFO'],
      [directory, 'a directory'],
      [file, 'a regular file outside nsfs'],
    ] as const) {
      for (const command of ['ADD', 'CHECK']) {
        const r = await plugin(command, cniNetns, ['env']);
        assert.notEqual(r.code, 0, `${command} ${cniNetns}: ${r.stdout}${r.stderr}`);
        const e = JSON.parse(r.stdout) as { code: number; msg: string; details: string };
        assert.equal(e.code, 4, r.stdout);
        assert.equal(e.msg, `CNI_NETNS ${cniNetns} is not a pod's network namespace; refusing to touch it`);
        assert.match(e.details, new RegExp(`^it is ${kind}, not a network namespace file`));
      }
      const del = await plugin('DEL', cniNetns, ['env']);
      assert.equal(del.code, 0, `DEL ${cniNetns}: ${del.stdout}${del.stderr}`);
    }
  });

  for (const command of ['ADD', 'CHECK', 'DEL']) {
    it(`${command}: its own netns, by bind mount and by /proc/self, is refused with code 4 and left as it was`, async () => {
      const own = throwaway('own');
      const before = rulesOf(own, 'nft');
      for (const cniNetns of [own.path, '/proc/self/ns/net']) {
        const r = await plugin(command, cniNetns, ['ip', 'netns', 'exec', own.name]);
        assert.notEqual(r.code, 0, `${cniNetns}: ${r.stdout}${r.stderr}`);
        const e = JSON.parse(r.stdout) as { code: number; msg: string; details: string };
        assert.equal(e.code, 4, r.stdout);
        assert.match(e.msg, /is not a pod's network namespace/);
        assert.match(e.details, /the network namespace mesh-cni itself runs in/);
        assert.deepEqual(rulesOf(own, 'nft'), before, `${cniNetns}: nothing changed`);
      }
    });

    it(`${command}: PID 1's netns is refused with code 4 and left as it was`, async () => {
      // PID 1 of a fresh PID namespace (with its own /proc) is a shell in netns `init`; the
      // plugin, its child, runs in another netns, `runner`, so only the PID 1 check catches it.
      const init = throwaway('init');
      const runner = new Netns('runner');
      spaces.push(runner);
      const before = rulesOf(init, 'nft');
      const r = await plugin(command, '/proc/1/ns/net', [
        'ip',
        'netns',
        'exec',
        init.name,
        'unshare',
        '--pid',
        '--fork',
        '--mount-proc',
        '/bin/sh',
        '-c',
        `ip netns exec ${runner.name} "$@"; exit $?`,
        'sh',
      ]);
      assert.notEqual(r.code, 0, r.stdout + r.stderr);
      const e = JSON.parse(r.stdout) as { code: number; msg: string; details: string };
      assert.equal(e.code, 4, r.stdout);
      assert.match(e.details, /the network namespace of PID 1/);
      assert.deepEqual(rulesOf(init, 'nft'), before, 'nothing changed');
    });
  }
});

// Pods started by an earlier mesh-cni have our rules written straight into the builtin chains
// (it restored whole tables). Their DEL, and any ADD, now runs this version.
describe('rules an earlier mesh-cni left in the builtin chains', () => {
  const OLD = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:MESH_INBOUND - [0:0]
:MESH_OUTPUT - [0:0]
:MESH_REDIRECT - [0:0]
-A PREROUTING -i net1 -j MESH_REDIRECT
-A PREROUTING -i eth1 -j RETURN
-A PREROUTING -p tcp -j MESH_INBOUND
-A OUTPUT -o eth1 -j RETURN
-A OUTPUT -j MESH_OUTPUT
-A MESH_INBOUND -p tcp -m tcp --dport 15008 -j RETURN
-A MESH_OUTPUT -j MESH_REDIRECT
-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
`;
  const spaces: Netns[] = [];
  after(() => {
    for (const s of spaces) s.remove();
  });

  for (const flavour of FLAVOURS) {
    it(`${flavour}: DEL takes out every jump into our chains and the chains; a new ADD replaces them`, async () => {
      const ns = new Netns('old');
      spaces.push(ns);
      await restore(ns.path, flavour, 4, OLD);
      assert.equal(await removeRules(ns.path, flavour, 4), true);
      const left = await save(ns.path, flavour, 4);
      assert.doesNotMatch(left, /MESH_/);
      assert.match(
        left,
        /-A OUTPUT -o eth1 -j RETURN/,
        'rules without a jump into ours are not known as ours: they stay',
      );

      await restore(ns.path, flavour, 4, OLD);
      const doc = buildFamilyRules(specForPod({}), 4).restore;
      assert.equal(await applyRules(ns.path, flavour, 4, doc), 'reconciled');
      const now = await save(ns.path, flavour, 4);
      assert.deepEqual(diffRules(parseRules(doc), parseRules(now)), []);
      assert.doesNotMatch(now, /-A PREROUTING -p tcp -j MESH_INBOUND|-A PREROUTING -i net1 -j MESH_REDIRECT/);
    });
  }
});

describe('a second ADD over whatever of ours is there', () => {
  const spaces: Netns[] = [];
  after(() => {
    for (const s of spaces) s.remove();
  });
  const tproxy = buildFamilyRules(
    specForPod({ metadata: { annotations: { 'sidecar.mesh.io/interceptionMode': 'TPROXY' } } }),
    4,
  ).restore;
  const redirect = buildFamilyRules(specForPod({}), 4).restore;

  for (const flavour of FLAVOURS) {
    it(`${flavour}: a changed spec leaves exactly the new set (chains no longer wanted deleted), also after a half-applied first ADD`, async () => {
      const ns = new Netns('again');
      spaces.push(ns);
      assert.equal(await applyRules(ns.path, flavour, 4, tproxy), 'created');
      assert.equal(await applyRules(ns.path, flavour, 4, redirect), 'reconciled');
      const now = await save(ns.path, flavour, 4);
      assert.deepEqual(diffRules(parseRules(redirect), parseRules(now)), []);
      assert.doesNotMatch(now, /MESH_TPROXY|MESH_DIVERT/, 'the TPROXY chains are gone');

      // Only mangle has a chain of ours (legacy commits table by table: a first ADD that failed
      // after nat): the -N document fails there, the reconcile puts everything right.
      const half = new Netns('half');
      spaces.push(half);
      half.exec([`iptables-${flavour}`, '-t', 'mangle', '-N', 'MESH_INBOUND']);
      assert.equal(await applyRules(half.path, flavour, 4, tproxy), 'reconciled');
      assert.deepEqual(diffRules(parseRules(tproxy), parseRules(await save(half.path, flavour, 4))), []);
    });
  }
});

describe('the netns guard itself', () => {
  it("knows the plugin's own netns by any path, and a pod's netns as a pod's", () => {
    assert.match(notAPodNetns('/proc/self/ns/net') ?? '', /mesh-cni itself runs in/);
    assert.match(notAPodNetns(`/proc/${process.pid}/ns/net`) ?? '', /mesh-cni itself runs in/);
    const ns = new Netns('guard');
    try {
      assert.equal(notAPodNetns(ns.path), null);
    } finally {
      ns.remove();
    }
  });
});

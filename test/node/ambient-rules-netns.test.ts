// Ambient rules on real iptables, both flavours, in netns this test makes (docs/ambient.md
// "Ambient mode's rules"): peer <-> node <-> pod, 198.18.89.0/24 and 198.18.88.0/24 (and
// 2001:db8:89::/64, 2001:db8:88::/64 for the IPv6 run), forwarding in the node netns, which stands
// for the host (its ipset and MESH_POSTRT). No ztunnel exists here: a python3 listener in the pod
// netns stands in for it on 15001/15006/15008 (and the app on 8080), and answers each connection
// with "<listening port> <source address> <SO_ORIGINAL_DST>". Every netns, set and process made
// here is removed after each test, pass or fail (ipsets and rules live in the netns and go with
// it).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe, it } from 'node:test';
import {
  addProbeIP,
  applyHost,
  parseProbeSet,
  PROBE_SET_V4,
  PROBE_SET_V6,
  removeHost,
  removeProbeIP,
} from '../../src/ambient/hostrules.ts';
import {
  applyInpod,
  PROBE_SNAT_V6,
  removeInpod,
  type Family,
  type Flavour,
  type InpodOptions,
  type Runner,
} from '../../src/ambient/podrules.ts';
import { cleanupAfterEach, type Defer } from '../helpers/cleanup.ts';
import { run } from '../helpers/netns.ts';
import { CLIENT, LISTENER, PYTHON } from '../helpers/ztunnel-listeners.ts';

const defer = cleanupAfterEach();
let counter = 0;

async function must(argv: readonly string[], input?: string): Promise<string> {
  const r = await run(argv[0]!, argv.slice(1), input === undefined ? {} : { input });
  if (r.code !== 0) throw new Error(`${argv.join(' ')} failed (${r.code}): ${r.stderr}`);
  return r.stdout;
}

/** A netns named mcni-amb-<pid>-<tag><n>, removed after the test. */
async function netns(tag: string, d: Defer): Promise<string> {
  const name = `mcni-amb-${process.pid}-${tag}${++counter}`;
  await must(['ip', 'netns', 'add', name]);
  d(() => must(['ip', 'netns', 'del', name]));
  await must(['ip', '-n', name, 'link', 'set', 'lo', 'up']);
  return name;
}

/** The runner the applier gets: the agent's would nsenter by fd; here `ip netns exec`. */
function runnerIn(ns: string): Runner {
  return async (argv, opts) => {
    const r = await run('ip', ['netns', 'exec', ns, ...argv], opts?.input === undefined ? {} : { input: opts.input });
    return { ...r, error: null };
  };
}

/** Listeners on `ports` inside `ns` until the test ends (killed by the pid we started). */
async function listen(ns: string, ports: number[], d: Defer): Promise<void> {
  const child = spawn('ip', ['netns', 'exec', ns, PYTHON, '-c', LISTENER, ...ports.map(String)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  d(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    }
  });
  await new Promise<void>((resolve, reject) => {
    let err = '';
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    child.stdout.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`listener in ${ns} exited (${code}): ${err}`)));
  });
}

/** Connects from `ns`, returns the listener's answer: [port, source, original destination]. */
async function connect(ns: string, host: string, port: number, mark = 0): Promise<string[]> {
  const out = await must(['ip', 'netns', 'exec', ns, PYTHON, '-c', CLIENT, host, String(port), String(mark)]);
  return out.trim().split(' ');
}

const POD = '198.18.88.2';
const PEER = '198.18.89.2';
// IPv6: documentation prefixes, only ever inside the netns made here.
const POD6 = '2001:db8:88::2';
const PEER6 = '2001:db8:89::2';
const UID_A = '4f6a1c2e-0000-4000-8000-00000000000a';
const UID_B = '4f6a1c2e-0000-4000-8000-00000000000b';
const DEFAULT: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };

interface Topology {
  readonly peer: string;
  readonly node: string;
  readonly pod: string;
}

async function topology(d: Defer): Promise<Topology> {
  const [peer, node, pod] = [await netns('peer', d), await netns('node', d), await netns('pod', d)];
  const ip = (ns: string, ...args: string[]) => must(['ip', '-n', ns, ...args]);
  await ip(node, 'link', 'add', 'to-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod);
  await ip(node, 'link', 'add', 'to-peer', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', peer);
  await ip(node, 'addr', 'add', '198.18.88.1/24', 'dev', 'to-pod');
  await ip(node, 'addr', 'add', '198.18.89.1/24', 'dev', 'to-peer');
  await ip(node, 'link', 'set', 'to-pod', 'up');
  await ip(node, 'link', 'set', 'to-peer', 'up');
  await ip(node, 'addr', 'add', '2001:db8:88::1/64', 'dev', 'to-pod', 'nodad');
  await ip(node, 'addr', 'add', '2001:db8:89::1/64', 'dev', 'to-peer', 'nodad');
  await must(['ip', 'netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  await must(['ip', 'netns', 'exec', node, 'sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1']);
  for (const [ns, addr, gw, addr6, gw6] of [
    [pod, `${POD}/24`, '198.18.88.1', `${POD6}/64`, '2001:db8:88::1'],
    [peer, `${PEER}/24`, '198.18.89.1', `${PEER6}/64`, '2001:db8:89::1'],
  ] as const) {
    await ip(ns, 'addr', 'add', addr, 'dev', 'eth0');
    await ip(ns, 'addr', 'add', addr6, 'dev', 'eth0', 'nodad');
    await ip(ns, 'link', 'set', 'eth0', 'up');
    await ip(ns, 'route', 'add', 'default', 'via', gw);
    await ip(ns, '-6', 'route', 'add', 'default', 'via', gw6);
  }
  return { peer, node, pod };
}

/** iptables-save reduced to what a comparison needs: per table, non-builtin chains and rules. */
async function rulesOf(ns: string, flavour: Flavour, family: Family): Promise<string> {
  const text = await must(['ip', 'netns', 'exec', ns, `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-save`]);
  const tables = new Map<string, string[]>();
  let cur: string[] = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) tables.set(line, (cur = []));
    else if (line.startsWith('-A') || (line.startsWith(':') && line.includes(' - ['))) cur.push(line);
  }
  return [...tables]
    .filter(([, l]) => l.length > 0)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([t, l]) => [t, ...l].join('\n'))
    .join('\n');
}

/** Someone else's rules in every table we touch, which must survive us. */
async function othersRules(ns: string, flavour: Flavour, family: Family): Promise<void> {
  const doc = [
    '*mangle',
    ':OTHER_PRE - [0:0]',
    '-A PREROUTING -j OTHER_PRE',
    '-A OTHER_PRE -p udp --dport 9999 -j MARK --set-mark 7',
    'COMMIT',
    '*nat',
    '-A PREROUTING -p tcp --dport 9999 -j ACCEPT',
    '-A OUTPUT -p tcp --dport 9998 -j ACCEPT',
    '-A POSTROUTING -p tcp --dport 9997 -j ACCEPT',
    'COMMIT',
    '*raw',
    '-A OUTPUT -p udp --dport 9996 -j ACCEPT',
    'COMMIT',
    '',
  ].join('\n');
  await must(
    ['ip', 'netns', 'exec', ns, `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-restore`, '--noflush'],
    doc,
  );
}

for (const flavour of ['nft', 'legacy'] as const) {
  describe(`ambient rules, iptables-${flavour}`, () => {
    it('traffic matrix: probe SNAT, inbound to 15006, 15008 direct, outbound to 15001, marked bypasses', async () => {
      const t = await topology(defer);
      await listen(t.pod, [8080, 15001, 15006, 15008], defer);
      await listen(t.peer, [9090], defer);
      assert.equal(await applyInpod(runnerIn(t.pod), flavour, [4], DEFAULT), 'applied');

      // Without the host path, the node's own connection is captured like any other.
      assert.deepEqual(await connect(t.node, POD, 8080), ['15006', '198.18.88.1', `${POD}:8080`]);

      await applyHost(runnerIn(t.node), flavour, [4]);
      await addProbeIP(runnerIn(t.node), POD, UID_A);
      const [port, source] = await connect(t.node, POD, 8080);
      assert.deepEqual([port, source], ['8080', '169.254.7.127'], 'node -> pod: the app sees the probe address');

      assert.deepEqual(await connect(t.peer, POD, 8080), ['15006', PEER, `${POD}:8080`], 'peer -> pod: 15006');
      assert.deepEqual((await connect(t.peer, POD, 15008)).slice(0, 2), ['15008', PEER], 'peer -> 15008 direct');
      assert.deepEqual(await connect(t.pod, PEER, 9090), ['15001', POD, `${PEER}:9090`], 'pod -> peer: 15001');
      assert.deepEqual((await connect(t.pod, PEER, 9090, 1337)).slice(0, 2), ['9090', POD], 'marked: direct');
      assert.deepEqual((await connect(t.pod, '127.0.0.1', 8080)).slice(0, 2), ['8080', '127.0.0.1'], 'pod -> lo');

      // The pod's entry removed: the node's connection is captured again.
      assert.deepEqual(await removeProbeIP(runnerIn(t.node), POD, UID_A), { removed: true });
      assert.equal((await connect(t.node, POD, 8080))[0], '15006');
    });

    it('traffic matrix over IPv6: the v6 probe address, 15006, 15008, 15001, marked bypasses', async () => {
      const t = await topology(defer);
      await listen(t.pod, [8080, 15001, 15006, 15008], defer);
      await listen(t.peer, [9090], defer);
      await applyInpod(runnerIn(t.pod), flavour, [4, 6], DEFAULT);
      await applyHost(runnerIn(t.node), flavour, [4, 6]);
      await addProbeIP(runnerIn(t.node), POD6, UID_A);
      assert.deepEqual((await connect(t.node, POD6, 8080)).slice(0, 2), ['8080', PROBE_SNAT_V6], 'node -> pod');
      assert.deepEqual(await connect(t.peer, POD6, 8080), ['15006', PEER6, `[${POD6}]:8080`], 'peer -> pod');
      assert.deepEqual((await connect(t.peer, POD6, 15008)).slice(0, 2), ['15008', PEER6], 'peer -> 15008');
      assert.deepEqual(await connect(t.pod, PEER6, 9090), ['15001', POD6, `[${PEER6}]:9090`], 'pod -> peer');
      assert.deepEqual((await connect(t.pod, PEER6, 9090, 1337)).slice(0, 2), ['9090', POD6], 'marked: direct');
      assert.deepEqual((await connect(t.pod, '::1', 8080)).slice(0, 2), ['8080', '::1'], 'pod -> lo');
    });

    it('apply twice: no change the second time; an option change reconciled; removal leaves the others', async () => {
      const pod = await netns('pod', defer);
      const run = runnerIn(pod);
      for (const f of [4, 6] as const) await othersRules(pod, flavour, f);
      const before = { 4: await rulesOf(pod, flavour, 4), 6: await rulesOf(pod, flavour, 6) };
      const routesBefore = await must(['ip', '-n', pod, '-4', 'rule']);

      const dns = { ...DEFAULT, dnsCapture: true };
      assert.equal(await applyInpod(run, flavour, [4, 6], dns), 'applied');
      const once = { 4: await rulesOf(pod, flavour, 4), 6: await rulesOf(pod, flavour, 6) };
      assert.match(once[4], /MESH_PRERT/);
      assert.match(once[6], /\*raw[^*]*-j CT --zone 1/);
      assert.equal(await applyInpod(run, flavour, [4, 6], dns), 'unchanged');
      assert.deepEqual({ 4: await rulesOf(pod, flavour, 4), 6: await rulesOf(pod, flavour, 6) }, once);
      const rules = await must(['ip', '-n', pod, '-4', 'rule']);
      assert.equal(rules.match(/^32764:\s+from all fwmark 0x111\/0xfff lookup 100/gm)?.length, 1, rules);
      assert.match(await must(['ip', '-n', pod, '-4', 'route', 'show', 'table', '100']), /local default dev lo/);
      assert.match(await must(['ip', '-n', pod, '-6', 'route', 'show', 'table', '100']), /local default dev lo/);

      // DNS capture off: our raw chains go, the others' raw rule stays.
      assert.equal(await applyInpod(run, flavour, [4, 6], DEFAULT), 'applied');
      const raw = (await rulesOf(pod, flavour, 4)).split('*raw')[1] ?? '';
      assert.doesNotMatch(raw, /MESH_/);
      assert.match(raw, /--dport 9996/);

      await removeInpod(run, flavour, [4, 6]);
      assert.deepEqual({ 4: await rulesOf(pod, flavour, 4), 6: await rulesOf(pod, flavour, 6) }, before);
      assert.equal(await must(['ip', '-n', pod, '-4', 'rule']), routesBefore);
      assert.equal(await must(['ip', '-n', pod, '-4', 'route', 'show', 'table', '100']), '');
      assert.equal(await must(['ip', '-n', pod, '-6', 'route', 'show', 'table', '100']), '');
      await removeInpod(run, flavour, [4, 6]); // nothing of ours left: no error
    });

    it('host: idempotent, keeps the set entries at start, removal leaves the others and no set', async () => {
      const node = await netns('node', defer);
      const run = runnerIn(node);
      await othersRules(node, flavour, 4);
      // A MESH_* chain on the host that is not the probe path's (another part of the mesh): not ours to touch.
      const foreign = '*nat\n:MESH_NOT_AMBIENT - [0:0]\n-A PREROUTING -j MESH_NOT_AMBIENT\nCOMMIT\n';
      await must(['ip', 'netns', 'exec', node, `iptables-${flavour}-restore`, '--noflush'], foreign);
      const before = await rulesOf(node, flavour, 4);
      assert.equal(await applyHost(run, flavour, [4, 6]), 'applied');
      const once = await rulesOf(node, flavour, 4);
      assert.match(once, /-A POSTROUTING -j MESH_POSTRT\n/);
      await addProbeIP(run, POD, UID_A);
      // A restart: the set keeps its entries (the dataplane's start-up sync prunes the stale
      // ones), the rule is left as it is.
      assert.equal(await applyHost(run, flavour, [4, 6]), 'unchanged');
      assert.equal(await rulesOf(node, flavour, 4), once);
      assert.deepEqual(
        [...parseProbeSet(await must(['ip', 'netns', 'exec', node, 'ipset', 'save', PROBE_SET_V4]))],
        [[POD, UID_A]],
      );
      // Ours is first in POSTROUTING, before the others' rule there (Istio inserts it first).
      assert.match(once, /\*nat[^*]*-A POSTROUTING -j MESH_POSTRT\n-A POSTROUTING -p tcp/);

      await removeHost(run, flavour, [4, 6]);
      assert.equal(await rulesOf(node, flavour, 4), before);
      assert.equal(await must(['ip', 'netns', 'exec', node, 'ipset', 'list', '-n']), '');
      await removeHost(run, flavour, [4, 6]); // again: nothing there, no error
    });
  });
}

describe('host probe set', () => {
  it('a reused IP: B added after A, the late delete of A keeps B', async () => {
    const node = await netns('node', defer);
    const run = runnerIn(node);
    await applyHost(run, 'nft', [4]);
    await addProbeIP(run, POD, UID_A);
    await addProbeIP(run, POD, UID_B); // the IP went to pod B before A's removal arrived
    assert.deepEqual(await removeProbeIP(run, POD, UID_A), { removed: false, owner: UID_B });
    const entries = () => must(['ip', 'netns', 'exec', node, 'ipset', 'save', PROBE_SET_V4]).then(parseProbeSet);
    assert.deepEqual([...(await entries())], [[POD, UID_B]]);
    assert.deepEqual(await removeProbeIP(run, POD, UID_B), { removed: true });
    assert.deepEqual([...(await entries())], []);
    assert.deepEqual(await removeProbeIP(run, POD, UID_B), { removed: false, owner: null });
  });
});

describe('host probe set: races and spellings', () => {
  const entriesOf = (node: string, set: string) =>
    must(['ip', 'netns', 'exec', node, 'ipset', 'save', set]).then(parseProbeSet);

  it("a new pod's add of a reused IP that lands between a removal's list and its delete is kept", async () => {
    const node = await netns('node', defer);
    const plain = runnerIn(node);
    // The agent's one host runner. Once armed, right after the late removal of pod A has run its
    // `ipset save`, the IP goes to pod B (another enrollment of the same agent, not awaited), and
    // A's delete comes 300 ms later.
    let armed = false;
    let added: Promise<void> | null = null;
    const run: Runner = async (argv, opts) => {
      const r = await plain(argv, opts);
      if (armed && argv[1] === 'save' && added === null) {
        added = addProbeIP(run, POD, UID_B);
        await new Promise((res) => setTimeout(res, 300));
      }
      return r;
    };
    await applyHost(run, 'nft', [4]);
    await addProbeIP(run, POD, UID_A);
    armed = true;
    const removal = await removeProbeIP(run, POD, UID_A);
    await added;
    assert.deepEqual([...(await entriesOf(node, PROBE_SET_V4))], [[POD, UID_B]], "pod B's entry survives");
    // One after the other: A's entry went first, then B's add.
    assert.deepEqual(removal, { removed: true });
  });

  it('an IPv6 address in another spelling, or IPv4-mapped, is the same entry', async () => {
    const node = await netns('node', defer);
    const run = runnerIn(node);
    await applyHost(run, 'nft', [4, 6]);
    await addProbeIP(run, POD6, UID_A);
    assert.deepEqual(await removeProbeIP(run, '2001:DB8:88:0:0::2', UID_A), { removed: true });
    assert.deepEqual([...(await entriesOf(node, PROBE_SET_V6))], []);
    // An IPv4 pod's address written IPv4-mapped goes into the IPv4 set, where the SNAT rule matches it.
    await addProbeIP(run, `::ffff:${POD}`, UID_A);
    assert.deepEqual([...(await entriesOf(node, PROBE_SET_V4))], [[POD, UID_A]]);
    assert.deepEqual(await removeProbeIP(run, `::ffff:${POD}`, UID_A), { removed: true });
    assert.deepEqual([...(await entriesOf(node, PROBE_SET_V4))], []);
  });
});

describe('in-pod rules: a pod whose loopback has IPv6 off', () => {
  for (const flavour of ['nft', 'legacy'] as const) {
    it(`iptables-${flavour}: both families' rules, the IPv6 local route skipped (as Istio), removal clean`, async () => {
      const pod = await netns('pod', defer);
      await must(['ip', 'netns', 'exec', pod, 'sysctl', '-qw', 'net.ipv6.conf.lo.disable_ipv6=1']);
      const run = runnerIn(pod);
      assert.equal(await applyInpod(run, flavour, [4, 6], DEFAULT), 'applied');
      assert.match(await rulesOf(pod, flavour, 6), /-A MESH_OUTPUT .*-j REDIRECT --to-ports 15001/);
      assert.match(await must(['ip', '-n', pod, '-4', 'route', 'show', 'table', '100']), /local default dev lo/);
      assert.match(await must(['ip', '-n', pod, '-6', 'rule']), /fwmark 0x111\/0xfff lookup 100/);
      assert.equal(await applyInpod(run, flavour, [4, 6], DEFAULT), 'unchanged');
      await removeInpod(run, flavour, [4, 6]);
      assert.doesNotMatch(await rulesOf(pod, flavour, 6), /MESH_/);
      assert.doesNotMatch(await must(['ip', '-n', pod, '-6', 'rule']), /lookup 100/);
    });
  }
});

describe('a probe address spelled otherwise than iptables-save prints it', () => {
  for (const flavour of ['nft', 'legacy'] as const) {
    it(`iptables-${flavour}: the second apply (pod and node) changes nothing`, async () => {
      const ns = await netns('pod', defer);
      const run = runnerIn(ns);
      const v6 = 'FD16:9254:7127:1337:0:0:0:7';
      const opts = { ...DEFAULT, probeSnatV6: v6 };
      assert.equal(await applyInpod(run, flavour, [6], opts), 'applied');
      assert.equal(await applyInpod(run, flavour, [6], opts), 'unchanged');
      assert.equal(await applyHost(run, flavour, [6], { v6 }), 'applied');
      assert.equal(await applyHost(run, flavour, [6], { v6 }), 'unchanged');
    });
  }
});

describe('in-pod hooks go first in their builtins', () => {
  for (const flavour of ['nft', 'legacy'] as const) {
    it(`iptables-${flavour}: a pod's own ACCEPT already in nat PREROUTING does not take inbound past ztunnel`, async () => {
      const t = await topology(defer);
      await listen(t.pod, [8080, 15006], defer);
      // Someone else's rule first (a chained plugin, the pod's own init container): it would
      // decide before a jump appended after it.
      await must([
        'ip',
        'netns',
        'exec',
        t.pod,
        `iptables-${flavour}`,
        '-t',
        'nat',
        '-A',
        'PREROUTING',
        '-p',
        'tcp',
        '-j',
        'ACCEPT',
      ]);
      await applyInpod(runnerIn(t.pod), flavour, [4], DEFAULT);
      assert.deepEqual(await connect(t.peer, POD, 8080), ['15006', PEER, `${POD}:8080`], 'peer -> pod: still 15006');
      const prerouting = (await must(['ip', 'netns', 'exec', t.pod, `iptables-${flavour}-save`, '-t', 'nat']))
        .split('\n')
        .filter((l) => l.startsWith('-A PREROUTING '));
      assert.deepEqual(
        prerouting,
        ['-A PREROUTING -j MESH_PRERT', '-A PREROUTING -p tcp -j ACCEPT'],
        'ours first, theirs kept',
      );
    });
  }
});

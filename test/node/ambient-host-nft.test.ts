// Ambient's host probe path in native nftables (src/ambient/hostnft.ts), on the real nft: a test
// netns stands for the node, joined by veths to a pod netns (a python3 listener on 8080 that
// answers with the peer address it saw) and to an "outside" netns whose traffic the node routes
// to the pod (forwarded, as kube-proxy's NodePort traffic is). The node's probe is a TCP connect
// from the node netns as kubelet's uid (setpriv): SNATed to 169.254.7.127 when the pod's IP is in
// our set; a connect of another uid, and forwarded traffic, keep their source. Every netns,
// process and temp file is removed after each test (our table lives in the node netns).

import assert from 'node:assert/strict';
import { describe, it as nodeIt } from 'node:test';
import { HostHealer } from '../../src/ambient/hostheal.ts';
import { HOST_TABLE, NftHostProbes } from '../../src/ambient/hostnft.ts';
import { PROBE_SET_V4, PROBE_SET_V6 } from '../../src/ambient/hostrules.ts';
import type { Runner } from '../../src/ambient/podrules.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FOREIGN_TABLES, foreignTables } from '../helpers/nftables.ts';
import { Netns, run } from '../helpers/netns.ts';
import { sh, shStatus } from '../helpers/sh.ts';
import { CLIENT, listenIn, PYTHON } from '../helpers/ztunnel-listeners.ts';

const defer = cleanupAfterEach();
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 120_000 }, fn);

const NODE_TO_POD = '198.18.92.1';
const POD = '198.18.92.2';
const POD_OTHER = '198.18.92.3';
const OUTSIDE = '198.18.93.2';
const PROBE = '169.254.7.127';
const KUBELET_UID = 4242;
const UID_A = '5a1e0c2e-0000-4000-8000-00000000000a';
const UID_B = '5a1e0c2e-0000-4000-8000-00000000000b';

function netns(tag: string): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  return n;
}

function runnerIn(ns: Netns): Runner {
  return async (argv, opts) => {
    const r = await run(
      'ip',
      ['netns', 'exec', ns.name, ...argv],
      opts?.input === undefined ? {} : { input: opts.input },
    );
    return { ...r, error: null };
  };
}

const nftIn = (ns: Netns, ...args: string[]) => ns.exec(['nft', ...args]);

/** node <-> pod, node <-> outside (the node forwards), a listener on the pod's 8080. */
async function topology(): Promise<{ node: Netns; pod: Netns; outside: Netns }> {
  const node = netns('nftnode');
  const pod = netns('nftpod');
  const outside = netns('nftout');
  const ip = (ns: Netns, ...args: string[]) => sh(['ip', '-n', ns.name, ...args]);
  ip(node, 'link', 'add', 'to-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.name);
  ip(node, 'link', 'add', 'to-out', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', outside.name);
  ip(node, 'addr', 'add', `${NODE_TO_POD}/24`, 'dev', 'to-pod');
  ip(node, 'addr', 'add', '198.18.93.1/24', 'dev', 'to-out');
  ip(node, 'link', 'set', 'to-pod', 'up');
  ip(node, 'link', 'set', 'to-out', 'up');
  node.exec(['sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
  ip(pod, 'addr', 'add', `${POD}/24`, 'dev', 'eth0');
  ip(pod, 'addr', 'add', `${POD_OTHER}/24`, 'dev', 'eth0');
  ip(pod, 'link', 'set', 'eth0', 'up');
  ip(pod, 'route', 'add', 'default', 'via', NODE_TO_POD);
  ip(outside, 'addr', 'add', `${OUTSIDE}/24`, 'dev', 'eth0');
  ip(outside, 'link', 'set', 'eth0', 'up');
  ip(outside, 'route', 'add', 'default', 'via', '198.18.93.1');
  const app = await listenIn(pod.path, [8080]);
  defer(() => app.stop());
  return { node, pod, outside };
}

/** The source address the pod's app saw for a connect from `ns`, as `uid` when given. */
async function sourceSeen(ns: Netns, host: string, uid?: number): Promise<string> {
  const as = uid === undefined ? [] : ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups'];
  const r = await run('nsenter', [`--net=${ns.path}`, '--', ...as, PYTHON, '-c', CLIENT, host, '8080', '0'], {
    timeoutMs: 15_000,
  });
  if (r.code !== 0) throw new Error(`connect from ${ns.name} to ${host} failed (${r.code}): ${r.stderr}`);
  return r.stdout.trim().split(' ')[1]!;
}

const elements = (ns: Netns, set = PROBE_SET_V4) => {
  const json = JSON.parse(nftIn(ns, '-j', 'list', 'set', 'inet', HOST_TABLE, set)) as {
    nftables: { set?: { elem?: { elem: { val: string; comment?: string } }[] } }[];
  };
  const s = json.nftables.find((i) => i.set)!.set!;
  return Object.fromEntries((s.elem ?? []).map((e) => [e.elem.val, e.elem.comment ?? '']));
};

describe('ambient host probe path, native nftables', () => {
  it("kubelet's connects to an enrolled pod are SNATed to the probe address; another uid's and forwarded ones are not", async () => {
    const { node, outside } = await topology();
    const host = new NftHostProbes(runnerIn(node), { families: [4], kubeletUid: KUBELET_UID });
    assert.equal(await host.apply(), 'applied');
    assert.equal(await sourceSeen(node, POD, KUBELET_UID), NODE_TO_POD, 'not enrolled yet: as it is');

    await host.addProbeIP(POD, UID_A);
    assert.equal(await sourceSeen(node, POD, KUBELET_UID), PROBE, "kubelet's probe: SNATed");
    assert.equal(await sourceSeen(node, POD), NODE_TO_POD, "root's connect: another uid, not SNATed");
    assert.equal(await sourceSeen(node, POD, 4243), NODE_TO_POD, 'another uid: not SNATed');
    assert.equal(await sourceSeen(outside, POD), OUTSIDE, 'forwarded through the node: not SNATed');
    assert.equal(await sourceSeen(node, POD_OTHER, KUBELET_UID), NODE_TO_POD, 'an IP not in the set: not SNATed');
    assert.match(nftIn(node, 'list', 'chain', 'inet', HOST_TABLE, 'postrouting'), /counter packets [1-9]/);

    assert.deepEqual(await host.removeProbeIP(POD, UID_A), { removed: true });
    assert.equal(await sourceSeen(node, POD, KUBELET_UID), NODE_TO_POD, 'out of the set: as it is');
  });

  it('elements carry their pod UID; a removal for an old pod keeps the new owner of a reused IP', async () => {
    const node = netns('nftnode');
    const host = new NftHostProbes(runnerIn(node), { families: [4, 6], kubeletUid: 0 });
    await host.apply();
    await host.addProbeIP(POD, UID_A);
    assert.deepEqual(elements(node), { [POD]: UID_A });
    await host.addProbeIP(POD, UID_B); // the IP went to a new pod: re-owned
    assert.deepEqual(elements(node), { [POD]: UID_B });
    assert.deepEqual(await host.removeProbeIP(POD, UID_A), { removed: false, owner: UID_B });
    assert.deepEqual(elements(node), { [POD]: UID_B });
    // IPv4-mapped IPv6 goes in the IPv4 set; IPv6 in its own, in one spelling
    assert.equal(
      await host.addProbeIPs([
        ['::ffff:198.18.92.3', UID_A],
        ['FD00:0:0::5', UID_A],
      ]),
      true,
    );
    assert.deepEqual(elements(node), { [POD]: UID_B, [POD_OTHER]: UID_A });
    assert.deepEqual(elements(node, PROBE_SET_V6), { 'fd00::5': UID_A });
    assert.deepEqual(Object.fromEntries(await host.entries()), { [POD]: UID_B, [POD_OTHER]: UID_A, 'fd00::5': UID_A });
    // A batch with one bad element: none of it goes in (false, as the ipset batch says it).
    assert.equal(
      await host.addProbeIPs([
        ['198.18.92.9', UID_A],
        ['fd00::6', 'not a uid"; flush ruleset'],
      ]),
      false,
    );
    assert.deepEqual(elements(node), { [POD]: UID_B, [POD_OTHER]: UID_A });
    assert.deepEqual(await host.removeProbeIP('198.18.92.77', UID_A), { removed: false, owner: null });
    // A start-up apply keeps what is in the sets.
    assert.equal(await host.apply(), 'unchanged');
    assert.deepEqual(elements(node), { [POD]: UID_B, [POD_OTHER]: UID_A });
  });

  it('healed: the table deleted, a set flushed, the chain flushed; foreign tables untouched', async () => {
    const node = netns('nftnode');
    node.exec(['nft', '-f', '-'], FOREIGN_TABLES);
    const before = foreignTables(node);
    const host = new NftHostProbes(runnerIn(node), { families: [4], kubeletUid: 0 });
    await host.apply();
    await host.addProbeIP(POD, UID_A);
    await host.addProbeIP(POD_OTHER, UID_B);
    assert.deepEqual(await host.removeProbeIP(POD_OTHER, UID_B), { removed: true });
    const healer = new HostHealer(host, { timings: { maxHeals: 10 } });
    assert.equal(await healer.pass(), 'intact');

    nftIn(node, 'delete', 'table', 'inet', HOST_TABLE);
    assert.deepEqual(
      (await host.inspect()).map((d) => d.what),
      ['rule', 'set', 'entry'],
    );
    assert.equal(await healer.pass(), 'healed');
    assert.deepEqual(elements(node), { [POD]: UID_A }, 'the recorded entry back, not the removed one');

    nftIn(node, 'flush', 'set', 'inet', HOST_TABLE, PROBE_SET_V4);
    assert.deepEqual(
      (await host.inspect()).map((d) => d.what),
      ['entry'],
    );
    assert.equal(await healer.pass(), 'healed');
    assert.deepEqual(elements(node), { [POD]: UID_A });

    nftIn(node, 'flush', 'chain', 'inet', HOST_TABLE, 'postrouting');
    assert.deepEqual(await host.inspect(), [{ what: 'rule', family: 4, detail: 'postrouting is empty (flushed)' }]);
    assert.equal(await healer.pass(), 'healed');
    assert.equal(await healer.pass(), 'intact');
    assert.equal(foreignTables(node), before);

    assert.equal(await host.remove(), 'removed');
    assert.doesNotMatch(nftIn(node, 'list', 'tables'), new RegExp(HOST_TABLE));
    assert.equal(foreignTables(node), before, 'uninstall: only ours went');
    assert.equal(await host.remove(), 'absent');
  });

  it("a writer that keeps undoing it: readiness names our nft table, not iptables' chain", async () => {
    const node = netns('nftnode');
    const host = new NftHostProbes(runnerIn(node), { families: [4], kubeletUid: 0 });
    await host.apply();
    const healer = new HostHealer(host, { timings: { maxHeals: 1 } });
    for (let i = 0; i < 2; i++) {
      nftIn(node, 'delete', 'table', 'inet', HOST_TABLE);
      assert.equal(await healer.pass(), 'healed');
    }
    const [reason] = healer.notReadyReasons();
    assert.match(reason!, /the host probe path \(table inet mesh_ambient_host\) keeps being undone/);
    assert.doesNotMatch(reason!, /MESH_POSTRT|mesh-inpod-probes ipsets/);
  });

  it('a table of our name not written by us: refused, never deleted', async () => {
    const node = netns('nftnode');
    node.exec(['nft', '-f', '-'], `table inet ${HOST_TABLE} {\n\tchain c {\n\t\ttcp dport 7 counter accept\n\t}\n}\n`);
    const theirs = nftIn(node, '-a', 'list', 'table', 'inet', HOST_TABLE);
    const host = new NftHostProbes(runnerIn(node), { families: [4], kubeletUid: 0 });
    await assert.rejects(host.apply(), /not written by mesh-cni/);
    await assert.rejects(host.addProbeIP(POD, UID_A));
    await assert.rejects(host.inspect(), /not written by mesh-cni/);
    await assert.rejects(host.repair(), /not written by mesh-cni/);
    assert.equal(await host.remove(), 'foreign');
    assert.equal(nftIn(node, '-a', 'list', 'table', 'inet', HOST_TABLE), theirs);
  });

  it("both families' rules read back with the host's nft: list ruleset, its JSON, and the text applies again", async () => {
    const node = netns('nftnode');
    const host = new NftHostProbes(runnerIn(node), {
      families: [4, 6],
      kubeletUid: 0,
      snat: { v6: 'FD16:9254:7127:1337:ffff:ffff:ffff:ffff' },
    });
    await host.apply();
    await host.addProbeIPs([
      [POD, UID_A],
      ['fd00::5', UID_B],
    ]);
    const text = shStatus(['ip', 'netns', 'exec', node.name, 'nft', 'list', 'ruleset']);
    assert.equal(text.code, 0, text.out);
    assert.match(
      text.out,
      /meta skuid 0 ip6 daddr @mesh-inpod-probes-v6 counter packets 0 bytes 0 snat ip6 to fd16:9254:7127:1337:ffff:ffff:ffff:ffff/,
    );
    assert.match(
      text.out,
      /meta skuid 0 ip daddr @mesh-inpod-probes-v4 counter packets 0 bytes 0 snat ip to 169\.254\.7\.127/,
    );
    assert.doesNotMatch(text.out, /# xt_|\[invalid|unknown|Unsupported/i);
    JSON.parse(nftIn(node, '-j', 'list', 'ruleset'));
    const fresh = netns('nftfresh');
    sh(['ip', 'netns', 'exec', fresh.name, 'nft', '-c', '-f', '-'], { input: text.out });
    assert.equal(await host.apply(), 'unchanged', 'what it reads back is what it wrote');
  });
});

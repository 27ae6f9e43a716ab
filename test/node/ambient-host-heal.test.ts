// The host probe path put back when another writer takes it (src/ambient/hostheal.ts), on real
// iptables of both flavours and real ipsets: a test netns stands for the node, joined by a veth
// to a pod netns with the in-pod rules and a python3 listener on 8080 (the app) and 15006
// (ztunnel's inbound). The kubelet-like probe is a TCP connect from the node netns to the pod's
// 8080: through the probe path it reaches 8080 from the probe address 169.254.7.127; without it
// the pod's rules send it to 15006. The healer's loop runs on a stepped clock: each step ends
// one wait of the loop and returns once the check it started is done. Every netns, process and
// socket made is removed after each test (the rules and sets live in the netns and go with it).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { describe, it as nodeIt } from 'node:test';
import { createDataplane, type PodAnnotator } from '../../src/ambient/dataplane.ts';
import { HostHealer, type HealWhat } from '../../src/ambient/hostheal.ts';
import {
  addProbeIP,
  applyHost,
  iptablesHostState,
  parseProbeSet,
  PROBE_SET_V4,
  removeProbeIP,
} from '../../src/ambient/hostrules.ts';
import { applyInpod, type Flavour, type Runner } from '../../src/ambient/podrules.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { metricValue } from '../helpers/metrics.ts';
import type { Clock } from '../../src/orch/limits.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { Netns, run } from '../helpers/netns.ts';
import { connectFrom, listenIn } from '../helpers/ztunnel-listeners.ts';

const defer = cleanupAfterEach();
const it = (name: string, fn: () => Promise<void>) => nodeIt(name, { timeout: 120_000 }, fn);

const POD = '198.18.90.2';
const POD_B = '198.18.90.3';
const POD_C = '198.18.90.4';
const UID_A = '5a1e0c2e-0000-4000-8000-00000000000a';
const UID_B = '5a1e0c2e-0000-4000-8000-00000000000b';
const UID_C = '5a1e0c2e-0000-4000-8000-00000000000c';
const HEALTHY = '8080 169.254.7.127';
const CAPTURED = '15006 198.18.90.1';
/** Someone else's nat rules and chain: a full restore of theirs leaves only these. */
const FOREIGN_NAT = [
  '*nat',
  ':POSTROUTING ACCEPT [0:0]',
  ':OTHER_POST - [0:0]',
  '-A POSTROUTING -j OTHER_POST',
  '-A OTHER_POST -p tcp --dport 9997 -j ACCEPT',
  'COMMIT',
  '',
].join('\n');

/** A wait of the loop under test: the clock moves on only when the test steps it. */
class StepClock implements Clock {
  #now = 0;
  readonly #sleeps: { ms: number; resolve: () => void }[] = [];
  #waiter: (() => void) | null = null;

  now(): number {
    return this.#now;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(new Error('stopped'));
      const entry = { ms, resolve };
      this.#sleeps.push(entry);
      signal?.addEventListener(
        'abort',
        () => {
          this.#sleeps.splice(this.#sleeps.indexOf(entry), 1);
          reject(new Error('stopped'));
        },
        { once: true },
      );
      this.#waiter?.();
    });
  }

  async #pending(): Promise<{ ms: number; resolve: () => void }> {
    while (this.#sleeps.length === 0) await new Promise<void>((r) => (this.#waiter = r));
    return this.#sleeps[0]!;
  }

  /** Ends the pending wait; once the loop waits again: how long it had waited, and will wait next. */
  async step(): Promise<{ slept: number; next: number }> {
    const s = await this.#pending();
    this.#sleeps.shift();
    this.#now += s.ms;
    s.resolve();
    return { slept: s.ms, next: (await this.#pending()).ms };
  }
}

async function must(argv: readonly string[], input?: string): Promise<string> {
  const r = await run(argv[0]!, argv.slice(1), input === undefined ? {} : { input });
  if (r.code !== 0) throw new Error(`${argv.join(' ')} failed (${r.code}): ${r.stderr}`);
  return r.stdout;
}

function netns(tag: string): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  return n;
}

/** One runner for the node, as the dataplane has one: the record of our set entries is per runner. */
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

/** node <-> pod over a veth, the pod redirected to "ztunnel" (its listener on 15006) by its rules. */
async function topology(flavour: Flavour): Promise<{ node: Netns; pod: Netns }> {
  const node = netns('healnode');
  const pod = netns('healpod');
  const ip = (ns: Netns, ...args: string[]) => must(['ip', '-n', ns.name, ...args]);
  await ip(node, 'link', 'add', 'to-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.name);
  await ip(node, 'addr', 'add', '198.18.90.1/24', 'dev', 'to-pod');
  await ip(node, 'link', 'set', 'to-pod', 'up');
  await ip(pod, 'addr', 'add', `${POD}/24`, 'dev', 'eth0');
  await ip(pod, 'link', 'set', 'eth0', 'up');
  await ip(pod, 'route', 'add', 'default', 'via', '198.18.90.1');
  const opts = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
  await applyInpod(runnerIn(pod), flavour, [4], opts);
  const app = await listenIn(pod.path, [8080, 15006]);
  defer(() => app.stop());
  return { node, pod };
}

/** kubelet's probe of the pod, from the node: which listener took it, and from which source. */
async function probe(node: Netns): Promise<string> {
  return (await connectFrom(node.path, POD, 8080)).slice(0, 2).join(' ');
}

const heals = (what: HealWhat) => metricValue('mesh_cni_ambient_host_heals_total', { what });

async function healsNow(): Promise<Record<HealWhat, number>> {
  return { rule: await heals('rule'), set: await heals('set'), entry: await heals('entry') };
}

const setOf = async (node: Netns) =>
  Object.fromEntries(parseProbeSet(await must(['ip', 'netns', 'exec', node.name, 'ipset', 'save', PROBE_SET_V4])));

for (const flavour of ['nft', 'legacy'] as const) {
  describe(`host probe path healed, iptables-${flavour}`, () => {
    it('a full foreign restore, a flushed chain, a flushed and a destroyed set: back at the next check', async () => {
      const { node } = await topology(flavour);
      const host = runnerIn(node);
      const inNode = (...argv: string[]) => must(['ip', 'netns', 'exec', node.name, ...argv]);
      await applyHost(host, flavour, [4]);
      await addProbeIP(host, POD, UID_A);
      await addProbeIP(host, POD_B, UID_B);
      // A pod that left: its entry must not come back with the others'.
      await addProbeIP(host, POD_C, UID_C);
      assert.deepEqual(await removeProbeIP(host, POD_C, UID_C), { removed: true });
      // Someone else's set on the node: never ours to touch.
      await inNode('ipset', 'create', 'other-set', 'hash:ip');
      await inNode('ipset', 'add', 'other-set', '198.18.91.9');
      assert.equal(await probe(node), HEALTHY);

      const clock = new StepClock();
      // More heals than the default bound follow one another here: the fight is the next test's.
      const healer = new HostHealer(iptablesHostState(host, flavour, [4]), { clock, timings: { maxHeals: 10 } });
      healer.start();
      defer(() => healer.stop());
      const before = await healsNow();
      assert.deepEqual(await clock.step(), { slept: 10_000, next: 10_000 }, 'intact: nothing done');
      assert.deepEqual(await healsNow(), before);

      // (a) Another agent's iptables-restore of the nat table, without --noflush.
      await must(['ip', 'netns', 'exec', node.name, `iptables-${flavour}-restore`, '-w', '5'], FOREIGN_NAT);
      assert.equal(await probe(node), CAPTURED, 'the foreign restore took the probe path away');
      assert.deepEqual(await clock.step(), { slept: 10_000, next: 10_000 });
      assert.equal(await probe(node), HEALTHY, '(a) healed within one interval');
      const save = await inNode(`iptables-${flavour}-save`, '-t', 'nat');
      assert.match(save, /-A POSTROUTING -j MESH_POSTRT\n/);
      assert.match(save, /-A OTHER_POST -p tcp -m tcp --dport 9997 -j ACCEPT/, "the other writer's rules stay");

      // (b) Our chain flushed.
      await inNode(`iptables-${flavour}`, '-w', '5', '-t', 'nat', '-F', 'MESH_POSTRT');
      assert.equal(await probe(node), CAPTURED);
      await clock.step();
      assert.equal(await probe(node), HEALTHY, '(b) healed');

      // (c) Our set flushed: the entries come back from the agent's record, UIDs and all.
      await inNode('ipset', 'flush', PROBE_SET_V4);
      assert.equal(await probe(node), CAPTURED);
      await clock.step();
      assert.equal(await probe(node), HEALTHY, '(c) flush healed');
      assert.deepEqual(await setOf(node), { [POD]: UID_A, [POD_B]: UID_B });

      // (c) Our set destroyed (a set in use cannot be, so after a full restore took our rule).
      await must(['ip', 'netns', 'exec', node.name, `iptables-${flavour}-restore`, '-w', '5'], FOREIGN_NAT);
      await inNode('ipset', 'destroy', PROBE_SET_V4);
      assert.equal(await probe(node), CAPTURED);
      await clock.step();
      assert.equal(await probe(node), HEALTHY, '(c) destroy healed');
      assert.deepEqual(await setOf(node), { [POD]: UID_A, [POD_B]: UID_B });

      const after = await healsNow();
      assert.deepEqual(
        { rule: after.rule - before.rule, set: after.set - before.set, entry: after.entry - before.entry },
        { rule: 3, set: 1, entry: 2 },
        'each heal counted by what it put back',
      );
      assert.match(await inNode('ipset', 'save', 'other-set'), /add other-set 198\.18\.91\.9/);
      assert.deepEqual(healer.notReadyReasons(), []);
    });
  });
}

describe('host probe path: another writer undoing every heal', () => {
  it('heals are bounded and back off, readiness says why, and it is ready once the writer stops', async () => {
    const flavour = 'nft';
    const { node } = await topology(flavour);
    const host = runnerIn(node);
    const inNode = (...argv: string[]) => must(['ip', 'netns', 'exec', node.name, ...argv]);
    await applyHost(host, flavour, [4]);
    await addProbeIP(host, POD, UID_A);
    const clock = new StepClock();
    const healer = new HostHealer(iptablesHostState(host, flavour, [4]), { clock });
    healer.start();
    defer(() => healer.stop());
    assert.equal(await probe(node), HEALTHY);

    const before = await heals('rule');
    const nexts: number[] = [];
    for (let i = 0; i < 9; i++) {
      await inNode(`iptables-${flavour}`, '-w', '5', '-t', 'nat', '-D', 'POSTROUTING', '-j', 'MESH_POSTRT');
      nexts.push((await clock.step()).next);
      if (i < 3) assert.deepEqual(healer.notReadyReasons(), [], `heal ${i + 1}: within the bound`);
    }
    assert.equal((await heals('rule')) - before, 9, 'every heal counted');
    // Three heals at the interval, then each wait doubles, up to 5 minutes.
    assert.deepEqual(nexts, [10_000, 10_000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]);
    const [reason, ...more] = healer.notReadyReasons();
    assert.deepEqual(more, []);
    assert.match(reason!, /keeps being undone by another writer/);
    assert.match(reason!, /the jump from nat POSTROUTING to MESH_POSTRT is gone/);
    assert.equal(await probe(node), HEALTHY, 'still healed each time');

    // The writer stops: checks go back to the interval; ready after three intact checks in a row.
    for (let i = 0; i < 3; i++) {
      assert.notDeepEqual(healer.notReadyReasons(), [], `not ready before intact check ${i + 1}`);
      assert.equal((await clock.step()).next, 10_000);
    }
    assert.deepEqual(healer.notReadyReasons(), []);
    assert.equal((await heals('rule')) - before, 9);
  });
});

describe('host probe path: a check that cannot run', () => {
  it('backs off, says not ready after three in a row, and is ready once it runs again', async () => {
    const flavour = 'nft';
    const node = netns('healnode');
    let where = node.name;
    // The node's runner; pointed at a netns that is not there, every program fails to start.
    const host: Runner = async (argv, opts) => {
      const r = await run(
        'ip',
        ['netns', 'exec', where, ...argv],
        opts?.input === undefined ? {} : { input: opts.input },
      );
      return { ...r, error: null };
    };
    await applyHost(host, flavour, [4]);
    const clock = new StepClock();
    const healer = new HostHealer(iptablesHostState(host, flavour, [4]), { clock });
    healer.start();
    defer(() => healer.stop());

    where = `${node.name}-gone`;
    const nexts: number[] = [];
    for (let i = 0; i < 3; i++) {
      assert.deepEqual(healer.notReadyReasons(), [], `not ready only after three failures (${i})`);
      nexts.push((await clock.step()).next);
    }
    assert.deepEqual(nexts, [20_000, 40_000, 80_000]);
    const [reason] = healer.notReadyReasons();
    assert.match(
      reason!,
      /cannot check or heal the host probe path \(3 checks in a row\): iptables-nft-save -t nat failed/,
    );

    where = node.name;
    assert.deepEqual(await clock.step(), { slept: 80_000, next: 10_000 });
    assert.deepEqual(healer.notReadyReasons(), []);
  });
});

const annotator: PodAnnotator = { setRedirection: async () => {} };

function settingsFor(sock: string): Settings {
  const base = buildSettings({}, {});
  return {
    ...base,
    ambient: { ...base.ambient, ztunnelUdsAddress: sock, hostRoot: '/', ipv6: false },
    repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
  };
}

describe('host probe path: healed by the dataplane from start to stop', () => {
  it('a start-up entry flushed and the jump removed come back; readiness carries the fight; stop ends the checks', async () => {
    const flavour = 'nft';
    const { node } = await topology(flavour);
    const inNode = (...argv: string[]) => must(['ip', 'netns', 'exec', node.name, ...argv]);
    // Root's own dir for the ZDS socket (the dataplane refuses one others can write).
    const dir = mkdtempSync('/run/mcni-heal-');
    defer(async () => rmSync(dir, { recursive: true, force: true }));
    const clock = new StepClock();
    const dp = createDataplane(ambientArgs(settingsFor(path.join(dir, 'ztunnel.sock'))), {
      annotator,
      host: runnerIn(node),
      flavour: async () => flavour,
      hostHeal: { clock, timings: { maxHeals: 1 } },
    });
    defer(() => dp.stop(false));
    // A pod enrolled before this start: its probe entry is in the agent's record from the start-up sync.
    const uid = randomUUID();
    await dp.start([{ uid, namespace: 'shop', name: 'cart', serviceAccount: 'cart', ips: [POD], annotations: {} }]);
    assert.equal(await probe(node), HEALTHY);

    await inNode('ipset', 'flush', PROBE_SET_V4);
    assert.equal(await probe(node), CAPTURED);
    assert.deepEqual(await clock.step(), { slept: 10_000, next: 10_000 });
    assert.equal(await probe(node), HEALTHY, 'the start-up entry is back');
    assert.deepEqual(await setOf(node), { [POD]: uid });
    assert.deepEqual(dp.notReadyReasons(), []);

    await inNode(`iptables-${flavour}`, '-w', '5', '-t', 'nat', '-D', 'POSTROUTING', '-j', 'MESH_POSTRT');
    assert.deepEqual(await clock.step(), { slept: 10_000, next: 20_000 });
    assert.equal(await probe(node), HEALTHY);
    assert.match(dp.notReadyReasons().join('\n'), /keeps being undone by another writer/);

    await dp.stop(false);
    await inNode('ipset', 'flush', PROBE_SET_V4);
    assert.equal(await probe(node), CAPTURED, 'stopped: nothing put back (an upgrade leaves the node as it is)');
  });
});

// In-place repair on a node that redirects with native nftables (docs/repair.md "Repair in place",
// docs/nftables.md): the pod's rules are the plugin's table inet mesh_pod, written in a real netns
// entered by fd through src/podnetns's runInNetns and proven by the real dist/mesh-validation.cjs.
// A damaged table (a rule deleted, the table deleted) is rewritten; a pod the plugin redirected
// with iptables is moved to the table, our iptables rules going, another component's staying; on
// an iptables node our table goes. nft that crashes, and a plan nft cannot say, fail the repair
// (rules_failed) with what happened, and leave the pod's rules as they were: never half-written.
// The crashing nft is a shell stub run where nft is. Every netns and temp dir is removed after
// each test, passed or not (the tables live in the netns and go with it).
// Needs root, nft, iptables-{legacy,nft}-* and a built dist/ (npm run build).

import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { applyPodTable, checkPodTable, podTableBody } from '../../cni-plugin/netns/nftpod.ts';
import { applyRules as pluginApply, ipBatch as pluginIpBatch } from '../../cni-plugin/netns/iptables.ts';
import type { Flavour } from '../../cni-plugin/redirect/iptables.ts';
import { POD_TABLE } from '../../cni-plugin/redirect/nftrender.ts';
import { buildFamilyRules, sidecarPlan } from '../../cni-plugin/redirect/rules.ts';
import { specForPod, type RedirectSpec } from '../../cni-plugin/redirect/spec.ts';
import { openNetns } from '../../src/podnetns/held.ts';
import { runInNetns, type HeldNetns } from '../../src/podnetns/index.ts';
import { InPlaceRepairer, type InPlaceResult } from '../../src/repair/inplace.ts';
import { RulesFailed, writeNftables } from '../../src/repair/rulewriters.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { podNetnsWithVeth, type Netns } from '../helpers/netns.ts';
import { testPod } from '../helpers/pods.ts';

const defer = cleanupAfterEach();
const VALIDATION = path.join(ROOT, 'dist', 'mesh-validation.cjs');
const IP = '198.18.6.2';
const FLAVOURS: Flavour[] = ['legacy', 'nft'];

function pod(name: string): V1Pod {
  const p = testPod(name, { initExitCode: 126 });
  return {
    ...p,
    metadata: { ...p.metadata, uid: `uid-${name}` },
    status: { ...p.status, podIP: IP, podIPs: [{ ip: IP }] },
  };
}

/** A pod-like netns (eth0 with the pod's IP, a default route), removed after the test. */
const podNetns = (tag: string): Netns => podNetnsWithVeth(tag, IP, defer);

/** A shell script standing in for nft, in a temp dir removed after the test. */
function stubNft(script: string): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'mcni-rnft-'));
  defer(async () => rmSync(d, { recursive: true, force: true }));
  const bin = path.join(d, 'nft');
  writeFileSync(bin, `#!/bin/sh\n${script}\n`);
  chmodSync(bin, 0o755);
  return bin;
}

/**
 * Repairs `p` in `ns` as the agent does: held by fd, every program through runInNetns (nft as
 * `nft`, or the stub when given), the real validation check as the proof.
 */
async function repairIn(
  ns: Netns,
  p: V1Pod,
  o: { nativeNftables: boolean; nft?: string; flavour?: Flavour },
): Promise<InPlaceResult> {
  const held = await openNetns(ns.path, 0);
  try {
    const repairer = new InPlaceRepairer({
      netns: {
        findPodNetns: async () => ({ ok: true, netns: held }),
        runInNetns: (n, argv, opts) =>
          runInNetns(n as HeldNetns, o.nft && argv[0] === 'nft' ? [o.nft, ...argv.slice(1)] : argv, opts),
        stillThere: async () => true,
      },
      validationBundle: VALIDATION,
      nativeNftables: o.nativeNftables,
      hostFlavour: async () => o.flavour ?? 'nft',
    });
    return await repairer.repair(p);
  } finally {
    held.close();
  }
}

const plansOf = (p: V1Pod) => [sidecarPlan(specForPod(p), 4)];
/** Our table as nft prints it, handles and all but the counters' figures (the proof moves them); '' when none. */
const ourTable = (ns: Netns): string =>
  ns.exec(['nft', 'list', 'tables']).includes(`inet ${POD_TABLE}`)
    ? ns.exec(['nft', '-a', 'list', 'table', 'inet', POD_TABLE]).replace(/counter packets \d+ bytes \d+/g, 'counter')
    : '';
const saved = (ns: Netns, flavour: Flavour): string => ns.exec([`iptables-${flavour}-save`]).replace(/^#.*\n/gm, '');
/** Our iptables chains and jumps in `flavour`, sorted (comparable before and after). */
const ourIptables = (ns: Netns, flavour: Flavour): string[] =>
  saved(ns, flavour)
    .split('\n')
    .filter((l) => /^:MESH_/.test(l) || /-j MESH_/.test(l) || /^-A MESH_/.test(l))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ''))
    .sort();

/** Deletes the rule of our `chain` that `match` finds, by its handle, as a person by hand would. */
function deleteRule(ns: Netns, chain: string, match: RegExp): void {
  const listed = ns.exec(['nft', '-a', 'list', 'chain', 'inet', POD_TABLE, chain]);
  const line = listed.split('\n').find((l) => match.test(l));
  const handle = line && /# handle (\d+)$/.exec(line)?.[1];
  assert.ok(handle, `a rule matching ${match} in:\n${listed}`);
  ns.exec(['nft', 'delete', 'rule', 'inet', POD_TABLE, chain, 'handle', handle]);
}

/** The plugin's ADD with iptables, in `flavour`: what a pod redirected before the switch holds. */
async function byPluginIptables(ns: Netns, p: V1Pod, flavour: Flavour): Promise<void> {
  const rules = buildFamilyRules(specForPod(p), 4);
  await pluginApply(ns.path, flavour, 4, rules.restore);
  await pluginIpBatch(ns.path, 4, rules.ipBatch);
}

function assertOk(r: InPlaceResult, detail: RegExp): void {
  assert.ok(r.ok, JSON.stringify(r));
  assert.match(r.detail, detail);
  assert.match(r.detail, /validation passed/);
}

describe('in-place repair with native nftables', () => {
  it('a damaged table is rewritten: a rule deleted, then the table deleted; right, it is left alone', async () => {
    const ns = podNetns('rnftd');
    const p = pod('dmg-0');
    assertOk(await repairIn(ns, p, { nativeNftables: true }), /nftables table inet mesh_pod created/);
    assert.deepEqual(await checkPodTable(ns.path, plansOf(p)), []);
    assert.deepEqual(ourIptables(ns, 'nft'), [], 'no iptables rules of ours');
    assert.deepEqual(ourIptables(ns, 'legacy'), []);

    const right = ourTable(ns);
    assertOk(await repairIn(ns, p, { nativeNftables: true }), /nftables table inet mesh_pod unchanged/);
    assert.equal(ourTable(ns), right, 'a right table is not written again (same handles)');

    deleteRule(ns, 'nat4_MESH_OUTPUT', /counter .*jump nat4_MESH_REDIRECT /);
    assert.notDeepEqual(await checkPodTable(ns.path, plansOf(p)), []);
    assertOk(await repairIn(ns, p, { nativeNftables: true }), /nftables table inet mesh_pod replaced/);
    assert.deepEqual(await checkPodTable(ns.path, plansOf(p)), []);

    ns.exec(['nft', 'delete', 'table', 'inet', POD_TABLE]);
    assertOk(await repairIn(ns, p, { nativeNftables: true }), /nftables table inet mesh_pod created/);
    assert.deepEqual(await checkPodTable(ns.path, plansOf(p)), []);
  });

  for (const flavour of FLAVOURS)
    it(`a pod redirected with iptables (${flavour}) is moved to the table; a foreign rule stays`, async () => {
      const ns = podNetns('rnftm');
      const p = pod('move-0');
      await byPluginIptables(ns, p, flavour);
      ns.exec([`iptables-${flavour}`, '-t', 'filter', '-A', 'INPUT', '-p', 'tcp', '--dport', '9', '-j', 'ACCEPT']);
      assert.notDeepEqual(ourIptables(ns, flavour), []);

      const r = await repairIn(ns, p, { nativeNftables: true });
      assertOk(r, /nftables table inet mesh_pod created/);
      assert.match(r.detail, new RegExp(`our iptables rules removed \\(IPv4, ${flavour}`));
      assert.deepEqual(await checkPodTable(ns.path, plansOf(p)), []);
      assert.deepEqual(ourIptables(ns, flavour), [], `no iptables rules of ours:\n${saved(ns, flavour)}`);
      assert.match(saved(ns, flavour), /-A INPUT -p tcp -m tcp --dport 9 -j ACCEPT/, "another's rule kept");
    });

  it('on an iptables node our table goes, after the iptables rules are written', async () => {
    const ns = podNetns('rnfti');
    const p = pod('back-0');
    // The plugin's ADD while the node used nftables.
    await applyPodTable(ns.path, podTableBody(plansOf(p)), plansOf(p), null);
    assert.notEqual(ourTable(ns), '');
    const r = await repairIn(ns, p, { nativeNftables: false, flavour: 'nft' });
    assertOk(r, /IPv4 created/);
    assert.match(r.detail, /our nftables table inet mesh_pod removed/);
    assert.equal(ourTable(ns), '');
    assert.notDeepEqual(ourIptables(ns, 'nft'), []);
  });

  it('on an iptables node a crashing nft fails no repair: the iptables rules are written', async () => {
    const ns = podNetns('rnftx');
    const p = pod('skew-0');
    const r = await repairIn(ns, p, { nativeNftables: false, flavour: 'nft', nft: stubNft('kill -SEGV $$') });
    assertOk(r, /IPv4 created/);
    assert.match(r.detail, /could not check for a table of ours left from nftables/);
    assert.notDeepEqual(ourIptables(ns, 'nft'), []);
  });

  for (const [what, script] of [
    ['on every run', 'kill -SEGV $$'],
    ['on a write (reads are the real nft)', 'case "$*" in *-f*) cat > /dev/null; kill -SEGV $$;; esac\nexec nft "$@"'],
  ] as const)
    it(`nft crashing ${what}: rules_failed, the iptables rules and a damaged table as they were`, async () => {
      const nft = stubNft(script);
      // A pod redirected with iptables before the switch: its rules stay whole.
      const moving = podNetns('rnftc');
      const p = pod('crash-0');
      await byPluginIptables(moving, p, 'nft');
      const before = ourIptables(moving, 'nft');
      const r = await repairIn(moving, p, { nativeNftables: true, nft });
      assert.ok(!r.ok, JSON.stringify(r));
      assert.equal(r.reason, 'rules_failed');
      assert.equal(r.final, false, 'a crash may pass: retried');
      assert.match(r.detail, /writing the nftables table inet mesh_pod: .*killed by a signal .*did nft crash/);
      assert.deepEqual(ourIptables(moving, 'nft'), before, 'our iptables rules untouched');
      assert.equal(ourTable(moving), '', 'no table of ours, not a part of one');

      // A table of ours with a rule deleted: left as it was, not a part of a new one.
      const damaged = podNetns('rnftk');
      assertOk(await repairIn(damaged, p, { nativeNftables: true }), /created/);
      deleteRule(damaged, 'nat4_MESH_REDIRECT', /redirect to :15001/);
      const was = ourTable(damaged);
      const r2 = await repairIn(damaged, p, { nativeNftables: true, nft });
      assert.ok(!r2.ok && r2.reason === 'rules_failed', JSON.stringify(r2));
      assert.match(r2.detail, /killed by a signal/);
      assert.equal(ourTable(damaged), was);
    });

  it('a plan nft cannot say: rules_failed for good, before anything runs in the netns', async () => {
    const ns = podNetns('rnftr');
    const held = await openNetns(ns.path, 0);
    defer(async () => held.close());
    const ran: string[] = [];
    // No annotation makes one (the spec's checks are the renderer's): a spec made by hand does.
    const spec: RedirectSpec = { ...specForPod(pod('bad-0')), proxyUids: ['proxy'] };
    const runner = {
      where: 'in the test netns',
      run: (argv: readonly string[], o: { input?: string | null }) => {
        ran.push(argv.join(' '));
        return runInNetns(held, argv, { input: o.input ?? null });
      },
    };
    const err = await writeNftables(runner, spec, [4]).then(
      () => assert.fail('expected a refusal'),
      (e: unknown) => e,
    );
    assert.ok(err instanceof RulesFailed, String(err));
    assert.equal(err.final, true);
    assert.match(
      err.message,
      /cannot be written as an nftables table \(.*"proxy" is not a numeric uid.*nothing was written/,
    );
    assert.deepEqual(ran, [], 'nothing ran in the netns');
    assert.equal(ourTable(ns), '');
  });
});

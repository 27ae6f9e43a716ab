// In-place repair's rule application in real netns (`ip netns add`), entered by fd through
// src/podnetns's runInNetns, with both iptables flavours: idempotent (right rules: no restore at
// all), wrong rules replaced, another component's rules kept; the agent leaves a pod netns
// exactly as the plugin's ADD leaves one for the same pod; the proof runs the real
// dist/mesh-validation.cjs inside the netns, and anything but exit 0 is proof_failed.
// Needs root, iptables-{legacy,nft}-* and a built dist/ (npm run build).

import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import {
  diffRules,
  ensureRules,
  parseRules,
  save,
  type Flavour,
  type NetnsRunner,
  type RuleSet,
} from '../../cni-plugin/redirect/iptables.ts';
import { applyRules as pluginApply, ipBatch as pluginIpBatch } from '../../cni-plugin/netns/iptables.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../cni-plugin/redirect/spec.ts';
import { runInNetns } from '../../src/podnetns/index.ts';
import { openNetns } from '../../src/podnetns/held.ts';
import type { HeldNetns } from '../../src/podnetns/index.ts';
import { InPlaceRepairer, type PodNetns } from '../../src/repair/inplace.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns } from '../helpers/netns.ts';
import { testPod } from '../helpers/pods.ts';

const FLAVOURS: Flavour[] = ['legacy', 'nft'];
const VALIDATION = path.join(ROOT, 'dist', 'mesh-validation.cjs');

function pod(name: string): V1Pod {
  const p = testPod(name, { initExitCode: 126 });
  return {
    ...p,
    metadata: { ...p.metadata, uid: `uid-${name}` },
    status: { ...p.status, podIP: '198.18.5.2', podIPs: [{ ip: '198.18.5.2' }] },
  };
}

/** A runner on runInNetns that records what it ran. */
function recording(held: HeldNetns): NetnsRunner & { ran: string[] } {
  const ran: string[] = [];
  return {
    where: `in held fd ${held.fd}`,
    ran,
    run: (argv, o) => {
      ran.push(argv[0]!);
      return runInNetns(held, argv, { input: o.input ?? null, timeoutMs: 10_000 });
    },
  };
}

/** Only what is ours (MESH_ chains and jumps into them), for comparing two netns. */
function ours(rs: RuleSet): string[] {
  const out: string[] = [];
  for (const [table, chains] of rs)
    for (const [chain, rules] of chains) {
      if (chain.startsWith('MESH_')) out.push(`${table} :${chain}`, ...rules.map((r) => `${table} ${r}`));
      else out.push(...rules.filter((r) => / -j MESH_/.test(r)).map((r) => `${table} ${r}`));
    }
  return out.sort();
}

/** A pod-like netns: eth0 with the pod's IP and a default route (a veth whose peer stays inside). */
function podNetns(tag: string): Netns {
  const ns = new Netns(tag);
  try {
    ns.exec(['ip', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
    ns.exec(['ip', 'addr', 'add', '198.18.5.2/24', 'dev', 'eth0']);
    ns.exec(['ip', 'link', 'set', 'eth0', 'up']);
    ns.exec(['ip', 'link', 'set', 'peer0', 'up']);
    ns.exec(['ip', 'route', 'add', 'default', 'dev', 'eth0']);
  } catch (e) {
    ns.remove();
    throw e;
  }
  return ns;
}

const FOREIGN = `*nat
:FOREIGN_KEEP - [0:0]
-A OUTPUT -d 198.18.9.9/32 -j FOREIGN_KEEP
-A FOREIGN_KEEP -p tcp -j RETURN
COMMIT
`;

describe('in-place repair: rules by fd in a real netns', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-ns-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  for (const flavour of FLAVOURS) {
    it(`${flavour}: created, then unchanged (no restore at all), wrong replaced; a foreign rule survives`, async () => {
      const ns = new Netns('inpl');
      const held = await openNetns(ns.path, 0);
      try {
        ns.exec([`iptables-${flavour}-restore`, '--noflush'], FOREIGN);
        const r = recording(held);
        const doc = buildFamilyRules(specForPod(pod('web-0')), 4).restore;
        const want = parseRules(doc);

        assert.equal(await ensureRules(r, flavour, 4, doc), 'created');
        const have1 = parseRules(await save(r, flavour, 4));
        assert.deepEqual(diffRules(want, have1), []);

        r.ran.length = 0;
        assert.equal(await ensureRules(r, flavour, 4, doc), 'unchanged');
        assert.deepEqual(r.ran, [`iptables-${flavour}-save`], 'read only: no restore');

        // Someone changed ours: a rule out of our chain, and a jump of ours doubled.
        const outChain = [...want.get('nat')!.keys()].find(
          (c) => c.startsWith('MESH_') && want.get('nat')!.get(c)!.length,
        );
        assert.ok(outChain);
        ns.exec([`iptables-${flavour}`, '-t', 'nat', '-D', outChain, '1']);
        ns.exec([`iptables-${flavour}`, '-t', 'nat', '-A', 'OUTPUT', '-j', 'MESH_OUTPUT']);
        assert.notDeepEqual(diffRules(want, parseRules(await save(r, flavour, 4))), []);
        assert.equal(await ensureRules(r, flavour, 4, doc), 'replaced');
        const have2 = parseRules(await save(r, flavour, 4));
        assert.deepEqual(diffRules(want, have2), []);

        const saved = await save(r, flavour, 4);
        assert.match(saved, /:FOREIGN_KEEP/);
        assert.match(saved, /-A OUTPUT -d 198\.18\.9\.9\/32 -j FOREIGN_KEEP/);
        assert.match(saved, /-A FOREIGN_KEEP -p tcp -j RETURN/);
      } finally {
        held.close();
        ns.remove();
      }
    });

    it(`${flavour}: the agent leaves a netns as the plugin's ADD does for the same pod, and proves it`, async () => {
      let byPlugin: Netns | undefined;
      let byAgent: Netns | undefined;
      let held: HeldNetns | undefined;
      try {
        byPlugin = podNetns('inplp');
        byAgent = podNetns('inpla');
        const p = pod('same-0');
        const rules = buildFamilyRules(specForPod(p), 4);
        await pluginApply(byPlugin.path, flavour, 4, rules.restore);
        await pluginIpBatch(byPlugin.path, 4, rules.ipBatch);

        held = await openNetns(byAgent.path, 0);
        const h = held;
        const fake: PodNetns = {
          findPodNetns: async (uid, ips) => {
            assert.equal(uid, 'uid-same-0');
            assert.deepEqual(ips, ['198.18.5.2']);
            return { ok: true, netns: h };
          },
          runInNetns: (n, argv, o) => runInNetns(n as HeldNetns, argv, o),
          stillThere: async () => true,
        };
        const repairer = new InPlaceRepairer({
          netns: fake,
          validationBundle: VALIDATION,
          hostFlavour: async () => flavour,
        });
        const r = await repairer.repair(p);
        assert.ok(r.ok, JSON.stringify(r));
        assert.match(r.detail, /IPv4 created/);
        assert.match(r.detail, /validation passed/);

        const plug = parseRules(byPlugin.exec([`iptables-${flavour}-save`]));
        const agent = parseRules(byAgent.exec([`iptables-${flavour}-save`]));
        assert.deepEqual(ours(agent), ours(plug));
        assert.ok(ours(agent).length > 0);
        assert.equal(held.fd, -1, 'the repairer closes the netns it was handed');
      } finally {
        held?.close();
        byPlugin?.remove();
        byAgent?.remove();
      }
    });
  }

  for (const flavour of FLAVOURS) {
    it(`${flavour}: a foreign rule whose comment names our jump is not ours: kept, and right rules stay unchanged`, async () => {
      const ns = new Netns('inplc');
      const held = await openNetns(ns.path, 0);
      try {
        // Another component's rule that mentions our chain only in its comment (iptables-save
        // keeps the quotes): taken for a jump of ours, it was deleted by every reconcile, and
        // right rules never read as unchanged.
        ns.exec(
          [`iptables-${flavour}-restore`, '--noflush'],
          '*nat\n:FOREIGN_KEEP - [0:0]\n' +
            '-A OUTPUT -d 198.18.9.8/32 -m comment --comment "runs before -j MESH_OUTPUT" -j FOREIGN_KEEP\n' +
            'COMMIT\n',
        );
        const r = recording(held);
        const doc = buildFamilyRules(specForPod(pod('cmt-0')), 4).restore;
        assert.equal(await ensureRules(r, flavour, 4, doc), 'created');
        assert.equal(await ensureRules(r, flavour, 4, doc), 'unchanged');
        assert.match(
          await save(r, flavour, 4),
          /-A OUTPUT -d 198\.18\.9\.8\/32 .*runs before -j MESH_OUTPUT.* -j FOREIGN_KEEP/,
        );
      } finally {
        held.close();
        ns.remove();
      }
    });
  }

  it('a validation check that does not pass is proof_failed, with its text', async () => {
    const ns = new Netns('inplf');
    const held = await openNetns(ns.path, 0);
    try {
      const failing = path.join(dir, 'fails.cjs');
      await writeFile(
        failing,
        "process.stderr.write('mesh-validation: outbound TCP is not redirected: fake\\n'); process.exit(126);\n",
      );
      const repairer = new InPlaceRepairer({
        netns: {
          findPodNetns: async () => ({ ok: true, netns: held }),
          runInNetns: (n, argv, o) => runInNetns(n as HeldNetns, argv, o),
          stillThere: async () => true,
        },
        validationBundle: failing,
        hostFlavour: async () => 'nft',
      });
      const r = await repairer.repair(pod('proof-0'));
      assert.equal(r.ok, false);
      assert.ok(!r.ok);
      assert.equal(r.reason, 'proof_failed');
      assert.equal(r.final, false);
      assert.match(r.detail, /exited 126: mesh-validation: outbound TCP is not redirected: fake/);
    } finally {
      held.close();
      ns.remove();
    }
  });

  it('the pod process gone from its netns after the proof is no_netns, final', async () => {
    const ns = podNetns('inplg');
    const held = await openNetns(ns.path, 0);
    try {
      const repairer = new InPlaceRepairer({
        netns: {
          findPodNetns: async () => ({ ok: true, netns: held }),
          runInNetns: (n, argv, o) => runInNetns(n as HeldNetns, argv, o),
          stillThere: async () => false,
        },
        validationBundle: VALIDATION,
        hostFlavour: async () => 'nft',
      });
      const r = await repairer.repair(pod('gone-0'));
      assert.ok(!r.ok);
      assert.equal(r.reason, 'no_netns');
      assert.equal(r.final, true);
    } finally {
      held.close();
      ns.remove();
    }
  });
});

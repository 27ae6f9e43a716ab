// The rule builder against table fixtures (annotations + proxy env in -> iptables-restore text
// out, per family), bad annotations refused with a clear message, and a round trip of every
// fixture through real iptables (nft and legacy) in fresh netns. UPDATE_FIXTURES=1 rewrites the
// expected files (review the diff!).

import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import {
  applyRules,
  diffRules,
  parseRules,
  reconcileRestore,
  removeRules,
  restore,
  save,
  type Flavour,
} from '../../cni-plugin/netns/iptables.ts';
import { canonicalAddress, parseCidr, parsePortList } from '../../cni-plugin/redirect/net.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { AnnotationError, specForPod, type PodLike } from '../../cni-plugin/redirect/spec.ts';
import { Netns } from '../helpers/netns.ts';
import { fixturePod, RULE_FIXTURES, ruleFixtures } from '../helpers/rulefixtures.ts';

const DIR = RULE_FIXTURES;
const fixtures = ruleFixtures();
const podOf = fixturePod;

const good = fixtures.filter((f) => f.error === undefined);
const bad = fixtures.filter((f) => f.error !== undefined);

describe('rule builder fixtures', () => {
  it('has fixtures of both kinds', () => {
    assert.ok(good.length >= 10 && bad.length >= 5, `${good.length} good, ${bad.length} bad`);
  });

  for (const f of good) {
    for (const fam of [4, 6] as const) {
      it(`${f.name} IPv${fam}: ${f.description}`, () => {
        const file = path.join(DIR, `${f.name}.v${fam}.rules`);
        const r = buildFamilyRules(specForPod(podOf(f)), fam);
        const text =
          r.restore + (r.ipBatch.length ? `# ip -${fam} -batch:\n${r.ipBatch.map((l) => `# ${l}`).join('\n')}\n` : '');
        if (process.env.UPDATE_FIXTURES === '1' || !existsSync(file)) writeFileSync(file, text);
        assert.equal(text, readFileSync(file, 'utf8'));
      });
    }
  }

  for (const f of bad) {
    it(`refuses ${f.name}: ${f.description}`, () => {
      assert.throws(
        () => specForPod(podOf(f)),
        (e: unknown) => {
          assert.ok(e instanceof AnnotationError, `expected AnnotationError, got ${String(e)}`);
          assert.ok(
            e.message.includes(f.error!),
            `message ${JSON.stringify(e.message)} lacks ${JSON.stringify(f.error)}`,
          );
          assert.ok(!e.message.includes('\n-A'), 'the message echoes the value JSON-quoted');
          return true;
        },
      );
    });
  }
});

describe('rule builder values', () => {
  it('canonicalises CIDRs as iptables-save prints them', () => {
    assert.equal(parseCidr('10.96.1.7/12').text, '10.96.0.0/12');
    assert.equal(parseCidr('10.1.2.3').text, '10.1.2.3/32');
    assert.equal(parseCidr('FD00:0:0::1/64').text, 'fd00::/64');
    assert.equal(parseCidr('2001:db8:0:0:1:0:0:1').text, '2001:db8::1:0:0:1/128');
    assert.equal(parseCidr('::ffff:10.0.0.1/128').text, '::ffff:a00:1/128');
    assert.equal(canonicalAddress('0:0:0:0:0:0:0:1'), '::1');
    assert.equal(parseCidr('127.0.0.1/8').loopback, true);
    assert.equal(parseCidr('::1').loopback, true);
    for (const bad of ['', '10.0.0', '10.0.0.0/', '01.0.0.0/8', '1::2::3', '12345::', '10.0.0.0/8/8', ' /8']) {
      assert.throws(() => parseCidr(bad), Error, bad);
    }
  });

  it('deduplicates ports and refuses non-ports', () => {
    assert.deepEqual(parsePortList(' 80, 443,80 ,'), [80, 443]);
    for (const bad of ['-1', '65536', '1e3', '0x50', '8O']) assert.throws(() => parsePortList(bad), Error, bad);
  });

  // Istio's rule (cni/pkg/plugin kubernetes.go + sidecar_redirect.go): the proxy is every
  // container named mesh-proxy, init containers first (a native sidecar is one), then the
  // others; the last one with a securityContext gives runAsUser/runAsGroup; absent or 0 is 1337.
  describe('the proxy uid/gid the owner matches use', () => {
    const sc = (runAsUser?: number, runAsGroup?: number) => ({ securityContext: { runAsUser, runAsGroup } });
    const ids = (spec: PodLike['spec']) => {
      const s = specForPod({ metadata: { annotations: {} }, spec });
      return [s.proxyUids, s.proxyGids];
    };
    it('comes from the mesh-proxy container, not from the pod or the app', () => {
      assert.deepEqual(
        ids({
          containers: [
            { name: 'app', ...sc(1000) },
            { name: 'mesh-proxy', ...sc(1000670000, 1000670001) },
          ],
        }),
        [['1000670000'], ['1000670001']],
      );
      assert.deepEqual(ids({ containers: [{ name: 'app', ...sc(1000, 1000) }, { name: 'mesh-proxy' }] }), [
        ['1337'],
        ['1337'],
      ]);
    });
    it('falls back to 1337 for each of uid and gid that is absent or 0', () => {
      assert.deepEqual(ids({ containers: [{ name: 'mesh-proxy', ...sc(0, 0) }] }), [['1337'], ['1337']]);
      assert.deepEqual(ids({ containers: [{ name: 'mesh-proxy', ...sc(1000670000) }] }), [['1000670000'], ['1337']]);
      assert.deepEqual(ids({ containers: [{ name: 'mesh-proxy', ...sc(undefined, 2000) }] }), [['1337'], ['2000']]);
      assert.deepEqual(ids({ containers: [{ name: 'mesh-proxy', securityContext: { runAsUser: null } as never }] }), [
        ['1337'],
        ['1337'],
      ]);
    });
    it('reads a native sidecar (mesh-proxy among the init containers), and its env', () => {
      const spec = specForPod({
        metadata: { annotations: {} },
        spec: {
          initContainers: [
            { name: 'mesh-validation', ...sc(5) },
            {
              name: 'mesh-proxy',
              ...sc(1000670000, 1000670001),
              env: [{ name: 'MESH_META_DNS_CAPTURE', value: 'true' }],
            },
          ],
          containers: [{ name: 'app' }],
        },
      });
      assert.deepEqual([spec.proxyUids, spec.proxyGids, spec.captureDns], [['1000670000'], ['1000670001'], true]);
    });
    it('takes the last mesh-proxy with a securityContext (containers after init containers)', () => {
      assert.deepEqual(
        ids({
          initContainers: [{ name: 'mesh-proxy', ...sc(1111, 1111) }],
          containers: [{ name: 'mesh-proxy', ...sc(2222) }],
        }),
        [['2222'], ['1337']],
      );
      assert.deepEqual(
        ids({ initContainers: [{ name: 'mesh-proxy', ...sc(1111, 1111) }], containers: [{ name: 'mesh-proxy' }] }),
        [['1111'], ['1111']],
      );
    });
    it('refuses a value that is no uid, before any rule is built', () => {
      for (const bad of [-1, 1.5, 2 ** 32, '1000' as unknown as number]) {
        assert.throws(
          () => ids({ containers: [{ name: 'mesh-proxy', ...sc(bad) }] }),
          (e: unknown) => e instanceof AnnotationError && /runAsUser/.test(e.message),
          String(bad),
        );
      }
    });
    it("reads the env flags as Go's ParseBool does (1, t, T, TRUE, true, True)", () => {
      const dns = (value: string) =>
        specForPod({
          metadata: { annotations: {} },
          spec: { containers: [{ name: 'mesh-proxy', env: [{ name: 'MESH_META_DNS_CAPTURE', value }] }] },
        }).captureDns;
      for (const v of ['1', 't', 'T', 'TRUE', 'true', 'True']) assert.equal(dns(v), true, v);
      for (const v of ['0', 'false', 'yes', 'tRue', ' true', '']) assert.equal(dns(v), false, v);
    });
  });

  it('takes mesh.io/reroute-virtual-interfaces over the deprecated kubevirtInterfaces when present, even empty', () => {
    const virt = (annotations: Record<string, string>) => specForPod({ metadata: { annotations } }).virtInterfaces;
    assert.deepEqual(virt({ 'traffic.sidecar.mesh.io/kubevirtInterfaces': 'net1' }), ['net1']);
    assert.deepEqual(virt({ 'mesh.io/reroute-virtual-interfaces': 'net2,net3' }), ['net2', 'net3']);
    assert.deepEqual(
      virt({ 'mesh.io/reroute-virtual-interfaces': 'net2', 'traffic.sidecar.mesh.io/kubevirtInterfaces': 'net1' }),
      ['net2'],
    );
    assert.deepEqual(
      virt({ 'mesh.io/reroute-virtual-interfaces': '', 'traffic.sidecar.mesh.io/kubevirtInterfaces': 'net1' }),
      [],
    );
    assert.throws(
      () => virt({ 'mesh.io/reroute-virtual-interfaces': 'bad name' }),
      /annotation mesh\.io\/reroute-virtual-interfaces="bad name"/,
    );
  });

  it('always keeps the agent ports out of inbound capture', () => {
    const spec = specForPod({ metadata: { annotations: { 'traffic.sidecar.mesh.io/excludeInboundPorts': '22' } } });
    assert.deepEqual(spec.inboundExcludePorts, [22, 15020, 15021, 15090]);
  });
});

// Round trip: what we restore is exactly what iptables-save reads back, in both flavours.
describe('rule builder round trip through real iptables', () => {
  const namespaces: Netns[] = [];
  after(() => {
    for (const n of namespaces) n.remove();
  });

  for (const flavour of ['nft', 'legacy'] as Flavour[]) {
    it(`${flavour}: every fixture restores and saves back identically, twice in a row`, async () => {
      for (const f of good) {
        const ns = new Netns('rt');
        namespaces.push(ns);
        for (const fam of [4, 6] as const) {
          const doc = buildFamilyRules(specForPod(podOf(f)), fam).restore;
          assert.equal(await applyRules(ns.path, flavour, fam, doc), 'created');
          // A second ADD must leave one set of rules, not two.
          assert.equal(await applyRules(ns.path, flavour, fam, doc), 'reconciled');
          const saved = await save(ns.path, flavour, fam);
          assert.deepEqual(diffRules(parseRules(doc), parseRules(saved)), [], `${f.name} IPv${fam} ${flavour}`);
          for (const chains of parseRules(saved).values()) {
            for (const rules of chains.values()) assert.equal(new Set(rules).size, rules.length, 'no duplicated rules');
          }
        }
        ns.remove();
      }
    });
  }

  it('detects a changed rule set, and removing ours leaves nothing of ours', async () => {
    const ns = new Netns('rt');
    namespaces.push(ns);
    const doc = buildFamilyRules(specForPod({}), 4).restore;
    await restore(ns.path, 'nft', 4, doc);
    ns.exec(['iptables-nft', '-t', 'nat', '-D', 'MESH_OUTPUT', '-j', 'MESH_REDIRECT']);
    const problems = diffRules(parseRules(doc), parseRules(await save(ns.path, 'nft', 4)));
    assert.equal(problems.length, 1);
    assert.match(problems[0]!, /nat MESH_OUTPUT rule \d+: expected -A MESH_OUTPUT -j MESH_REDIRECT, found \(none\)/);
    assert.equal(await removeRules(ns.path, 'nft', 4), true);
    assert.doesNotMatch(await save(ns.path, 'nft', 4), /MESH_/);
    assert.equal(reconcileRestore(null, parseRules(await save(ns.path, 'nft', 4))), null, 'nothing left to remove');
  });
});

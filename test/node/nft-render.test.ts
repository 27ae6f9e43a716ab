// The nftables renderer (cni-plugin/redirect/nftrender.ts) against fixtures: the same pod specs
// as the iptables fixtures (test/node/fixtures/rules/<case>.json) in, one inet table body out
// (<case>.nft, both families), each fixture written into real nft in a fresh netns and read back;
// and the terms it must refuse rather than guess. UPDATE_FIXTURES=1 rewrites the .nft files
// (review the diff!).

import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { byPath } from '../../cni-plugin/netns/iptables.ts';
import { PlanBuilder, type Plan } from '../../cni-plugin/redirect/model.ts';
import { applyTable, checkBody, readTable } from '../../cni-plugin/redirect/nft.ts';
import { NftRenderError, POD_TABLE, renderNftBody } from '../../cni-plugin/redirect/nftrender.ts';
import { sidecarPlan } from '../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../cni-plugin/redirect/spec.ts';
import { hostPlan } from '../../src/ambient/hostrules.ts';
import { inpodPlan, podOptions } from '../../src/ambient/podrules.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns } from '../helpers/netns.ts';
import { fixturePod, RULE_FIXTURES, ruleFixtures, type RuleFixture } from '../helpers/rulefixtures.ts';

const DIR = RULE_FIXTURES;
const AMBIENT_DIR = path.join(ROOT, 'test/node/fixtures/ambient');
const defer = cleanupAfterEach();

const fixtures = ruleFixtures().filter((f) => f.error === undefined);

const bodyOf = (f: RuleFixture, fams: readonly (4 | 6)[] = [4, 6]): string => {
  const spec = specForPod(fixturePod(f));
  return renderNftBody(fams.map((fam) => sidecarPlan(spec, fam)));
};

describe('nft renderer fixtures', () => {
  it('has a fixture for every iptables case', () => {
    assert.ok(fixtures.length >= 15, `${fixtures.length} cases`);
  });

  for (const f of fixtures) {
    it(`${f.name}: ${f.description}`, () => {
      const file = path.join(DIR, `${f.name}.nft`);
      const body = bodyOf(f);
      if (process.env.UPDATE_FIXTURES === '1' || !existsSync(file)) writeFileSync(file, body);
      assert.equal(body, readFileSync(file, 'utf8'));
      // The applier's shape rules: every rule with a counter, one per line, no brace left open.
      checkBody(body);
    });
  }

  it('renders the same text every time, whatever order the plans come in', () => {
    const spec = specForPod(fixturePod(fixtures.find((f) => f.name === 'tproxy-everything')!));
    const a = renderNftBody([sidecarPlan(spec, 4), sidecarPlan(spec, 6)]);
    const b = renderNftBody([sidecarPlan(spec, 6), sidecarPlan(spec, 4)]);
    assert.equal(a, b);
  });

  it('an IPv4-only pod gets IPv4 chains and jumps only', () => {
    const body = bodyOf(
      fixtures.find((f) => f.name === 'default')!,
      [4],
    );
    assert.match(body, /meta nfproto ipv4 counter jump nat4_MESH_OUTPUT/);
    assert.doesNotMatch(body, /ipv6|ip6 |nat6_/);
  });

  it('maps every term of every fixture: no rule has an iptables spelling left', () => {
    for (const f of fixtures) {
      const body = bodyOf(f);
      assert.doesNotMatch(body, /(^|\s)(-[mjpsdio]|--\w)/m, f.name);
      for (const line of body.split('\n').filter((l) => l.startsWith('\t') && !l.includes('policy accept'))) {
        assert.match(
          line,
          /(^|\s)counter (jump|return|accept|drop|redirect|tproxy|meta mark set|ct mark set|ct zone set)/,
          line,
        );
      }
    }
  });

  it('TPROXY: a packet tproxy finds no socket for is dropped, as iptables TPROXY drops it', () => {
    const body = bodyOf(fixtures.find((f) => f.name === 'tproxy')!);
    const lines = body.split('\n');
    const i = lines.findIndex((l) => /tproxy ip to :15006 meta mark set 0x539 accept/.test(l));
    assert.ok(i > 0, body);
    assert.equal(lines[i + 1], '\tip daddr != 127.0.0.1 meta l4proto tcp counter drop');
  });
});

interface AmbientCase {
  readonly name: string;
  readonly description: string;
  readonly annotations: Record<string, string>;
  readonly globalDnsCapture: boolean;
}
const ambientCases = (
  JSON.parse(readFileSync(path.join(AMBIENT_DIR, 'cases.json'), 'utf8')) as { cases: AmbientCase[] }
).cases;
const ambientBody = (c: AmbientCase): string =>
  renderNftBody(([4, 6] as const).map((fam) => inpodPlan(fam, podOptions(c.annotations, c.globalDnsCapture))));

describe('nft renderer: the ambient in-pod cases', () => {
  for (const c of ambientCases) {
    it(`${c.name}: ${c.description}`, () => {
      const file = path.join(AMBIENT_DIR, `${c.name}.nft`);
      const body = ambientBody(c);
      if (process.env.UPDATE_FIXTURES === '1' || !existsSync(file)) writeFileSync(file, body);
      assert.equal(body, readFileSync(file, 'utf8'));
      checkBody(body);
    });
  }

  it("refuses the node's probe plan: its ipset is no set of the pod table's", () => {
    assert.throws(() => renderNftBody([hostPlan(4)]), /is an ipset of the agent's/);
  });
});

describe('nft renderer refuses what it cannot say exactly', () => {
  const plan = (build: (b: PlanBuilder) => void): Plan => {
    const b = new PlanBuilder(4);
    build(b);
    return b.plan();
  };
  const refuses = (p: Plan, why: RegExp) =>
    assert.throws(
      () => renderNftBody([p]),
      (e: Error) => {
        assert.ok(e instanceof NftRenderError, String(e));
        assert.match(e.message, why);
        return true;
      },
    );

  it('an ipset match', () => {
    refuses(
      plan((b) => {
        b.hook('nat', 'OUTPUT', 'MESH_OUTPUT');
        b.add('nat', 'MESH_OUTPUT', { ext: [{ kind: 'set', name: 'mesh-pods-v4', dir: 'dst' }] }, { kind: 'return' });
      }),
      /set mesh-pods-v4 is an ipset/,
    );
  });

  it('a connmark save under a mask', () => {
    refuses(
      plan((b) => {
        b.hook('mangle', 'PREROUTING', 'MESH_PREROUTING');
        b.add(
          'mangle',
          'MESH_PREROUTING',
          {},
          { kind: 'connmark-copy', dir: 'save', nfmask: 0xfff, ctmask: 0xffffffff },
        );
      }),
      /under a mask/,
    );
  });

  it('a redirect with no protocol, and one outside the nat table', () => {
    refuses(
      plan((b) => b.add('nat', 'MESH_OUTPUT', {}, { kind: 'redirect', port: 15001 })),
      /needs the rule to name tcp or udp/,
    );
    refuses(
      plan((b) => b.add('mangle', 'MESH_OUTPUT', { proto: 'tcp' }, { kind: 'redirect', port: 15001 })),
      /redirect is for the nat table/,
    );
  });

  it('a jump to a chain the plan does not have in that table', () => {
    refuses(
      plan((b) => {
        b.chain('mangle', 'MESH_REDIRECT');
        b.add('nat', 'MESH_OUTPUT', {}, { kind: 'jump', chain: 'MESH_REDIRECT' });
      }),
      /no chain of this plan's nat/,
    );
  });

  it('a hook iptables has no chain for, and two plans of one family', () => {
    refuses(
      plan((b) => b.hook('raw', 'INPUT', 'MESH_INPUT')),
      /raw table has no INPUT/,
    );
    assert.throws(() => renderNftBody([plan(() => {}), plan(() => {})]), /two plans for one family/);
  });

  it('a value nft would parse as something else', () => {
    refuses(
      plan((b) => b.add('nat', 'MESH_OUTPUT', { oif: { value: 'lo" accept #' } }, { kind: 'return' })),
      /is not an interface name/,
    );
    refuses(
      plan((b) =>
        b.add('nat', 'MESH_OUTPUT', { ext: [{ kind: 'owner', uid: { value: 'root' } }] }, { kind: 'return' }),
      ),
      /not a numeric uid/,
    );
    refuses(
      plan((b) => b.add('nat', 'MESH_OUTPUT', { dst: { value: { addr: '::1', len: 32 } } }, { kind: 'return' })),
      /is not an IPv4 address/,
    );
  });
});

describe('nft renderer output in the real nft 1.0.6', () => {
  it('every fixture is taken whole by nft and listed back with a counter on every rule', async () => {
    const ns = new Netns('nftr');
    defer(async () => ns.remove());
    const runner = byPath(ns.path);
    const bodies = [
      ...fixtures.map((f) => ({ name: f.name, body: bodyOf(f) })),
      ...ambientCases.map((c) => ({ name: `ambient ${c.name}`, body: ambientBody(c) })),
    ];
    for (const f of bodies) {
      const body = f.body;
      await applyTable(runner, POD_TABLE, body);
      const have = await readTable(runner, POD_TABLE);
      assert.ok(have !== null, f.name);
      const shape = checkBody(body);
      for (const [chain, n] of shape.chains) {
        const rules = have.chains.get(chain);
        assert.equal(rules?.length, n, `${f.name}: chain ${chain}`);
        assert.ok(
          rules.every((r) => r.counter),
          `${f.name}: chain ${chain} counters`,
        );
      }
      // What `nft list ruleset` prints of it, nft takes back (a person can save and restore it).
      const listed = ns.exec(['nft', 'list', 'ruleset']);
      assert.match(listed, /table inet mesh_pod \{/);
      ns.exec(['nft', '-c', '-f', '-'], `flush ruleset\n${listed}`);
    }
  });
});

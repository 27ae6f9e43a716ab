// The reference's own plugin cases (Istio's cni/pkg/plugin/plugin_dryrun_test.go and its
// testdata goldens), each as a fixture of ours: the pod (annotations, mesh-proxy env and
// securityContext) in, the rules we expect out, in our names, per IP family. See
// fixtures/plugin-conformance/README.md for the case -> fixture table and every deliberate
// difference with the packets it changes.
//
// Rules are compared in a view that holds whatever the restore document's framing: the rules a
// builtin chain's hook runs, in the order it runs them, as our entry chain MESH_<builtin> holds
// them (rules written into the builtin itself move in front of that chain, the jump into it
// goes), then every other chain of ours, sorted, table by table. The same view is taken of
// iptables-save after a real restore in a fresh netns, with nf_tables and with legacy.
// UPDATE_FIXTURES=1 rewrites the expected files (review the diff: comments are lost).

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { parseRules, type RuleSet } from '../../cni-plugin/netns/iptables.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod, type PodLike } from '../../cni-plugin/redirect/spec.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns } from '../helpers/netns.ts';

const DIR = path.join(ROOT, 'test/node/fixtures/plugin-conformance');

interface Fixture {
  readonly name: string;
  readonly reference: { readonly case: string; readonly golden: string };
  readonly description: string;
  readonly annotations?: Record<string, string>;
  readonly proxyEnv?: Record<string, string>;
  readonly proxySecurityContext?: { runAsUser?: number; runAsGroup?: number };
  /** Each deliberate difference from the reference, with the packets it changes. */
  readonly differences: readonly string[];
}

const fixtures: Fixture[] = readdirSync(DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => ({
    name: f.replace(/\.json$/, ''),
    ...(JSON.parse(readFileSync(path.join(DIR, f), 'utf8')) as Omit<Fixture, 'name'>),
  }));

/** The reference's fake pod: an app container, the proxy, the validation container. */
function podOf(f: Fixture): PodLike {
  return {
    metadata: {
      name: 'conformance',
      namespace: 'default',
      annotations: { 'sidecar.mesh.io/status': '{}', ...f.annotations },
    },
    spec: {
      containers: [
        { name: 'app' },
        {
          name: 'mesh-proxy',
          env: Object.entries(f.proxyEnv ?? {}).map(([name, value]) => ({ name, value })),
          ...(f.proxySecurityContext ? { securityContext: f.proxySecurityContext } : {}),
        },
        { name: 'mesh-validation' },
      ],
    },
  };
}

const TABLES = ['nat', 'mangle', 'raw'] as const;
const BUILTIN: Record<string, readonly string[]> = {
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
  raw: ['PREROUTING', 'OUTPUT'],
};

/** The framing-independent view described at the top, as text. */
function hookView(rules: RuleSet): string {
  const out: string[] = [];
  const body = (r: string): string => r.replace(/^-A \S+ /, '');
  for (const t of TABLES) {
    const chains = rules.get(t);
    if (!chains) continue;
    const view = new Map<string, string[]>();
    for (const [c, rs] of chains) if (!BUILTIN[t]!.includes(c)) view.set(c, rs.map(body));
    for (const b of BUILTIN[t]!) {
      const own = (chains.get(b) ?? []).map(body);
      const jump = own.indexOf(`-j MESH_${b}`);
      const hook =
        jump < 0
          ? [...own, ...(view.get(`MESH_${b}`) ?? [])]
          : [...own.slice(0, jump), ...(view.get(`MESH_${b}`) ?? []), ...own.slice(jump + 1)];
      if (hook.length > 0) view.set(`MESH_${b}`, hook);
    }
    const names = [...view.keys()].filter((c) => view.get(c)!.length > 0).sort();
    if (names.length === 0) continue;
    out.push(`*${t}`);
    for (const c of names) out.push(...view.get(c)!.map((r) => `-A ${c} ${r}`));
  }
  return out.join('\n') + '\n';
}

/** `ip -4|-6 -batch` lines of a fixture: its lines starting with `ip `. */
const ipLines = (text: string): string[] =>
  text
    .split('\n')
    .filter((l) => l.startsWith('ip '))
    .map((l) => l.replace(/^ip -[46] /, ''));

function expected(f: Fixture, fam: 4 | 6): { rules: string; ip: string[]; file: string } {
  const file = path.join(DIR, `${f.name}.v${fam}.rules`);
  const built = buildFamilyRules(specForPod(podOf(f)), fam);
  if (process.env.UPDATE_FIXTURES === '1' || !existsSync(file)) {
    const head = `# Reference case ${f.reference.case}, IPv${fam}: ${f.description}\n`;
    writeFileSync(
      file,
      head + hookView(parseRules(built.restore)) + built.ipBatch.map((l) => `ip -${fam} ${l}\n`).join(''),
    );
  }
  const text = readFileSync(file, 'utf8');
  return { rules: hookView(parseRules(text)), ip: ipLines(text), file };
}

describe('plugin conformance: the reference plugin cases as our fixtures', () => {
  it('has a fixture for every reference case, each listed in the README with its differences', () => {
    const readme = readFileSync(path.join(DIR, 'README.md'), 'utf8');
    // plugin_dryrun_test.go's cases, plus the one golden in its testdata that no case reads.
    const reference = [
      'basic',
      'include-exclude-ip',
      'include-exclude-ports',
      'tproxy',
      'DNS',
      'invalid-drop',
      'custom-uid',
      'custom-uid-zero',
      'custom-uid-tproxy',
    ];
    assert.deepEqual(
      fixtures
        .map((f) => f.reference.case)
        .filter((c) => !c.startsWith('('))
        .sort(),
      [...reference].sort(),
    );
    for (const f of fixtures) {
      assert.ok(readme.includes(`[${f.name}.json](${f.name}.json)`), `README.md lists ${f.name}.json`);
      assert.ok(readme.includes(f.reference.golden.replace(/^.*\//, '')), `README.md names ${f.reference.golden}`);
    }
  });

  for (const f of fixtures) {
    for (const fam of [4, 6] as const) {
      it(`${f.name} IPv${fam}: ${f.description}`, () => {
        const want = expected(f, fam);
        const built = buildFamilyRules(specForPod(podOf(f)), fam);
        assert.equal(hookView(parseRules(built.restore)), want.rules, want.file);
        assert.deepEqual(built.ipBatch, want.ip, `${want.file}: ip -${fam} -batch lines`);
      });
    }
  }
});

describe('plugin conformance: the fixtures hold in a real netns', () => {
  const namespaces: Netns[] = [];
  after(() => {
    for (const n of namespaces) n.remove();
  });

  for (const flavour of ['nft', 'legacy'] as const) {
    it(`${flavour}: each case restored in a fresh netns saves back as its fixture`, () => {
      for (const f of fixtures) {
        const ns = new Netns('conf');
        namespaces.push(ns);
        for (const fam of [4, 6] as const) {
          const built = buildFamilyRules(specForPod(podOf(f)), fam);
          const cmd = fam === 4 ? 'iptables' : 'ip6tables';
          ns.exec([`${cmd}-${flavour}-restore`, '--noflush'], built.restore);
          if (built.ipBatch.length > 0) ns.exec(['ip', `-${fam}`, '-batch', '-'], built.ipBatch.join('\n') + '\n');
          const saved = ns.exec([`${cmd}-${flavour}-save`]);
          assert.equal(hookView(parseRules(saved)), expected(f, fam).rules, `${f.name} IPv${fam} ${flavour}`);
          if (f.annotations?.['sidecar.mesh.io/interceptionMode'] === 'TPROXY') {
            assert.match(
              ns.exec(['ip', `-${fam}`, 'rule', 'show']),
              /fwmark 0x539 lookup 133/,
              `${f.name} IPv${fam}: policy route for TPROXY`,
            );
          }
        }
        ns.remove();
      }
    });
  }
});

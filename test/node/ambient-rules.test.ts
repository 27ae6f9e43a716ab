// Ambient rule builders (src/ambient/podrules.ts, hostrules.ts: plans in the one rule model,
// rendered by cni-plugin/redirect/restoredoc.ts) against our fixtures in
// test/node/fixtures/ambient/: per case, pod annotations in (cases.json), one iptables-restore
// document per family out. UPDATE_FIXTURES=1 rewrites the expected files (review the diff!).
//
// The fixtures are the test. That they say what Istio says is shown by the second part: each of
// Istio's in-pod and host goldens, read from the read-only mirror at test time, holds the same
// rules in each chain as our plan for the same inputs once ISTIO_* is renamed MESH_* and Istio's
// spelling is put in iptables-save's (ours is already). On a machine without the mirror that part
// is skipped, by name, with the path it looked for.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { diffRules, parseRules, reconcileRestore, type RuleSet } from '../../cni-plugin/redirect/iptables.ts';
import { ipBatchLines } from '../../cni-plugin/redirect/restoredoc.ts';
import {
  addProbeCommand,
  hostPlan,
  hostRestore,
  parseProbeSet,
  probeSetsDocument,
  PROBE_SET_V4,
} from '../../src/ambient/hostrules.ts';
import {
  AmbientRulesError,
  inpodPlan,
  inpodRestore,
  podOptions,
  type Family,
  type InpodOptions,
} from '../../src/ambient/podrules.ts';
import { ROOT } from '../helpers/cli.ts';

const DIR = path.join(ROOT, 'test/node/fixtures/ambient');
const UPDATE = process.env.UPDATE_FIXTURES === '1';

interface Case {
  readonly name: string;
  readonly istio: string;
  readonly description: string;
  readonly annotations: Record<string, string>;
  readonly globalDnsCapture: boolean;
}
const cases = (JSON.parse(readFileSync(path.join(DIR, 'cases.json'), 'utf8')) as { cases: Case[] }).cases;

function header(name: string, family: Family, description: string): string {
  const about = 'Expected output of src/ambient; written for mesh-cni (see cases.json).';
  return `# ${name}, IPv${family}: ${description}\n# ${about}\n`;
}

function checkFixture(file: string, head: string, doc: string): void {
  const p = path.join(DIR, file);
  if (UPDATE) writeFileSync(p, head + doc);
  const want = readFileSync(p, 'utf8')
    .split('\n')
    .filter((l) => !l.startsWith('#'))
    .join('\n');
  assert.equal(doc, want, `${file} differs (UPDATE_FIXTURES=1 rewrites it; review the diff)`);
}

describe('in-pod rules: fixtures', () => {
  for (const c of cases) {
    for (const family of [4, 6] as const) {
      it(`${c.name} IPv${family}: ${c.description}`, () => {
        const doc = inpodRestore(family, podOptions(c.annotations, c.globalDnsCapture));
        checkFixture(`${c.name}.v${family}.rules`, header(c.name, family, c.description), doc);
      });
    }
  }
  for (const family of [4, 6] as const) {
    it(`host probe SNAT IPv${family}`, () => {
      const desc = 'node sockets to enrolled pods SNATed to the probe address';
      checkFixture(`hostprobe.v${family}.rules`, header('hostprobe', family, desc), hostRestore(family));
    });
  }
});

describe('in-pod rules: options', () => {
  it('refuses a bad boolean annotation instead of ignoring it (fail closed; Istio ignores it)', () => {
    assert.throws(
      () => podOptions({ 'ambient.mesh.io/bypass-inbound-capture': 'yes' }, false),
      (e: Error) => e instanceof AmbientRulesError && /bypass-inbound-capture="yes" is not a boolean/.test(e.message),
    );
    assert.throws(() => podOptions({ 'ambient.mesh.io/dns-capture': '' }, false), /dns-capture="" is not a boolean/);
  });
  it("reads booleans as Istio's strconv.ParseBool does (1 t T TRUE true True and the false ones), refuses the rest", () => {
    const key = 'ambient.mesh.io/bypass-inbound-capture';
    for (const v of ['1', 't', 'T', 'TRUE', 'true', 'True'])
      assert.equal(podOptions({ [key]: v }, false).ingressMode, true, v);
    for (const v of ['0', 'f', 'F', 'FALSE', 'false', 'False'])
      assert.equal(podOptions({ [key]: v }, false).ingressMode, false, v);
    // Istio ignores these (inbound captured); taking them as true would bypass ztunnel where Istio does not.
    for (const v of ['TrUe', ' true', 'true ', 'yes'])
      assert.throws(() => podOptions({ [key]: v }, false), /is not a boolean/, JSON.stringify(v));
    assert.equal(podOptions({ 'ambient.mesh.io/dns-capture': 'F' }, true).dnsCapture, false);
  });
  it('refuses an interface name that is not one interface (wildcard, option, too long)', () => {
    for (const bad of ['eth+', '-j ACCEPT', 'a'.repeat(16), 'a b', '!eth0']) {
      assert.throws(
        () => podOptions({ 'mesh.io/reroute-virtual-interfaces': bad }, false),
        /reroute-virtual-interfaces: ".*" is not an interface name/,
        bad,
      );
    }
  });
  it('refuses a probe address of the wrong family', () => {
    const o: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [], probeSnatV4: '::1' };
    assert.throws(() => inpodPlan(4, o), /"::1" is not an IPv4 address/);
    assert.throws(() => hostPlan(6, '10.0.0.1'), /"10.0.0.1" is not an IPv6 address/);
  });
  it('the ip rule and route to table 100, added and removed (the route left out where lo has no IPv6)', () => {
    const opts: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
    assert.deepEqual(ipBatchLines(inpodPlan(4, opts), 'add'), [
      'route replace local default dev lo table 100',
      'rule add fwmark 0x111/0xfff lookup 100 priority 32764',
    ]);
    assert.deepEqual(ipBatchLines(inpodPlan(6, opts), 'del'), [
      'rule del fwmark 0x111/0xfff lookup 100 priority 32764',
      'route del local default dev lo table 100',
    ]);
    assert.deepEqual(ipBatchLines(inpodPlan(6, opts), 'add', false), [
      'rule add fwmark 0x111/0xfff lookup 100 priority 32764',
    ]);
    assert.equal(ipBatchLines(inpodPlan(4, opts), 'add', false).length, 2, 'IPv4 has no optional route');
  });
});

describe('reconcile documents (the one applier, cni-plugin/redirect/iptables.ts)', () => {
  const opts: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
  // What iptables-save prints after our default IPv4 document, plus someone else's rules.
  const saved = [
    '*mangle',
    ':PREROUTING ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':MESH_OUTPUT - [0:0]',
    ':MESH_PRERT - [0:0]',
    ':OTHER - [0:0]',
    '-A PREROUTING -j OTHER',
    '-A PREROUTING -j MESH_PRERT',
    '-A OUTPUT -j MESH_OUTPUT',
    '-A MESH_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff',
    '-A MESH_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff',
    '-A OTHER -p udp -j MARK --set-xmark 0x7/0xffffffff',
    'COMMIT',
    '*nat',
    ':PREROUTING ACCEPT [3:180]',
    ':OUTPUT ACCEPT [0:0]',
    ':MESH_OUTPUT - [0:0]',
    ':MESH_PRERT - [0:0]',
    '-A PREROUTING -p udp -m udp --dport 9999 -j ACCEPT',
    '-A PREROUTING -j MESH_PRERT',
    '-A OUTPUT -j MESH_OUTPUT',
    '-A MESH_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT',
    '-A MESH_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT',
    '-A MESH_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT',
    '-A MESH_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001',
    '-A MESH_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT',
    '-A MESH_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff ' +
      '-j REDIRECT --to-ports 15006',
    'COMMIT',
  ].join('\n');

  const want = (o: InpodOptions): RuleSet => parseRules(inpodRestore(4, o));
  it('nothing to do when what is there is ours as wanted (iptables-save form read back)', () => {
    assert.deepEqual(diffRules(want(opts), parseRules(saved)), []);
  });
  it('removal: our jumps out, our chains flushed and deleted, nothing else named', () => {
    const doc = reconcileRestore(null, parseRules(saved))!;
    checkFixture('removal.v4.rules', '# removal of ours from the state in ambient-rules.test.ts\n', doc);
    assert.doesNotMatch(doc, /OTHER|9999/);
  });
  it('a changed option rewrites ours in one document per table, and adds raw only when DNS is captured', () => {
    const dns = want({ ...opts, dnsCapture: true });
    assert.notDeepEqual(diffRules(dns, parseRules(saved)), []);
    const doc = reconcileRestore(dns, parseRules(saved))!;
    assert.match(doc, /^\*raw\n:MESH_OUTPUT - \[0:0\]\n:MESH_PRERT - \[0:0\]\n-A MESH_OUTPUT /m);
    assert.match(doc, /\*raw\n(.|\n)*-I PREROUTING 1 -j MESH_PRERT\n-I OUTPUT 1 -j MESH_OUTPUT\nCOMMIT\n$/);
    assert.match(doc, /^\*nat\n-D PREROUTING -j MESH_PRERT\n-D OUTPUT -j MESH_OUTPUT\n:MESH_OUTPUT - \[0:0\]/m);
  });
  it("in a pod, a sidecar mode's MESH_* leftovers go (as Istio sweeps ISTIO_*); a caller can own less", () => {
    const leftover = saved.replace(
      '*nat\n',
      '*nat\n:MESH_INBOUND - [0:0]\n-A PREROUTING -p tcp -j MESH_INBOUND\n-A MESH_INBOUND -p tcp -j RETURN\n',
    );
    assert.notDeepEqual(diffRules(want(opts), parseRules(leftover)), []);
    const doc = reconcileRestore(want(opts), parseRules(leftover))!;
    assert.match(doc, /^-D PREROUTING -p tcp -j MESH_INBOUND\n(.|\n)*^-X MESH_INBOUND$/m);
    const only = (c: string) => c === 'MESH_PRERT' || c === 'MESH_OUTPUT';
    assert.deepEqual(diffRules(want(opts), parseRules(leftover), only), []);
    assert.doesNotMatch(reconcileRestore(want(opts), parseRules(leftover), only)!, /MESH_INBOUND/);
  });
  it("another component's rule that names our chain only in a comment is not ours: kept, and no rewrite", () => {
    // iptables-save quotes comments (with \" inside); the target is the -j/-g outside them.
    const commented = saved.replace(
      '-A PREROUTING -p udp -m udp --dport 9999 -j ACCEPT',
      '-A PREROUTING -p udp -m udp --dport 9999 -m comment --comment "sends \\"-j MESH_PRERT\\" elsewhere" -j ACCEPT\n' +
        '-A PREROUTING -m comment --comment "before -j MESH_PRERT" -j OTHER',
    );
    assert.deepEqual(diffRules(want(opts), parseRules(commented)), [], 'nothing of ours changed');
    const removal = reconcileRestore(null, parseRules(commented))!;
    assert.doesNotMatch(removal, /comment/, "removal names no rule of another's");
  });
});

describe('host probe set', () => {
  it('the start document makes both sets with comments and keeps their entries (the start-up sync prunes)', () => {
    assert.equal(
      probeSetsDocument([4, 6]),
      'create mesh-inpod-probes-v4 hash:ip family inet comment\n' +
        'create mesh-inpod-probes-v6 hash:ip family inet6 comment\n',
    );
  });
  it('adds carry the UID and -exist, into the set of the address family', () => {
    assert.deepEqual(addProbeCommand('198.18.88.2', 'a-1'), [
      'add',
      PROBE_SET_V4,
      '198.18.88.2',
      'comment',
      'a-1',
      '-exist',
    ]);
    assert.equal(addProbeCommand('2001:db8::2', 'a-1')[1], 'mesh-inpod-probes-v6');
    assert.throws(() => addProbeCommand('198.18.88.2', 'x" -exist'), /is not a UID/);
    assert.throws(() => addProbeCommand('198.18.88', 'a'), /is not an IP address/);
  });
  it('reads ipset save', () => {
    const text =
      'create mesh-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12\n' +
      'add mesh-inpod-probes-v4 198.18.88.2 comment "uid-b"\nadd mesh-inpod-probes-v4 198.18.88.3\n';
    assert.deepEqual(
      [...parseProbeSet(text)],
      [
        ['198.18.88.2', 'uid-b'],
        ['198.18.88.3', ''],
      ],
    );
  });
});

// ---- Istio's goldens, from the mirror ----

const MIRROR = '/work/.mirror/istio+istio/repo';
const GOLDENS = 'cni/pkg/iptables/testdata';

function istioGolden(name: string): string | null {
  const r = spawnSync('git', ['-C', MIRROR, 'show', `HEAD:${GOLDENS}/${name}.golden`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout : null;
}

const BASIC_OPTIONS = ['-s', '-d', '-i', '-o', '-p'];

/**
 * Istio's spelling of a rule in iptables-save's (ours is already in it, restoredoc.ts): the basic
 * options (-s -d -i -o -p) first, addresses with their prefix length, a port match's implicit
 * `-m tcp`/`-m udp` right after them, `--to-port` as `--to-ports`, `-I X 1` as `-A X`.
 */
function savedForm(line: string, family: Family): string {
  const [, chain, ...t] = line.replace(/^-I (\S+) 1 /, '-A $1 ').split(' ');
  const basic = new Map<string, string[]>();
  const rest: string[] = [];
  for (let i = 0; i < t.length; i++) {
    const neg = t[i] === '!' && BASIC_OPTIONS.includes(t[i + 1]!);
    const opt = neg ? t[++i]! : t[i]!;
    if (BASIC_OPTIONS.includes(opt) && t[i + 1] !== undefined) {
      let value = t[++i]!;
      if ((opt === '-s' || opt === '-d') && !value.includes('/')) value += `/${family === 4 ? 32 : 128}`;
      basic.set(opt, neg ? ['!', opt, value] : [opt, value]);
    } else {
      rest.push(opt === '--to-port' ? '--to-ports' : opt);
    }
  }
  const proto = basic.get('-p')?.at(-1);
  const hasPort = rest.includes('--dport') || rest.includes('--sport');
  const explicit = rest.some((x, j) => x === '-m' && rest[j + 1] === proto);
  if ((proto === 'tcp' || proto === 'udp') && hasPort && !explicit) rest.unshift('-m', proto);
  return ['-A', chain!, ...BASIC_OPTIONS.flatMap((o) => basic.get(o) ?? []), ...rest].join(' ');
}

/** Per family: `table chain` -> its rules, sorted by key; builtins only by their jumps into ours. */
type Chains = [string, string[]][];
const sorted = (m: Map<string, string[]>): Chains => [...m].sort(([a], [b]) => (a < b ? -1 : 1));

/**
 * Istio's golden, renamed (ISTIO_ -> MESH_), as Chains per family: a table seen again starts
 * the next family's part (the _ipv6 goldens hold the IPv4 rules, then the IPv6 ones).
 */
function goldenChains(golden: string): Chains[] {
  const parts: Map<string, string[]>[] = [];
  let seen = new Set<string>();
  let m = new Map<string, string[]>();
  let table = '';
  const lines = golden.replaceAll('ISTIO_', 'MESH_').replaceAll('istio-inpod-probes', 'mesh-inpod-probes').split('\n');
  for (const line of lines.map((l) => l.trim())) {
    if (line.startsWith('* ')) {
      table = line.slice(2);
      if (seen.has(table)) {
        parts.push(m);
        m = new Map();
        seen = new Set();
      }
      seen.add(table);
    } else if (line.startsWith('-N ')) {
      m.set(`${table} ${line.slice(3)}`, m.get(`${table} ${line.slice(3)}`) ?? []);
    } else if (line.startsWith('-A ') || line.startsWith('-I ')) {
      const key = `${table} ${line.split(' ')[1]}`;
      (m.get(key) ?? m.set(key, []).get(key)!).push(line);
    }
  }
  parts.push(m);
  return parts.map((p, i) => {
    const family: Family = i === 0 ? 4 : 6;
    return sorted(new Map([...p].map(([k, rules]) => [k, rules.map((r) => savedForm(r, family))])));
  });
}

/** Our restore document as Chains (parseRules reads `-I X 1` as the rule it puts in X). */
function ourChains(doc: string): Chains {
  const m = new Map<string, string[]>();
  for (const [t, chains] of parseRules(doc)) for (const [c, rules] of chains) m.set(`${t} ${c}`, rules);
  return sorted(m);
}

const mirrorThere = existsSync(MIRROR);
describe(
  'equal to Istio (goldens read from the mirror, chains renamed)',
  { skip: mirrorThere ? false : `no Istio mirror at ${MIRROR}` },
  () => {
    for (const c of cases) {
      for (const v6 of [false, true]) {
        const golden = `${c.istio}${v6 ? '_ipv6' : ''}`;
        it(golden, () => {
          const text = istioGolden(golden);
          assert.ok(text !== null, `${GOLDENS}/${golden}.golden is not in ${MIRROR}`);
          const want = goldenChains(text);
          // Istio's inputs, read off its own golden: the interface names and its test IPv6 probe address.
          const ifaces = [...new Set([...text.matchAll(/ -i (\S+)/g)].map((m) => m[1]!))];
          const v6probe = /-d ([0-9a-f:]+) -p tcp -m tcp -j ACCEPT/.exec(text.split('* mangle').slice(2).join(''))?.[1];
          const opts = podOptions(
            { ...c.annotations, 'mesh.io/reroute-virtual-interfaces': ifaces.join(',') },
            c.globalDnsCapture,
          );
          const mine = [ourChains(inpodRestore(4, opts))];
          if (v6) mine.push(ourChains(inpodRestore(6, { ...opts, probeSnatV6: v6probe! })));
          // The same rules in each chain, in order; where the hooks sit in the builtins differs
          // (Istio appends them, we put them first: docs/ambient.md "Ambient mode's rules").
          assert.deepEqual(mine, want);
        });
      }
    }
    for (const v6 of [false, true]) {
      const golden = `hostprobe${v6 ? '_ipv6' : ''}`;
      it(golden, () => {
        const text = istioGolden(golden);
        assert.ok(text !== null, `${GOLDENS}/${golden}.golden is not in ${MIRROR}`);
        const mine = [ourChains(hostRestore(4))];
        if (v6) mine.push(ourChains(hostRestore(6)));
        assert.deepEqual(mine, goldenChains(text));
      });
    }
  },
);

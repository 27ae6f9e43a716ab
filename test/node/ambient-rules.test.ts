// Ambient rule builders (src/ambient/podrules.ts, hostrules.ts) against our fixtures in
// test/node/fixtures/ambient/: per case, pod annotations in (cases.json), one iptables-restore
// document per family out. UPDATE_FIXTURES=1 rewrites the expected files (review the diff!).
//
// The fixtures are the test. That they say what Istio says is shown by the second part: each of
// Istio's in-pod and host goldens, read from the read-only mirror at test time, equals our
// builder's output for the same inputs once ISTIO_* is renamed MESH_*. On a machine without the
// mirror that part is skipped, by name, with the path it looked for.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import {
  addProbeCommand,
  hostRules,
  parseProbeSet,
  probeSetsDocument,
  PROBE_SET_V4,
} from '../../src/ambient/hostrules.ts';
import {
  AmbientRulesError,
  byTable,
  canonicalRule,
  inpodRouteCommands,
  inpodRules,
  podOptions,
  reconcileDocument,
  renderRestore,
  type Family,
  type InpodOptions,
  type Rule,
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
        const rules = inpodRules(family, podOptions(c.annotations, c.globalDnsCapture));
        checkFixture(`${c.name}.v${family}.rules`, header(c.name, family, c.description), renderRestore(rules));
      });
    }
  }
  for (const family of [4, 6] as const) {
    it(`host probe SNAT IPv${family}`, () => {
      const desc = 'node sockets to enrolled pods SNATed to the probe address';
      checkFixture(`hostprobe.v${family}.rules`, header('hostprobe', family, desc), renderRestore(hostRules(family)));
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
    assert.throws(() => inpodRules(4, o), /"::1" is not an IPv4 address/);
    assert.throws(() => hostRules(6, '10.0.0.1'), /"10.0.0.1" is not an IPv6 address/);
  });
  it('the ip rule and route to table 100, added and removed', () => {
    assert.deepEqual(inpodRouteCommands(4, 'add'), [
      ['route', 'replace', 'local', '0.0.0.0/0', 'dev', 'lo', 'table', '100'],
      ['rule', 'add', 'fwmark', '0x111/0xfff', 'pref', '32764', 'lookup', '100'],
    ]);
    assert.deepEqual(inpodRouteCommands(6, 'del'), [
      ['rule', 'del', 'fwmark', '0x111/0xfff', 'pref', '32764', 'lookup', '100'],
      ['route', 'del', 'local', '::/0', 'dev', 'lo', 'table', '100'],
    ]);
  });
});

describe('reconcile documents', () => {
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

  it('nothing to do when what is there is ours as wanted (iptables-save form read back)', () => {
    assert.equal(reconcileDocument(inpodRules(4, opts), saved, 4), null);
  });
  it('removal: our jumps out, our chains flushed and deleted, nothing else named', () => {
    const doc = reconcileDocument([], saved, 4)!;
    checkFixture('removal.v4.rules', '# removal of ours from the state in ambient-rules.test.ts\n', doc);
    assert.doesNotMatch(doc, /OTHER|9999/);
  });
  it('a changed option rewrites ours in one document per table, and adds raw only when DNS is captured', () => {
    const doc = reconcileDocument(inpodRules(4, { ...opts, dnsCapture: true }), saved, 4)!;
    assert.match(doc, /^\*raw\n:MESH_OUTPUT - \[0:0\]\n:MESH_PRERT - \[0:0\]\n-A PREROUTING -j MESH_PRERT\n/m);
    assert.match(doc, /^\*nat\n-D PREROUTING -j MESH_PRERT\n-D OUTPUT -j MESH_OUTPUT\n:MESH_PRERT - \[0:0\]/m);
  });
  it("in a pod, a sidecar mode's MESH_* leftovers go (as Istio sweeps ISTIO_*); a caller can own less", () => {
    const leftover = saved.replace(
      '*nat\n',
      '*nat\n:MESH_INBOUND - [0:0]\n-A PREROUTING -p tcp -j MESH_INBOUND\n-A MESH_INBOUND -p tcp -j RETURN\n',
    );
    const doc = reconcileDocument(inpodRules(4, opts), leftover, 4)!;
    assert.match(doc, /^-D PREROUTING -p tcp -j MESH_INBOUND\n(.|\n)*^-X MESH_INBOUND$/m);
    const only = (c: string) => c === 'MESH_PRERT' || c === 'MESH_OUTPUT';
    assert.equal(reconcileDocument(inpodRules(4, opts), leftover, 4, only), null);
  });
  it("another component's rule that names our chain only in a comment is not ours: kept, and no rewrite", () => {
    // iptables-save quotes comments (with \" inside); the target is the -j/-g outside them.
    const commented = saved.replace(
      '-A PREROUTING -p udp -m udp --dport 9999 -j ACCEPT',
      '-A PREROUTING -p udp -m udp --dport 9999 -m comment --comment "sends \\"-j MESH_PRERT\\" elsewhere" -j ACCEPT\n' +
        '-A PREROUTING -m comment --comment "before -j MESH_PRERT" -j OTHER',
    );
    assert.equal(reconcileDocument(inpodRules(4, opts), commented, 4), null, 'nothing of ours changed');
    const removal = reconcileDocument([], commented, 4)!;
    assert.doesNotMatch(removal, /comment/, "removal names no rule of another's");
  });
  it('canonical forms: what iptables-save prints for what we write', () => {
    assert.equal(
      canonicalRule('-A X -s 1.2.3.4 -p tcp -m tcp -j ACCEPT', 4),
      '-A X -s 1.2.3.4/32 -p tcp -m tcp -j ACCEPT',
    );
    assert.equal(
      canonicalRule('-A X -p tcp --dport 53 -j REDIRECT --to-port 1', 4),
      '-A X -p tcp -m tcp --dport 53 -j REDIRECT --to-ports 1',
    );
    assert.equal(canonicalRule('-I X 1 -j MESH_Y', 6), '-A X -j MESH_Y');
    assert.equal(
      canonicalRule('-A X -m owner --socket-exists -p tcp -m set --match-set s dst -j SNAT', 4),
      '-A X -p tcp -m owner --socket-exists -m set --match-set s dst -j SNAT',
    );
    assert.equal(
      canonicalRule('-A X -p tcp ! --dport 1 ! -d ::1 -j A', 6),
      '-A X ! -d ::1/128 -p tcp -m tcp ! --dport 1 -j A',
    );
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

/** Istio's golden, renamed, as lines: the version-detection lines dropped, ISTIO_ -> MESH_. */
function renamed(golden: string): string[] {
  return golden
    .replaceAll('ISTIO_', 'MESH_')
    .replaceAll('istio-inpod-probes', 'mesh-inpod-probes')
    .split('\n')
    .map((l) => l.trimEnd())
    .filter((l) => l !== '' && l !== 'iptables-save' && l !== 'ip6tables-save');
}

/** Our rules in the layout of Istio's builder output (`* table`, `-N chain`), for the comparison only. */
function istioLayout(rules: readonly Rule[]): string[] {
  const out: string[] = [];
  for (const [t, { chains, lines }] of byTable(rules))
    out.push(`* ${t}`, ...chains.map((c) => `-N ${c}`), ...lines, 'COMMIT');
  return out;
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
          const want = renamed(text);
          // Istio's inputs, read off its own golden: the interface names and its test IPv6 probe address.
          const ifaces = [...new Set([...text.matchAll(/ -i (\S+)/g)].map((m) => m[1]!))];
          const v6probe = /-d ([0-9a-f:]+) -p tcp -m tcp -j ACCEPT/.exec(text.split('* mangle').slice(2).join(''))?.[1];
          const opts = podOptions(
            { ...c.annotations, 'mesh.io/reroute-virtual-interfaces': ifaces.join(',') },
            c.globalDnsCapture,
          );
          const mine = istioLayout(inpodRules(4, opts));
          if (v6) mine.push(...istioLayout(inpodRules(6, { ...opts, probeSnatV6: v6probe! })));
          assert.deepEqual(mine, want);
        });
      }
    }
    for (const v6 of [false, true]) {
      const golden = `hostprobe${v6 ? '_ipv6' : ''}`;
      it(golden, () => {
        const text = istioGolden(golden);
        assert.ok(text !== null, `${GOLDENS}/${golden}.golden is not in ${MIRROR}`);
        const mine = istioLayout(hostRules(4));
        if (v6) mine.push(...istioLayout(hostRules(6)));
        // Istio's builder writes an insert as it is run: -I POSTROUTING 1 (so do we).
        assert.deepEqual(mine, renamed(text));
      });
    }
  },
);

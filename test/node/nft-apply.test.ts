// The native nftables applier (cni-plugin/redirect/nft.ts) on the real nft, in netns each test
// makes: our table written whole in one transaction, replaced whole, removed, someone else's
// tables byte-for-byte as they were, a counter on every rule, and the ways nft fails (missing,
// hanging, crashing, without JSON) each a clear error that leaves nothing of ours half-written.
// The failing nfts are shell stubs the runner runs in nft's place. Every netns and temp dir is
// removed after each test, passed or not (the tables live in the netns and go with it).

import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { exec } from '../../cni-plugin/netns/exec.ts';
import { byPath } from '../../cni-plugin/netns/iptables.ts';
import type { NetnsRunner } from '../../cni-plugin/redirect/iptables.ts';
import {
  applyTable,
  checkBody,
  ensureTable,
  NftError,
  OWNER_SET,
  readTable,
  removeTable,
} from '../../cni-plugin/redirect/nft.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FOREIGN_TABLES, foreignTables } from '../helpers/nftables.ts';
import { Netns } from '../helpers/netns.ts';
import { sh, shStatus } from '../helpers/sh.ts';

const defer = cleanupAfterEach();
const TABLE = 'mesh_pod';

/** A pod's table as a renderer might write it: a set, two nat chains, a counter on every rule. */
const BODY = `
set excluded_v4 {
	type ipv4_addr; flags interval;
	elements = { 198.18.5.0/24 }
}
chain prerouting {
	type nat hook prerouting priority dstnat; policy accept;
	meta l4proto tcp ip saddr 169.254.7.127 counter accept comment "the node's probes"
	meta l4proto tcp tcp dport != 15008 counter redirect to :15006
}
chain output {
	type nat hook output priority -100; policy accept;
	ip daddr @excluded_v4 counter return
	oifname "lo" counter accept
	meta l4proto tcp counter redirect to :15001
}
`;

/** The next ADD's body: one chain fewer, other rules. */
const BODY_2 = `
chain output {
	type nat hook output priority -100; policy accept;
	meta l4proto tcp tcp dport 9 counter accept
}
`;

function netns(): Netns {
  const n = new Netns('nft');
  defer(async () => n.remove());
  return n;
}

const nftIn = (ns: Netns, ...args: string[]) => ns.exec(['nft', ...args]);
/** Someone else's tables as `nft -a list` prints them: handles too, so a table made again shows. */
const ourTables = (ns: Netns) =>
  nftIn(ns, 'list', 'tables')
    .split('\n')
    .filter((l) => l.includes(TABLE));

/** A temp dir for stubs, removed after the test. */
function tempDir(): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'mcni-nft-'));
  defer(async () => rmSync(d, { recursive: true, force: true }));
  return d;
}

/** A shell script standing in for nft; `log` gets a line per run with its arguments. */
function stub(script: string): { bin: string; log: string } {
  const d = tempDir();
  const bin = path.join(d, 'nft');
  const log = path.join(d, 'calls');
  writeFileSync(log, '');
  writeFileSync(bin, `#!/bin/sh\necho "$*" >> ${log}\n${script}\n`);
  chmodSync(bin, 0o755);
  return { bin, log };
}

const calls = (log: string) =>
  readFileSync(log, 'utf8')
    .split('\n')
    .filter((l) => l !== '');

/** Runs `bin` where the applier runs nft, in the netns, with the plugin's exec and a time limit. */
function runnerWith(ns: Netns, bin: string, timeoutMs = 5000): NetnsRunner {
  return {
    where: `in ${ns.path}`,
    run: (argv, o) =>
      exec('nsenter', [`--net=${ns.path}`, '--', argv[0] === 'nft' ? bin : argv[0]!, ...argv.slice(1)], {
        timeoutMs,
        input: o.input ?? null,
        stdout: o.stdout ?? true,
      }),
  };
}

async function rejectsWith(p: Promise<unknown>, pattern: RegExp, permanent?: boolean): Promise<NftError> {
  let err: unknown;
  await p.then(
    () => assert.fail(`expected a rejection matching ${pattern}`),
    (e: unknown) => (err = e),
  );
  assert.ok(err instanceof NftError, `an NftError, not ${String(err)}`);
  assert.match(err.message, pattern);
  if (permanent !== undefined) assert.equal(err.permanent, permanent, err.message);
  return err;
}

describe('nft applier: our table, whole, and nothing else', () => {
  it('ADD, re-ADD and DEL write and remove only our table; foreign tables stay byte-for-byte', async () => {
    const ns = netns();
    ns.exec(['nft', '-f', '-'], FOREIGN_TABLES);
    const before = foreignTables(ns);
    const run = byPath(ns.path);

    assert.equal(await applyTable(run, TABLE, BODY), 'created');
    assert.equal(foreignTables(ns), before, 'ADD');
    const first = await readTable(run, TABLE);
    assert.ok(first && first.digest !== null, 'ours, by its owner set');
    assert.deepEqual([...first.chains.keys()].sort(), ['output', 'prerouting']);
    assert.equal(first.chains.get('output')!.length, 3);
    assert.ok(first.sets.has(OWNER_SET) && first.sets.has('excluded_v4'));
    assert.match(nftIn(ns, 'list', 'table', 'inet', TABLE), /comment "written by mesh-cni; it removes it"/);

    assert.equal(await applyTable(run, TABLE, BODY_2), 'replaced');
    assert.equal(foreignTables(ns), before, 're-ADD');
    const second = await readTable(run, TABLE);
    assert.ok(second);
    assert.notEqual(second.handle, first.handle, 'a new table, not an edited one');
    assert.deepEqual([...second.chains.keys()], ['output'], 'the old chains are gone whole');
    assert.equal(second.chains.get('output')!.length, 1);
    assert.ok(!second.sets.has('excluded_v4'));
    assert.deepEqual(ourTables(ns), [`table inet ${TABLE}`]);

    assert.equal(await removeTable(run, TABLE), 'removed');
    assert.equal(foreignTables(ns), before, 'DEL');
    assert.deepEqual(ourTables(ns), []);
    assert.equal(await removeTable(run, TABLE), 'absent', 'a second DEL finds nothing');
  });

  it('every rule we write has a counter; a body rule without one is refused before nft runs', async () => {
    const ns = netns();
    const run = byPath(ns.path);
    await applyTable(run, TABLE, BODY);
    const have = await readTable(run, TABLE);
    const rules = [...have!.chains.values()].flat();
    assert.equal(rules.length, 5);
    assert.ok(rules.every((r) => r.counter));
    assert.equal((nftIn(ns, 'list', 'table', 'inet', TABLE).match(/counter packets/g) ?? []).length, 5);

    const { bin, log } = stub('exec nft "$@"');
    const noCounter =
      'chain output {\n\ttype nat hook output priority -100; policy accept;\n\tmeta l4proto tcp redirect to :15001\n}\n';
    await rejectsWith(applyTable(runnerWith(ns, bin), TABLE, noCounter), /line 3: rule without a counter/);
    // two rules on one line, one of them without: still refused
    const sneaky = 'chain output {\n\tcounter accept; tcp dport 9 drop\n}\n';
    assert.throws(() => checkBody(sneaky), /rule without a counter.*tcp dport 9 drop/);
    // "counter" only in a comment is no counter
    assert.throws(() => checkBody('chain c {\n\taccept comment "counter"\n}\n'), /without a counter/);
    assert.deepEqual(calls(log), [], 'nft never ran');
  });

  it('a body that reaches outside our table is refused', () => {
    assert.throws(() => checkBody('chain c {\n}\n}\ntable ip nat {\n'), /expected "chain NAME \{"|more "\}"/);
    assert.throws(() => checkBody('flush ruleset\n'), /expected "chain NAME \{"/);
    assert.throws(() => checkBody('set s { type ipv4_addr;\n'), /never closed/);
    assert.throws(() => checkBody(`set ${OWNER_SET} { type mark; }\n`), /the applier's own set/);
    assert.throws(() => checkBody('chain c {\n\tip daddr { 1.1.1.1,\n}\n'), /one rule per line/);
  });

  it('a body that has nft read a host file, or a quoted string nft reads past its line, never runs', async () => {
    // nft, run as the node's root, takes `include` in a set or map block as in a chain: the file
    // is read and its first line printed in the syntax error, which a CNI error hands to the pod.
    const secret = path.join(tempDir(), 'secret');
    writeFileSync(secret, 'host-secret-7f3a\n');
    const ns = netns();
    const { bin, log } = stub('exec nft "$@"');
    for (const body of [
      `set s {\n\ttype ipv4_addr\n\tinclude "${secret}"\n}\n`,
      `map m {\n\ttype ipv4_addr : verdict\n\tinclude "${secret}"\n}\n`,
      `set s {\n\ttype ipv4_addr; include "${secret}"; }\n`,
      `define x = 1\nchain c {\n\tcounter accept\n}\n`,
      `chain c {\n\tip daddr $x counter accept\n}\n`,
    ]) {
      const err = await rejectsWith(applyTable(runnerWith(ns, bin), TABLE, body), /include|define|variable/);
      assert.doesNotMatch(err.message, /host-secret/);
    }
    // nft's quoted string runs to the next `"`, newlines and all: a `}` the line-wise check saw
    // inside quotes would be outside them for nft.
    const split = 'set s {\n\ttype ipv4_addr; comment "a\n}\nchain c {\n\tcounter accept comment "b"\n}\n';
    await rejectsWith(applyTable(runnerWith(ns, bin), TABLE, split), /quoted string/);
    assert.deepEqual(calls(log), [], 'nft never ran');
    assert.deepEqual(ourTables(ns), []);
  });

  it('a ruleset with an error in its last rule leaves nothing of ours, and on re-ADD the old table whole', async () => {
    const ns = netns();
    const run = byPath(ns.path);
    const broken = BODY.replace(
      'meta l4proto tcp counter redirect to :15001',
      'meta l4proto tcp counter redirect to :99999',
    );
    await rejectsWith(applyTable(run, TABLE, broken), /nft -f - in .* failed \(exit 1\):[\s\S]*99999/, false);
    assert.deepEqual(ourTables(ns), [], 'no table, no chain, no rule of ours');

    await applyTable(run, TABLE, BODY);
    const whole = nftIn(ns, '-a', 'list', 'table', 'inet', TABLE);
    await rejectsWith(applyTable(run, TABLE, broken), /99999/);
    assert.equal(nftIn(ns, '-a', 'list', 'table', 'inet', TABLE), whole, 'the old table, every rule, same handles');
  });

  it('a table of our name not written by us: refused on ADD, left alone by DEL', async () => {
    const ns = netns();
    ns.exec(['nft', '-f', '-'], `table inet ${TABLE} {\n\tchain c {\n\t\ttcp dport 7 counter accept\n\t}\n}\n`);
    const theirs = nftIn(ns, '-a', 'list', 'table', 'inet', TABLE);
    const run = byPath(ns.path);
    await rejectsWith(
      applyTable(run, TABLE, BODY),
      /was not written by mesh-cni .*nft delete table inet mesh_pod/,
      true,
    );
    await rejectsWith(ensureTable(run, TABLE, BODY), /was not written by mesh-cni/, true);
    assert.equal(await removeTable(run, TABLE), 'foreign');
    assert.equal(nftIn(ns, '-a', 'list', 'table', 'inet', TABLE), theirs);
  });

  it('ensureTable: unchanged when intact, replaced when a rule of ours went, created when the table went', async () => {
    const ns = netns();
    const run = byPath(ns.path);
    assert.equal(await ensureTable(run, TABLE, BODY), 'created');
    assert.equal(await ensureTable(run, TABLE, BODY), 'unchanged');
    const handle = /counter packets .* # handle (\d+)\n/.exec(
      nftIn(ns, '-a', 'list', 'chain', 'inet', TABLE, 'output'),
    )![1]!;
    nftIn(ns, 'delete', 'rule', 'inet', TABLE, 'output', 'handle', handle);
    assert.equal(await ensureTable(run, TABLE, BODY), 'replaced');
    assert.equal((await readTable(run, TABLE))!.chains.get('output')!.length, 3);
    assert.equal(await ensureTable(run, TABLE, BODY_2), 'replaced', 'another body');
    nftIn(ns, 'delete', 'table', 'inet', TABLE);
    assert.equal(await ensureTable(run, TABLE, BODY), 'created');
  });

  it("what we write reads back with the host's nft: list ruleset, its JSON, and the text applies again", async () => {
    const ns = netns();
    ns.exec(['nft', '-f', '-'], FOREIGN_TABLES);
    await applyTable(byPath(ns.path), TABLE, BODY);
    const text = shStatus(['ip', 'netns', 'exec', ns.name, 'nft', 'list', 'ruleset']);
    assert.equal(text.code, 0, text.out);
    assert.doesNotMatch(text.out, /# xt_|\[invalid|unknown|Unsupported/i);
    const json = JSON.parse(nftIn(ns, '-j', 'list', 'ruleset')) as { nftables: Record<string, unknown>[] };
    assert.ok(json.nftables.some((i) => (i.table as { name?: string } | undefined)?.name === TABLE));
    // The listing is nft input again: what a person copies out of `nft list ruleset` works.
    const fresh = netns();
    sh(['ip', 'netns', 'exec', fresh.name, 'nft', '-c', '-f', '-'], { input: text.out });
  });
});

describe('nft applier: when nft fails, a clear error and nothing half-written', () => {
  it('nft missing', async () => {
    const ns = netns();
    const run = runnerWith(ns, '/nonexistent/nft');
    await rejectsWith(applyTable(run, TABLE, BODY), /cannot run nft in .*install nftables/, true);
    await rejectsWith(removeTable(run, TABLE), /cannot run nft .*install nftables/, true);
  });

  it('nft that hangs: killed at the time limit, nothing of ours, the old table whole', async () => {
    const ns = netns();
    const { bin } = stub('exec sleep 600');
    await rejectsWith(applyTable(runnerWith(ns, bin, 300), TABLE, BODY), /did not finish within 300 ms/, false);
    assert.deepEqual(ourTables(ns), []);
    await applyTable(byPath(ns.path), TABLE, BODY);
    const whole = nftIn(ns, '-a', 'list', 'table', 'inet', TABLE);
    await rejectsWith(applyTable(runnerWith(ns, bin, 300), TABLE, BODY_2), /did not finish/);
    await rejectsWith(removeTable(runnerWith(ns, bin, 300), TABLE), /did not finish/);
    assert.equal(nftIn(ns, '-a', 'list', 'table', 'inet', TABLE), whole);
  });

  it('nft that crashes (SIGSEGV) after reading the transaction', async () => {
    const ns = netns();
    const { bin } = stub('cat > /dev/null; kill -SEGV $$');
    await rejectsWith(applyTable(runnerWith(ns, bin), TABLE, BODY), /killed by a signal .*did nft crash/, false);
    assert.deepEqual(ourTables(ns), []);
    await applyTable(byPath(ns.path), TABLE, BODY);
    const whole = nftIn(ns, '-a', 'list', 'table', 'inet', TABLE);
    await rejectsWith(applyTable(runnerWith(ns, bin), TABLE, BODY_2), /killed by a signal/);
    assert.equal(nftIn(ns, '-a', 'list', 'table', 'inet', TABLE), whole);
  });

  it('nft without JSON: a read fails once, permanently, and nothing is retried or removed', async () => {
    const ns = netns();
    const { bin, log } = stub(
      'for a in "$@"; do [ "$a" = -j ] && { echo "Error: JSON support not compiled-in" >&2; exit 1; }; done\nexec nft "$@"',
    );
    const run = runnerWith(ns, bin);
    assert.equal(await applyTable(run, TABLE, BODY), 'created', 'a first ADD reads nothing');
    const whole = nftIn(ns, '-a', 'list', 'table', 'inet', TABLE);
    await rejectsWith(
      removeTable(run, TABLE),
      /cannot print JSON .*JSON support not compiled-in.*install an nft built with JSON/,
      true,
    );
    await rejectsWith(applyTable(run, TABLE, BODY_2), /cannot print JSON/, true);
    await rejectsWith(ensureTable(run, TABLE, BODY), /cannot print JSON/, true);
    assert.deepEqual(
      calls(log).map((c) => c.split(' ')[0]),
      ['-f', '-j', '-f', '-j', '-j'],
      'each call ran nft once per step: one create, then one read each, never a loop',
    );
    assert.equal(nftIn(ns, '-a', 'list', 'table', 'inet', TABLE), whole);
  });

  it('nft that prints something other than JSON', async () => {
    const ns = netns();
    await applyTable(byPath(ns.path), TABLE, BODY);
    const { bin } = stub('echo "table inet mesh_pod {"');
    await rejectsWith(removeTable(runnerWith(ns, bin), TABLE), /printed no JSON/, true);
  });
});

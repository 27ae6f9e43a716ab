// What someone who can write the net dir plants there, and that the agent must judge as the
// runtime (libcni) does: where the two views differ, the agent could report ready while the file
// the runtime loads lacks our entry. Every case is judged against what libcni does: Go's decoder
// (nesting limit 10000) and Go's sort.Strings (UTF-8 byte order). Planted files also must not stop
// an uninstall halfway, nor put their content into readiness reasons (docs/security.md "What the
// agent and the plugin read, and who writes it").

import assert from 'node:assert/strict';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterEach, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { libcniVerdict } from '../../src/install/cniconfig.ts';
import { InstallPass, type PassReport } from '../../src/install/pass.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const trees: HostTree[] = [];
afterEach(async () => {
  for (const t of trees.splice(0)) await t.remove();
});

async function pass(
  owned: boolean,
  plant: (net: string) => Promise<void> | void,
): Promise<{ tree: HostTree; out: PassReport }> {
  const tree = await makeHostTree();
  trees.push(tree);
  await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  await plant(tree.netDir);
  const s = buildSettings(
    { 'reconcile-interval': '1h', ...tree.flags, 'mesh-owned-cni-config': String(owned) },
    tree.env,
  );
  const out = await new InstallPass(s.install, s.env).run();
  return { tree, out };
}

const ready = (o: PassReport) => o.notReady.length === 0 && o.problems.length === 0;
const reasons = (o: PassReport) => [...o.notReady, ...o.problems.map((p) => p.message)].join('\n');

/** The config file libcni loads first: config names sorted by their bytes, as Go does. */
function runtimeFirst(net: string): Buffer {
  const names = readdirSync(net, { encoding: 'buffer' })
    .filter((b) => /\.(conf|conflist|json)$/.test(b.toString('latin1')))
    .sort(Buffer.compare);
  return names[0]!;
}
const holdsOurs = (net: string, name: Buffer) =>
  readFileSync(Buffer.concat([Buffer.from(net + '/'), name]))
    .toString()
    .includes('mesh-cni');

const nested = (depth: number) =>
  `{"cniVersion":"1.0.0","name":"a","x":${'['.repeat(depth) + ']'.repeat(depth)},"plugins":[{"type":"bridge"}]}`;

describe('deeply nested configs are judged as Go judges them', () => {
  it('a file nested 3000 deep (libcni loads it) is never passed over', async () => {
    for (const owned of [false, true]) {
      const { tree, out } = await pass(owned, (net) => fs.writeFile(path.join(net, '00-a.conflist'), nested(3000)));
      // Either our entry reaches what the runtime reads first, or the agent is not ready.
      if (ready(out))
        assert.ok(
          holdsOurs(tree.netDir, runtimeFirst(tree.netDir)) || owned,
          `owned=${owned}: ready, but 00-a.conflist lacks our entry`,
        );
      if (owned && ready(out)) assert.equal(out.primary, '00-a.conflist');
      if (!owned) assert.equal(out.primary, '00-a.conflist', reasons(out));
    }
  });

  it('libcniVerdict: up to 10000 levels loads, one more is refused (Go: exceeded max depth)', () => {
    assert.equal(libcniVerdict(nested(9998), '00-a.conflist').ok, true);
    const v = libcniVerdict(nested(10000), '00-a.conflist');
    assert.equal(v.ok, false);
    assert.match((v as { reason: string }).reason, /nested deeper than 10000/);
  });

  it('a deep value inside a plugin is judged too (.conf and .conflist)', () => {
    const deep = '['.repeat(5000) + ']'.repeat(5000);
    assert.equal(libcniVerdict(`{"cniVersion":"1.0.0","type":"bridge","args":${deep}}`, '00-a.conf').ok, true);
    assert.equal(
      libcniVerdict(`{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge","args":${deep}}]}`, '00-a.conflist')
        .ok,
      true,
    );
  });

  it('a huge number anywhere (even a duplicate key JSON.parse drops) is refused, as Go refuses it', () => {
    assert.equal(
      libcniVerdict('{"cniVersion":"1.0.0","name":"a","x":1e400,"x":1,"plugins":[{"type":"bridge"}]}', '00-a.conflist')
        .ok,
      false,
    );
    assert.equal(
      libcniVerdict(
        `{"cniVersion":"1.0.0","name":"a","x":${'['.repeat(4000)}1e999${']'.repeat(4000)},"plugins":[{"type":"bridge"}]}`,
        '00-a.conflist',
      ).ok,
      false,
    );
    assert.equal(
      libcniVerdict('{"cniVersion":"1.0.0","name":"a","x":"1e400","plugins":[{"type":"bridge"}]}', '00-a.conflist').ok,
      true,
    );
  });
});

describe('names are ordered by their UTF-8 bytes, as libcni sorts them', () => {
  // U+E000 is EE 80 80 in UTF-8, U+10000 is F0 90 80 80: bytes put U+E000 first; UTF-16 code
  // units (D800 DC00 against E000) put U+10000 first.
  it('splice and owned: the primary is the first by bytes', async () => {
    for (const owned of [false, true]) {
      const { tree, out } = await pass(owned, (net) => {
        writeFileSync(path.join(net, '0\uE000.conflist'), BRIDGE_CONFLIST.replace('bridge-net', 'first-net'));
        writeFileSync(path.join(net, '0\u{10000}.conflist'), BRIDGE_CONFLIST);
      });
      assert.ok(ready(out), reasons(out));
      const first = runtimeFirst(tree.netDir);
      assert.ok(holdsOurs(tree.netDir, first));
      if (!owned) assert.equal(out.primary, '0\uE000.conflist');
      // Ours (02-mesh-cni.conflist sorts first) is made from the first primary by bytes.
      else assert.match(readFileSync(path.join(tree.netDir, first.toString())).toString(), /first-net/);
    }
  });

  it('owned: a file before ours by bytes (not by UTF-16) is seen as before ours', async () => {
    const { tree, out } = await pass(true, (net) => {
      writeFileSync(path.join(net, '01\uE000.conflist'), BRIDGE_CONFLIST.replace('bridge-net', 'first-net'));
      writeFileSync(path.join(net, '01\u{10000}.conflist'), BRIDGE_CONFLIST);
    });
    const first = runtimeFirst(tree.netDir);
    assert.ok(
      !ready(out) || holdsOurs(tree.netDir, first),
      `ready, but the runtime reads ${JSON.stringify(first.toString())} without our entry`,
    );
  });

  it('a config name that is not valid UTF-8 makes the agent not ready, naming it by its bytes', async () => {
    for (const owned of [false, true]) {
      const { out } = await pass(owned, (net) => {
        writeFileSync(
          Buffer.concat([Buffer.from(net + '/0'), Buffer.from([0x80]), Buffer.from('.conflist')]),
          BRIDGE_CONFLIST,
        );
        writeFileSync(path.join(net, '0\uFFFD.conflist'), BRIDGE_CONFLIST);
      });
      assert.ok(!ready(out), `owned=${owned}: ready with a name the agent cannot spell`);
      assert.match(reasons(out), /0\\x80\.conflist/);
    }
  });
});

describe('uninstall does every step it can', () => {
  it('a directory planted at our record does not stop the rest: orchconfig removed, entry out, all errors said', async () => {
    const { tree, out } = await pass(true, () => {});
    assert.ok(ready(out), reasons(out));
    const net = tree.netDir;
    const record = readdirSync(net).find((n) => n.endsWith('.mesh-from'));
    assert.ok(record, 'no record of ours was written');
    await fs.rm(path.join(net, record));
    await fs.mkdir(path.join(net, record));
    // A second planted obstacle, in another step: a directory at an original-record name.
    await fs.mkdir(path.join(net, '.10-bridge.conflist.mesh-original'));
    const s = buildSettings({ 'reconcile-interval': '1h', ...tree.flags, 'mesh-owned-cni-config': 'true' }, tree.env);
    await assert.rejects(new InstallPass(s.install, s.env).cleanup(), (e: Error) => {
      assert.match(e.message, new RegExp(record.replaceAll('.', '\\.')));
      assert.match(e.message, /\.10-bridge\.conflist\.mesh-original/);
      return true;
    });
    const left = readdirSync(net).filter((n) => !n.startsWith('.'));
    assert.deepEqual(left, ['10-bridge.conflist']);
    assert.doesNotMatch(readFileSync(path.join(net, '10-bridge.conflist'), 'utf8'), /mesh-cni/);
  });
});

describe('readiness reasons carry no file content', () => {
  it('a skipped .conflist\'s "name" is not in the reason', async () => {
    const { out } = await pass(false, (net) =>
      fs.writeFile(path.join(net, '00-a.conflist'), '{"cniVersion":"1.0.0","name":"planted-s3cret-words"}'),
    );
    const all = [...out.notReady, ...(out.skipped ?? []).map((k) => k.reason)].join('\n');
    assert.match(JSON.stringify(out.skipped), /00-a\.conflist/);
    assert.doesNotMatch(all, /planted-s3cret-words/);
  });
});

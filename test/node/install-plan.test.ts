// The planner (src/install/plan.ts) alone, table-tested: a net dir as a listing and file texts
// in, the planned writes, removals and reports out, and the dir the steps leave (applied here to
// the listing in memory). Rows of our own (splice, standalone, owned mode, switching modes,
// shadowing files, rollback copies, malformed primaries, uninstall), then every conformance
// fixture (test/node/fixtures/install-conformance/: in/ -> out/ -> clean/) through the planner
// alone. No file system: the real pass, with its I/O, is tested by the install-* suites.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { isOurs, withOurEntry, withoutOurEntry } from '../../src/install/cniconfig.ts';
import { ownedText } from '../../src/install/owned.ts';
import { planCleanup, planConfig, planPrelude, type Plan } from '../../src/install/plan.ts';
import {
  emptyMemory,
  plainFile,
  PlanContext,
  STANDALONE_CONF_NAME,
  type Memory,
  type NetDirView,
  type PlanSettings,
  type Step,
} from '../../src/install/plancontext.ts';
import { formatOriginal, sha256 } from '../../src/install/records.ts';
import { UnsafeFileError } from '../../src/install/safefile.ts';
import { renderEntry, DEFAULT_TEMPLATE } from '../../src/install/template.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ROOT } from '../helpers/cli.ts';
import { dirFiles, FIXTURE_ENTRY, FIXTURE_VALUES, type ConformanceCase } from '../helpers/install-fixtures.ts';
import { BRIDGE_CONFLIST } from '../helpers/hosttree.ts';

const NET = '/host/etc/cni/net.d';
const OWNED = '02-mesh-cni.conflist';
const ORCH = 'ZZZ-mesh-cni-orchconfig';
const FLANNEL_CONF = readFileSync(path.join(ROOT, 'test/node/fixtures/install/flannel-conf/input.conf'), 'utf8');
const WITH_ENTRY = withOurEntry(BRIDGE_CONFLIST, '10-bridge.conflist', FIXTURE_ENTRY)!.text;
const MADE_OWNED = ownedText(BRIDGE_CONFLIST, '10-bridge.conflist', FIXTURE_ENTRY);
const CILIUM = '{"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni"}]}\n';

/** A file in the listing: its text, or its text and mode. */
type File = string | { readonly text: string; readonly mode: number };
type Files = Record<string, File>;

const textOf = (f: File) => (typeof f === 'string' ? f : f.text);
const modeOf = (f: File) => (typeof f === 'string' ? 0o644 : f.mode);
const enoent = (name: string) => Object.assign(new Error(`${name}: no such file`), { code: 'ENOENT' });

/** The net dir as the planner sees it, from a listing and texts; `dir/file` names are files in a subdir. */
function memoryView(files: Files): NetDirView {
  const get = (name: string) => files[name];
  const isDir = (name: string) => get(name) === undefined && Object.keys(files).some((n) => n.startsWith(`${name}/`));
  const text = (name: string) => {
    if (isDir(name)) throw new UnsafeFileError(name, 'not_regular', `${name} is a directory, not a regular file`);
    return get(name) === undefined ? null : textOf(get(name)!);
  };
  return {
    list: async () => [...new Set(Object.keys(files).map((n) => n.split('/')[0]!))],
    read: async (name) => text(name),
    readRecord: async (name) => (get(name) === undefined ? null : textOf(get(name)!)),
    readCached: async (name) => (text(name) === null ? null : plainFile(text(name)!)),
    peekCached: () => undefined,
    warmCached: async () => undefined,
    keepCached: () => undefined,
    stat: async (name) => {
      const f = get(name);
      if (f === undefined) throw enoent(name);
      return { mode: 0o100000 | modeOf(f), uid: 0, gid: 0 };
    },
    lstat: async (name) => {
      const f = get(name);
      if (isDir(name)) return { isFile: false, isDirectory: true, isSymbolicLink: false, mode: 0o40755 };
      return f === undefined
        ? null
        : { isFile: true, isDirectory: false, isSymbolicLink: false, mode: 0o100000 | modeOf(f) };
    },
    readlink: async (name) => {
      throw Object.assign(new Error(`${name} is no link`), { code: 'EINVAL' });
    },
    listDir: async (name) => {
      if (get(name) !== undefined) throw Object.assign(new Error(`${name}: not a directory`), { code: 'ENOTDIR' });
      const inside = Object.keys(files).filter((n) => n.startsWith(`${name}/`));
      if (inside.length === 0) throw enoent(name);
      return inside.map((n) => ({ name: n.slice(name.length + 1), isDirectory: false }));
    },
  };
}

type Mode = 'chained' | 'owned' | 'standalone';

function settings(mode: Mode, extra: Partial<PlanSettings> = {}): PlanSettings {
  return {
    netDir: NET,
    chained: mode !== 'standalone',
    owned: mode === 'owned',
    ownedName: OWNED,
    confName: '',
    orchcfgName: ORCH,
    standaloneName: STANDALONE_CONF_NAME,
    ...extra,
  };
}

async function plan(
  mode: Mode,
  files: Files,
  opts: { memory?: Memory; extra?: Partial<PlanSettings>; cleanup?: boolean } = {},
): Promise<Plan> {
  const ctx = new PlanContext(settings(mode, opts.extra), memoryView(files), opts.memory ?? emptyMemory(), 1_000_000);
  if (opts.cleanup) return planCleanup(ctx);
  await planPrelude(ctx);
  return planConfig(ctx, FIXTURE_ENTRY);
}

/** One line per step that touches the dir or says something; memory steps left out. */
function summary(steps: readonly Step[]): string[] {
  const out: string[] = [];
  for (const s of steps) {
    if (s.kind === 'write')
      out.push(
        `write ${s.name}${s.through !== undefined ? ' (through)' : ''}${s.guard ? ` (if ${s.guard.name} unchanged)` : ''}`,
      );
    else if (s.kind === 'remove' || s.kind === 'symlink') out.push(`${s.kind} ${s.name}`);
    else if (s.kind === 'fail') out.push(`fail ${s.reason}`);
    else if (s.kind === 'notReady' || s.kind === 'note') out.push(s.kind);
  }
  return out;
}

/** The listing the steps leave (texts and modes). */
function applied(files: Files, steps: readonly Step[]): Files {
  const dir: Files = { ...files };
  for (const s of steps) {
    if (s.kind === 'write') dir[s.name] = { text: s.text, mode: s.mode };
    else if (s.kind === 'remove') delete dir[s.name];
  }
  return dir;
}

/** The texts of a listing. */
const texts = (files: Files): Record<string, string> =>
  Object.fromEntries(Object.entries(files).map(([n, f]) => [n, textOf(f)]));

const types = (text: string | undefined) =>
  text === undefined ? [] : (JSON.parse(text) as { plugins: { type: string }[] }).plugins.map((p) => p.type);

interface Row {
  readonly name: string;
  readonly mode: Mode;
  readonly files: Files;
  readonly memory?: Memory;
  readonly extra?: Partial<PlanSettings>;
  /** The steps (summary()). */
  readonly steps: readonly string[];
  readonly primary: string | null;
  /** Plugin types per file after the steps; null: the file is gone. */
  readonly after?: Record<string, readonly string[] | null>;
  /** Exact texts after the steps. */
  readonly texts?: Record<string, string>;
  readonly skipped?: readonly string[];
}

const rows: Row[] = [
  {
    name: 'splice: our entry appended to the primary conflist, edited where it is (through a link)',
    mode: 'chained',
    files: { '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: ['write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)'],
    primary: '10-bridge.conflist',
    texts: { '10-bridge.conflist': WITH_ENTRY },
  },
  {
    name: 'splice: nothing to write when our entry is there, last',
    mode: 'chained',
    files: { '10-bridge.conflist': WITH_ENTRY },
    steps: [],
    primary: '10-bridge.conflist',
  },
  {
    name: 'splice: a .conf becomes a .conflist, its bytes recorded before it goes',
    mode: 'chained',
    files: { '10-flannel.conf': FLANNEL_CONF },
    steps: [
      'write 10-flannel.conflist (if 10-flannel.conf unchanged)',
      'write .10-flannel.conflist.mesh-original',
      'remove 10-flannel.conf',
    ],
    primary: '10-flannel.conflist',
    after: { '10-flannel.conflist': ['flannel', 'mesh-cni'], '10-flannel.conf': null },
  },
  {
    name: 'splice: a new first file takes the entry; the old primary gets its bytes back',
    mode: 'chained',
    files: { '05-cilium.conflist': CILIUM, '10-bridge.conflist': WITH_ENTRY },
    steps: [
      'write 05-cilium.conflist (through) (if 05-cilium.conflist unchanged)',
      'remove .10-bridge.conflist.mesh-original',
      'write 10-bridge.conflist (through)',
    ],
    primary: '05-cilium.conflist',
    texts: { '10-bridge.conflist': BRIDGE_CONFLIST },
  },
  {
    name: 'malformed primary: passed over as the runtime would, the next one loads',
    mode: 'chained',
    files: { '05-half.conflist': '{"cniVersion": "1.0.0", "name": "ha', '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: ['write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)'],
    primary: '10-bridge.conflist',
    skipped: ['05-half.conflist'],
    texts: { '05-half.conflist': '{"cniVersion": "1.0.0", "name": "ha' },
  },
  {
    name: 'malformed primary and nothing after it: an error, nothing written',
    mode: 'chained',
    files: { '10-bridge.conflist': '{"plugins": []}' },
    steps: ['fail primary_malformed'],
    primary: null,
    skipped: ['10-bridge.conflist'],
  },
  {
    name: 'malformed named primary (--cni-conf-name): taken as it is, left untouched, an error',
    mode: 'chained',
    files: { '10-bridge.conflist': '{"plugins": []}' },
    extra: { confName: '10-bridge.conflist' },
    steps: ['fail primary_malformed'],
    primary: null,
  },
  {
    name: 'no primary yet: waiting, not an error',
    mode: 'chained',
    files: { 'cni.lock': '' },
    steps: ['notReady'],
    primary: null,
  },
  {
    name: 'standalone: our own conflist, and our entry out of the primary',
    mode: 'standalone',
    files: { '10-bridge.conflist': WITH_ENTRY },
    steps: [
      `write ${STANDALONE_CONF_NAME}`,
      'remove .10-bridge.conflist.mesh-original',
      'write 10-bridge.conflist (through)',
    ],
    primary: STANDALONE_CONF_NAME,
    after: { [STANDALONE_CONF_NAME]: ['mesh-cni'] },
    texts: { '10-bridge.conflist': BRIDGE_CONFLIST },
  },
  {
    name: 'owned mode: our file made from the primary, which is never edited, and its record',
    mode: 'owned',
    files: { '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: [`write ${OWNED} (if 10-bridge.conflist unchanged)`, `write .${OWNED}.mesh-from`],
    primary: OWNED,
    texts: {
      [OWNED]: MADE_OWNED,
      '10-bridge.conflist': BRIDGE_CONFLIST,
      [`.${OWNED}.mesh-from`]: '10-bridge.conflist\n',
    },
  },
  {
    name: 'owned mode: nothing to write when ours is right',
    mode: 'owned',
    files: {
      [OWNED]: { text: MADE_OWNED, mode: 0o600 },
      [`.${OWNED}.mesh-from`]: '10-bridge.conflist\n',
      '10-bridge.conflist': BRIDGE_CONFLIST,
    },
    steps: [],
    primary: OWNED,
  },
  {
    name: 'owned mode: the primary gone, ours kept as it is (not ready)',
    mode: 'owned',
    files: { [OWNED]: { text: MADE_OWNED, mode: 0o600 }, [`.${OWNED}.mesh-from`]: '10-bridge.conflist\n' },
    steps: ['notReady'],
    primary: OWNED,
    texts: { [OWNED]: MADE_OWNED },
  },
  {
    name: 'owned mode: a file at our name that holds no entry of ours is never overwritten',
    mode: 'owned',
    files: { [OWNED]: CILIUM, '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: ['fail file_refused'],
    primary: null,
  },
  {
    name: 'switching modes, chained -> owned: ours made, then the primary given back byte for byte',
    mode: 'owned',
    files: { '10-bridge.conflist': WITH_ENTRY },
    steps: [
      `write ${OWNED} (if 10-bridge.conflist unchanged)`,
      `write .${OWNED}.mesh-from`,
      'remove .10-bridge.conflist.mesh-original',
      'write 10-bridge.conflist (through)',
    ],
    primary: OWNED,
    texts: { '10-bridge.conflist': BRIDGE_CONFLIST, [OWNED]: MADE_OWNED },
  },
  {
    name: 'switching modes, owned -> chained: the entry spliced in first, then ours and its record go',
    mode: 'chained',
    files: {
      [OWNED]: { text: MADE_OWNED, mode: 0o600 },
      [`.${OWNED}.mesh-from`]: '10-bridge.conflist\n',
      '10-bridge.conflist': BRIDGE_CONFLIST,
    },
    steps: [
      'write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)',
      `remove ${OWNED}`,
      `remove .${OWNED}.mesh-from`,
    ],
    primary: '10-bridge.conflist',
    after: { [OWNED]: null, '10-bridge.conflist': ['bridge', 'mesh-cni'] },
  },
  {
    name: 'shadowing: in owned mode, a primary sorting before our file gets the entry spliced in, with a note',
    mode: 'owned',
    files: { '01-multus.conflist': CILIUM },
    steps: ['write 01-multus.conflist (through) (if 01-multus.conflist unchanged)', 'note'],
    primary: '01-multus.conflist',
    after: { '01-multus.conflist': ['cilium-cni', 'mesh-cni'] },
  },
  {
    name: 'shadowing: a config at our own name before the primary, not known as ours, is an error and stays',
    mode: 'chained',
    files: { [OWNED]: CILIUM, '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: ['write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)', 'fail config_shadowed'],
    primary: '10-bridge.conflist',
    texts: { [OWNED]: CILIUM },
  },
  {
    name: 'rollback copy: ours with the entry taken out by a version without owned mode goes once the entry is in',
    mode: 'chained',
    files: { [OWNED]: BRIDGE_CONFLIST, '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: [
      'write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)',
      `remove ${OWNED}`,
      `remove .${OWNED}.mesh-from`,
    ],
    primary: '10-bridge.conflist',
    after: { [OWNED]: null },
  },
  {
    name: 'rollback copy: in owned mode a byte copy at our name is overwritten, not refused',
    mode: 'owned',
    files: { [OWNED]: BRIDGE_CONFLIST, '10-bridge.conflist': BRIDGE_CONFLIST },
    steps: [`write ${OWNED} (if 10-bridge.conflist unchanged)`, `write .${OWNED}.mesh-from`],
    primary: OWNED,
    texts: { [OWNED]: MADE_OWNED },
  },
  {
    name: 'a plugin .conf in the directory a conflist names: not installing',
    mode: 'chained',
    files: { '10-bridge.conflist': BRIDGE_CONFLIST, 'bridge-net/20-more.conf': '{"type": "tuning"}' },
    steps: ['fail primary_unsupported'],
    primary: null,
  },
  // The orchconfig's name against the primary's: no rule. libcni's ConfFiles (containerd's go-cni,
  // CRI-O's ocicni) reads only names ending .conf, .conflist or .json, which the orchconfig's may
  // not, so it is never a config, wherever it sorts (docs/installer.md "install-cni: the installer").
  {
    name: 'the default orchconfig name sorts before calico.conflist (lower case): spliced all the same',
    mode: 'chained',
    files: { 'calico.conflist': BRIDGE_CONFLIST, [ORCH]: '{}' },
    steps: ['write calico.conflist (through) (if calico.conflist unchanged)'],
    primary: 'calico.conflist',
    after: { 'calico.conflist': ['bridge', 'mesh-cni'] },
  },
  {
    name: 'the default orchconfig name sorts before bridge.conf: made a conflist with our entry all the same',
    mode: 'chained',
    files: { 'bridge.conf': FLANNEL_CONF },
    steps: [
      'write bridge.conflist (if bridge.conf unchanged)',
      'write .bridge.conflist.mesh-original',
      'remove bridge.conf',
    ],
    primary: 'bridge.conflist',
    after: { 'bridge.conflist': ['flannel', 'mesh-cni'], 'bridge.conf': null },
  },
  {
    name: 'owned mode: the default orchconfig name sorts before calico.conflist: ours made all the same',
    mode: 'owned',
    files: { 'calico.conflist': BRIDGE_CONFLIST },
    steps: [`write ${OWNED} (if calico.conflist unchanged)`, `write .${OWNED}.mesh-from`],
    primary: OWNED,
  },
  {
    name: 'an orchconfig name that sorts before every config (00-orchconfig): spliced all the same',
    mode: 'chained',
    extra: { orchcfgName: '00-orchconfig' },
    files: { '10-bridge.conflist': BRIDGE_CONFLIST, '00-orchconfig': '{}' },
    steps: ['write 10-bridge.conflist (through) (if 10-bridge.conflist unchanged)'],
    primary: '10-bridge.conflist',
    texts: { '10-bridge.conflist': WITH_ENTRY },
  },
];

describe('planner: listing and texts in, steps out', () => {
  for (const row of rows) {
    it(row.name, async () => {
      const p = await plan(row.mode, row.files, { memory: row.memory, extra: row.extra });
      assert.equal(p.error, undefined, p.error?.message);
      assert.deepEqual(summary(p.steps), row.steps);
      assert.equal(p.primary, row.primary);
      assert.deepEqual(
        p.skipped.map((k) => k.file),
        row.skipped ?? [],
      );
      const dir = texts(applied(row.files, p.steps));
      for (const [name, want] of Object.entries(row.after ?? {}))
        assert.deepEqual(want === null ? dir[name] : types(dir[name]), want ?? undefined, name);
      for (const [name, want] of Object.entries(row.texts ?? {})) assert.equal(dir[name], want, name);
      // Planned twice from the same dir, the same steps: the planner is a function of its input.
      assert.deepEqual((await plan(row.mode, row.files, { memory: row.memory, extra: row.extra })).steps, p.steps);
      // And from the dir the steps leave, nothing more to write: a second pass is idle.
      if (row.steps.some((s) => s.startsWith('write')) && !row.steps.some((s) => s.startsWith('fail'))) {
        const again = await plan(row.mode, applied(row.files, p.steps));
        assert.deepEqual(
          summary(again.steps).filter((s) => !s.startsWith('note')),
          [],
        );
      }
    });
  }
});

describe('planner: uninstall', () => {
  const conflist = withOurEntry(FLANNEL_CONF, '10-flannel.conf', FIXTURE_ENTRY)!;
  const record = formatOriginal({
    name: '10-flannel.conf',
    text: FLANNEL_CONF,
    mode: 0o644,
    uid: 0,
    gid: 0,
    written: sha256(conflist.text),
  });

  it('gives a .conf back from the .conflist we made, by its record, byte for byte', async () => {
    const files = { '10-flannel.conflist': conflist.text, '.10-flannel.conflist.mesh-original': record, [ORCH]: '{}' };
    const p = await plan('chained', files, { cleanup: true });
    const dir = texts(applied(files, p.steps));
    assert.deepEqual(Object.keys(dir).sort(), ['10-flannel.conf']);
    assert.equal(dir['10-flannel.conf'], FLANNEL_CONF);
  });

  it('splices the entry out of a .conflist no longer as we wrote it; the stale record goes', async () => {
    const changed = conflist.text.replace('"cbr0"', '"cbr1"');
    const files = {
      '10-flannel.conflist': changed,
      '.10-flannel.conflist.mesh-original': record,
      [OWNED]: { text: MADE_OWNED, mode: 0o600 },
    };
    const p = await plan('chained', files, { cleanup: true });
    const dir = texts(applied(files, p.steps));
    assert.deepEqual(Object.keys(dir).sort(), ['10-flannel.conflist']);
    assert.equal(dir['10-flannel.conflist'], withoutOurEntry(changed, '10-flannel.conflist'));
    assert.ok(
      !(JSON.parse(dir['10-flannel.conflist']!) as { plugins: unknown[] }).plugins.some((x) => isOurs(x as never)),
    );
  });

  it('gives back what memory holds without reading a record (a .conf made a conflist this run)', async () => {
    const original = {
      name: '10-flannel.conf',
      text: FLANNEL_CONF,
      mode: 0o640,
      uid: 0,
      gid: 0,
      written: sha256(conflist.text),
    };
    const memory = { ...emptyMemory(), originals: new Map([['10-flannel.conflist', original]]) };
    const p = await plan('chained', { '10-flannel.conflist': conflist.text }, { cleanup: true, memory });
    const back = p.steps.find((s) => s.kind === 'write' && s.name === '10-flannel.conf');
    assert.ok(back && back.kind === 'write' && back.text === FLANNEL_CONF && back.mode === 0o640);
  });
});

describe('planner: before anything is touched', () => {
  it('an owned file of ours under an earlier name is never taken for the primary, and goes once ours is in place', async () => {
    const earlier = '01-old-mesh.conflist';
    const files: Files = {
      [earlier]: { text: MADE_OWNED, mode: 0o600 },
      [`.${earlier}.mesh-from`]: '10-bridge.conflist\n',
      '10-bridge.conflist': BRIDGE_CONFLIST,
    };
    const p = await plan('owned', files);
    assert.equal(p.primary, OWNED);
    assert.deepEqual(summary(p.steps), [
      `write ${OWNED} (if 10-bridge.conflist unchanged)`,
      `write .${OWNED}.mesh-from`,
      `remove ${earlier}`,
      `remove .${earlier}.mesh-from`,
    ]);
  });
});

describe('planner: the conformance fixtures (in/ -> out/ -> clean/, test/node/fixtures/install-conformance/)', () => {
  const FIXTURES = path.join(ROOT, 'test/node/fixtures/install-conformance');
  const ORCHCONFIG = 'ZZZ-mesh-cni-orchconfig';
  const entry = renderEntry(
    DEFAULT_TEMPLATE,
    { ...FIXTURE_VALUES, kubeconfigFilepath: `/etc/cni/net.d/${ORCHCONFIG}` },
    'the default template',
  );
  /** The config files of a listing as dirFiles gives them: no dotfiles, no orchconfig. */
  const visible = (files: Files) =>
    Object.fromEntries(
      Object.entries(texts(files))
        .filter(([n]) => !n.startsWith('.') && n !== ORCHCONFIG)
        .sort(),
    );
  /** What the remember steps leave in memory. */
  const remembered = (steps: readonly Step[], memory: Memory): Memory => {
    const originals = new Map(memory.originals);
    for (const s of steps) {
      if (s.kind !== 'remember') continue;
      if (s.original === null) originals.delete(s.name);
      else originals.set(s.name, s.original);
    }
    return { ...memory, originals };
  };

  for (const name of readdirSync(FIXTURES)
    .filter((n) => existsSync(path.join(FIXTURES, n, 'case.json')))
    .sort()) {
    const dir = path.join(FIXTURES, name);
    const c = JSON.parse(readFileSync(path.join(dir, 'case.json'), 'utf8')) as ConformanceCase;
    it(name, async () => {
      const install = buildSettings({ 'orchcfg-file-name': ORCHCONFIG, ...c.flags }, { NODE_NAME: 'node-1' }).install;
      const s: PlanSettings = {
        netDir: NET,
        chained: install.chained,
        owned: install.meshOwnedCniConfig,
        ownedName: install.meshOwnedCniConfigFilename,
        confName: install.cniConfName,
        orchcfgName: install.orchcfgFileName,
        standaloneName: install.cniConfName || STANDALONE_CONF_NAME,
      };
      let files: Files = dirFiles(path.join(dir, 'in'));
      let memory = emptyMemory();
      let said: string[] = [];
      for (const more of [{}, existsSync(path.join(dir, 'later')) ? dirFiles(path.join(dir, 'later')) : null]) {
        if (more === null) continue;
        files = { ...files, ...more };
        const ctx = new PlanContext(s, memoryView(files), memory, 0);
        await planPrelude(ctx);
        const p = await planConfig(ctx, entry);
        assert.equal(p.error, undefined, p.error?.message);
        files = applied(files, p.steps);
        memory = remembered(p.steps, memory);
        said = p.steps.flatMap((x) => (x.kind === 'fail' || x.kind === 'notReady' ? [x.message] : []));
      }
      assert.deepEqual(visible(files), dirFiles(path.join(dir, 'out'), [ORCHCONFIG]));
      if (c.ready) assert.deepEqual(said, [], 'ready: nothing said');
      else
        assert.ok(
          said.some((m) => new RegExp(c.reason ?? '.').test(m)),
          `not ready: ${said.join('; ')}`,
        );
      const clean = await planCleanup(new PlanContext(s, memoryView(files), memory, 0));
      assert.deepEqual(visible(applied(files, clean.steps)), dirFiles(path.join(dir, 'clean'), [ORCHCONFIG]));
    });
  }
});

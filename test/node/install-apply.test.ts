// The applier (src/install/apply.ts) on a real temp dir: steps run in order; a write whose guard
// finds the primary changed stops the steps after it (but a note that must stand either way); a
// step that throws stops the rest of a pass, or, in an uninstall, only the rest of its group;
// what is reported as written and removed; what the agent then remembers.

import assert from 'node:assert/strict';
import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { applySteps, type Applied, type MutableMemory } from '../../src/install/apply.ts';
import type { Step } from '../../src/install/plancontext.ts';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-apply-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const fresh = (): Applied => ({ writes: [], problems: [], notReady: [], notes: [], groupErrors: [] });
const memory = (): MutableMemory => ({ originals: new Map(), ownedFrom: null, ownedFromGoneSince: null });
const read = (name: string) => readFile(path.join(dir, name), 'utf8').catch(() => null);

describe('applier: steps in order on a real dir', () => {
  it('writes, removes and reports; a removal of a file already gone is reported only when asked', async () => {
    await writeFile(path.join(dir, '10-a.conf'), 'a');
    const out = fresh();
    const mem = memory();
    await applySteps(
      [
        { kind: 'write', name: '10-a.conflist', text: 'new', mode: 0o644, report: 'cni_config' },
        { kind: 'remove', name: '10-a.conf', report: 'cni_config' },
        { kind: 'remove', name: 'gone.conf', report: 'cni_config' },
        { kind: 'remove', name: 'gone-too.conf', report: 'cni_config', reportEvenIfGone: true },
        { kind: 'ownedFrom', from: '10-a.conf' },
        { kind: 'fail', reason: 'config_shadowed', message: 'shadowed' },
      ],
      dir,
      mem,
      out,
    );
    assert.equal(await read('10-a.conflist'), 'new');
    assert.equal(await read('10-a.conf'), null);
    assert.deepEqual(
      out.writes.map((w) => `${w.action} ${path.basename(w.file)}`),
      ['write 10-a.conflist', 'remove 10-a.conf', 'remove gone-too.conf'],
    );
    assert.deepEqual(out.problems, [{ reason: 'config_shadowed', message: 'shadowed' }]);
    assert.deepEqual(out.notReady, ['shadowed']);
    assert.equal(mem.ownedFrom, '10-a.conf');
  });

  it('a guard that finds the primary changed: not written, said, and nothing after it but a standing note', async () => {
    await writeFile(path.join(dir, '10-p.conflist'), 'rewritten by its CNI');
    const out = fresh();
    const mem = memory();
    const steps: Step[] = [
      {
        kind: 'write',
        name: '02-ours.conflist',
        text: 'ours',
        mode: 0o600,
        guard: { name: '10-p.conflist', text: 'as we read it' },
        ifChanged: { notReady: 'changed; again', primary: null },
        report: 'cni_config',
      },
      { kind: 'ownedFrom', from: '10-p.conflist' },
      { kind: 'remove', name: '10-p.conflist', report: 'cni_config' },
      { kind: 'note', message: 'stands', evenIfChanged: true },
      { kind: 'note', message: 'does not' },
    ];
    await applySteps(steps, dir, mem, out);
    assert.equal(await read('02-ours.conflist'), null);
    assert.equal(await read('10-p.conflist'), 'rewritten by its CNI');
    assert.deepEqual(out.notReady, ['changed; again']);
    assert.deepEqual(out.notes, ['stands']);
    assert.deepEqual(out.stoppedWith, { primary: null });
    assert.equal(mem.ownedFrom, null);
    assert.deepEqual(out.writes, []);
  });

  it('a step that throws stops the pass there: the steps before it are done', async () => {
    await mkdir(path.join(dir, 'planted.conf'));
    const out = fresh();
    const mem = memory();
    await assert.rejects(
      applySteps(
        [
          { kind: 'write', name: 'first.conflist', text: 'x', mode: 0o644 },
          { kind: 'remove', name: 'planted.conf' },
          { kind: 'write', name: 'after.conflist', text: 'y', mode: 0o644 },
        ],
        dir,
        mem,
        out,
      ),
    );
    assert.equal(await read('first.conflist'), 'x');
    assert.equal(await read('after.conflist'), null);
  });

  it('uninstall: a group that fails leaves the others done, and is said once', async () => {
    await mkdir(path.join(dir, '.x.conflist.mesh-original'));
    await writeFile(path.join(dir, 'orch'), 'token');
    const out = fresh();
    await applySteps(
      [
        { kind: 'group', what: 'removing .x.conflist.mesh-original' },
        { kind: 'remove', name: '.x.conflist.mesh-original' },
        { kind: 'write', name: 'skipped.conf', text: 'no', mode: 0o644 },
        { kind: 'groupFailed', what: 'removing .x.conflist.mesh-original', message: 'planning stopped too' },
        { kind: 'group', what: 'taking our entry out of y.conflist' },
        { kind: 'groupFailed', what: 'taking our entry out of y.conflist', message: 'cannot read it' },
        { kind: 'group', what: 'removing orch' },
        { kind: 'remove', name: 'orch', report: 'orchconfig' },
      ],
      dir,
      memory(),
      out,
    );
    assert.equal(await read('orch'), null);
    assert.equal(await read('skipped.conf'), null);
    assert.equal(out.groupErrors.length, 2);
    assert.match(out.groupErrors[0]!, /^removing \.x\.conflist\.mesh-original: /);
    assert.doesNotMatch(out.groupErrors[0]!, /planning stopped too/);
    assert.equal(out.groupErrors[1], 'taking our entry out of y.conflist: cannot read it');
    assert.deepEqual(
      out.writes.map((w) => `${w.kind} ${w.action}`),
      ['orchconfig remove'],
    );
  });
});

// The probe set writes of src/ambient/hostrules.ts are ordered per host runner: one at a time
// through the same runner (a removal's list-then-delete never has an add in between), while two
// runners (two dataplanes in one process) never wait on each other. The runners here are
// in-memory: what is observed is only which ipset call starts when.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { addProbeIP, removeProbeIP } from '../../src/ambient/hostrules.ts';
import type { Runner, RunResult } from '../../src/ambient/podrules.ts';

const UID_A = '0a0a0a0a-0000-4000-8000-00000000000a';
const UID_B = '0b0b0b0b-0000-4000-8000-00000000000b';
const ok: RunResult = { code: 0, stdout: '', stderr: '', error: null };

/** A runner whose every call waits until the test releases it; `calls` says which started. */
function heldRunner() {
  const calls: string[] = [];
  const waiting: (() => void)[] = [];
  const run: Runner = (argv) => {
    calls.push(argv.slice(1, 2).join(' '));
    return new Promise((resolve) => waiting.push(() => resolve(ok)));
  };
  const releaseAll = () => waiting.splice(0).forEach((r) => r());
  return { run, calls, releaseAll };
}

/** Event-loop turns until `cond` holds (at most 50): no timers. */
async function until(cond: () => boolean): Promise<boolean> {
  for (let i = 0; i < 50 && !cond(); i++) await new Promise<void>((r) => setImmediate(r));
  return cond();
}

describe('probe set writes', () => {
  it('two host runners do not wait on each other', async () => {
    const held = heldRunner();
    const first = addProbeIP(held.run, '198.18.9.1', UID_A);
    let otherDone = false;
    const free: Runner = async () => ok;
    const other = addProbeIP(free, '198.18.9.2', UID_B).then(() => (otherDone = true));
    try {
      assert.ok(await until(() => otherDone), "the second runner's add waited for the first runner's");
    } finally {
      // Released whatever happened, so nothing is left pending.
      await until(() => held.calls.length > 0);
      held.releaseAll();
      await Promise.all([first, other]);
    }
  });

  it('through one runner, a removal starts only after the add before it has finished', async () => {
    const held = heldRunner();
    const add = addProbeIP(held.run, '198.18.9.3', UID_A);
    const removal = removeProbeIP(held.run, '198.18.9.3', UID_A);
    assert.ok(await until(() => held.calls.length === 1));
    assert.deepEqual(held.calls, ['add']);
    held.releaseAll();
    await add;
    assert.ok(await until(() => held.calls.length === 2));
    assert.deepEqual(held.calls, ['add', 'save']);
    held.releaseAll();
    assert.deepEqual(await removal, { removed: false, owner: null });
  });
});

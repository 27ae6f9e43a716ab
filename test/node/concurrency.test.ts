// src/concurrency.ts: the agent's named concurrency primitives. Ordering is observed through
// promises the test resolves itself (no timers).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { KeyedSerial, Limit, mapBounded, Serial } from '../../src/concurrency.ts';

/** A promise and the functions that settle it. */
function gate<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
const turn = () => new Promise<void>((r) => setImmediate(r));

describe('mapBounded', () => {
  it('runs at most `limit` at once and gives the results in list order', async () => {
    const gates = [0, 1, 2, 3, 4].map(() => gate<number>());
    let running = 0;
    let most = 0;
    const done = mapBounded([0, 1, 2, 3, 4], 2, async (i) => {
      running++;
      most = Math.max(most, running);
      const v = await gates[i]!.promise;
      running--;
      return v * 10;
    });
    for (const i of [4, 3, 2, 1, 0]) {
      gates[i]!.resolve(i);
      await turn();
    }
    assert.deepEqual(await done, [0, 10, 20, 30, 40]);
    assert.equal(most, 2);
  });

  it('starts nothing after a failure and settles only when those under way have', async () => {
    const started: number[] = [];
    const slow = gate();
    let slowDone = false;
    const done = mapBounded([0, 1, 2, 3], 2, async (i) => {
      started.push(i);
      if (i === 0) throw new Error('zero failed');
      await slow.promise;
      slowDone = true;
    });
    const outcome = done.then(
      () => 'resolved',
      (e: Error) => e.message,
    );
    await turn();
    slow.resolve();
    assert.equal(await outcome, 'zero failed');
    assert.equal(slowDone, true, 'the item under way settled first');
    assert.deepEqual(started, [0, 1]);
  });

  it('an empty list is done at once', async () => {
    assert.deepEqual(await mapBounded([], 4, async () => 1), []);
  });
});

describe('Limit', () => {
  it('lets n run at once, the others in call order', async () => {
    const limit = new Limit(1);
    const order: string[] = [];
    const first = gate();
    const a = limit.run(async () => {
      order.push('a');
      await first.promise;
    });
    const b = limit.run(async () => void order.push('b'));
    await turn();
    assert.deepEqual(order, ['a']);
    first.resolve();
    await Promise.all([a, b]);
    assert.deepEqual(order, ['a', 'b']);
  });
});

describe('Serial and KeyedSerial', () => {
  it('Serial runs one at a time in call order, a failure not stopping the next', async () => {
    const q = new Serial();
    const order: string[] = [];
    const first = gate();
    const a = q.run(async () => {
      await first.promise;
      order.push('a');
      throw new Error('a failed');
    });
    const b = q.run(async () => void order.push('b'));
    await turn();
    assert.deepEqual(order, []);
    first.resolve();
    await assert.rejects(a, /a failed/);
    await b;
    assert.deepEqual(order, ['a', 'b']);
  });

  it('two Serials do not wait on each other', async () => {
    const held = gate();
    const one = new Serial();
    void one.run(() => held.promise);
    assert.equal(await new Serial().run(async () => 'ran'), 'ran');
    held.resolve();
  });

  it('KeyedSerial orders calls per key, runs different keys side by side and forgets idle keys', async () => {
    const q = new KeyedSerial<string>();
    const order: string[] = [];
    const a1 = gate();
    const p1 = q.run('a', async () => {
      await a1.promise;
      order.push('a1');
    });
    const p2 = q.run('a', async () => void order.push('a2'));
    const p3 = q.run('b', async () => void order.push('b1'));
    await p3;
    assert.deepEqual(order, ['b1']);
    a1.resolve();
    await Promise.all([p1, p2]);
    assert.deepEqual(order, ['b1', 'a1', 'a2']);
    await turn();
    assert.equal(q.size, 0);
  });
});

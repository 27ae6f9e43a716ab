// The work queue (src/orch/workqueue.ts) on a fake clock: what runs, how often, when, how many at
// once, and what stop() waits for. Time only moves when a test advances it, so backoff and rate
// limits are checked to the millisecond without waiting.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Clock } from '../../src/orch/limits.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import {
  WorkQueue,
  type RetryVerdict,
  type ReconcileContext,
  type WorkQueueOptions,
} from '../../src/orch/workqueue.ts';

/** A clock whose sleeps end only when advance() passes them. */
class FakeClock implements Clock {
  t = 0;
  readonly #timers = new Set<{ at: number; resolve: () => void }>();
  now(): number {
    return this.t;
  }
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason as Error);
      const timer = { at: this.t + ms, resolve };
      this.#timers.add(timer);
      signal?.addEventListener(
        'abort',
        () => {
          this.#timers.delete(timer);
          reject(signal.reason as Error);
        },
        { once: true },
      );
    });
  }
  /** Moves time on by `ms`, firing each sleep due on the way, in order. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await settle();
      const due = [...this.#timers].filter((x) => x.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.#timers.delete(due);
      this.t = due.at;
      due.resolve();
    }
    this.t = end;
    await settle();
  }
}

/** Lets every promise callback that can run now run. */
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

let queueSeq = 0;
/** A queue on a fake clock, no jitter; records every attempt (key, time) and every hook. */
function harness<K>(
  reconcile: (key: K, ctx: ReconcileContext) => Promise<RetryVerdict>,
  o: Partial<WorkQueueOptions<K>> = {},
) {
  const clock = new FakeClock();
  const attempts: { key: K; at: number; attempt: number }[] = [];
  const retries: { key: K; attempt: number; delayMs: number }[] = [];
  const gaveUp: { key: K; attempts: number; why: string }[] = [];
  const name = `test-${++queueSeq}`;
  const q = new WorkQueue<K>({
    name,
    concurrency: 4,
    backoff: { baseMs: 100, maxMs: 1000, jitter: 0 },
    maxAttempts: 5,
    clock,
    reconcile: (key, ctx) => {
      attempts.push({ key, at: clock.now(), attempt: ctx.attempt });
      return reconcile(key, ctx);
    },
    onRetry: (key, i) => retries.push({ key, attempt: i.attempt, delayMs: i.delayMs }),
    onGiveUp: (key, i) => gaveUp.push({ key, attempts: i.attempts, why: i.why }),
    ...o,
  });
  return { q, clock, attempts, retries, gaveUp, name };
}

async function metric(name: string, labels: Record<string, string>): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  return m?.values.find((v) => Object.entries(labels).every(([k, val]) => v.labels[k] === val))?.value ?? 0;
}

/** A promise with its resolve, for reconciles a test lets finish when it wants. */
function gate() {
  let open!: () => void;
  const p = new Promise<void>((r) => (open = r));
  return { p, open };
}

describe('work queue: outcomes, retries and backoff', () => {
  const table: {
    name: string;
    outcomes: RetryVerdict[];
    maxAttempts?: number;
    attempts: number[];
    delays: number[];
    gaveUp?: string;
    drops?: Record<string, number>;
  }[] = [
    { name: 'done at once', outcomes: ['done'], attempts: [0], delays: [] },
    { name: 'drop: no retry, counted', outcomes: ['drop'], attempts: [0], delays: [], drops: { dropped: 1 } },
    {
      name: 'retries back off exponentially, capped at maxMs',
      outcomes: ['retry', 'retry', 'retry', 'retry', 'done'],
      attempts: [0, 100, 300, 700, 1500],
      delays: [100, 200, 400, 800],
    },
    {
      name: "a server's Retry-After is a floor",
      outcomes: [{ retryAfterMs: 2500 }, 'retry', 'done'],
      attempts: [0, 2500, 2700],
      delays: [2500, 200],
    },
    {
      name: 'gives up after maxAttempts',
      outcomes: ['retry', 'retry', 'retry'],
      maxAttempts: 3,
      attempts: [0, 100, 300],
      delays: [100, 200],
      gaveUp: 'max_attempts',
      drops: { max_attempts: 1 },
    },
    {
      name: 'a throw is a retry',
      outcomes: ['throw' as unknown as RetryVerdict, 'done'],
      attempts: [0, 100],
      delays: [100],
    },
  ];
  for (const c of table) {
    it(c.name, async () => {
      let i = 0;
      const h = harness<string>(
        async () => {
          const o = c.outcomes[i++]!;
          if ((o as unknown) === 'throw') throw new Error('reconcile threw');
          return o;
        },
        c.maxAttempts ? { maxAttempts: c.maxAttempts } : {},
      );
      h.q.add('a');
      await h.clock.advance(10_000);
      assert.deepEqual(
        h.attempts.map((a) => a.at),
        c.attempts,
      );
      assert.deepEqual(
        h.attempts.map((a) => a.attempt),
        c.attempts.map((_, n) => n + 1),
      );
      assert.deepEqual(
        h.retries.map((r) => r.delayMs),
        c.delays,
      );
      assert.deepEqual(
        h.gaveUp.map((g) => g.why),
        c.gaveUp ? [c.gaveUp] : [],
      );
      assert.equal(h.q.has('a'), false, 'finished keys are forgotten');
      assert.equal(await metric('mesh_cni_workqueue_retries_total', { queue: h.name }), c.delays.length);
      for (const reason of ['dropped', 'max_attempts', 'stopped']) {
        assert.equal(
          await metric('mesh_cni_workqueue_drops_total', { queue: h.name, reason }),
          c.drops?.[reason] ?? 0,
          reason,
        );
      }
    });
  }

  it('jitter spreads a delay over [d*(1-j), d*(1+j)]', async () => {
    for (const [random, want] of [
      [0, 50],
      [1, 150],
      [0.5, 100],
    ] as const) {
      const h = harness<string>(async (_k, ctx) => (ctx.attempt === 1 ? 'retry' : 'done'), {
        backoff: { baseMs: 100, maxMs: 1000, jitter: 0.5, random: () => random },
      });
      h.q.add('a');
      await h.clock.advance(1000);
      assert.deepEqual(
        h.retries.map((r) => r.delayMs),
        [want],
      );
    }
  });

  it('the backoff is per key: one key retrying does not slow another', async () => {
    const h = harness<string>(async (k, ctx) => (k === 'bad' && ctx.attempt < 4 ? 'retry' : 'done'));
    h.q.add('bad');
    await h.clock.advance(150);
    h.q.add('good');
    await h.clock.advance(1000);
    assert.deepEqual(
      h.attempts.map((a) => `${a.key}@${a.at}`),
      ['bad@0', 'bad@100', 'good@150', 'bad@300', 'bad@700'],
    );
  });
});

describe('work queue: deduplication', () => {
  const table: {
    name: string;
    script: (q: WorkQueue<string>, running: ReturnType<typeof gate>) => Promise<void> | void;
    runs: number;
  }[] = [
    {
      name: 'a key added while queued runs once',
      script: (q) => {
        q.add('blocker');
        q.add('k');
        q.add('k');
        q.add('k');
      },
      runs: 1,
    },
    {
      name: 'a key added while in flight runs once more after (and only once more)',
      script: async (q, running) => {
        q.add('k');
        await settle();
        q.add('k');
        q.add('k');
        running.open();
      },
      runs: 2,
    },
  ];
  for (const c of table) {
    it(c.name, async () => {
      const running = gate();
      const h = harness<string>(
        async () => {
          await running.p;
          return 'done';
        },
        { concurrency: 1 },
      );
      await c.script(h.q, running);
      running.open();
      await h.clock.advance(1);
      const ofK = h.attempts.filter((a) => a.key === 'k');
      assert.equal(ofK.length, c.runs);
      assert.deepEqual(
        ofK.map((a) => a.attempt),
        Array(c.runs).fill(1),
        'a re-run is new work: attempt 1 again',
      );
      assert.equal(h.q.has('k'), false);
    });
  }

  it('a key added while waiting for its retry is not run sooner nor twice', async () => {
    const h = harness<string>(async (_k, ctx) => (ctx.attempt === 1 ? 'retry' : 'done'));
    assert.equal(h.q.add('k'), true);
    await h.clock.advance(10);
    assert.equal(h.q.has('k'), true);
    assert.equal(h.q.add('k'), false);
    await h.clock.advance(1000);
    assert.deepEqual(
      h.attempts.map((a) => a.at),
      [0, 100],
    );
  });

  it('remove() takes out a key not attempted yet, not one under way', async () => {
    const running = gate();
    const h = harness<string>(
      async () => {
        await running.p;
        return 'done';
      },
      { concurrency: 1 },
    );
    h.q.add('first');
    h.q.add('second');
    await settle();
    assert.equal(h.q.remove('first'), false, 'in flight');
    assert.equal(h.q.remove('second'), true);
    assert.equal(h.q.has('second'), false);
    running.open();
    await h.clock.advance(1);
    assert.deepEqual(
      h.attempts.map((a) => a.key),
      ['first'],
    );
  });

  // The depth gauge and the key map after remove() and stop() (repair removes the queued
  // repair of a deleted pod; the agent stops with keys queued).
  it('remove() and stop() bring the depth back to 0 and forget the keys', async () => {
    const running = gate();
    const h = harness<string>(
      async () => {
        await running.p;
        return 'done';
      },
      { concurrency: 1 },
    );
    for (const k of ['busy', 'gone', 'later']) h.q.add(k);
    await settle();
    assert.equal(await metric('mesh_cni_workqueue_depth', { queue: h.name }), 2);
    assert.equal(h.q.remove('gone'), true);
    assert.equal(await metric('mesh_cni_workqueue_depth', { queue: h.name }), 1, 'after remove()');
    const stopped = h.q.stop(1000);
    assert.equal(h.q.has('later'), false, 'a key queued at stop is forgotten');
    assert.equal(await metric('mesh_cni_workqueue_depth', { queue: h.name }), 0, 'after stop()');
    running.open();
    assert.deepEqual(await stopped, { notStarted: 1 });
    assert.deepEqual(
      h.attempts.map((a) => a.key),
      ['busy'],
    );
    assert.equal(h.q.has('busy'), false);
  });
});

describe('work queue: concurrency and rate', () => {
  it('runs at most `concurrency` reconciles at once, in the order keys came', async () => {
    let inFlight = 0;
    let peak = 0;
    const gates = new Map<string, ReturnType<typeof gate>>();
    const h = harness<string>(
      async (k) => {
        inFlight++;
        peak = Math.max(peak, inFlight);
        const g = gate();
        gates.set(k, g);
        await g.p;
        inFlight--;
        return 'done';
      },
      { concurrency: 3 },
    );
    for (let i = 0; i < 10; i++) h.q.add(`k${i}`);
    await settle();
    assert.equal(inFlight, 3);
    assert.deepEqual(h.q.status(), { queued: 7, inFlight: 3, waiting: 0 });
    assert.equal(await metric('mesh_cni_workqueue_depth', { queue: h.name }), 7);
    while (h.attempts.length < 10 || inFlight > 0) {
      for (const g of gates.values()) g.open();
      await settle();
    }
    assert.equal(peak, 3);
    assert.deepEqual(
      h.attempts.map((a) => a.key),
      Array.from({ length: 10 }, (_, i) => `k${i}`),
    );
    assert.equal(await metric('mesh_cni_workqueue_depth', { queue: h.name }), 0);
  });

  // Without a rate limit the reconcile used to start inside add(), before its job
  // counted in the slots, so a reconcile that added a key at once ran beside it over the bound.
  it('a key added by a reconcile before its first await still waits for a slot (no rate limit)', async () => {
    let inFlight = 0;
    let peak = 0;
    const running = gate();
    const h = harness<string>(
      async (k) => {
        inFlight++;
        peak = Math.max(peak, inFlight);
        if (k === 'parent') h.q.add('child');
        await running.p;
        inFlight--;
        return 'done';
      },
      { concurrency: 1 },
    );
    h.q.add('parent');
    await settle();
    assert.deepEqual(h.q.status(), { queued: 1, inFlight: 1, waiting: 0 });
    running.open();
    await h.clock.advance(1);
    assert.equal(peak, 1);
    assert.deepEqual(
      h.attempts.map((a) => a.key),
      ['parent', 'child'],
    );
  });

  it('a retry waits outside the slots: other keys run meanwhile', async () => {
    const h = harness<string>(async (k, ctx) => (k === 'slow' && ctx.attempt === 1 ? { retryAfterMs: 500 } : 'done'), {
      concurrency: 1,
    });
    h.q.add('slow');
    h.q.add('other');
    await h.clock.advance(1000);
    assert.deepEqual(
      h.attempts.map((a) => `${a.key}@${a.at}`),
      ['slow@0', 'other@0', 'slow@500'],
    );
  });

  it('takes one token per attempt: burst at once, then qps', async () => {
    const h = harness<string>(async (k, ctx) => (k === 'k0' && ctx.attempt === 1 ? 'retry' : 'done'), {
      rate: { qps: 10, burst: 2 },
    });
    for (let i = 0; i < 5; i++) h.q.add(`k${i}`);
    await h.clock.advance(1000);
    // k0 and k1 from the burst, then one token every 100 ms; k0's retry (due at 100) queues behind k4.
    assert.deepEqual(
      h.attempts.map((a) => `${a.key}@${a.at}`),
      ['k0@0', 'k1@0', 'k2@100', 'k3@200', 'k4@300', 'k0@400'],
    );
  });
});

describe('work queue: hooks', () => {
  it('a hook that throws strands no key: the retry still runs, and giving up still forgets the key', async () => {
    const outcomes: RetryVerdict[] = ['retry', 'done', 'retry', 'retry'];
    const { q, clock, attempts } = harness<string>(async () => outcomes.shift() ?? 'done', {
      maxAttempts: 2,
      onRetry: () => {
        throw new Error('observer bug');
      },
      onGiveUp: () => {
        throw new Error('observer bug');
      },
    });
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown) => unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      q.add('a');
      await clock.advance(1000);
      assert.deepEqual(
        attempts.map((a) => a.attempt),
        [1, 2],
        'the retry ran although onRetry threw',
      );
      assert.equal(q.has('a'), false, 'done: the key is forgotten');
      q.add('b');
      await clock.advance(1000);
      assert.equal(q.has('b'), false, 'given up: the key is forgotten although onGiveUp threw');
      q.add('b');
      assert.equal(q.has('b'), true, 'and it can be added again');
      await settle();
      assert.deepEqual(unhandled, []);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await q.stop(0);
    }
  });
});

describe('work queue: stop', () => {
  it('lets reconciles under way finish within the grace period; starts nothing more, drops retries', async () => {
    const running = gate();
    const signals: AbortSignal[] = [];
    const h = harness<string>(
      async (k, ctx) => {
        signals.push(ctx.signal);
        if (k === 'retrying') return 'retry';
        await running.p;
        return 'retry';
      },
      { concurrency: 1 },
    );
    h.q.add('retrying');
    await settle();
    h.q.add('busy');
    h.q.add('queued-1');
    h.q.add('queued-2');
    await settle();
    assert.deepEqual(h.q.status(), { queued: 2, inFlight: 1, waiting: 1 });
    const stopped = h.q.stop(10_000);
    assert.equal(h.q.add('late'), false, 'nothing is added after stop');
    await h.clock.advance(5000);
    running.open();
    assert.deepEqual(await stopped, { notStarted: 2 });
    assert.equal(
      signals.some((s) => s.aborted),
      false,
      'finished within the grace: nothing cancelled',
    );
    assert.deepEqual(
      h.attempts.map((a) => a.key),
      ['retrying', 'busy'],
    );
    assert.deepEqual(
      h.gaveUp,
      [{ key: 'busy', attempts: 1, why: 'stopping' }],
      'a retry asked for while stopping is a give-up',
    );
    assert.equal(
      await metric('mesh_cni_workqueue_drops_total', { queue: h.name, reason: 'stopped' }),
      4,
      'the two queued, the waiting retry, the one stopped',
    );
    assert.deepEqual(h.q.status(), { queued: 0, inFlight: 0, waiting: 0 });
  });

  it('cancels reconciles still running when the grace period is over, and waits for work beside them', async () => {
    let besideDone = false;
    const h = harness<string>(async (_k, ctx) => {
      ctx.beside(
        new Promise<void>((r) =>
          ctx.signal.addEventListener('abort', () => setImmediate(() => ((besideDone = true), r()))),
        ),
      );
      await new Promise((r) => ctx.signal.addEventListener('abort', r));
      return 'done';
    });
    h.q.add('stuck');
    await settle();
    let resolved = false;
    const stopped = h.q.stop(3000).then(() => (resolved = true));
    await h.clock.advance(2999);
    assert.equal(resolved, false, 'still within the grace period');
    await h.clock.advance(1);
    await stopped;
    assert.equal(besideDone, true, 'stop waited for the work beside the reconcile');
  });
});

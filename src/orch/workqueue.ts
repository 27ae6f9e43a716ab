// A keyed work queue for the agent's controllers: the repair controller now, ambient mode's pod
// reconcile next. Its user says what one key needs (`reconcile`); the queue decides when, how
// often and how many at once, as Istio's controllers.Queue does around client-go's workqueue:
// - keyed and deduplicated: a key already queued, or waiting for its retry, is not queued twice;
//   a key added while its reconcile runs is run once more after that one ends (it may have
//   missed the change that added it);
// - bounded concurrency, and a token bucket (one token per attempt) so a burst of keys becomes
//   a bounded request rate;
// - per-key jittered exponential backoff between attempts (a server's Retry-After as a floor),
//   given up after maxAttempts; a retry waits outside the concurrency slots;
// - stop: nothing new starts, retries are dropped, reconciles under way get `graceMs` to finish
//   before their signal is aborted;
// - metrics labelled by queue name, and an injected clock so tests need no real waiting.

import { Gauge } from 'prom-client';
import { combinations, describeLabels, knownCounter, registry } from '../monitoring/metrics.ts';
import { Backoff, TokenBucket, realClock, type BackoffOptions, type Clock } from './limits.ts';

/** Whether and when to retry a key: finished, never worth retrying, or try again after a backoff. */
export type RetryVerdict = 'done' | 'drop' | 'retry' | { readonly retryAfterMs: number };

export interface ReconcileContext {
  /** 1 for the first attempt at this key, counting up across its retries. */
  readonly attempt: number;
  /** Aborted when stop()'s grace period is over: cancel requests with it. */
  readonly signal: AbortSignal;
  /** Work this reconcile started that runs beside it, outside its slot; stop() waits for it too. */
  beside(work: Promise<unknown>): void;
}

export interface WorkQueueOptions<K> {
  /** Names the queue in its metrics (label `queue`). */
  readonly name: string;
  /** Should not throw; a throw counts as 'retry'. */
  readonly reconcile: (key: K, ctx: ReconcileContext) => Promise<RetryVerdict>;
  /** Reconciles run at once, at most. */
  readonly concurrency: number;
  /** Attempts per second (and burst) over all keys; none: unlimited. */
  readonly rate?: { readonly qps: number; readonly burst: number };
  readonly backoff: BackoffOptions;
  /** Attempts at one key before it is given up (until it is added again). */
  readonly maxAttempts: number;
  readonly clock?: Clock;
  /** A retry was scheduled: after `delayMs`, as attempt `attempt + 1`. */
  readonly onRetry?: (key: K, info: RetryInfo) => void;
  /** The reconcile asked for a retry that will not happen: attempts used up, or the queue is stopping. */
  readonly onGiveUp?: (key: K, info: GiveUpInfo) => void;
}

export interface RetryInfo {
  readonly attempt: number;
  readonly delayMs: number;
  /** What the reconcile threw, if it threw. */
  readonly error?: unknown;
}

export interface GiveUpInfo {
  readonly attempts: number;
  readonly why: 'max_attempts' | 'stopping';
  readonly error?: unknown;
}

export type DropReason = 'dropped' | 'max_attempts' | 'stopped';

const depth = new Gauge({
  name: 'mesh_cni_workqueue_depth',
  help: 'Keys queued and waiting for a worker (not those in flight or waiting for their retry), by queue.',
  labelNames: ['queue'] as const,
  registers: [registry],
});

// The queues are this module's users' (repair, ambient): each makes its series when it is made.
const QUEUE = { queue: "the queue's name (repair, ambient), its series made with the queue" };
describeLabels('mesh_cni_workqueue_depth', { series: [], open: QUEUE });

const retries = knownCounter({
  name: 'mesh_cni_workqueue_retries_total',
  help: 'Retries scheduled after a failed attempt, by queue.',
  series: [{}],
  open: QUEUE,
});

const drops = knownCounter({
  name: 'mesh_cni_workqueue_drops_total',
  help:
    'Keys dropped unfinished, by queue and reason ' +
    '(dropped: the reconcile said no retry helps; max_attempts; stopped: the queue stopped first).',
  series: combinations({ reason: ['dropped', 'max_attempts', 'stopped'] satisfies DropReason[] }),
  open: QUEUE,
});

interface Entry {
  state: 'queued' | 'running' | 'waiting';
  /** Attempts made so far. */
  attempt: number;
  backoff: Backoff | undefined;
  /** Added again while running: run once more after. */
  again: boolean;
}

export class WorkQueue<K> {
  readonly #o: WorkQueueOptions<K>;
  readonly #clock: Clock;
  readonly #bucket: TokenBucket | undefined;
  readonly #entries = new Map<K, Entry>();
  /** Keys in the order they became ready; a key no longer queued is skipped when reached. */
  readonly #ready: K[] = [];
  #queued = 0;
  readonly #running = new Set<Promise<void>>();
  readonly #beside = new Set<Promise<unknown>>();
  /** Soft stop: nothing new starts, no more retries. */
  readonly #stopping = new AbortController();
  /** Hard stop: reconciles under way are cancelled (after the grace period). */
  readonly #abort = new AbortController();
  #stopped: Promise<{ notStarted: number }> | undefined;

  constructor(o: WorkQueueOptions<K>) {
    this.#o = o;
    this.#clock = o.clock ?? realClock;
    this.#bucket = o.rate ? new TokenBucket(o.rate.qps, o.rate.burst, this.#clock) : undefined;
    depth.set({ queue: o.name }, 0);
    retries.zero({ queue: o.name });
    drops.zero({ queue: o.name });
  }

  /** Queues `key` unless it is queued or waiting for its retry already; true if it will run (again). */
  add(key: K): boolean {
    if (this.#stopping.signal.aborted) return false;
    const e = this.#entries.get(key);
    if (e) {
      if (e.state !== 'running' || e.again) return false;
      e.again = true;
      return true;
    }
    this.#entries.set(key, { state: 'queued', attempt: 0, backoff: undefined, again: false });
    this.#enqueue(key);
    this.#pump();
    return true;
  }

  /** Queued, in flight or waiting for its retry. */
  has(key: K): boolean {
    return this.#entries.has(key);
  }

  /** Takes out a key that is queued and not attempted yet; true if it was. */
  remove(key: K): boolean {
    const e = this.#entries.get(key);
    if (!e || e.state !== 'queued' || e.attempt > 0) return false;
    this.#entries.delete(key);
    this.#setQueued(-1);
    return true;
  }

  status(): { queued: number; inFlight: number; waiting: number } {
    let waiting = 0;
    for (const e of this.#entries.values()) if (e.state === 'waiting') waiting++;
    return { queued: this.#queued, inFlight: this.#running.size, waiting };
  }

  /**
   * Starts nothing more and drops retries; reconciles under way get `graceMs` to finish before
   * their signal is aborted. Resolves when they and the work beside them have ended, with the
   * number of keys that were queued and never started.
   */
  stop(graceMs: number): Promise<{ notStarted: number }> {
    this.#stopped ??= this.#stop(graceMs);
    return this.#stopped;
  }

  async #stop(graceMs: number): Promise<{ notStarted: number }> {
    this.#stopping.abort(new Error(`work queue ${this.#o.name} stopping`));
    const notStarted = this.#queued;
    for (const [key, e] of this.#entries) {
      if (e.state !== 'queued') continue;
      this.#entries.delete(key);
      drops.inc({ queue: this.#o.name, reason: 'stopped' });
    }
    this.#setQueued(-notStarted);
    const graceOver = new AbortController();
    void this.#clock.sleep(graceMs, graceOver.signal).then(
      () => this.#abort.abort(new Error(`work queue ${this.#o.name} stopped`)),
      () => {},
    );
    await Promise.allSettled([...this.#running]);
    await Promise.allSettled([...this.#beside]);
    graceOver.abort();
    return { notStarted };
  }

  #enqueue(key: K): void {
    this.#ready.push(key);
    this.#setQueued(1);
  }

  #setQueued(delta: number): void {
    this.#queued += delta;
    depth.set({ queue: this.#o.name }, this.#queued);
  }

  #pump(): void {
    while (!this.#stopping.signal.aborted && this.#running.size < this.#o.concurrency && this.#ready.length > 0) {
      const key = this.#ready.shift()!;
      const e = this.#entries.get(key);
      if (!e || e.state !== 'queued') continue;
      e.state = 'running';
      this.#setQueued(-1);
      // Started once the job holds its slot: a reconcile that adds a key before its first await
      // (no rate limit: nothing is awaited before it) must not start that key beside it.
      const job: Promise<void> = Promise.resolve()
        .then(() => this.#work(key, e))
        .finally(() => {
          this.#running.delete(job);
          this.#pump();
        });
      this.#running.add(job);
    }
  }

  async #work(key: K, e: Entry): Promise<void> {
    const name = this.#o.name;
    if (this.#bucket) {
      try {
        await this.#bucket.take(this.#stopping.signal);
      } catch {
        this.#entries.delete(key);
        drops.inc({ queue: name, reason: 'stopped' });
        return;
      }
    }
    e.attempt++;
    let outcome: RetryVerdict;
    let error: unknown;
    try {
      const ctx: ReconcileContext = { attempt: e.attempt, signal: this.#abort.signal, beside: (w) => this.#track(w) };
      outcome = await this.#o.reconcile(key, ctx);
    } catch (err) {
      outcome = 'retry';
      error = err;
    }
    const errorField = error === undefined ? {} : { error };
    if (outcome === 'done' || outcome === 'drop') {
      if (outcome === 'drop') drops.inc({ queue: name, reason: 'dropped' });
      this.#finish(key, e);
      return;
    }
    if (this.#stopping.signal.aborted || e.attempt >= this.#o.maxAttempts) {
      const why = this.#stopping.signal.aborted ? 'stopping' : 'max_attempts';
      drops.inc({ queue: name, reason: why === 'stopping' ? 'stopped' : 'max_attempts' });
      observe(() => this.#o.onGiveUp?.(key, { attempts: e.attempt, why, ...errorField }));
      this.#finish(key, e);
      return;
    }
    retries.inc({ queue: name });
    e.backoff ??= new Backoff(this.#o.backoff);
    const delayMs = e.backoff.next(typeof outcome === 'object' ? outcome.retryAfterMs : 0);
    // The retry covers an add() made while this attempt ran.
    e.again = false;
    e.state = 'waiting';
    observe(() => this.#o.onRetry?.(key, { attempt: e.attempt, delayMs, ...errorField }));
    this.#clock.sleep(delayMs, this.#stopping.signal).then(
      () => {
        e.state = 'queued';
        this.#enqueue(key);
        this.#pump();
      },
      () => {
        this.#entries.delete(key);
        drops.inc({ queue: name, reason: 'stopped' });
      },
    );
  }

  /** The key is finished; added again while it ran, it starts over as new work. */
  #finish(key: K, e: Entry): void {
    if (!e.again || this.#stopping.signal.aborted) {
      this.#entries.delete(key);
      return;
    }
    Object.assign(e, { state: 'queued', attempt: 0, backoff: undefined, again: false } satisfies Entry);
    this.#enqueue(key);
  }

  #track(work: Promise<unknown>): void {
    const settled = work.then(
      () => {},
      () => {},
    );
    this.#beside.add(settled);
    void settled.finally(() => this.#beside.delete(settled));
  }
}

/**
 * Runs an observer hook (onRetry, onGiveUp: logs, metrics). One that throws must not strand its
 * key (left "waiting" for ever: add() refused) nor end the process with an unhandled rejection.
 */
function observe(hook: () => void): void {
  try {
    hook();
  } catch {
    // An observer's bug is not the queue's: the key goes on as if the hook had returned.
  }
}

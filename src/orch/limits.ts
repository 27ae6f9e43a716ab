// Client-side limits on what the agent sends: jittered exponential backoff (the pod watch's
// and namespace watches' restarts, the work queue's retries) and a token bucket (QPS + burst; the work queue's rate).
// Clock and randomness are injectable for tests.

export interface Clock {
  now(): number;
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export const realClock: Clock = {
  now: () => performance.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason as Error);
      const t = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      const onAbort = () => {
        clearTimeout(t);
        reject(signal!.reason as Error);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
    }),
};

export interface BackoffOptions {
  readonly baseMs: number;
  readonly maxMs: number;
  /**
   * How each delay is drawn from its step (baseMs * 2^attempt, capped at maxMs). A number 0..1:
   * uniformly over [step*(1-jitter), step*(1+jitter)], capped (default 0.5). 'full': uniformly
   * from 0 to the step, so many agents that failed together come back spread over the whole
   * window, not in waves (the list/watch loops).
   */
  readonly jitter?: number | 'full';
  /** A server's Retry-After (429, 503) is a floor, itself capped at this (default: no cap). */
  readonly retryAfterCapMs?: number;
  readonly random?: () => number;
}

/** Exponential backoff with jitter, so many agents that lost the same API server do not return in step. */
export class Backoff {
  #attempt = 0;
  readonly #o: Required<BackoffOptions>;
  constructor(o: BackoffOptions) {
    this.#o = { jitter: 0.5, retryAfterCapMs: Infinity, random: Math.random, ...o };
  }
  get attempt(): number {
    return this.#attempt;
  }
  /** The next delay; a server's Retry-After is honoured as a floor. */
  next(retryAfterMs = 0): number {
    const { baseMs, maxMs, jitter, random } = this.#o;
    const step = Math.min(maxMs, baseMs * 2 ** Math.min(this.#attempt, 30));
    this.#attempt++;
    const drawn = jitter === 'full' ? random() * step : step + step * jitter * (2 * random() - 1);
    return Math.max(this.retryAfter(retryAfterMs), Math.min(maxMs, Math.max(0, drawn)));
  }
  /** A server's Retry-After as waited for: at most retryAfterCapMs. */
  retryAfter(retryAfterMs = 0): number {
    return Math.min(retryAfterMs, this.#o.retryAfterCapMs);
  }
  reset(): void {
    this.#attempt = 0;
  }
}

/** Token bucket: `take()` resolves when a token is free; waiters are served in order. */
export class TokenBucket {
  readonly #qps: number;
  readonly #burst: number;
  readonly #clock: Clock;
  #tokens: number;
  #last: number;
  #tail: Promise<void> = Promise.resolve();
  constructor(qps: number, burst: number, clock: Clock = realClock) {
    this.#qps = qps;
    this.#burst = Math.max(1, burst);
    this.#clock = clock;
    this.#tokens = this.#burst;
    this.#last = clock.now();
  }
  #refill(): void {
    const now = this.#clock.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#last) / 1000) * this.#qps);
    this.#last = now;
  }
  /** Milliseconds until a token would be free (0 if one is). */
  wait(): number {
    this.#refill();
    return this.#tokens >= 1 ? 0 : ((1 - this.#tokens) / this.#qps) * 1000;
  }
  take(signal?: AbortSignal): Promise<void> {
    const turn = this.#tail.then(async () => {
      for (let w = this.wait(); w > 0; w = this.wait()) await this.#clock.sleep(w, signal);
      this.#tokens -= 1;
    });
    // A cancelled waiter must not block the ones behind it.
    this.#tail = turn.catch(() => {});
    return turn;
  }
}

// The agent's concurrency primitives, each with one name: at most n at once (Limit, mapBounded),
// one at a time in call order (Serial), and one at a time per key (KeyedSerial). A queue is an
// instance its owner holds, never a module global: two owners never wait on each other.

/** At most `n` of the functions given run at once; the others wait, in call order. */
export class Limit {
  #free: number;
  readonly #waiting: (() => void)[] = [];
  constructor(n: number) {
    this.#free = n;
  }
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next();
      else this.#free++;
    }
  }
}

/**
 * `fn` over `items`, at most `limit` at a time, in list order; the results in list order. After
 * a failure no further item starts; it settles when those under way have, rejecting with the
 * first failure, so a caller cleaning up after it sees everything that was made.
 */
export async function mapBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  let failure: { error: unknown } | null = null;
  const worker = async () => {
    while (failure === null && next < items.length) {
      const i = next++;
      try {
        results[i] = await fn(items[i]!, i);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(Math.max(1, limit), items.length) }, worker));
  if (failure !== null) throw (failure as { error: unknown }).error;
  return results;
}

/** One at a time, in call order: each function starts after every earlier one has settled. */
export class Serial {
  #tail: Promise<unknown> = Promise.resolve();
  run<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.#tail.then(fn, fn);
    this.#tail = run.catch(() => undefined);
    return run;
  }
}

/** A Serial per key, forgotten when its last function has settled (the map stays the size of what runs). */
export class KeyedSerial<K> {
  readonly #tails = new Map<K, Promise<unknown>>();
  run<T>(key: K, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.catch(() => undefined);
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return run;
  }
  /** Keys with a function under way or waiting. */
  get size(): number {
    return this.#tails.size;
  }
}

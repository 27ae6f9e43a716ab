// Paces the reading of many connections to one rate, fairly: a token bucket (at most `burstMs`
// worth) that a read may take below zero, since a read hands over up to 64 KiB at once. A
// connection whose read leaves the bucket below zero pauses and queues; while the bucket is
// below zero, new connections pause too, in a queue of their own. As the bucket refills, one
// connection at a time is resumed: new ones first (a plugin run's whole output is its first
// read), then the longest waiting. So a flood is read at the rate, and a plugin run waits for
// one turn at most, however many flooding connections queue before it.

export interface Pausable {
  pause(): unknown;
  resume(): unknown;
}

export class ReadPacer {
  readonly #rate: number; // per millisecond
  readonly #burst: number;
  readonly #maxDebt: number;
  readonly #onPause: () => void;
  #tokens: number;
  #refilled = Date.now();
  #timer: NodeJS.Timeout | null = null;
  readonly #fresh = new Set<Pausable>();
  readonly #waiting = new Set<Pausable>();

  /** `onPause` counts each time a connection has to wait. */
  constructor(perSecond: number, burstMs: number, onPause: () => void) {
    this.#rate = perSecond / 1000;
    this.#burst = Math.max(1, this.#rate * burstMs);
    // Debt is capped at a few bursts: a burst of costly reads (tiny lines, each charged) must not
    // make a plugin run that arrives just after wait for seconds. So the rate holds only while a
    // read (up to 64 KiB and its lines) costs less than the cap: from about 200 KiB/s up.
    this.#maxDebt = 4 * this.#burst;
    this.#tokens = this.#burst;
    this.#onPause = onPause;
  }

  /** Connections waiting their turn now. */
  get waiting(): number {
    return this.#fresh.size + this.#waiting.size;
  }

  /** Of those, new connections not read from yet. */
  get waitingNew(): number {
    return this.#fresh.size;
  }

  /** Whether `c` is a new connection still waiting for its first read. */
  owesFirstRead(c: Pausable): boolean {
    return this.#fresh.has(c);
  }

  /** Whether `c` is waiting its turn (its sender is not slow then: we are). */
  holds(c: Pausable): boolean {
    return this.#fresh.has(c) || this.#waiting.has(c);
  }

  /** A new connection: it waits only while the rate is used up, ahead of the older ones. */
  admit(c: Pausable): void {
    this.#refill();
    if (this.#tokens >= 0) return;
    this.#wait(c, this.#fresh);
  }

  /** `cost` was just read from `c`. */
  charge(c: Pausable, cost: number): void {
    this.#refill();
    this.#tokens = Math.max(this.#tokens - cost, -this.#maxDebt);
    if (this.#tokens < 0) this.#wait(c, this.#waiting);
  }

  /** `c` is closed. */
  forget(c: Pausable): void {
    this.#fresh.delete(c);
    this.#waiting.delete(c);
  }

  stop(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #wait(c: Pausable, queue: Set<Pausable>): void {
    c.pause();
    queue.add(c);
    this.#onPause();
    this.#arm();
  }

  #refill(): void {
    const now = Date.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + (now - this.#refilled) * this.#rate);
    this.#refilled = now;
  }

  #arm(): void {
    if (this.#timer !== null || this.waiting === 0) return;
    this.#timer = setTimeout(() => this.#turn(), Math.max(1, Math.ceil(-this.#tokens / this.#rate)));
  }

  #turn(): void {
    this.#timer = null;
    this.#refill();
    if (this.#tokens >= 0) {
      const queue = this.#fresh.size > 0 ? this.#fresh : this.#waiting;
      const next = queue.values().next().value;
      if (next !== undefined) {
        queue.delete(next);
        next.resume();
      }
    }
    this.#arm();
  }
}

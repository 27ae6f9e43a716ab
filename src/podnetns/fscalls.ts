// File system calls on paths others control (a pod's /proc entries, the netns path of a CNI ADD)
// run on libuv's thread pool: 4 workers by default, shared with every other file read, DNS
// lookup and crypto call of the agent. Opened without blocking (held.ts), such a call returns at
// once, except where the kernel itself waits: a FUSE or network file system that does not
// answer, an automount that does not come, holds its worker until it does, and nothing can take
// the worker back (libuv cancels only work not started yet). So these calls are bounded here:
// - at most `slots` at once (2: half the default pool). A call past its deadline keeps its slot
//   until it really returns, so calls that hang take at most those workers, never the pool;
// - a caller waits at most `deadlineMs` (2 s: inside the plugin's 5 s for a whole ADD, whose
//   answer then names the path instead of timing out), whether for a slot or for the call. The
//   call goes on alone; what it gives when it returns (an open fd) is disposed of, not leaked;
// - while a call is past its deadline, notReadyReasons names it, for /readyz: the node has a
//   path that hangs the kernel, and the agent has fewer workers until it returns.

/** How many calls at once, and how long a caller waits. */
export interface FsCallLimits {
  readonly slots: number;
  readonly deadlineMs: number;
}

export const POD_PATH_CALL_LIMITS: FsCallLimits = { slots: 2, deadlineMs: 2_000 };

/** A bounded call that did not finish (or start) within its deadline; it may still be running. */
export class FsCallTimeout extends Error {
  readonly code = 'ETIMEDOUT';
  constructor(message: string) {
    super(message);
    this.name = 'FsCallTimeout';
  }
}

interface Running {
  readonly what: string;
  readonly since: number;
  /** Its caller was answered with a timeout: it is stuck, as far as anyone can tell. */
  late: boolean;
}

export class FsCallGate {
  readonly #limits: FsCallLimits;
  readonly #running = new Set<Running>();
  readonly #waiting: (() => void)[] = [];

  constructor(limits: FsCallLimits = POD_PATH_CALL_LIMITS) {
    this.#limits = limits;
  }

  /**
   * `call`'s result, or a FsCallTimeout once `deadlineMs` passed (waiting for a slot included).
   * `what` names the call and its path ("opening /x as a netns"). A result that comes after the
   * timeout is handed to `dispose`.
   */
  run<T>(what: string, call: () => Promise<T>, dispose: (late: T) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let answered = false;
      let entry: Running | null = null;
      const start = () => {
        if (answered) return this.#next();
        const me: Running = { what, since: Date.now(), late: false };
        entry = me;
        this.#running.add(me);
        void (async () => call())()
          .then(
            (v) => {
              if (!answered) {
                answered = true;
                clearTimeout(timer);
                resolve(v);
                return;
              }
              try {
                dispose(v);
              } catch {
                /* disposing is best effort: the caller already has its answer */
              }
            },
            (e: unknown) => {
              if (answered) return;
              answered = true;
              clearTimeout(timer);
              reject(e as Error);
            },
          )
          .finally(() => {
            this.#running.delete(me);
            this.#next();
          });
      };
      const timer = setTimeout(() => {
        answered = true;
        const ms = this.#limits.deadlineMs;
        if (entry === null) {
          const i = this.#waiting.indexOf(start);
          if (i >= 0) this.#waiting.splice(i, 1);
          reject(
            new FsCallTimeout(
              `${what}: not started within ${ms} ms, the ${this.#limits.slots} calls on pod paths allowed at once ` +
                `all still running (${this.#describe([...this.#running])}); the rest of the agent keeps its other ` +
                'workers; see /readyz for what hangs',
            ),
          );
          return;
        }
        entry.late = true;
        reject(
          new FsCallTimeout(
            `${what} did not return within ${ms} ms: the kernel is still in the call (a FUSE or network file ` +
              "system, or an automount, that does not answer?); it holds one of the agent's thread pool workers " +
              'until it returns (see /readyz)',
          ),
        );
      }, this.#limits.deadlineMs);
      timer.unref();
      if (this.#running.size < this.#limits.slots) start();
      else this.#waiting.push(start);
    });
  }

  /** One line per call past its deadline and still running. */
  notReadyReasons(): string[] {
    const stuck = [...this.#running].filter((r) => r.late);
    return stuck.map(
      (r) =>
        `podnetns: ${r.what} has not returned for ${this.#age(r)}: a thread pool worker is held in the kernel until ` +
        `it does (${this.#limits.slots - stuck.length} of ${this.#limits.slots} slots for calls on pod paths left); ` +
        'find what hangs on that path (a FUSE or network mount) and unmount it',
    );
  }

  /** Calls running now (late ones included). */
  get running(): number {
    return this.#running.size;
  }

  /** For ControlZ: the limits, the calls running, the ones past their deadline. */
  status(): Record<string, unknown> {
    const stuck = [...this.#running].filter((r) => r.late).map((r) => ({ call: r.what, for: this.#age(r) }));
    return { ...this.#limits, running: this.#running.size, waiting: this.#waiting.length, stuck };
  }

  #next(): void {
    while (this.#waiting.length > 0 && this.#running.size < this.#limits.slots) this.#waiting.shift()!();
  }

  #age(r: Running): string {
    return `${((Date.now() - r.since) / 1000).toFixed(1)} s`;
  }

  #describe(rs: readonly Running[]): string {
    return rs.map((r) => `${r.what}, for ${this.#age(r)}`).join('; ');
  }
}

/**
 * The agent's one gate for calls on pod paths: the thread pool is the process's, so are its
 * slots (repair and ambient mode share them).
 */
export const podPathCalls = new FsCallGate();

/**
 * The gate as a part of the agent (src/component.ts's shape): not ready while a call on a pod path
 * is past its deadline, its calls on ControlZ. Nothing to stop: a hung call cannot be taken back.
 */
export function podPathCallsPart(gate: FsCallGate = podPathCalls) {
  return {
    name: 'pod-path-calls',
    notReadyReasons: () => gate.notReadyReasons(),
    status: () => gate.status(),
    stop: async () => {},
  };
}

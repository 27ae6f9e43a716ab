// List-then-watch of the pods a part of the agent cares about (the repair controller, the
// plugin's pod lookup), with our own failure handling: 410 Gone -> relist; watch closed ->
// re-watch after a jittered exponential backoff; any HTTP or network error -> backoff and retry,
// never a silent stop; a watch that sends nothing (no event, no bookmark) for too long is aborted
// and restarted. The cache it keeps is what the repair controller's periodic resync re-checks
// and what the pod lookup answers from. The agent's wiring (src/agent.ts) builds the node's watch
// once (nodePodSource) and hands it to every reader; it never belongs to one of them.

import type { V1Pod } from '@kubernetes/client-node';
import type { LogScope } from '../config/flags.ts';
import { scope, type Logger } from '../monitoring/logging.ts';
import type { PodQuery, OrchApi, WatchEventType } from './api.ts';
import { ApiError, statusText, toApiError } from './errors.ts';
import { Backoff, realClock, type BackoffOptions, type Clock } from './limits.ts';

/** One reader of a watch; each brings its own metrics through the optional hooks. */
export interface PodHandler {
  upsert(pod: V1Pod): void;
  remove(pod: V1Pod): void;
  /** The watch ended and is started again (after a backoff), for this reason. */
  restarted?(reason: RestartReason): void;
  /** The number of pods cached, after each change (and when the reader is added). */
  cacheSize?(pods: number): void;
}

export interface PodSourceOptions {
  readonly query: PodQuery;
  readonly pageSize: number;
  readonly requestTimeoutMs: number;
  /** Asked of the server; it ends the watch then, and we re-watch from where we were. */
  readonly watchTimeoutSeconds: number;
  /** No event or bookmark for this long: the watch is taken as dead and restarted. */
  readonly silenceTimeoutMs: number;
  /** A watch that lived this long or delivered anything counts as healthy (the backoff starts over). */
  readonly healthyAfterMs: number;
  readonly backoff: BackoffOptions;
  readonly clock: Clock;
  /** The log scope of the watch's own messages (its readers' metrics come by PodHandler). */
  readonly logScope: LogScope;
}

/**
 * The watch timing both readers use by default. A real API server sends a bookmark about once a
 * minute, so two minutes of silence means the stream is dead; it closes a watch itself after
 * watchTimeoutSeconds (here 5-10 min, jittered).
 */
export const WATCH_DEFAULTS = {
  pageSize: 500,
  requestTimeoutMs: 30_000,
  watchTimeoutSeconds: 300,
  silenceTimeoutMs: 120_000,
  healthyAfterMs: 10_000,
  backoff: { baseMs: 1000, maxMs: 30_000 },
} as const satisfies Partial<PodSourceOptions>;

export type RestartReason = 'closed' | 'expired' | 'silent' | 'error';
export type SourceState = 'starting' | 'listing' | 'watching' | 'backoff' | 'stopped';

interface WatchEnd {
  readonly reason: RestartReason | 'stopped';
  readonly healthy: boolean;
  readonly error?: ApiError;
}

const podKey = (p: V1Pod) => `${p.metadata?.namespace ?? ''}/${p.metadata?.name ?? ''}`;

export class PodSource {
  readonly #api: OrchApi;
  readonly #o: PodSourceOptions;
  readonly #handlers: PodHandler[];
  readonly #log: Logger;
  readonly #cache = new Map<string, V1Pod>();
  readonly #stop = new AbortController();
  readonly #restarts: Record<RestartReason, number> = { closed: 0, expired: 0, silent: 0, error: 0 };
  #state: SourceState = 'starting';
  #resourceVersion = '';
  #lists = 0;
  #lastError = '';
  #loop: Promise<void> | undefined;
  #synced!: () => void;
  /** Resolves after the first complete list. */
  readonly synced = new Promise<void>((r) => (this.#synced = r));

  /** `handler` gets every pod added, changed or gone; null when readers come by addHandler. */
  constructor(api: OrchApi, handler: PodHandler | null, o: PodSourceOptions) {
    this.#api = api;
    this.#handlers = handler ? [handler] : [];
    this.#o = o;
    this.#log = scope(o.logScope);
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  /** Another reader of the same watch (one watch per node, not one per reader); gets the cache first. */
  addHandler(handler: PodHandler): void {
    this.#handlers.push(handler);
    for (const p of this.#cache.values()) handler.upsert(p);
    if (this.#lists > 0) handler.cacheSize?.(this.#cache.size);
  }

  async stop(): Promise<void> {
    this.#stop.abort(new Error('pod watch stopping'));
    await this.#loop;
    this.#state = 'stopped';
  }

  pods(): V1Pod[] {
    return [...this.#cache.values()];
  }

  /** The cached pod, if the list/watch has it. */
  get(namespace: string, name: string): V1Pod | undefined {
    return this.#cache.get(`${namespace}/${name}`);
  }

  get state(): SourceState {
    return this.#state;
  }

  status() {
    return {
      state: this.#state,
      resourceVersion: this.#resourceVersion,
      cachedPods: this.#cache.size,
      lists: this.#lists,
      watchRestarts: { ...this.#restarts },
      lastError: this.#lastError,
    };
  }

  get #stopped(): boolean {
    return this.#stop.signal.aborted;
  }

  async #sleep(ms: number): Promise<void> {
    await this.#o.clock.sleep(ms, this.#stop.signal).catch(() => {});
  }

  async #run(): Promise<void> {
    const backoff = new Backoff(this.#o.backoff);
    let rv = '';
    while (!this.#stopped) {
      let delay: number;
      try {
        if (rv === '') {
          this.#state = 'listing';
          rv = await this.#list();
        }
        this.#state = 'watching';
        const end = await this.#watch(rv);
        if (end.reason === 'stopped') break;
        // Events and bookmarks moved #resourceVersion on; an expired one means listing again.
        rv = end.reason === 'expired' ? '' : this.#resourceVersion;
        if (end.healthy) backoff.reset();
        this.#restarts[end.reason]++;
        for (const h of this.#handlers) h.restarted?.(end.reason);
        delay = backoff.next(end.error?.retryAfterMs);
        if (end.error) this.#lastError = end.error.message;
        const level = end.reason === 'closed' && end.healthy ? 'debug' : 'warn';
        this.#log[level]('pod watch ended; watching again', { reason: end.reason, relist: rv === '', retryInMs: Math.round(delay), attempt: backoff.attempt, ...(end.error ? { error: end.error.message } : {}) });
      } catch (e) {
        if (this.#stopped) break;
        const err = toApiError('listing pods', e);
        // A list from a continue token that expired meanwhile starts over.
        if (err.code === 410) rv = '';
        this.#restarts.error++;
        for (const h of this.#handlers) h.restarted?.('error');
        this.#lastError = err.message;
        delay = backoff.next(err.retryAfterMs);
        this.#log.warn('cannot list pods; retrying', { error: err.message, retryInMs: Math.round(delay), attempt: backoff.attempt });
      }
      this.#state = 'backoff';
      await this.#sleep(delay);
    }
    this.#state = 'stopped';
  }

  /** One full list (all pages); replaces the cache and tells the handler what changed. */
  async #list(): Promise<string> {
    const seen = new Map<string, V1Pod>();
    let continueToken: string | undefined;
    let rv: string;
    do {
      const signal = AbortSignal.any([this.#stop.signal, AbortSignal.timeout(this.#o.requestTimeoutMs)]);
      const page = await this.#api.listPods({ ...this.#o.query, limit: this.#o.pageSize, continueToken }, signal);
      for (const p of page.items) seen.set(podKey(p), p);
      continueToken = page.continueToken;
      rv = page.resourceVersion;
    } while (continueToken);
    this.#lists++;
    for (const [k, old] of this.#cache) {
      if (!seen.has(k)) {
        this.#cache.delete(k);
        for (const h of this.#handlers) h.remove(old);
      }
    }
    for (const [k, p] of seen) {
      this.#cache.set(k, p);
      for (const h of this.#handlers) h.upsert(p);
    }
    for (const h of this.#handlers) h.cacheSize?.(this.#cache.size);
    this.#resourceVersion = rv;
    this.#synced();
    this.#log.debug('listed pods', { count: seen.size, resourceVersion: rv });
    return rv;
  }

  /** One watch from `rv` until it ends for whatever reason. */
  #watch(rv: string): Promise<WatchEnd> {
    return new Promise<WatchEnd>((resolve) => {
      const started = this.#o.clock.now();
      let delivered = false;
      let finished = false;
      let controller: AbortController | undefined;
      let watchdog: NodeJS.Timeout | undefined;
      const finish = (reason: WatchEnd['reason'], error?: ApiError) => {
        if (finished) return;
        finished = true;
        clearTimeout(watchdog);
        this.#stop.signal.removeEventListener('abort', onStop);
        controller?.abort();
        const healthy = delivered || this.#o.clock.now() - started >= this.#o.healthyAfterMs;
        resolve({ reason, healthy, ...(error ? { error } : {}) });
      };
      const arm = () => {
        // Restarted on every event: the same timer, pushed back.
        if (watchdog) watchdog.refresh();
        else watchdog = setTimeout(() => finish('silent', new ApiError('watching pods', undefined, `no event or bookmark for ${this.#o.silenceTimeoutMs} ms`)), this.#o.silenceTimeoutMs);
      };
      const onStop = () => finish('stopped');
      this.#stop.signal.addEventListener('abort', onStop, { once: true });
      arm();
      const onEvent = (type: WatchEventType, obj: unknown) => {
        if (finished) return;
        arm();
        if (type === 'ERROR') {
          const status = obj as { code?: number; message?: string; reason?: string };
          const err = new ApiError('watching pods', status.code ?? 500, statusText(status));
          finish(status.code === 410 ? 'expired' : 'error', err);
          return;
        }
        const pod = obj as V1Pod;
        const objRv = pod.metadata?.resourceVersion;
        if (objRv) this.#resourceVersion = objRv;
        if (type === 'BOOKMARK') return;
        delivered = true;
        const k = podKey(pod);
        if (type === 'DELETED') {
          this.#cache.delete(k);
          for (const h of this.#handlers) h.remove(pod);
        } else {
          this.#cache.set(k, pod);
          for (const h of this.#handlers) h.upsert(pod);
        }
        for (const h of this.#handlers) h.cacheSize?.(this.#cache.size);
      };
      const done = (err: unknown) => {
        if (finished) return;
        if (err) {
          const e = toApiError('watching pods', err);
          finish(e.code === 410 ? 'expired' : 'error', e);
        } else {
          finish('closed');
        }
      };
      // Jitter the server-side timeout so agents restarted together do not re-watch together.
      const timeoutSeconds = Math.round(this.#o.watchTimeoutSeconds * (1 + Math.random()));
      this.#api
        .watchPods({ ...this.#o.query, resourceVersion: rv, timeoutSeconds }, onEvent, done)
        .then((c) => {
          controller = c;
          // Opened after we gave up on it (watchdog or stop): close it at once.
          if (finished) c.abort();
        })
        .catch(done);
    });
  }
}

/** The pods of this node: what the kubelet of `nodeName` runs. */
export function nodePodQuery(nodeName: string): PodQuery {
  return { fieldSelector: `spec.nodeName=${nodeName}`, labelSelector: '' };
}

/** The node's pod watch (not started), with the default timing. */
export function nodePodSource(api: OrchApi, nodeName: string, logScope: LogScope): PodSource {
  return new PodSource(api, null, { ...WATCH_DEFAULTS, query: nodePodQuery(nodeName), clock: realClock, logScope });
}

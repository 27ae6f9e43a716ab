// List-then-watch of one kind of object (the node's pods, the cluster's namespaces), kept in a
// cache its readers hear every change of, with our own failure handling: 410 Gone -> read the
// state again; watch closed -> re-watch from its last resourceVersion (no list); any HTTP or
// network error -> backoff and retry, never a silent stop; a watch that sends nothing (no event,
// no bookmark) for too long is aborted and restarted.
//
// The state is read as the fleet can afford (docs/design.md "Fleet scale"): by the streaming watch-list
// (sendInitialEvents, KEP-3157), else a list from the API server's watch cache (resourceVersion=0,
// no limit), and only if the server refuses that, a consistent list (every object of the cluster
// read from etcd); each fallback is logged and kept for the life of the process. A watch cut while
// healthy is resumed after a random part of a 12 s spread; failures back off with full jitter.
// What differs between kinds is a Resource: its path, its key, what is kept of each object.

import type { V1ObjectMeta } from '@kubernetes/client-node';
import type { LogScope } from '../config/flags.ts';
import { scope, type Logger } from '../monitoring/logging.ts';
import { watchReached, type StartupWatch, type WatchStage } from '../monitoring/startup.ts';
import type { OrchApi, Selectors, WatchEventType, WatchTuning } from './api.ts';
import { ApiError, statusText, toApiError } from './errors.ts';
import { Backoff, type BackoffOptions, type Clock } from './limits.ts';
import type { ListMode } from './ratelimit.ts';

/** What an informer needs of an object: its metadata. */
export interface KubeObject {
  metadata?: V1ObjectMeta;
}

/** One kind of object an informer reads. */
export interface Resource<T extends KubeObject> {
  /** Its collection under /api/v1 ('pods'), also how log lines name it. */
  readonly plural: string;
  /** One of it, in log lines ('pod'). */
  readonly singular: string;
  readonly key: (o: T) => string;
  /** What is kept of each object read; none: all of it. */
  readonly slim?: (o: T) => T;
  /** The one way it is read, whatever the agent's list mode (a fallback on refusal still applies). */
  readonly listMode?: ListMode;
  /** What to check when the server refuses the query however it is read (the flags that made it). */
  readonly queryHint: string;
}

/** One reader of an informer; each brings its own metrics through the optional hooks. */
export interface Handler<T> {
  /** Added or changed; `old` is the object as cached before (undefined: new to the cache). */
  upsert(o: T, old?: T): void;
  remove(o: T): void;
  /** The watch ended and is started again (after a backoff), for this reason. */
  restarted?(reason: RestartReason): void;
  /** The number of objects cached, after each change (and when the reader is added). */
  cacheSize?(n: number): void;
}

export interface InformerOptions {
  readonly query: Selectors;
  readonly pageSize: number;
  readonly requestTimeoutMs: number;
  /** Asked of the server; it ends the watch then, and we re-watch from where we were. */
  readonly watchTimeoutSeconds: number;
  /** No event or bookmark for this long: the watch is taken as dead and restarted. */
  readonly silenceTimeoutMs: number;
  /** A watch that lived this long or delivered anything counts as healthy (the backoff starts over). */
  readonly healthyAfterMs: number;
  readonly backoff: Pick<BackoffOptions, 'baseMs' | 'maxMs'>;
  readonly clock: Clock;
  /** The log scope of the watch's own messages (its readers' metrics come by Handler). */
  readonly logScope: LogScope;
  /** How the state is read, the re-watch spread and the start jitter: else the API's tuning, else FLEET_DEFAULTS. */
  readonly tuning?: Partial<WatchTuning>;
  readonly random?: () => number;
  /** Its name in mesh_cni_startup_duration_seconds{watch}; none: its start-up is not recorded. */
  readonly startupName?: StartupWatch;
}

/**
 * How an agent reads and re-watches when its settings do not say (docs/design.md "Fleet scale"): the
 * streaming watch-list where served (else a list from the watch cache); a watch cut while healthy
 * is resumed within 12 s, at random, so a fleet whose watches were all cut at once (an API server
 * restart, a compaction) comes back spread over 12 s; the first read waits up to 1 s.
 */
export const FLEET_DEFAULTS: WatchTuning = { listMode: 'auto', reconnectSpreadMs: 12_000, startJitterMs: 1000 };

/** The bookmark that ends a watch-list's initial events carries this annotation ("true"). */
export const INITIAL_EVENTS_END = 'k8s.io/initial-events-end';

/** An answer that says the server does not take these parameters (not a passing failure). */
function refusesParameters(e: ApiError): boolean {
  return e.code !== undefined && [400, 404, 405, 406, 415, 422, 501].includes(e.code);
}

/** A refusal as the server said it (code and Status text, not which request), to tell two apart. */
const refusalOf = (e: ApiError): string => (refusesParameters(e) ? `${e.code} ${e.detail}` : '');

/**
 * The watch timing every informer uses by default. A real API server sends a bookmark about once
 * a minute, so two minutes of silence means the stream is dead; it closes a watch itself after
 * watchTimeoutSeconds (here 5-10 min, jittered).
 */
export const WATCH_DEFAULTS = {
  pageSize: 500,
  requestTimeoutMs: 30_000,
  watchTimeoutSeconds: 300,
  silenceTimeoutMs: 120_000,
  healthyAfterMs: 10_000,
  backoff: { baseMs: 1000, maxMs: 30_000 },
} as const satisfies Partial<InformerOptions>;

/** How a list/watch loop backs off: full jitter, a Retry-After waited for at most 5 minutes. */
export const WATCH_BACKOFF = { jitter: 'full', retryAfterCapMs: 5 * 60_000 } as const satisfies Partial<BackoffOptions>;

export type RestartReason = 'closed' | 'expired' | 'silent' | 'error';
export type SourceState = 'starting' | 'listing' | 'watching' | 'backoff' | 'stopped';

interface WatchEnd {
  /** unsupported: a watch-list the server does not serve (the agent lists instead). */
  readonly reason: RestartReason | 'stopped' | 'unsupported';
  readonly healthy: boolean;
  /** The cache is current (a watch-list past its initial events, or any plain watch). */
  readonly synced: boolean;
  /** Closed by the server at the timeoutSeconds we asked for. */
  readonly timedOut: boolean;
  readonly error?: ApiError;
}

export class Informer<T extends KubeObject> {
  readonly #api: OrchApi;
  readonly #r: Resource<T>;
  readonly #o: InformerOptions;
  readonly #handlers: Handler<T>[];
  readonly #log: Logger;
  readonly #cache = new Map<string, T>();
  readonly #stop = new AbortController();
  readonly #restarts: Record<RestartReason, number> = { closed: 0, expired: 0, silent: 0, error: 0 };
  #state: SourceState = 'starting';
  #resourceVersion = '';
  #lists = 0;
  #lastError = '';
  /** Since when (clock ms) lists and watches fail with no watch opened; undefined: not failing. */
  #failingSince: number | undefined;
  #failures = 0;
  #listMode: ListMode;
  /**
   * The refusal that made this watch leave a way of reading, the way it left, and the log line
   * that says so, written once the new way reads. When the new way is refused alike, the server
   * refuses the query (a selector the start-up check passed, say a pod field an older API server
   * does not know), not the way of reading: back to that way, as no fallback helps.
   */
  #fellBackOn: { readonly from: ListMode; readonly refusal: string; readonly say: () => void } | undefined;
  /** The server refuses the query itself, so: only backoff, never a fallback, for this refusal. */
  #queryRefusal = '';
  readonly #tuning: WatchTuning;
  readonly #random: () => number;
  #loop: Promise<void> | undefined;
  #synced!: () => void;
  /** Resolves after the first complete list. */
  readonly synced = new Promise<void>((r) => (this.#synced = r));

  /** `handler` gets every object added, changed or gone; null when readers come by addHandler. */
  constructor(api: OrchApi, resource: Resource<T>, handler: Handler<T> | null, o: InformerOptions) {
    this.#api = api;
    this.#r = resource;
    this.#handlers = handler ? [handler] : [];
    this.#o = o;
    this.#log = scope(o.logScope);
    this.#tuning = { ...FLEET_DEFAULTS, ...api.tuning, ...o.tuning };
    if (resource.listMode) this.#tuning = { ...this.#tuning, listMode: resource.listMode };
    this.#listMode = this.#tuning.listMode;
    this.#random = o.random ?? Math.random;
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  /** Another reader of the same watch (one watch per node, not one per reader); gets the cache first. */
  addHandler(handler: Handler<T>): void {
    this.#handlers.push(handler);
    for (const o of this.#cache.values()) this.#tell([handler], 'upsert', o, undefined);
    if (this.#lists > 0) handler.cacheSize?.(this.#cache.size);
  }

  async stop(): Promise<void> {
    this.#stop.abort(new Error(`${this.#r.singular} watch stopping`));
    await this.#loop;
    this.#state = 'stopped';
  }

  /** Every object cached. */
  list(): T[] {
    return [...this.#cache.values()];
  }

  /** The cached object of this key, if the list/watch has it. */
  cached(key: string): T | undefined {
    return this.#cache.get(key);
  }

  get state(): SourceState {
    return this.#state;
  }

  /** Lists and watches have failed for `forMs` at least, no watch opened since: how often, and the last error. */
  failing(forMs: number): { readonly attempts: number; readonly lastError: string } | undefined {
    if (this.#failingSince === undefined || this.#o.clock.now() - this.#failingSince < forMs) return undefined;
    return { attempts: this.#failures, lastError: this.#lastError };
  }

  /** What /status shows of it (each kind names its cache count). */
  protected informerStatus() {
    return {
      state: this.#state,
      resourceVersion: this.#resourceVersion,
      cached: this.#cache.size,
      lists: this.#lists,
      listMode: this.#listMode,
      watchRestarts: { ...this.#restarts },
      lastError: this.#lastError,
      failing: this.#failingSince !== undefined,
    };
  }

  get #stopped(): boolean {
    return this.#stop.signal.aborted;
  }

  #reached(stage: WatchStage): void {
    if (this.#o.startupName) watchReached(this.#o.startupName, stage);
  }

  async #sleep(ms: number): Promise<void> {
    await this.#o.clock.sleep(ms, this.#stop.signal).catch(() => {});
  }

  #failed(error: string): void {
    this.#lastError = error;
    this.#failures++;
    this.#failingSince ??= this.#o.clock.now();
  }

  async #run(): Promise<void> {
    const cap = this.#o.backoff.maxMs;
    const backoff = new Backoff({ ...this.#o.backoff, ...WATCH_BACKOFF, random: this.#random });
    const { plural } = this.#r;
    let rv = '';
    // A mass restart (a rollout, every node rebooted) does not send every agent's first read at once.
    let delay = this.#random() * Math.min(this.#tuning.startJitterMs, cap);
    while (!this.#stopped) {
      if (delay > 0) {
        if (this.#state !== 'starting') this.#state = 'backoff';
        await this.#sleep(delay);
        if (this.#stopped) break;
      }
      try {
        let end: WatchEnd;
        if (rv === '' && this.#listMode === 'auto') {
          this.#state = 'listing';
          end = await this.#watch('', true);
          if (end.reason === 'unsupported') {
            this.#listMode = 'cache';
            const error = end.error?.message ?? '';
            const say = () =>
              this.#log.warn(
                'the API server does not serve the streaming watch-list; listing from its watch cache instead ' +
                  '(resourceVersion=0), for as long as this agent runs',
                { error },
              );
            this.#fellBackOn = { from: 'auto', refusal: end.error ? refusalOf(end.error) : '', say };
            delay = 0;
            continue;
          }
        } else {
          if (rv === '') {
            this.#state = 'listing';
            rv = await this.#list();
          }
          this.#state = 'watching';
          end = await this.#watch(rv, false);
        }
        if (end.reason === 'stopped' || end.reason === 'unsupported') break;
        // Events and bookmarks moved #resourceVersion on; an expired watch, or a watch-list that
        // ended before its initial events did, means reading the state again.
        rv = end.reason === 'expired' || !end.synced ? '' : this.#resourceVersion;
        if (end.healthy) backoff.reset();
        this.#restarts[end.reason]++;
        for (const h of this.#handlers) h.restarted?.(end.reason);
        const retryAfter = end.error?.retryAfterMs;
        const spread = Math.min(this.#tuning.reconnectSpreadMs, cap);
        // Its own timeout (already 5-10 min at random): at once. Cut while healthy (an API server
        // restart, a compaction cuts every watch of the fleet together): anywhere in the spread.
        // Failing: exponential backoff with full jitter.
        const cut = !end.timedOut && end.healthy && spread > 0;
        delay = end.timedOut
          ? 0
          : cut
            ? Math.max(backoff.retryAfter(retryAfter), this.#random() * spread)
            : backoff.next(retryAfter);
        if (end.error) this.#failed(end.error.message);
        if (end.error && this.#saidRefused(end.error, delay)) continue;
        const level = end.reason === 'closed' && end.healthy ? 'debug' : 'warn';
        this.#log[level](`${this.#r.singular} watch ended; watching again`, {
          reason: end.reason,
          relist: rv === '',
          retryInMs: Math.round(delay),
          attempt: backoff.attempt,
          ...(end.error ? { error: end.error.message } : {}),
        });
      } catch (e) {
        if (this.#stopped) break;
        const err = toApiError(`listing ${plural}`, e);
        const refusal = refusalOf(err);
        if (refusal !== '' && refusal === this.#fellBackOn?.refusal) {
          // Refused just as the way of reading it left: the query is refused; back to that way.
          this.#listMode = this.#fellBackOn.from;
          this.#queryRefusal = refusal;
          this.#fellBackOn = undefined;
        } else if (this.#listMode === 'cache' && refusal !== '' && refusal !== this.#queryRefusal) {
          // Every Kubernetes API server takes resourceVersion=0; whatever stands in front of this
          // one does not: consistent reads (each one goes to etcd) keep the agent working.
          this.#listMode = 'consistent';
          this.#fellBackOn?.say(); // refused otherwise here: that fallback stands
          const say = () =>
            this.#log.warn(
              'the API server refuses lists from its watch cache (resourceVersion=0); listing with consistent ' +
                `reads instead, which read every ${this.#r.singular} of the cluster from etcd`,
              { error: err.message },
            );
          this.#fellBackOn = { from: 'cache', refusal, say };
          delay = 0;
          continue;
        }
        // A list from a continue token that expired meanwhile starts over; one not older than a
        // resourceVersion the server no longer takes starts from any (the reflector: from etcd).
        if (err.code === 410) {
          rv = '';
          this.#resourceVersion = '';
        }
        this.#restarts.error++;
        for (const h of this.#handlers) h.restarted?.('error');
        this.#failed(err.message);
        delay = backoff.next(err.retryAfterMs);
        if (this.#saidRefused(err, delay)) continue;
        this.#log.warn(`cannot list ${plural}; retrying`, {
          error: err.message,
          retryInMs: Math.round(delay),
          attempt: backoff.attempt,
        });
      }
    }
    this.#state = 'stopped';
  }

  /** When `e` is the refusal of the query itself: says so, with the query, and true. */
  #saidRefused(e: ApiError, delay: number): boolean {
    if (this.#queryRefusal === '' || refusalOf(e) !== this.#queryRefusal) return false;
    this.#log.error(
      `the API server refuses this ${this.#r.singular} query, however it is read: ${this.#r.queryHint}; retrying`,
      {
        fieldSelector: this.#o.query.fieldSelector,
        labelSelector: this.#o.query.labelSelector,
        error: e.message,
        retryInMs: Math.round(delay),
      },
    );
    return true;
  }

  /** What is kept of an object read. */
  #kept(o: T): T {
    return this.#r.slim ? this.#r.slim(o) : o;
  }

  /**
   * One full list (all pages); replaces the cache. From the watch cache (no limit: the cache
   * ignores it) unless --orch-list-mode=consistent or the server refused that: resourceVersion=0
   * (any age) the first time; after that not older than the last resourceVersion seen, as the
   * reflector relists: a cache behind (another API server's) would take the agent back in time.
   */
  async #list(): Promise<string> {
    const seen = new Map<string, T>();
    const last = this.#resourceVersion;
    const params =
      this.#listMode === 'consistent'
        ? { limit: this.#o.pageSize }
        : last === ''
          ? { resourceVersion: '0' }
          : { resourceVersion: last, resourceVersionMatch: 'NotOlderThan' as const };
    let continueToken: string | undefined;
    let rv: string;
    do {
      const signal = AbortSignal.any([this.#stop.signal, AbortSignal.timeout(this.#o.requestTimeoutMs)]);
      const query = { ...this.#o.query, ...params, ...(continueToken ? { continueToken } : {}) };
      this.#reached('first_request');
      const page = await this.#api.list(this.#r.plural, query, signal);
      this.#reached('first_response');
      for (const o of page.items as T[]) seen.set(this.#r.key(o), this.#kept(o));
      continueToken = page.continueToken;
      rv = page.resourceVersion;
    } while (continueToken);
    this.#replace(seen, rv);
    this.#log.debug(`listed ${this.#r.plural}`, { count: seen.size, resourceVersion: rv, mode: this.#listMode });
    return rv;
  }

  /**
   * Each reader hears the change. One that throws (a bug, or an object it cannot take) is logged
   * and never stops the others or the watch: a throw here failed the list for ever (the watch never
   * current) or, inside a watch event, escaped the stream's listener and ended the agent.
   */
  #tell(readers: readonly Handler<T>[], what: 'upsert' | 'remove', o: T, old: T | undefined): void {
    const { singular } = this.#r;
    for (const h of readers) {
      try {
        if (what === 'upsert') h.upsert(o, old);
        else h.remove(o);
      } catch (e) {
        this.#log.error(
          `a reader of the ${singular} watch failed on a ${singular}; the watch and the other readers go on`,
          {
            [singular]: this.#r.key(o),
            event: what,
            error: e instanceof Error ? e.message : String(e),
          },
        );
      }
    }
  }

  /** Into the cache, and every reader hears it. */
  #put(k: string, o: T): void {
    const old = this.#cache.get(k);
    this.#cache.set(k, o);
    this.#tell(this.#handlers, 'upsert', o, old);
  }

  /** The state read (a list, or a watch-list's initial events) replaces the cache; readers hear what changed. */
  #replace(seen: Map<string, T>, rv: string): void {
    this.#lists++;
    for (const [k, old] of this.#cache) {
      if (!seen.has(k)) {
        this.#cache.delete(k);
        this.#tell(this.#handlers, 'remove', old, undefined);
      }
    }
    for (const [k, o] of seen) this.#put(k, o);
    for (const h of this.#handlers) h.cacheSize?.(this.#cache.size);
    this.#resourceVersion = rv;
    // Read: the way of reading stands, and the query is taken.
    this.#fellBackOn?.say();
    this.#fellBackOn = undefined;
    this.#queryRefusal = '';
    this.#reached('initial_list');
    this.#synced();
  }

  /**
   * One watch from `rv` until it ends for whatever reason. `initial`: the streaming watch-list
   * (sendInitialEvents): the state comes first, into a map of its own, and replaces the cache at
   * the bookmark annotated k8s.io/initial-events-end; only then is the watch current.
   */
  #watch(rv: string, initial: boolean): Promise<WatchEnd> {
    const { plural, singular } = this.#r;
    const what = initial ? `watching ${plural} (watch-list)` : `watching ${plural}`;
    return new Promise<WatchEnd>((resolve) => {
      const started = this.#o.clock.now();
      // Jitter the server-side timeout so agents restarted together do not re-watch together.
      const timeoutSeconds = Math.round(this.#o.watchTimeoutSeconds * (1 + this.#random()));
      let pending: Map<string, T> | null = initial ? new Map() : null;
      let delivered = false;
      let finished = false;
      let controller: AbortController | undefined;
      // Given up on before it opened (the watchdog, stop): the wait and the request are cancelled,
      // not left hanging on a server that stalls (one more each silence timeout).
      const opening = new AbortController();
      let watchdog: NodeJS.Timeout | undefined;
      const finish = (reason: WatchEnd['reason'], error?: ApiError) => {
        if (finished) return;
        finished = true;
        clearTimeout(watchdog);
        this.#stop.signal.removeEventListener('abort', onStop);
        opening.abort();
        controller?.abort();
        const lived = this.#o.clock.now() - started;
        const healthy = delivered || lived >= this.#o.healthyAfterMs;
        const timedOut = reason === 'closed' && lived >= timeoutSeconds * 1000 - 1000;
        resolve({ reason, healthy, synced: pending === null, timedOut, ...(error ? { error } : {}) });
      };
      const arm = () => {
        // Restarted on every event: the same timer, pushed back.
        if (watchdog) watchdog.refresh();
        else {
          const why = `no event or bookmark for ${this.#o.silenceTimeoutMs} ms`;
          const silent = () => finish('silent', new ApiError(what, undefined, why));
          watchdog = setTimeout(silent, this.#o.silenceTimeoutMs);
        }
      };
      const onStop = () => finish('stopped');
      this.#stop.signal.addEventListener('abort', onStop, { once: true });
      arm();
      const onEvent = (type: WatchEventType, obj: unknown) => {
        if (finished) return;
        arm();
        this.#reached('first_response');
        if (type === 'ERROR') {
          const status = obj as { code?: number; message?: string; reason?: string };
          const err = new ApiError(what, status.code ?? 500, statusText(status));
          finish(status.code === 410 ? 'expired' : 'error', err);
          return;
        }
        const full = obj as T;
        const objRv = full.metadata?.resourceVersion;
        if (pending) {
          // The initial events: the state as of the closing bookmark, not yet the cache.
          if (type === 'BOOKMARK') {
            if (full.metadata?.annotations?.[INITIAL_EVENTS_END] !== 'true') {
              const why =
                `a bookmark came before the initial events ended (no ${INITIAL_EVENTS_END}): ` +
                'the server ignores sendInitialEvents';
              finish('unsupported', new ApiError(what, undefined, why));
              return;
            }
            const state = pending;
            pending = null;
            delivered = true;
            this.#replace(state, objRv ?? '');
            this.#state = 'watching';
            this.#log.debug(`${singular} watch-list synced`, { count: state.size, resourceVersion: objRv ?? '' });
          } else if (type === 'DELETED') {
            pending.delete(this.#r.key(full));
          } else {
            pending.set(this.#r.key(full), this.#kept(full));
          }
          return;
        }
        if (objRv) this.#resourceVersion = objRv;
        if (type === 'BOOKMARK') return;
        delivered = true;
        const o = this.#kept(full);
        const k = this.#r.key(o);
        if (type === 'DELETED') {
          this.#cache.delete(k);
          this.#tell(this.#handlers, 'remove', o, undefined);
        } else {
          this.#put(k, o);
        }
        for (const h of this.#handlers) h.cacheSize?.(this.#cache.size);
      };
      const done = (err: unknown) => {
        if (finished) return;
        if (err) {
          const e = toApiError(what, err);
          const unsupported = pending && refusesParameters(e) && refusalOf(e) !== this.#queryRefusal;
          finish(e.code === 410 ? 'expired' : unsupported ? 'unsupported' : 'error', e);
        } else if (pending) {
          // A server that streams the watch-list ends its initial events with the bookmark first.
          const why = `the stream ended before the initial events did (no ${INITIAL_EVENTS_END} bookmark)`;
          finish('unsupported', new ApiError(what, undefined, why));
        } else {
          finish('closed');
        }
      };
      this.#reached('first_request');
      const q = {
        ...this.#o.query,
        resourceVersion: rv,
        timeoutSeconds,
        ...(initial ? { sendInitialEvents: true } : {}),
      };
      this.#api
        .watch(plural, q, onEvent, done, opening.signal)
        .then((c) => {
          controller = c;
          // Opened after we gave up on it (watchdog or stop): close it at once.
          if (finished) return c.abort();
          this.#reached('first_response');
          // Open: the cache follows the cluster again.
          this.#failingSince = undefined;
          this.#failures = 0;
        })
        .catch(done);
    });
  }
}

// List-then-watch of the cluster's namespaces, for their labels: ambient mode selects pods by
// their namespace's labels too (--ambient-enablement-selector), and a relabel re-checks the
// namespace's pods. Small beside the pod watch (podsource.ts), with the same failure handling:
// 410 Gone -> list again; a closed watch -> watch again from its last resourceVersion; errors ->
// full-jitter backoff, never a silent stop; a watch silent for too long is restarted. The list
// comes from the API server's watch cache (resourceVersion=0; a relist NotOlderThan what was seen);
// requests wait on the agent's rate limit (request.ts). Namespaces are few and change rarely: no
// watch-list, no pages. Timing and readiness: see #run and notReadyReasons.

import type { V1Namespace } from '@kubernetes/client-node';
import { scope } from '../monitoring/logging.ts';
import { watchReached, type StartupWatch, type WatchStage } from '../monitoring/startup.ts';
import type { OrchApi, WatchEventType, WatchTuning } from './api.ts';
import { ApiError, statusText, toApiError } from './errors.ts';
import { Backoff, realClock, type Clock } from './limits.ts';
import { FLEET_DEFAULTS, WATCH_BACKOFF } from './informer.ts';

const log = scope('ambient');

export interface NamespaceHandler {
  /** Added or changed; `old` is the namespace as cached before (undefined: new to the cache). */
  upsert(ns: V1Namespace, old: V1Namespace | undefined): void;
  remove(ns: V1Namespace): void;
}

export interface NamespaceSourceOptions {
  readonly clock: Clock;
  readonly backoff: { readonly baseMs: number; readonly maxMs: number };
  readonly requestTimeoutMs: number;
  readonly watchTimeoutSeconds: number;
  readonly silenceTimeoutMs: number;
  readonly random: () => number;
  /** A list or watch failing this long (none open since) makes ambient mode not ready. */
  readonly notReadyAfterMs: number;
  /** The re-watch spread and start jitter: else the API's tuning, else FLEET_DEFAULTS (podsource.ts). */
  readonly tuning?: Partial<Pick<WatchTuning, 'reconnectSpreadMs' | 'startJitterMs'>>;
  /** Its name in mesh_cni_startup_duration_seconds{watch}; none: its start-up is not recorded. */
  readonly startupName?: StartupWatch;
}

export const NAMESPACE_WATCH_DEFAULTS: NamespaceSourceOptions = {
  clock: realClock,
  backoff: { baseMs: 1000, maxMs: 30_000 },
  requestTimeoutMs: 30_000,
  watchTimeoutSeconds: 300,
  silenceTimeoutMs: 120_000,
  random: Math.random,
  notReadyAfterMs: 30_000,
  startupName: 'namespaces',
};

/**
 * What is kept of a namespace: every node caches every namespace of the cluster, and whole objects
 * (managedFields, last-applied annotations) cost ~1.5 KB of heap each against ~0.3 KB for this.
 */
function slim(ns: V1Namespace): V1Namespace {
  const m = ns.metadata ?? {};
  return {
    metadata: {
      name: m.name ?? '',
      uid: m.uid ?? '',
      resourceVersion: m.resourceVersion ?? '',
      labels: m.labels ?? {},
    },
  };
}

/** A watch that lived this long counts as working (as the pod watch's healthyAfterMs). */
const HEALTHY_AFTER_MS = 10_000;

type End = {
  readonly reason: 'closed' | 'expired' | 'error' | 'stopped';
  readonly delivered: boolean;
  /** Lived 10 s or delivered something: a cut of a working watch, not a failing one. */
  readonly healthy: boolean;
  /** Closed by the server at the timeoutSeconds asked for. */
  readonly timedOut: boolean;
  error?: ApiError;
};

export class NamespaceSource {
  readonly #api: OrchApi;
  readonly #o: NamespaceSourceOptions;
  readonly #cache = new Map<string, V1Namespace>();
  readonly #handlers: NamespaceHandler[] = [];
  readonly #stop = new AbortController();
  #loop: Promise<void> | undefined;
  #rv = '';
  /** The newest resourceVersion seen (kept across a 410): a relist is never older than it. */
  #seenRv = '';
  #lists = 0;
  #restarts = 0;
  #lastError = '';
  /** Since when (clock ms) lists and watches fail with no watch opened; undefined: not failing. */
  #failingSince: number | undefined;
  #failures = 0;
  #state: 'starting' | 'listing' | 'watching' | 'backoff' | 'stopped' = 'starting';
  #synced!: () => void;
  /** Resolves after the first complete list. */
  readonly synced = new Promise<void>((r) => (this.#synced = r));

  constructor(api: OrchApi, o: Partial<NamespaceSourceOptions> = {}) {
    this.#api = api;
    this.#o = { ...NAMESPACE_WATCH_DEFAULTS, ...o };
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#stop.abort(new Error('namespace watch stopping'));
    await this.#loop;
    this.#state = 'stopped';
  }

  /** Another reader; it hears the cached namespaces first. */
  addHandler(h: NamespaceHandler): void {
    this.#handlers.push(h);
    for (const ns of this.#cache.values()) this.#tell('upsert', ns, undefined, [h]);
  }

  /** The namespace's labels; undefined while it is not known. */
  labels(name: string): Readonly<Record<string, string>> | undefined {
    const ns = this.#cache.get(name);
    return ns ? (ns.metadata?.labels ?? {}) : undefined;
  }

  /**
   * Why ambient mode is not ready: the namespace reads failing for notReadyAfterMs, no watch open
   * since (a 403 on watch with list allowed kept the cache at its list, and /readyz said nothing).
   */
  notReadyReasons(): string[] {
    if (this.#failingSince === undefined) return [];
    if (this.#o.clock.now() - this.#failingSince < this.#o.notReadyAfterMs) return [];
    return [
      `ambient: the namespace watch is failing (${this.#failures} attempt(s)): ${this.#lastError}; ` +
        'the namespace labels pods are selected by may be stale: check that the agent may reach the API server ' +
        'and that its ClusterRole grants namespaces list and watch (deploy/overlays/ambient)',
    ];
  }

  status() {
    return {
      state: this.#state,
      resourceVersion: this.#rv,
      cachedNamespaces: this.#cache.size,
      lists: this.#lists,
      watchRestarts: this.#restarts,
      lastError: this.#lastError,
      failing: this.#failingSince !== undefined,
    };
  }

  #tell(what: 'upsert' | 'remove', ns: V1Namespace, old?: V1Namespace, to = this.#handlers): void {
    for (const h of to) {
      try {
        if (what === 'upsert') h.upsert(ns, old);
        else h.remove(ns);
      } catch (e) {
        log.error('a reader of the namespace watch failed; the watch goes on', {
          namespace: ns.metadata?.name,
          error: e instanceof Error ? e.message : String(e),
        });
      }
    }
  }

  async #run(): Promise<void> {
    const backoff = new Backoff({ ...this.#o.backoff, ...WATCH_BACKOFF, random: this.#o.random });
    // As the pod watch (docs/design.md "Fleet scale"): every node watches every namespace, so a fleet
    // started or cut together (an API server restart) must not come back in the same instant.
    const { reconnectSpreadMs, startJitterMs } = { ...FLEET_DEFAULTS, ...this.#api.tuning, ...this.#o.tuning };
    let delay = this.#o.random() * startJitterMs;
    while (!this.#stop.signal.aborted) {
      if (delay > 0) {
        this.#state = 'backoff';
        await this.#o.clock.sleep(delay, this.#stop.signal).catch(() => {});
        if (this.#stop.signal.aborted) break;
      }
      try {
        if (this.#rv === '') {
          this.#state = 'listing';
          await this.#list();
        }
        this.#state = 'watching';
        const end = await this.#watch();
        if (end.reason === 'stopped') break;
        if (end.reason === 'expired') this.#rv = '';
        if (end.healthy) backoff.reset();
        this.#restarts++;
        // Its own timeout (already 5-10 min at random): at once. A working watch cut early:
        // anywhere in the spread. Failing: exponential backoff with full jitter.
        const cut = !end.timedOut && end.healthy && reconnectSpreadMs > 0;
        delay = end.timedOut
          ? 0
          : cut
            ? Math.max(backoff.retryAfter(end.error?.retryAfterMs), this.#o.random() * reconnectSpreadMs)
            : end.reason === 'closed'
              ? 0
              : backoff.next(end.error?.retryAfterMs);
        if (end.error) {
          this.#failed(end.error.message);
          log.warn('namespace watch ended; watching again', {
            reason: end.reason,
            relist: this.#rv === '',
            retryInMs: Math.round(delay),
            error: end.error.message,
          });
        }
      } catch (e) {
        if (this.#stop.signal.aborted) break;
        const err = toApiError('listing namespaces', e);
        if (err.code === 410) this.#rv = '';
        this.#failed(err.message);
        delay = backoff.next(err.retryAfterMs);
        log.warn('cannot list namespaces; retrying', { error: err.message, retryInMs: Math.round(delay) });
      }
    }
    this.#state = 'stopped';
  }

  #failed(error: string): void {
    this.#lastError = error;
    this.#failures++;
    this.#failingSince ??= this.#o.clock.now();
  }

  async #list(): Promise<void> {
    const signal = AbortSignal.any([this.#stop.signal, AbortSignal.timeout(this.#o.requestTimeoutMs)]);
    // After a 410, not any age: an API server whose cache lags (behind a load balancer) could
    // hand back labels older than those seen, and the informer would undo a relabel for a while.
    this.#reached('first_request');
    const since = this.#seenRv
      ? { resourceVersion: this.#seenRv, resourceVersionMatch: 'NotOlderThan' as const }
      : null;
    const list = await this.#api.list('namespaces', since ?? { resourceVersion: '0' }, signal);
    this.#reached('first_response');
    const seen = new Map((list.items as V1Namespace[]).map((ns) => [ns.metadata?.name ?? '', slim(ns)] as const));
    for (const [name, old] of this.#cache) {
      if (!seen.has(name)) {
        this.#cache.delete(name);
        this.#tell('remove', old);
      }
    }
    for (const [name, ns] of seen) {
      const old = this.#cache.get(name);
      this.#cache.set(name, ns);
      this.#tell('upsert', ns, old);
    }
    this.#rv = list.resourceVersion;
    if (list.resourceVersion) this.#seenRv = list.resourceVersion;
    this.#lists++;
    this.#reached('initial_list');
    this.#synced();
  }

  #reached(stage: WatchStage): void {
    if (this.#o.startupName) watchReached(this.#o.startupName, stage);
  }

  #watch(): Promise<End> {
    return new Promise<End>((resolve) => {
      let finished = false;
      let delivered = false;
      const opened = this.#o.clock.now();
      const timeoutSeconds = Math.round(this.#o.watchTimeoutSeconds * (1 + this.#o.random()));
      let controller: AbortController | undefined;
      const opening = new AbortController();
      const finish = (reason: End['reason'], error?: ApiError) => {
        if (finished) return;
        finished = true;
        clearTimeout(silence);
        this.#stop.signal.removeEventListener('abort', onStop);
        opening.abort();
        controller?.abort();
        const lived = this.#o.clock.now() - opened;
        const healthy = delivered || lived >= HEALTHY_AFTER_MS;
        const timedOut = reason === 'closed' && lived >= timeoutSeconds * 1000 - 1000;
        resolve({ reason, delivered, healthy, timedOut, ...(error ? { error } : {}) });
      };
      const onStop = () => finish('stopped');
      this.#stop.signal.addEventListener('abort', onStop, { once: true });
      const why = `no event or bookmark for ${this.#o.silenceTimeoutMs} ms`;
      const silence = setTimeout(
        () => finish('error', new ApiError('watching namespaces', undefined, why)),
        this.#o.silenceTimeoutMs,
      );
      const onEvent = (type: WatchEventType, obj: unknown) => {
        if (finished) return;
        silence.refresh();
        if (type === 'ERROR') {
          const st = obj as { code?: number; message?: string; reason?: string };
          const err = new ApiError('watching namespaces', st.code ?? 500, statusText(st));
          finish(st.code === 410 ? 'expired' : 'error', err);
          return;
        }
        const full = obj as V1Namespace;
        if (full.metadata?.resourceVersion) this.#rv = this.#seenRv = full.metadata.resourceVersion;
        if (type === 'BOOKMARK') return;
        const ns = slim(full);
        delivered = true;
        const name = ns.metadata?.name ?? '';
        if (type === 'DELETED') {
          this.#cache.delete(name);
          this.#tell('remove', ns);
        } else {
          const old = this.#cache.get(name);
          this.#cache.set(name, ns);
          this.#tell('upsert', ns, old);
        }
      };
      const done = (err: unknown) => {
        if (!err) return finish('closed');
        const e = toApiError('watching namespaces', err);
        finish(e.code === 410 ? 'expired' : 'error', e);
      };
      this.#reached('first_request');
      this.#api
        .watch('namespaces', { resourceVersion: this.#rv, timeoutSeconds }, onEvent, done, opening.signal)
        .then((c) => {
          controller = c;
          if (finished) return c.abort();
          // Open: the labels follow the cluster again.
          this.#failingSince = undefined;
          this.#failures = 0;
        })
        .catch(done);
    });
  }
}

// The wire: @kubernetes/client-node's CoreV1Api and Watch, wrapped so every call has a deadline,
// can be cancelled on stop, and fails with one error type that says how to retry.

import {
  CoreV1Api,
  Observable,
  PatchStrategy,
  Watch,
  setHeaderOptions,
  type CoreV1Event,
  type KubeConfig,
  type ObservableMiddleware,
  type RequestContext,
  type ResponseContext,
  type V1Pod,
} from '@kubernetes/client-node';

export type FailureReason = 'throttled' | 'server_error' | 'client_error' | 'unreachable';

export class ApiError extends Error {
  /** HTTP status, or undefined when no answer came (refused, reset, timed out). */
  readonly code: number | undefined;
  readonly retryAfterMs: number | undefined;
  readonly reason: FailureReason;
  constructor(what: string, code: number | undefined, detail: string, retryAfterMs?: number) {
    super(`${what}: ${code === undefined ? detail : `HTTP ${code}${detail ? ` ${detail}` : ''}`}`);
    this.name = 'ApiError';
    this.code = code;
    this.retryAfterMs = retryAfterMs;
    this.reason = code === undefined ? 'unreachable' : code === 429 ? 'throttled' : code >= 500 ? 'server_error' : 'client_error';
  }
}

/** Seconds (or an HTTP date) in Retry-After, as milliseconds. */
export function parseRetryAfter(value: unknown): number | undefined {
  if (typeof value !== 'string' || value.trim() === '') return undefined;
  const s = Number(value);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const t = Date.parse(value);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

/** Turns whatever client-node threw into an ApiError. */
export function toApiError(what: string, e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  const err = e as { code?: unknown; statusCode?: unknown; body?: unknown; headers?: Record<string, unknown>; message?: string; name?: string };
  const code = typeof err.code === 'number' ? err.code : typeof err.statusCode === 'number' ? err.statusCode : undefined;
  if (code !== undefined) {
    let message: string;
    try {
      const status = (typeof err.body === 'string' ? JSON.parse(err.body) : err.body) as { message?: string; reason?: string } | undefined;
      message = [status?.reason, status?.message].filter(Boolean).join(': ');
    } catch {
      message = '';
    }
    return new ApiError(what, code, message, parseRetryAfter(err.headers?.['retry-after']));
  }
  const detail = err.name === 'AbortError' || err.name === 'TimeoutError' ? 'no answer in time (aborted)' : (err.message ?? String(e));
  return new ApiError(what, undefined, detail);
}

export interface PodList {
  readonly items: V1Pod[];
  readonly resourceVersion: string;
  readonly continueToken: string | undefined;
}

export interface PodQuery {
  readonly fieldSelector: string;
  readonly labelSelector: string;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface OrchApi {
  listPods(q: PodQuery & { limit: number; continueToken?: string }, signal: AbortSignal): Promise<PodList>;
  /** Starts a watch; resolves once the stream is open (or failed: then `done` was called too). */
  watchPods(
    q: PodQuery & { resourceVersion: string; timeoutSeconds: number },
    onEvent: (type: WatchEventType, object: unknown) => void,
    done: (err: unknown) => void,
  ): Promise<AbortController>;
  labelPod(pod: V1Pod, key: string, value: string, signal: AbortSignal): Promise<void>;
  deletePod(pod: V1Pod, signal: AbortSignal): Promise<void>;
  createEvent(namespace: string, event: CoreV1Event, signal: AbortSignal): Promise<void>;
}

/** Per-call options that put our deadline/cancel signal on the request (client-node has no timeout of its own). */
function withSignal(signal: AbortSignal, opts?: ReturnType<typeof setHeaderOptions>) {
  const middleware: ObservableMiddleware = {
    pre: (ctx: RequestContext) => {
      ctx.setSignal(signal);
      return new Observable(Promise.resolve(ctx));
    },
    post: (r: ResponseContext) => new Observable(Promise.resolve(r)),
  };
  return { ...opts, middleware: [...(opts?.middleware ?? []), middleware], middlewareMergeStrategy: 'append' as const };
}

export function clientNodeApi(kc: KubeConfig): OrchApi {
  const core = kc.makeApiClient(CoreV1Api);
  const watch = new Watch(kc);
  const name = (p: V1Pod) => `pod ${p.metadata?.namespace}/${p.metadata?.name}`;
  return {
    async listPods(q, signal) {
      try {
        const list = await core.listPodForAllNamespaces(
          { fieldSelector: q.fieldSelector || undefined, labelSelector: q.labelSelector || undefined, limit: q.limit, _continue: q.continueToken },
          withSignal(signal),
        );
        return { items: list.items, resourceVersion: list.metadata?.resourceVersion ?? '', continueToken: list.metadata?._continue || undefined };
      } catch (e) {
        throw toApiError('listing pods', e);
      }
    },
    watchPods(q, onEvent, done) {
      return watch.watch(
        '/api/v1/pods',
        {
          fieldSelector: q.fieldSelector || undefined,
          labelSelector: q.labelSelector || undefined,
          resourceVersion: q.resourceVersion,
          allowWatchBookmarks: true,
          timeoutSeconds: q.timeoutSeconds,
        },
        (type: string, obj: unknown) => onEvent(type as WatchEventType, obj),
        done,
      );
    },
    async labelPod(pod, key, value, signal) {
      try {
        // The uid in the patch is a precondition: a new pod that took the name is never labelled.
        await core.patchNamespacedPod(
          { name: pod.metadata!.name!, namespace: pod.metadata!.namespace!, body: { metadata: { uid: pod.metadata!.uid, labels: { [key]: value } } } },
          withSignal(signal, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)),
        );
      } catch (e) {
        throw toApiError(`labelling ${name(pod)}`, e);
      }
    },
    async deletePod(pod, signal) {
      try {
        await core.deleteNamespacedPod(
          { name: pod.metadata!.name!, namespace: pod.metadata!.namespace!, body: { preconditions: { uid: pod.metadata!.uid } } },
          withSignal(signal),
        );
      } catch (e) {
        throw toApiError(`deleting ${name(pod)}`, e);
      }
    },
    async createEvent(namespace, event, signal) {
      try {
        await core.createNamespacedEvent({ namespace, body: event }, withSignal(signal));
      } catch (e) {
        throw toApiError(`recording an event in namespace ${namespace}`, e);
      }
    },
  };
}

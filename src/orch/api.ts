// The wire, wrapped so every call has a deadline, can be cancelled on stop, and fails with one
// error type that says how to retry. @kubernetes/client-node gives the connection: its
// KubeConfig (orchconfig or in-cluster service account, token re-read as it rotates, CA, client
// certificates) applied to each request, and its Watch for the event streams. The few calls the
// agent makes are plain JSON requests here: client-node's generated API classes and models cost
// ~25 MB of resident memory on every node for five calls (scripts/slim-client-node.ts).

import http from 'node:http';
import https from 'node:https';
import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { Watch } from '@kubernetes/client-node/dist/watch.js';

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

export interface RequestOptions {
  readonly query?: Readonly<Record<string, string | number | boolean | undefined>>;
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
}

/** The message of a Kubernetes Status body ("reason: message"), or ''. */
function statusMessage(body: string): string {
  try {
    const status = JSON.parse(body) as { message?: unknown; reason?: unknown };
    return [status.reason, status.message].filter((x) => typeof x === 'string' && x !== '').join(': ');
  } catch {
    return '';
  }
}

const keepAliveAgents = new WeakMap<KubeConfig, { readonly tls: string; readonly agent: https.Agent }>();

/**
 * client-node makes a new agent, so a new TLS connection, for every request: a thousand repairs
 * would be a thousand handshakes with the API server. A plain HTTPS agent is swapped for one
 * keep-alive agent per KubeConfig, made again only when the TLS material changes (a rotated CA or
 * client certificate). Proxy agents are used as client-node made them.
 */
function keptAlive(kc: KubeConfig, made: https.RequestOptions['agent']): https.RequestOptions['agent'] {
  if (!made || made.constructor !== https.Agent) return made;
  const o = (made as https.Agent).options;
  const tls = JSON.stringify([o.ca, o.cert, o.key, o.pfx, o.passphrase, o.rejectUnauthorized, o.servername].map((v) => (v === undefined ? null : String(v))));
  const kept = keepAliveAgents.get(kc);
  if (kept?.tls === tls) return kept.agent;
  const agent = new https.Agent({ ...o, keepAlive: true });
  keepAliveAgents.set(kc, { tls, agent });
  if (kept) retire(kept.agent);
  return agent;
}

/** Closes an agent's idle connections now and the busy ones when their request is done. */
function retire(agent: https.Agent): void {
  agent.maxFreeSockets = 0;
  for (const sockets of Object.values(agent.freeSockets)) for (const s of sockets ?? []) s.destroy();
}

/**
 * One API call with the orchconfig's server, auth and TLS (client-node's applyToHTTPSOptions):
 * JSON in and out. Any failure is an ApiError: the HTTP status with the Status message and
 * Retry-After, or no status when no answer came.
 */
export async function apiRequest<T>(kc: KubeConfig, method: string, apiPath: string, what: string, o: RequestOptions = {}): Promise<T> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ApiError(what, undefined, 'the orchconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + apiPath);
  for (const [k, v] of Object.entries(o.query ?? {})) if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
  const body = o.body === undefined ? undefined : JSON.stringify(o.body);
  const opts: https.RequestOptions = { method, headers: { Accept: 'application/json' } };
  try {
    await kc.applyToHTTPSOptions(opts);
  } catch (e) {
    throw new ApiError(what, undefined, `cannot authenticate: ${(e as Error).message}`);
  }
  opts.agent = keptAlive(kc, opts.agent);
  // Content-Length always: Node sends a DELETE body neither chunked nor sized otherwise.
  if (body !== undefined) opts.headers = { ...opts.headers, 'Content-Type': o.contentType ?? 'application/json', 'Content-Length': Buffer.byteLength(body) };
  if (o.signal) opts.signal = o.signal;
  const send = url.protocol === 'http:' ? http.request : https.request;
  return new Promise<T>((resolve, reject) => {
    const req = send(url, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', (e) => reject(new ApiError(what, undefined, e.message)));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        const code = res.statusCode ?? 0;
        if (code < 200 || code > 299) {
          reject(new ApiError(what, code, statusMessage(text), parseRetryAfter(res.headers['retry-after'])));
          return;
        }
        try {
          resolve((text === '' ? undefined : JSON.parse(text)) as T);
        } catch (e) {
          reject(new ApiError(what, undefined, `answer is not JSON: ${(e as Error).message}`));
        }
      });
    });
    req.on('error', (e) => reject(new ApiError(what, undefined, e.name === 'AbortError' ? 'no answer in time (aborted)' : e.message)));
    req.end(body);
  });
}

const podPath = (p: V1Pod) => `/api/v1/namespaces/${encodeURIComponent(p.metadata!.namespace!)}/pods/${encodeURIComponent(p.metadata!.name!)}`;

let urlParseQuiet = false;

/**
 * node-fetch 2, under client-node's Watch, parses every URL with url.parse, which Node 24 reports
 * (DEP0169) on stderr at the agent's first watch: noise no operator can act on. Only that one
 * warning is dropped.
 */
function quietUrlParseDeprecation(): void {
  if (urlParseQuiet) return;
  urlParseQuiet = true;
  const emit = process.emitWarning.bind(process);
  process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
    const code = typeof rest[0] === 'object' && rest[0] !== null ? (rest[0] as { code?: unknown }).code : rest[1];
    if (code === 'DEP0169') return;
    (emit as (w: string | Error, ...r: unknown[]) => void)(warning, ...rest);
  }) as typeof process.emitWarning;
}

export function clientNodeApi(kc: KubeConfig): OrchApi {
  quietUrlParseDeprecation();
  const watch = new Watch(kc);
  const name = (p: V1Pod) => `pod ${p.metadata?.namespace}/${p.metadata?.name}`;
  return {
    async listPods(q, signal) {
      const list = await apiRequest<{ items?: V1Pod[]; metadata?: { resourceVersion?: string; continue?: string } }>(kc, 'GET', '/api/v1/pods', 'listing pods', {
        query: { fieldSelector: q.fieldSelector, labelSelector: q.labelSelector, limit: q.limit, continue: q.continueToken },
        signal,
      });
      return { items: list.items ?? [], resourceVersion: list.metadata?.resourceVersion ?? '', continueToken: list.metadata?.continue || undefined };
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
      // The uid in the patch is a precondition: a new pod that took the name is never labelled.
      await apiRequest(kc, 'PATCH', podPath(pod), `labelling ${name(pod)}`, {
        body: { metadata: { uid: pod.metadata!.uid, labels: { [key]: value } } },
        contentType: 'application/merge-patch+json',
        signal,
      });
    },
    async deletePod(pod, signal) {
      await apiRequest(kc, 'DELETE', podPath(pod), `deleting ${name(pod)}`, { body: { preconditions: { uid: pod.metadata!.uid } }, signal });
    },
    async createEvent(namespace, event: CoreV1Event, signal) {
      await apiRequest(kc, 'POST', `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`, `recording an event in namespace ${namespace}`, { body: event, signal });
    },
  };
}

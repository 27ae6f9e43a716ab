// One API call with the orchconfig's server, auth and TLS, taken from client-node's KubeConfig:
// JSON in and out, over keep-alive connections, failing with an ApiError.

import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { statusMessage } from '../../cni-plugin/shared/apistatus.ts';
import { ApiError, parseRetryAfter } from './errors.ts';
import type { RequestLimiter } from './ratelimit.ts';
import { logApiCall, logWatchEvent } from './requestlog.ts';

/** A call's query: a value that is undefined or empty is left out. */
export type Query = Readonly<Record<string, string | number | boolean | undefined>>;

export interface RequestOptions {
  readonly query?: Query;
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
  /**
   * The agent's rate limit (--orch-qps/--orch-burst) this request waits on; none: sent at once
   * (repair actions, which --repair-qps limits already; the node's own status).
   */
  readonly limiter?: RequestLimiter;
}

/** Retry-After counts on 429 and 503 only (what the API server's priority and fairness sends). */
function retryAfter(code: number, header: string | string[] | undefined): number | undefined {
  return code === 429 || code === 503 ? parseRetryAfter(header) : undefined;
}

/**
 * Why an answer is not JSON, by kind and place only: V8's message quotes the text, which may be
 * a token (a TokenRequest answer cut short), and this error reaches /readyz.
 */
function notJson(e: unknown, text: string): string {
  const message = e instanceof Error ? e.message : '';
  const kind = /^Unexpected end of JSON input/.test(message)
    ? 'it ends too early'
    : /^Unterminated string/.test(message)
      ? 'a string never ends'
      : /^Unexpected non-whitespace character after JSON/.test(message)
        ? 'more follows the value'
        : 'unexpected character';
  const pos = /at position (\d+)/.exec(message);
  const where = pos ? ` at character ${pos[1]}` : '';
  return `answer is not JSON (${kind}${where}; ${Buffer.byteLength(text)} bytes)`;
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
  const tls = JSON.stringify(
    [o.ca, o.cert, o.key, o.pfx, o.passphrase, o.rejectUnauthorized, o.servername].map((v) =>
      v === undefined ? null : String(v),
    ),
  );
  const kept = keepAliveAgents.get(kc);
  if (kept?.tls === tls) return kept.agent;
  // Idle connections close after 30 s, before the API server's or a load balancer's idle
  // timeout (60-90 s) could leave a dead one for the next request.
  const agent = new https.Agent({ ...o, keepAlive: true, timeout: 30_000 });
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
export async function apiRequest<T>(
  kc: KubeConfig,
  method: string,
  apiPath: string,
  what: string,
  o: RequestOptions = {},
): Promise<T> {
  const body = o.body === undefined ? undefined : JSON.stringify(o.body);
  const { url, opts, send } = await prepareCall(kc, method, apiPath, what, o.query ?? {}, o.signal, o.limiter);
  // Content-Length always: Node sends a DELETE body neither chunked nor sized otherwise.
  if (body !== undefined)
    opts.headers = {
      ...opts.headers,
      'Content-Type': o.contentType ?? 'application/json',
      'Content-Length': Buffer.byteLength(body),
    };
  if (o.signal) opts.signal = o.signal;
  const startedAt = performance.now();
  return new Promise<T>((resolve, reject) => {
    const req = send(url, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', (e) => reject(new ApiError(what, undefined, e.message)));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        const code = res.statusCode ?? 0;
        logApiCall({ method, url, status: code, startedAt, requestBody: body, responseBody: text });
        if (code < 200 || code > 299) {
          reject(new ApiError(what, code, statusMessage(text), retryAfter(code, res.headers['retry-after'])));
          return;
        }
        try {
          resolve((text === '' ? undefined : JSON.parse(text)) as T);
        } catch (e) {
          reject(new ApiError(what, undefined, notJson(e, text)));
        }
      });
    });
    req.on('error', (e) => {
      const err = new ApiError(what, undefined, e.name === 'AbortError' ? 'no answer in time (aborted)' : e.message);
      logApiCall({ method, url, status: undefined, startedAt, requestBody: body, error: err.message });
      reject(err);
    });
    req.end(body);
  });
}

/**
 * Where one call goes and how, once the limiter lets it go: the orchconfig's server with the
 * query (an empty or unset value left out), its auth and TLS (client-node's applyToHTTPSOptions)
 * on the kept-alive agent, and http or https as the server's URL says.
 */
async function prepareCall(
  kc: KubeConfig,
  method: string,
  apiPath: string,
  what: string,
  query: Query,
  signal: AbortSignal | undefined,
  limiter: RequestLimiter | undefined,
): Promise<{ url: URL; opts: https.RequestOptions; send: typeof https.request }> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ApiError(what, undefined, 'the orchconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + apiPath);
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
  await waitTurn(limiter, what, signal);
  const opts: https.RequestOptions = { method, headers: { Accept: 'application/json' } };
  try {
    await kc.applyToHTTPSOptions(opts);
  } catch (e) {
    throw new ApiError(what, undefined, `cannot authenticate: ${(e as Error).message}`);
  }
  opts.agent = keptAlive(kc, opts.agent);
  return { url, opts, send: url.protocol === 'http:' ? http.request : https.request };
}

/** Waits for the agent's rate limit (--orch-qps/--orch-burst), if the request is under one. */
async function waitTurn(limiter: RequestLimiter | undefined, what: string, signal?: AbortSignal): Promise<void> {
  try {
    await limiter?.take(signal);
  } catch {
    throw new ApiError(what, undefined, 'no answer in time (aborted while waiting for the client-side rate limit)');
  }
}

export interface WatchStream {
  /** Ends the stream; `done` is not called after this. */
  abort(): void;
}

const WATCH_EVENT_TYPES: ReadonlySet<unknown> = new Set(['ADDED', 'MODIFIED', 'DELETED', 'BOOKMARK', 'ERROR']);

/** One line of a watch stream as its event, or why it is not one (by kind only: it may hold a secret). */
function watchEvent(line: string): { type: string; object: object } | string {
  let event: unknown;
  try {
    event = JSON.parse(line);
  } catch {
    return 'not JSON';
  }
  const e = event as { type?: unknown; object?: unknown } | null;
  if (typeof e !== 'object' || e === null || Array.isArray(e)) return 'not a JSON object';
  if (!WATCH_EVENT_TYPES.has(e.type)) return 'no known event type';
  if (typeof e.object !== 'object' || e.object === null || Array.isArray(e.object)) return 'no object';
  return e as { type: string; object: object };
}

/** Longest watch event line taken (a pod is a few KiB; a runaway stream is cut, not buffered). */
const MAX_EVENT_BYTES = 16 << 20;

/**
 * A watch: GET with watch=true, one JSON event a line, over the same keep-alive connections and
 * auth as apiRequest, under the same rate limit. Resolves once the server answered 200 (events
 * then go to `onEvent`, and `done` is called once when the stream ends: null for a clean end);
 * rejects with an ApiError (the Status message, Retry-After) when it answered anything else or
 * not at all. Unlike client-node's Watch, an error answer keeps its body: a server that refuses
 * sendInitialEvents says why (docs/design.md "Fleet scale").
 */
export async function apiWatch(
  kc: KubeConfig,
  apiPath: string,
  what: string,
  query: Query,
  onEvent: (event: { type?: unknown; object?: unknown }) => void,
  done: (err: ApiError | null) => void,
  signal?: AbortSignal,
  limiter?: RequestLimiter,
): Promise<WatchStream> {
  const { url, opts, send } = await prepareCall(kc, 'GET', apiPath, what, { watch: true, ...query }, signal, limiter);
  const startedAt = performance.now();
  return new Promise<WatchStream>((resolve, reject) => {
    let ended = false;
    const end = (err: ApiError | null) => {
      if (ended) return;
      ended = true;
      done(err);
    };
    const onAbort = () => req.destroy();
    const req = send(url, opts, (res) => {
      signal?.removeEventListener('abort', onAbort);
      const code = res.statusCode ?? 0;
      if (code !== 200) {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          if ((size += c.length) <= 64 << 10) chunks.push(c);
        });
        res.on('error', (e) => reject(new ApiError(what, undefined, e.message)));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          logApiCall({ method: 'GET', url, status: code, startedAt, responseBody: text });
          reject(new ApiError(what, code, statusMessage(text), retryAfter(code, res.headers['retry-after'])));
        });
        return;
      }
      logApiCall({ method: 'GET', url, status: code, startedAt });
      // A watch is long-lived: the kept-alive agent's idle timeout is for idle connections only.
      res.socket.setTimeout(0);
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line.trim() === '') continue;
          if (ended) break;
          const event = watchEvent(line);
          if (typeof event === 'string') {
            // Skipping it would lose the event it stood for (the next bookmark moves the watch
            // past it): the watch ends, and is resumed from the last event taken (client-go too).
            req.destroy();
            end(
              new ApiError(
                what,
                undefined,
                `a line of the stream is not a watch event (${event}; ` + `${Buffer.byteLength(line)} bytes)`,
              ),
            );
            break;
          }
          logWatchEvent(url, line);
          onEvent(event);
        }
        if (buf.length > MAX_EVENT_BYTES) {
          req.destroy();
          end(new ApiError(what, undefined, `a watch event longer than ${MAX_EVENT_BYTES} bytes`));
        }
      });
      res.on('end', () => end(null));
      res.on('error', (e) => end(new ApiError(what, undefined, e.message)));
      res.on('close', () => end(res.complete ? null : new ApiError(what, undefined, 'the watch stream was cut')));
      resolve({
        abort: () => {
          ended = true;
          req.destroy();
        },
      });
    });
    req.on('error', (e) => {
      const err = new ApiError(what, undefined, e.name === 'AbortError' ? 'no answer in time (aborted)' : e.message);
      logApiCall({ method: 'GET', url, status: undefined, startedAt, error: err.message });
      reject(err);
      end(err);
    });
    // `signal` cancels the wait and the opening, not the stream (abort() does).
    if (signal?.aborted) req.destroy();
    else signal?.addEventListener('abort', onAbort, { once: true });
    req.end();
  });
}

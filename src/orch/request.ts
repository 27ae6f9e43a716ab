// One API call with the orchconfig's server, auth and TLS, taken from client-node's KubeConfig:
// JSON in and out, over keep-alive connections, failing with an ApiError.

import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { ApiError, parseRetryAfter, statusText } from './errors.ts';

export interface RequestOptions {
  readonly query?: Readonly<Record<string, string | number | boolean | undefined>>;
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
}

/** The "reason: message" of a Kubernetes Status body, or ''. */
function statusMessage(body: string): string {
  try {
    return statusText(JSON.parse(body) as { reason?: unknown; message?: unknown });
  } catch {
    return '';
  }
}

/**
 * Why an answer is not JSON, by kind and place only: V8's message quotes the text, which may be
 * a token (a TokenRequest answer cut short), and this error reaches /readyz.
 */
function notJson(e: unknown, text: string): string {
  const message = e instanceof Error ? e.message : '';
  const kind = /^Unexpected end of JSON input/.test(message) ? 'it ends too early'
    : /^Unterminated string/.test(message) ? 'a string never ends'
    : /^Unexpected non-whitespace character after JSON/.test(message) ? 'more follows the value'
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
  const tls = JSON.stringify([o.ca, o.cert, o.key, o.pfx, o.passphrase, o.rejectUnauthorized, o.servername].map((v) => (v === undefined ? null : String(v))));
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
          reject(new ApiError(what, undefined, notJson(e, text)));
        }
      });
    });
    req.on('error', (e) => reject(new ApiError(what, undefined, e.name === 'AbortError' ? 'no answer in time (aborted)' : e.message)));
    req.end(body);
  });
}

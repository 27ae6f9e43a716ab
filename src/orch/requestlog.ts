// --vklog: the agent's API requests in scope klog, as client-go's request logging does at -v.
// request.ts calls it for every request it sends (apiRequest, apiWatch), so every API call of the
// agent is logged here and nowhere else:
//   - v>=4: one line a request: method, path with query, status (0: no answer), latency;
//   - v>=8: the request and response bodies too (a watch: each event), at most MAX_BODY chars.
// Never a credential: no header is logged (the Authorization header holds the bearer token), a
// body that is not JSON is said by its length only (a TokenRequest answer cut short holds the
// token), and in JSON bodies every string under a key naming a token (a TokenRequest answer's
// status.token), password or secret, and every string shaped like a JWT, is replaced.

import { klogV } from '../monitoring/logging.ts';

export const VKLOG_REQUESTS = 4;
export const VKLOG_BODIES = 8;

/** Longest body logged, in characters (client-go cuts at 10240 too, below -v=9). */
const MAX_BODY = 10_240;
const REDACTED = '[redacted]';
const SECRET_KEY = /token|password|passwd|secret|credential|authorization|private.?key|client.?key/i;
// Three base64url parts, as a service-account token or any other JWT.
const JWT = /eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*/g;

export interface ApiCall {
  readonly method: string;
  readonly url: URL;
  /** The HTTP status; undefined when no answer came. */
  readonly status: number | undefined;
  /** performance.now() when the request was sent. */
  readonly startedAt: number;
  /** As sent (JSON text); only looked at when bodies are logged. */
  readonly requestBody?: string | undefined;
  /** As received; only looked at when bodies are logged. */
  readonly responseBody?: string | undefined;
  /** Why no answer came (an ApiError's message, which quotes no answer). */
  readonly error?: string | undefined;
}

function redactValue(key: string, v: unknown): unknown {
  if (typeof v === 'string') return SECRET_KEY.test(key) ? REDACTED : v.replace(JWT, REDACTED);
  if (Array.isArray(v)) return v.map((x) => redactValue(key, x));
  if (typeof v === 'object' && v !== null) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = redactValue(k, x);
    return out;
  }
  return v;
}

/** A body as logged: JSON with its secrets replaced, cut at MAX_BODY; anything else by length only. */
export function redactBody(text: string): string {
  if (text === '') return '';
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return `<${Buffer.byteLength(text)} bytes, not JSON: not logged>`;
  }
  let out: string;
  try {
    out = JSON.stringify(redactValue('', parsed));
  } catch {
    // JSON.parse reads any depth, writing back recurses: a body nested thousands deep overflows the
    // stack, which must not fail (or crash, from a response's event handler) the request it logs.
    return `<${Buffer.byteLength(text)} bytes, JSON nested too deep: not logged>`;
  }
  return out.length > MAX_BODY ? `${out.slice(0, MAX_BODY)} [truncated ${out.length - MAX_BODY} chars]` : out;
}

/** Logs one API request (a watch: its opening) at --vklog>=4, with bodies at >=8. */
export function logApiCall(call: ApiCall): void {
  const v4 = klogV(VKLOG_REQUESTS);
  if (!v4.enabled) return;
  const fields: Record<string, unknown> = {
    method: call.method,
    path: call.url.pathname + call.url.search,
    status: call.status ?? 0,
    latencyMs: Math.round(performance.now() - call.startedAt),
  };
  if (call.error !== undefined) fields.error = call.error;
  if (klogV(VKLOG_BODIES).enabled) {
    if (call.requestBody !== undefined) fields.requestBody = redactBody(call.requestBody);
    if (call.responseBody !== undefined) fields.responseBody = redactBody(call.responseBody);
  }
  v4.info('API request', fields);
}

/** Logs one event line of a watch at --vklog>=8 (the watch's response body, a line at a time). */
export function logWatchEvent(url: URL, line: string): void {
  const v8 = klogV(VKLOG_BODIES);
  if (!v8.enabled) return;
  v8.info('API watch event', { method: 'GET', path: url.pathname + url.search, body: redactBody(line) });
}

// One error type for every failed API call: the HTTP status (or none when no answer came), what
// kind of failure it is, and how long the server asked us to wait.

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

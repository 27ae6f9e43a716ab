// One error type for every failed API call: the HTTP status (or none when no answer came), what
// kind of failure it is, and how long the server asked us to wait.

export type FailureReason = 'throttled' | 'server_error' | 'client_error' | 'unreachable';

export class ApiError extends Error {
  /** HTTP status, or undefined when no answer came (refused, reset, timed out). */
  readonly code: number | undefined;
  readonly retryAfterMs: number | undefined;
  readonly reason: FailureReason;
  /** What the server said (its Status text), or why no answer came; without `what`. */
  readonly detail: string;
  constructor(what: string, code: number | undefined, detail: string, retryAfterMs?: number) {
    super(`${what}: ${code === undefined ? detail : `HTTP ${code}${detail ? ` ${detail}` : ''}`}`);
    this.name = 'ApiError';
    this.code = code;
    this.detail = detail;
    this.retryAfterMs = retryAfterMs;
    this.reason =
      code === undefined ? 'unreachable' : code === 429 ? 'throttled' : code >= 500 ? 'server_error' : 'client_error';
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

// The Status text is the plugin's too (one wording in both bundles); podsource.ts reads it from here.
export { statusText } from '../../cni-plugin/shared/apistatus.ts';

/**
 * An ApiError for what a call threw: our requests throw ApiErrors already; client-node's Watch
 * throws an Error with the HTTP status on `statusCode`, or a network error.
 */
export function toApiError(what: string, e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  const err = e as { statusCode?: unknown; message?: string; name?: string };
  if (typeof err.statusCode === 'number') return new ApiError(what, err.statusCode, '');
  const detail =
    err.name === 'AbortError' || err.name === 'TimeoutError'
      ? 'no answer in time (aborted)'
      : (err.message ?? String(e));
  return new ApiError(what, undefined, detail);
}

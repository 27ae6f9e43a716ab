// Reads one pod from the API server: a tiny node:https client (bearer token, CA or skip-verify)
// with bounded retries. A pod created a moment ago may not be readable yet (404, or an older pod
// of the same name with another UID), the API server may be restarting (5xx, 429, refused, slow):
// those are retried with backoff until the overall deadline; 401/403 and other 4xx are not.
//
// Bounded for the fleet (docs/design.md "Fleet scale"): while the agent is down (its own rollout) every
// pod start on the node comes here, so one pod start sends at most MAX_POD_GET_ATTEMPTS GETs, the
// waits between them drawn at random (full jitter) so nodes that failed together do not retry in
// step, and a Retry-After (429, 503) is a floor under the wait, never a reason to ask sooner.

import type https from 'node:https';
import type { PodLike } from '../redirect/spec.ts';
import type { OrchAccess } from './orchconfig.ts';
import { statusMessage } from '../shared/apistatus.ts';
import { isPodWithUid } from '../shared/poduid.ts';

export type LookupFailure = 'unauthorized' | 'not-found' | 'unavailable' | 'rejected';

export class PodLookupError extends Error {
  readonly reason: LookupFailure;
  readonly attempts: number;
  constructor(reason: LookupFailure, attempts: number, msg: string) {
    super(msg);
    this.reason = reason;
    this.attempts = attempts;
  }
}

/** 404s (or UID mismatches) tolerated before giving up: a new pod shows up within moments. */
const MAX_NOT_FOUND = 5;

/** GETs one pod start sends at most, the retry after a rotated token included: the documented worst case. */
export const MAX_POD_GET_ATTEMPTS = 6;
/** The wait before retry n is drawn from 0..min(CAP, BASE * 2^(n-1)): at most 3.1 s in all. */
export const RETRY_BASE_MS = 100;
export const RETRY_CAP_MS = 1600;
/** A Retry-After longer than this is not waited for (the pod start would time out first). */
export const RETRY_AFTER_CAP_MS = 2000;

export interface LookupOptions {
  readonly timeoutMs: number;
  readonly attemptTimeoutMs: number;
  /** When the runtime told us the pod UID, a pod with another UID is a stale namesake. */
  readonly expectUid?: string;
  /** Called on 401/403: a fresh read of the orchconfig (projected tokens rotate). */
  readonly reloadAccess?: () => OrchAccess;
  readonly onRetry?: (attempt: number, why: string, delayMs: number) => void;
  readonly random?: () => number;
}

export interface Reply {
  readonly status: number;
  readonly body: string;
  readonly retryAfterMs: number | null;
}

/** One GET. */
function getOnce(
  https: Https,
  access: OrchAccess,
  agent: https.Agent,
  path: string,
  timeoutMs: number,
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const host = access.server.hostname.replace(/^\[(.*)\]$/, '$1');
    const req = https.request(
      {
        host,
        port: access.server.port || 443,
        path,
        method: 'GET',
        agent,
        ca: access.caPem ?? undefined,
        rejectUnauthorized: !access.insecure,
        headers: { authorization: `Bearer ${access.token}`, accept: 'application/json', 'user-agent': 'mesh-cni' },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          clearTimeout(timer);
          const ra = Number(res.headers['retry-after']);
          resolve({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks).toString('utf8'),
            retryAfterMs: Number.isFinite(ra) && ra >= 0 ? ra * 1000 : null,
          });
        });
        res.on('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
      },
    );
    const timer = setTimeout(() => req.destroy(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    req.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    req.end();
  });
}

// Loaded on first use: keeps node:https (and its HTTP parser) out of the startup snapshot and off
// the path of commands that never call the API server.
export type Https = typeof import('node:https');

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** What a GET's 200 or 404 makes: the value, or why to ask again (a thrown PodLookupError ends it). */
export type Verdict<T> = { readonly value: T } | { readonly retry: string };

/** One object read with getWithRetries. */
export interface RetriedGet<T> {
  readonly path: string;
  /** Judges a 200 (its body) or a 404 (body ''). */
  readonly judge: (status: 200 | 404, body: string, attempt: number, where: string) => Verdict<T>;
  /** What a 401/403 message tells the operator to check (the token, the RBAC that is needed). */
  readonly refusedHint: string;
}

/**
 * GETs `get.path` until `get.judge` takes the reply: at most MAX_POD_GET_ATTEMPTS GETs within
 * opts.timeoutMs, full-jitter waits with Retry-After as a floor, one retry with a rotated token
 * after a 401/403; other 4xx fail at once. The pod's GET and the namespace's (nsclient.ts).
 */
export async function getWithRetries<T>(initial: OrchAccess, get: RetriedGet<T>, opts: LookupOptions): Promise<T> {
  let access = initial;
  const where = `${access.server.origin}${get.path}`;
  const deadline = Date.now() + opts.timeoutMs;
  const https = process.getBuiltinModule('node:https');
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  let reloaded = false;
  let attempt = 0;
  let last = '';
  try {
    for (;;) {
      attempt++;
      if (attempt > MAX_POD_GET_ATTEMPTS) {
        const why = `API server failed GET ${where} ${attempt - 1} times (the most one pod start sends); last: ${last}`;
        throw new PodLookupError('unavailable', attempt - 1, why);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw new PodLookupError(
          'unavailable',
          attempt - 1,
          `API server did not answer GET ${where} within ${opts.timeoutMs} ms (${attempt - 1} attempts; last: ${last})`,
        );
      }
      const window = Math.min(RETRY_CAP_MS, RETRY_BASE_MS * 2 ** Math.min(attempt - 1, 10));
      let delay = (opts.random ?? Math.random)() * window;
      try {
        const r = await getOnce(https, access, agent, get.path, Math.min(opts.attemptTimeoutMs, remaining));
        if (r.status === 200 || r.status === 404) {
          const verdict = get.judge(r.status, r.status === 200 ? r.body : '', attempt, where);
          if ('value' in verdict) return verdict.value;
          last = verdict.retry;
        } else if (r.status === 401 || r.status === 403) {
          last = `${r.status} ${statusMessage(r.body)}`;
          if (!reloaded && opts.reloadAccess) {
            reloaded = true;
            const fresh = opts.reloadAccess();
            if (fresh.token !== access.token) {
              access = fresh;
              delay = 0;
              opts.onRetry?.(attempt, `${r.status} with a token that has since been rotated`, delay);
              continue;
            }
          }
          throw new PodLookupError(
            'unauthorized',
            attempt,
            `API server refused GET ${where}: ${last}; ${get.refusedHint}`,
          );
        } else if (r.status === 429 || r.status >= 500) {
          last = `${r.status} ${statusMessage(r.body)}`;
          if (r.retryAfterMs !== null) delay = Math.max(delay, Math.min(r.retryAfterMs, RETRY_AFTER_CAP_MS));
        } else {
          throw new PodLookupError(
            'rejected',
            attempt,
            `API server answered GET ${where} with ${r.status}: ${statusMessage(r.body)}`,
          );
        }
      } catch (e) {
        if (e instanceof PodLookupError) throw e;
        last = (e as Error).message;
      }
      // The last GET failed: the pod start fails now, not after a wait for a GET it will not send.
      if (attempt >= MAX_POD_GET_ATTEMPTS) continue;
      delay = Math.min(delay, Math.max(0, deadline - Date.now()));
      opts.onRetry?.(attempt, last, delay);
      await sleep(delay);
    }
  } finally {
    agent.destroy();
  }
}

export async function getPod(
  initial: OrchAccess,
  namespace: string,
  name: string,
  opts: LookupOptions,
): Promise<PodLike> {
  let notFound = 0;
  const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;
  return getWithRetries<PodLike>(
    initial,
    {
      path,
      refusedHint: "check the orchconfig token and the agent's RBAC (get pods)",
      judge: (status, body, attempt, where) => {
        if (status === 200) {
          const pod = JSON.parse(body) as PodLike;
          if (!(opts.expectUid && pod.metadata?.uid && !isPodWithUid(pod, opts.expectUid))) return { value: pod };
          const last = `found UID ${pod.metadata.uid}, runtime asked for ${opts.expectUid}`;
          if (++notFound > MAX_NOT_FOUND)
            throw new PodLookupError(
              'not-found',
              attempt,
              `pod ${namespace}/${name} with UID ${opts.expectUid} not found at ${where}: ${last}`,
            );
          return { retry: last };
        }
        if (++notFound > MAX_NOT_FOUND)
          throw new PodLookupError(
            'not-found',
            attempt,
            `pod ${namespace}/${name} not found at ${where} after ${attempt} attempts`,
          );
        return { retry: '404 Not Found' };
      },
    },
    opts,
  );
}

// Reads one namespace's labels from the API server, for the ambient decision when the agent's
// pod lookup could not give them (cni-plugin/ambient.ts). The same GET, bounds and backoff as the
// pod's (podclient.ts): at most MAX_POD_GET_ATTEMPTS GETs, full jitter, Retry-After as a floor.
// A namespace holding a pod that is starting exists, so a 404 is not waited out: it fails at once.
// The plugin's token needs `namespaces get` for this (granted with ambient mode only).

import type { OrchAccess } from './orchconfig.ts';
import {
  getOnce,
  MAX_POD_GET_ATTEMPTS,
  PodLookupError,
  RETRY_AFTER_CAP_MS,
  RETRY_BASE_MS,
  RETRY_CAP_MS,
  type LookupOptions,
} from './podclient.ts';
import { statusMessage } from '../shared/apistatus.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The namespace's labels ({} when it has none); throws PodLookupError (the same reasons as the pod's). */
export async function getNamespaceLabels(
  initial: OrchAccess,
  name: string,
  opts: Omit<LookupOptions, 'expectUid'>,
): Promise<Record<string, string>> {
  let access = initial;
  const path = `/api/v1/namespaces/${encodeURIComponent(name)}`;
  const where = `${access.server.origin}${path}`;
  const deadline = Date.now() + opts.timeoutMs;
  const https = process.getBuiltinModule('node:https');
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  let reloaded = false;
  let last = '';
  try {
    for (let attempt = 1; ; attempt++) {
      if (attempt > MAX_POD_GET_ATTEMPTS)
        throw new PodLookupError(
          'unavailable',
          attempt - 1,
          `API server failed GET ${where} ${attempt - 1} times; last: ${last}`,
        );
      const remaining = deadline - Date.now();
      if (remaining <= 0)
        throw new PodLookupError(
          'unavailable',
          attempt - 1,
          `API server did not answer GET ${where} within ${opts.timeoutMs} ms (last: ${last})`,
        );
      let delay =
        (opts.random ?? Math.random)() * Math.min(RETRY_CAP_MS, RETRY_BASE_MS * 2 ** Math.min(attempt - 1, 10));
      try {
        const r = await getOnce(https, access, agent, path, Math.min(opts.attemptTimeoutMs, remaining));
        if (r.status === 200) return labelsOf(JSON.parse(r.body));
        if (r.status === 404) throw new PodLookupError('not-found', attempt, `namespace ${name} not found at ${where}`);
        if (r.status === 401 || r.status === 403) {
          last = `${r.status} ${statusMessage(r.body)}`;
          if (!reloaded && opts.reloadAccess) {
            reloaded = true;
            const fresh = opts.reloadAccess();
            if (fresh.token !== access.token) {
              access = fresh;
              opts.onRetry?.(attempt, `${r.status} with a token that has since been rotated`, 0);
              continue;
            }
          }
          throw new PodLookupError(
            'unauthorized',
            attempt,
            `API server refused GET ${where}: ${last}; ambient mode needs the plugin's token to get namespaces (RBAC)`,
          );
        }
        if (r.status !== 429 && r.status < 500)
          throw new PodLookupError(
            'rejected',
            attempt,
            `API server answered GET ${where} with ${r.status}: ${statusMessage(r.body)}`,
          );
        last = `${r.status} ${statusMessage(r.body)}`;
        if (r.retryAfterMs !== null) delay = Math.max(delay, Math.min(r.retryAfterMs, RETRY_AFTER_CAP_MS));
      } catch (e) {
        if (e instanceof PodLookupError) throw e;
        last = (e as Error).message;
      }
      if (attempt >= MAX_POD_GET_ATTEMPTS) continue;
      delay = Math.min(delay, Math.max(0, deadline - Date.now()));
      opts.onRetry?.(attempt, last, delay);
      await sleep(delay);
    }
  } finally {
    agent.destroy();
  }
}

/** metadata.labels as strings only (anything else is not a label the API server would hold). */
export function labelsOf(obj: unknown): Record<string, string> {
  const labels = (obj as { metadata?: { labels?: unknown } } | null)?.metadata?.labels;
  const out: Record<string, string> = {};
  if (typeof labels !== 'object' || labels === null) return out;
  for (const [k, v] of Object.entries(labels)) if (typeof v === 'string') out[k] = v;
  return out;
}

// Reads one namespace's labels from the API server, for the ambient decision when the agent's
// pod lookup could not give them (cni-plugin/ambient.ts). The same GET, bounds and backoff as the
// pod's (podclient.ts): at most MAX_POD_GET_ATTEMPTS GETs, full jitter, Retry-After as a floor.
// A namespace holding a pod that is starting exists, so a 404 is not waited out: it fails at once.
// The plugin's token needs `namespaces get` for this (granted with ambient mode only).

import type { OrchAccess } from './orchconfig.ts';
import { getWithRetries, PodLookupError, type LookupOptions } from './podclient.ts';

/** The namespace's labels ({} when it has none); throws PodLookupError (the same reasons as the pod's). */
export async function getNamespaceLabels(
  initial: OrchAccess,
  name: string,
  opts: Omit<LookupOptions, 'expectUid'>,
): Promise<Record<string, string>> {
  return getWithRetries(
    initial,
    {
      path: `/api/v1/namespaces/${encodeURIComponent(name)}`,
      refusedHint: "ambient mode needs the plugin's token to get namespaces (RBAC)",
      judge: (status, body, attempt, where) => {
        if (status === 404) throw new PodLookupError('not-found', attempt, `namespace ${name} not found at ${where}`);
        return { value: labelsOf(JSON.parse(body)) };
      },
    },
    opts,
  );
}

/** metadata.labels as strings only (anything else is not a label the API server would hold). */
export function labelsOf(obj: unknown): Record<string, string> {
  const labels = (obj as { metadata?: { labels?: unknown } } | null)?.metadata?.labels;
  const out: Record<string, string> = {};
  if (typeof labels !== 'object' || labels === null) return out;
  for (const [k, v] of Object.entries(labels)) if (typeof v === 'string') out[k] = v;
  return out;
}

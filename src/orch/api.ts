// The agent's view of the API server (OrchApi): list and watch pods, label (pods/status), delete,
// record an event, each cancellable and failing with one error type that says how to retry.
// @kubernetes/client-node gives the connection: its KubeConfig (orchconfig or in-cluster service
// account, token re-read as it rotates, CA, client certificates) and its Watch for the event
// streams. The other calls are plain JSON requests (request.ts): client-node's generated API
// classes and models cost ~25 MB of resident memory on every node for five calls
// (scripts/slim-client-node.ts).

import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { Watch } from '@kubernetes/client-node/dist/watch.js';
import { apiRequest } from './request.ts';

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
      // Through the status subresource, which takes labels but never a spec change: the agent
      // needs pods/status patch only, not the pods patch that could swap a pod's image. The uid
      // in the patch is a precondition: a new pod that took the name is never labelled.
      await apiRequest(kc, 'PATCH', `${podPath(pod)}/status`, `labelling ${name(pod)}`, {
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

// The agent's view of the API server (OrchApi): list and watch a collection (pods, namespaces), label (pods/status), delete,
// record an event, each cancellable and failing with one error type that says how to retry.
// @kubernetes/client-node gives the connection: its KubeConfig (orchconfig or in-cluster service
// account, token re-read as it rotates, CA, client certificates). The calls are plain JSON
// requests and a line-per-event watch stream (request.ts): client-node's generated API classes
// and models cost ~25 MB of resident memory on every node for five calls
// (scripts/slim-client-node.ts), and its Watch drops the body and Retry-After of an error answer.

import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { apiRequest, apiWatch } from './request.ts';
import type { ListMode, OrchContext } from './ratelimit.ts';

/** One page of a list: its objects, as the server sent them. */
export interface ObjectList {
  readonly items: unknown[];
  readonly resourceVersion: string;
  readonly continueToken: string | undefined;
}

/** Which objects of a collection (empty: any); pods are chosen by node, repair by its flags. */
export interface Selectors {
  readonly fieldSelector: string;
  readonly labelSelector: string;
}

export type PodQuery = Selectors;

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

/** Which list an informer sends (docs/design.md "Fleet scale"). */
export interface ListParams {
  /** '0': from the watch cache, any age; undefined: a consistent read (etcd). */
  readonly resourceVersion?: string;
  /** NotOlderThan, with a resourceVersion seen: from the watch cache, never older than that. */
  readonly resourceVersionMatch?: 'NotOlderThan';
  /** Pages (consistent reads only: the watch cache ignores it). */
  readonly limit?: number;
  readonly continueToken?: string;
}

/** How this agent lists and re-watches (from its settings; the defaults when absent). */
export interface WatchTuning {
  readonly listMode: ListMode;
  readonly reconnectSpreadMs: number;
  readonly startJitterMs: number;
}

export interface OrchApi {
  /** One page of the collection /api/v1/<resource> ('pods', 'namespaces'). */
  list(resource: string, q: Partial<Selectors> & ListParams, signal: AbortSignal): Promise<ObjectList>;
  /**
   * Starts a watch of /api/v1/<resource>; resolves once the stream is open (or failed: then `done`
   * was called too). `sendInitialEvents`: the streaming watch-list (state first, ending in a
   * bookmark annotated k8s.io/initial-events-end), with resourceVersionMatch=NotOlderThan.
   * `signal` cancels the wait for the rate limit and the opening (a watch given up on before the
   * server answered).
   */
  watch(
    resource: string,
    q: Partial<Selectors> & { resourceVersion: string; timeoutSeconds: number; sendInitialEvents?: boolean },
    onEvent: (type: WatchEventType, object: unknown) => void,
    done: (err: unknown) => void,
    signal?: AbortSignal,
  ): Promise<AbortController>;
  labelPod(pod: V1Pod, key: string, value: string, signal: AbortSignal): Promise<void>;
  deletePod(pod: V1Pod, signal: AbortSignal): Promise<void>;
  createEvent(namespace: string, event: CoreV1Event, signal: AbortSignal): Promise<void>;
  /**
   * Sets (or with null removes) one annotation of a pod through pods/status, a merge patch that
   * keeps its other annotations, with the uid as precondition (ambient's redirection annotation).
   */
  annotatePod(
    pod: { readonly namespace: string; readonly name: string; readonly uid: string },
    key: string,
    value: string | null,
    signal: AbortSignal,
  ): Promise<void>;
  /** The agent's list mode and re-watch timing, if its settings say. */
  readonly tuning?: WatchTuning;
}

const podPath = (p: V1Pod) =>
  `/api/v1/namespaces/${encodeURIComponent(p.metadata!.namespace!)}/pods/${encodeURIComponent(p.metadata!.name!)}`;

/**
 * The API over `kc`. `orch`: the agent's rate limit, which its lists and watches wait on, and its
 * list settings; none (a test, a tool): no limit, FLEET_DEFAULTS (informer.ts).
 */
export function clientNodeApi(kc: KubeConfig, orch?: OrchContext): OrchApi {
  const name = (p: V1Pod) => `pod ${p.metadata?.namespace}/${p.metadata?.name}`;
  const ctx = orch?.settings;
  const limiter = orch?.limiter;
  return {
    ...(ctx
      ? {
          tuning: {
            listMode: ctx.listMode,
            reconnectSpreadMs: ctx.reconnectSpreadMs,
            startJitterMs: ctx.startJitterMs,
          },
        }
      : {}),
    async list(resource, q, signal) {
      const list = await apiRequest<{ items?: unknown[]; metadata?: { resourceVersion?: string; continue?: string } }>(
        kc,
        'GET',
        `/api/v1/${resource}`,
        `listing ${resource}`,
        {
          query: {
            fieldSelector: q.fieldSelector,
            labelSelector: q.labelSelector,
            resourceVersion: q.resourceVersion,
            resourceVersionMatch: q.resourceVersionMatch,
            limit: q.limit,
            continue: q.continueToken,
          },
          signal,
          limiter,
        },
      );
      return {
        items: list.items ?? [],
        resourceVersion: list.metadata?.resourceVersion ?? '',
        continueToken: list.metadata?.continue || undefined,
      };
    },
    async watch(resource, q, onEvent, done, signal) {
      const what = q.sendInitialEvents ? `watching ${resource} (watch-list)` : `watching ${resource}`;
      const query = {
        fieldSelector: q.fieldSelector || undefined,
        labelSelector: q.labelSelector || undefined,
        resourceVersion: q.resourceVersion || undefined,
        allowWatchBookmarks: true,
        timeoutSeconds: q.timeoutSeconds,
        ...(q.sendInitialEvents ? { sendInitialEvents: true, resourceVersionMatch: 'NotOlderThan' } : {}),
      };
      const controller = new AbortController();
      try {
        const forward = (e: { type?: unknown; object?: unknown }) => onEvent(e.type as WatchEventType, e.object);
        const opening = signal ? AbortSignal.any([controller.signal, signal]) : controller.signal;
        const stream = await apiWatch(kc, `/api/v1/${resource}`, what, query, forward, done, opening, limiter);
        controller.signal.addEventListener('abort', () => stream.abort(), { once: true });
      } catch (e) {
        done(e);
      }
      return controller;
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
    async annotatePod(pod, key, value, signal) {
      const path = `/api/v1/namespaces/${encodeURIComponent(pod.namespace)}/pods/${encodeURIComponent(pod.name)}/status`;
      await apiRequest(kc, 'PATCH', path, `annotating pod ${pod.namespace}/${pod.name}`, {
        body: { metadata: { uid: pod.uid, annotations: { [key]: value } } },
        contentType: 'application/merge-patch+json',
        signal,
      });
    },
    async deletePod(pod, signal) {
      await apiRequest(kc, 'DELETE', podPath(pod), `deleting ${name(pod)}`, {
        body: { preconditions: { uid: pod.metadata!.uid } },
        signal,
      });
    },
    async createEvent(namespace, event: CoreV1Event, signal) {
      await apiRequest(
        kc,
        'POST',
        `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`,
        `recording an event in namespace ${namespace}`,
        { body: event, signal },
      );
    },
  };
}

// The cluster's namespaces, for their labels: ambient mode selects pods by their namespace's
// labels too (--ambient-enablement-selector), and a relabel re-checks the namespace's pods. An
// informer (informer.ts) of /api/v1/namespaces, with the pod watch's failure handling. Every node
// caches every namespace, so each is kept slim; they are few and change rarely, so they are
// always listed from the watch cache (no watch-list, no pages), whatever --orch-list-mode says.

import type { V1Namespace } from '@kubernetes/client-node';
import type { OrchApi } from './api.ts';
import { Informer, WATCH_DEFAULTS, type Handler, type InformerOptions, type Resource } from './informer.ts';
import { realClock } from './limits.ts';

export type NamespaceHandler = Handler<V1Namespace>;

export interface NamespaceSourceOptions extends InformerOptions {
  /** A list or watch failing this long (none open since) makes ambient mode not ready. */
  readonly notReadyAfterMs: number;
}

export const NAMESPACE_WATCH_DEFAULTS: NamespaceSourceOptions = {
  ...WATCH_DEFAULTS,
  query: { fieldSelector: '', labelSelector: '' },
  clock: realClock,
  random: Math.random,
  logScope: 'ambient',
  notReadyAfterMs: 30_000,
  startupName: 'namespaces',
};

/**
 * What is kept of a namespace: every node caches every namespace of the cluster, and whole objects
 * (managedFields, last-applied annotations) cost ~1.5 KB of heap each against ~0.3 KB for this.
 */
function slim(ns: V1Namespace): V1Namespace {
  const m = ns.metadata ?? {};
  return {
    metadata: {
      name: m.name ?? '',
      uid: m.uid ?? '',
      resourceVersion: m.resourceVersion ?? '',
      labels: m.labels ?? {},
    },
  };
}

const NAMESPACES: Resource<V1Namespace> = {
  plural: 'namespaces',
  singular: 'namespace',
  key: (ns) => ns.metadata?.name ?? '',
  slim,
  listMode: 'cache',
  queryHint: 'check what stands between the agent and the API server',
};

export class NamespaceSource extends Informer<V1Namespace> {
  readonly #notReadyAfterMs: number;

  constructor(api: OrchApi, o: Partial<NamespaceSourceOptions> = {}) {
    const options = { ...NAMESPACE_WATCH_DEFAULTS, ...o };
    super(api, NAMESPACES, null, options);
    this.#notReadyAfterMs = options.notReadyAfterMs;
  }

  /** The namespace's labels; undefined while it is not known. */
  labels(name: string): Readonly<Record<string, string>> | undefined {
    const ns = this.cached(name);
    return ns ? (ns.metadata?.labels ?? {}) : undefined;
  }

  /**
   * Why ambient mode is not ready: the namespace reads failing for notReadyAfterMs, no watch open
   * since (a 403 on watch with list allowed kept the cache at its list, and /readyz said nothing).
   */
  notReadyReasons(): string[] {
    const f = this.failing(this.#notReadyAfterMs);
    if (!f) return [];
    return [
      `ambient: the namespace watch is failing (${f.attempts} attempt(s)): ${f.lastError}; ` +
        'the namespace labels pods are selected by may be stale: check that the agent may reach the API server ' +
        'and that its ClusterRole grants namespaces list and watch (deploy/overlays/ambient)',
    ];
  }

  status() {
    const { cached, listMode: _, watchRestarts, ...s } = this.informerStatus();
    const restarts = Object.values(watchRestarts).reduce((a, b) => a + b, 0);
    return { ...s, cachedNamespaces: cached, watchRestarts: restarts };
  }
}

// The pods a part of the agent cares about (the repair controller, the plugin's pod lookup,
// ambient mode): an informer (informer.ts) of /api/v1/pods with a field and label selector. The
// cache it keeps is what the repair controller's periodic resync re-checks and what the pod
// lookup answers from. The agent's wiring (src/agent.ts) builds the node's watch once
// (nodePodSource) and hands it to every reader; it never belongs to one of them.

import type { V1Pod } from '@kubernetes/client-node';
import { escapeFieldValue } from '../config/selectors.ts';
import type { OrchApi, PodQuery } from './api.ts';
import { Informer, WATCH_DEFAULTS, type Handler, type InformerOptions, type Resource } from './informer.ts';
import { realClock } from './limits.ts';
import type { LogScope } from '../config/flags.ts';

export { FLEET_DEFAULTS, INITIAL_EVENTS_END, WATCH_DEFAULTS } from './informer.ts';
export type { RestartReason, SourceState } from './informer.ts';

/** One reader of a pod watch; each brings its own metrics through the optional hooks. */
export type PodHandler = Handler<V1Pod>;
export type PodSourceOptions = InformerOptions;

const podKey = (p: V1Pod) => `${p.metadata?.namespace ?? ''}/${p.metadata?.name ?? ''}`;

/**
 * What is kept of a pod: all of it but metadata.managedFields, the API server's record of which
 * client wrote which field (~1-4 KB a pod), which no reader reads; the cache holds every pod of
 * the node for the agent's life.
 */
function slim(p: V1Pod): V1Pod {
  if (p.metadata?.managedFields === undefined) return p;
  const { managedFields: _, ...metadata } = p.metadata;
  return { ...p, metadata };
}

const PODS: Resource<V1Pod> = {
  plural: 'pods',
  singular: 'pod',
  key: podKey,
  slim,
  queryHint: 'check its selectors (for repair: --repair-field-selectors, --repair-label-selectors)',
};

export class PodSource extends Informer<V1Pod> {
  /** `handler` gets every pod added, changed or gone; null when readers come by addHandler. */
  constructor(api: OrchApi, handler: PodHandler | null, o: PodSourceOptions) {
    super(api, PODS, handler, o);
  }

  pods(): V1Pod[] {
    return this.list();
  }

  /** The cached pod, if the list/watch has it. */
  get(namespace: string, name: string): V1Pod | undefined {
    return this.cached(`${namespace}/${name}`);
  }

  status() {
    const { cached, failing: _, ...s } = this.informerStatus();
    return { ...s, cachedPods: cached };
  }
}

/** The pods of this node: what the kubelet of `nodeName` runs. */
export function nodePodQuery(nodeName: string): PodQuery {
  return { fieldSelector: `spec.nodeName=${escapeFieldValue(nodeName)}`, labelSelector: '' };
}

/** The node's pod watch (not started), with the default timing. */
export function nodePodSource(api: OrchApi, nodeName: string, logScope: LogScope): PodSource {
  return new PodSource(api, null, {
    ...WATCH_DEFAULTS,
    query: nodePodQuery(nodeName),
    clock: realClock,
    logScope,
    startupName: 'node_pods',
  });
}

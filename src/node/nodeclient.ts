// The agent's calls on its own Node: read it, set our condition (nodes/status), take the start-up
// taint off (nodes, with a resourceVersion precondition), and record an Event on it. Outside the
// agent's client-side rate limit: they happen on readiness changes only, at most one write of each
// a readiness pass, and a taint removal waiting behind start-up's lists would keep the node
// unschedulable for longer.

import type { CoreV1Event } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { apiRequest } from '../orch/request.ts';
import type { NodeView } from './plan.ts';

export interface NodeClient {
  getNode(signal: AbortSignal): Promise<NodeView>;
  patchStatus(patch: unknown, signal: AbortSignal): Promise<NodeView>;
  patchNode(patch: unknown, signal: AbortSignal): Promise<NodeView>;
  /** Records an Event about the node (in namespace default, where the kubelet records its node's). */
  recordEvent(event: CoreV1Event, signal: AbortSignal): Promise<void>;
}

export function nodeClient(kc: KubeConfig, nodeName: string): NodeClient {
  const path = `/api/v1/nodes/${encodeURIComponent(nodeName)}`;
  return {
    getNode: (signal) => apiRequest<NodeView>(kc, 'GET', path, `reading node ${nodeName}`, { signal }),
    patchStatus: (patch, signal) =>
      apiRequest<NodeView>(kc, 'PATCH', `${path}/status`, `setting the condition of node ${nodeName}`, {
        body: patch,
        contentType: 'application/strategic-merge-patch+json',
        signal,
      }),
    patchNode: (patch, signal) =>
      apiRequest<NodeView>(kc, 'PATCH', path, `removing the start-up taint of node ${nodeName}`, {
        body: patch,
        contentType: 'application/merge-patch+json',
        signal,
      }),
    recordEvent: async (event, signal) => {
      await apiRequest(kc, 'POST', '/api/v1/namespaces/default/events', `recording an event on node ${nodeName}`, {
        body: event,
        signal,
      });
    },
  };
}

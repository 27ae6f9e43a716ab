// The node readiness part's metrics (docs/node-readiness.md).

import { Gauge } from 'prom-client';
import { combinations, knownCounter, registry } from '../monitoring/metrics.ts';

export const conditionWrites = knownCounter({
  name: 'mesh_cni_node_condition_writes_total',
  help:
    "Writes of the agent's node condition (--node-readiness-condition), by the status written (True, False) " +
    'and result (success, fail: retried on the next readiness pass).',
  series: combinations({ status: ['True', 'False'], result: ['success', 'fail'] }),
});

export const taintRemovals = knownCounter({
  name: 'mesh_cni_node_startup_taint_removals_total',
  help:
    'The start-up taint (--startup-taint) handled once the agent was first ready, by result: removed (by this ' +
    'agent), absent (not on the node: already removed, or never put there), conflict (the node changed under ' +
    'the patch: read again), fail (retried on the next readiness pass).',
  series: combinations({ result: ['removed', 'absent', 'conflict', 'fail'] }),
});

export const taintRemovedAt = new Gauge({
  name: 'mesh_cni_node_startup_taint_removed_timestamp_seconds',
  help: 'When this agent removed the start-up taint from its node (Unix time); 0 until it did.',
  registers: [registry],
});

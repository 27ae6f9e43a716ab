// The repair controller's metrics.

import { Counter, Gauge } from 'prom-client';
import { registry } from '../monitoring/metrics.ts';

export const podsRepaired = new Counter({
  name: 'mesh_cni_repair_pods_repaired_total',
  help: 'Pods broken by the start-up race that the repair controller fixed, by action (label, delete).',
  labelNames: ['type'] as const,
  registers: [registry],
});

export const repairFailures = new Counter({
  name: 'mesh_cni_repair_failures_total',
  help: 'Failed repair requests, by action (label, delete, event) and reason (throttled, server_error, client_error, unreachable, gave_up).',
  labelNames: ['type', 'reason'] as const,
  registers: [registry],
});

export const podsSeenBroken = new Counter({
  name: 'mesh_cni_repair_pods_seen_broken_total',
  help: 'Broken pod states seen (each pod counted once per failed run of its validation init container).',
  registers: [registry],
});

export const watchRestarts = new Counter({
  name: 'mesh_cni_repair_watch_restarts_total',
  help: 'Times the pod watch was restarted, by reason (closed, expired, silent, error).',
  labelNames: ['reason'] as const,
  registers: [registry],
});

export const watchedPods = new Gauge({
  name: 'mesh_cni_repair_watched_pods',
  help: 'Pods the repair controller currently has in its cache.',
  registers: [registry],
});

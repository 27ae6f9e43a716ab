// The repair controller's metrics.

import { Counter, Gauge } from 'prom-client';
import { combinations, knownCounter, registry } from '../monitoring/metrics.ts';

/** Why an API request failed (orch/errors.ts FailureReason), or gave_up: no attempt left. */
const REQUEST_FAILURES = ['throttled', 'server_error', 'client_error', 'unreachable', 'gave_up'] as const;
/** Why an in-place repair failed (inplace.ts InPlaceReason), or gave_up: its retries ran out. */
const IN_PLACE_FAILURES = [
  'no_netns',
  'ip_mismatch',
  'rules_failed',
  'proof_failed',
  'repair_did_not_hold',
  'no_capability',
  'will_not_restart',
  'host_network',
  'gave_up',
] as const;

export const podsRepaired = knownCounter({
  name: 'mesh_cni_repair_pods_repaired_total',
  help:
    'Pods broken by the start-up race the repair controller acted on, by action (repair: in place, label, delete) ' +
    'and result (success; fail: the action gave up, or in place fell through to label/delete).',
  series: combinations({ type: ['repair', 'label', 'delete'], result: ['success', 'fail'] }),
});

export const repairFailures = knownCounter({
  name: 'mesh_cni_repair_failures_total',
  help:
    'Failed repair requests, by action (label, delete, event) and reason (throttled, server_error, client_error, ' +
    'unreachable, gave_up); failed in-place repairs (type repair) by reason (no_netns, ip_mismatch, rules_failed, ' +
    'proof_failed, repair_did_not_hold, no_capability, will_not_restart, host_network; gave_up: retries ran out).',
  series: [
    ...combinations({ type: ['label', 'delete', 'event'], reason: REQUEST_FAILURES }),
    ...combinations({ type: ['repair'], reason: IN_PLACE_FAILURES }),
  ],
});

export const podsSeenBroken = new Counter({
  name: 'mesh_cni_repair_pods_seen_broken_total',
  help: 'Broken pod states seen (each pod counted once per failed run of its validation init container).',
  registers: [registry],
});

export const watchRestarts = knownCounter({
  name: 'mesh_cni_repair_watch_restarts_total',
  help: 'Times the pod watch was restarted, by reason (closed, expired, silent, error).',
  series: combinations({ reason: ['closed', 'expired', 'silent', 'error'] }),
});

export const watchedPods = new Gauge({
  name: 'mesh_cni_repair_watched_pods',
  help: 'Pods the repair controller currently has in its cache.',
  registers: [registry],
});

// The installer's metrics.

import { Counter, Gauge, Histogram } from 'prom-client';
import { registry } from '../monitoring/metrics.ts';

export const installReady = new Gauge({
  name: 'mesh_cni_install_ready',
  help: '1 when the mesh-cni binary, orchconfig and CNI config entry are all in place on this node, else 0.',
  registers: [registry],
});

export const reconciles = new Counter({
  name: 'mesh_cni_install_reconciles_total',
  help: 'Reconcile passes of the installer, by what triggered them.',
  labelNames: ['trigger'] as const,
  registers: [registry],
});

export const reconcileDuration = new Histogram({
  name: 'mesh_cni_install_reconcile_duration_seconds',
  help: 'Time one reconcile pass took.',
  buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
  registers: [registry],
});

export const writes = new Counter({
  name: 'mesh_cni_install_writes_total',
  help: 'Files the installer wrote or removed on the host, by kind (binary, orchconfig, cni_config) and action.',
  labelNames: ['kind', 'action'] as const,
  registers: [registry],
});

export const errors = new Counter({
  name: 'mesh_cni_install_errors_total',
  help: 'Reconcile passes that found a problem, by reason.',
  labelNames: ['reason'] as const,
  registers: [registry],
});

// The plugin's token (tokenrequest.ts), which the installer writes into the orchconfig.

export const pluginTokenRefreshes = new Counter({
  name: 'mesh_cni_plugin_token_refreshes_total',
  help: "Tokens minted for the CNI plugin's service account (TokenRequest).",
  registers: [registry],
});

export const pluginTokenRefreshFailures = new Counter({
  name: 'mesh_cni_plugin_token_refresh_failures_total',
  help: "Failed attempts to mint the CNI plugin's token, by reason (throttled, server_error, client_error, unreachable; refused: the answer's token was not the plugin account's); the old token stays in use until it expires.",
  labelNames: ['reason'] as const,
  registers: [registry],
});
// Every reason at 0 from the start, so an alert on the first failure has a series to compare.
for (const reason of ['throttled', 'server_error', 'client_error', 'unreachable', 'refused'])
  pluginTokenRefreshFailures.inc({ reason }, 0);

export const pluginTokenExpiry = new Gauge({
  name: 'mesh_cni_plugin_token_expiry_timestamp_seconds',
  help: "When the CNI plugin's current token expires (Unix time); 0 before the first one.",
  registers: [registry],
});

// --cleanup-on-exit's decision on stop (uninstall.ts). Every series exists from start-up at 0, so
// an alert on a keep that was a guess fires on the first one.

export const CLEANUP_REASONS = {
  uninstall: [
    'flag',
    'daemonset_gone',
    'daemonset_deleting',
    'node_name',
    'node_selector',
    'node_affinity',
    'untolerated_taint',
  ],
  keep: [
    'flag',
    'daemonset_targets_node',
    'no_pod_name',
    'no_node_name',
    'pod_not_found',
    'no_daemonset_owner',
    'node_not_found',
    'unsure_scheduling',
    'unreachable',
    'timeout',
    'unauthorized',
    'forbidden',
    'throttled',
    'server_error',
    'client_error',
  ],
} as const;

export type CleanupReason<D extends keyof typeof CLEANUP_REASONS = keyof typeof CLEANUP_REASONS> =
  (typeof CLEANUP_REASONS)[D][number];

export const cleanupDecisions = new Counter({
  name: 'mesh_cni_cleanup_decisions_total',
  help: "Decisions on stop whether to uninstall (take mesh-cni off this node) or keep it (a restart or upgrade, or the API server's answer could not tell), by decision and reason.",
  labelNames: ['decision', 'reason'] as const,
  registers: [registry],
});
for (const [decision, reasons] of Object.entries(CLEANUP_REASONS))
  for (const reason of reasons) cleanupDecisions.inc({ decision, reason }, 0);

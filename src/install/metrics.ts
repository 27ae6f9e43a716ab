// The installer's metrics.

import { Counter, Gauge, Histogram } from 'prom-client';
import { combinations, knownCounter, registry } from '../monitoring/metrics.ts';

export const installReady = new Gauge({
  name: 'mesh_cni_install_ready',
  help: '1 when the mesh-cni binary, orchconfig and CNI config entry are all in place on this node, else 0.',
  registers: [registry],
});

/** What brings a pass (watch.ts Trigger). */
const TRIGGERS = ['startup', 'net_dir', 'bin_dir', 'token', 'ca', 'template', 'periodic', 'retry'] as const;

export const reconciles = knownCounter({
  name: 'mesh_cni_install_reconciles_total',
  help: 'Reconcile passes of the installer, by what triggered them.',
  series: combinations({ trigger: TRIGGERS }),
});

/** Why a pass found a problem (plancontext.ts ErrorReason). */
const ERROR_REASONS = [
  'net_dir_missing',
  'primary_malformed',
  'template_invalid',
  'token_missing',
  'ca_missing',
  'api_host_missing',
  'binaries_failed',
  'write_failed',
  'file_refused',
  'primary_unsupported',
  'config_shadowed',
] as const;

/**
 * One install is one reconcile pass, as Istio counts one per install attempt
 * (istio_cni_installs_total): success when it ended with everything in place, written by it or
 * found there; not_ready when it ended waiting without an error (no primary CNI config yet);
 * else the reason of its first problem, in the order a pass works (binaries, net dir,
 * orchconfig, template, CNI config), where Istio stops at its first failed step. Every problem
 * of the pass is in mesh_cni_install_errors_total.
 */
export const INSTALL_RESULTS = ['success', 'not_ready', ...ERROR_REASONS] as const;
export type InstallResult = (typeof INSTALL_RESULTS)[number];

export const installs = knownCounter({
  name: 'mesh_cni_installs_total',
  help:
    'Install passes (reconcile passes) by result: success (binary, orchconfig and CNI config entry in place, ' +
    'written or found), not_ready (waiting without an error: no primary CNI config yet), else the reason of ' +
    "the pass's first problem (as mesh_cni_install_errors_total).",
  series: combinations({ result: INSTALL_RESULTS }),
});

export const reconcileDuration = new Histogram({
  name: 'mesh_cni_install_reconcile_duration_seconds',
  help: 'Time one reconcile pass took.',
  buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
  registers: [registry],
});

export const writes = knownCounter({
  name: 'mesh_cni_install_writes_total',
  help: 'Files the installer wrote or removed on the host, by kind (binary, orchconfig, cni_config) and action.',
  series: combinations({ kind: ['binary', 'orchconfig', 'cni_config'], action: ['write', 'remove'] }),
});

export const errors = knownCounter({
  name: 'mesh_cni_install_errors_total',
  help: 'Problems reconcile passes found, by reason (a pass may find several).',
  series: combinations({ reason: ERROR_REASONS }),
});

// The plugin's token (tokenrequest.ts), which the installer writes into the orchconfig.

export const pluginTokenRefreshes = new Counter({
  name: 'mesh_cni_plugin_token_refreshes_total',
  help: "Tokens minted for the CNI plugin's service account (TokenRequest).",
  registers: [registry],
});

export const pluginTokenRefreshFailures = knownCounter({
  name: 'mesh_cni_plugin_token_refresh_failures_total',
  help: "Failed attempts to mint the CNI plugin's token, by reason (throttled, server_error, client_error, unreachable; refused: the answer's token was not the plugin account's); the old token stays in use until it expires.",
  series: combinations({ reason: ['throttled', 'server_error', 'client_error', 'unreachable', 'refused'] }),
});

export const pluginTokenExpiry = new Gauge({
  name: 'mesh_cni_plugin_token_expiry_timestamp_seconds',
  help: "When the CNI plugin's current token expires (Unix time); 0 before the first one.",
  registers: [registry],
});

// --cleanup-on-exit's decision on stop (uninstall.ts): an alert on a keep that was a guess fires
// on the first one.

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

export const cleanupDecisions = knownCounter({
  name: 'mesh_cni_cleanup_decisions_total',
  help: "Decisions on stop whether to uninstall (take mesh-cni off this node) or keep it (a restart or upgrade, or the API server's answer could not tell), by decision and reason.",
  series: [
    ...combinations({ decision: ['uninstall'], reason: CLEANUP_REASONS.uninstall }),
    ...combinations({ decision: ['keep'], reason: CLEANUP_REASONS.keep }),
  ],
});

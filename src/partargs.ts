// Each part's own slice of the settings, cut here from the whole, in one place, as Istio's
// install-cni builds its per-part configs: a part is handed what it reads and nothing more, so
// it reads no other part's settings and a test hands it exactly what it needs. The whole
// Settings stops here and in src/agent.ts (eslint.config.js refuses it in the parts' folders).

import type { Settings } from './config/settings.ts';
import type { RepairArgs } from './repair/args.ts';
import type { StopBoundArgs } from './stopbound.ts';

/** Repair's flags, and which agent this is: its node, its pod (Events) and PATH (nsenter). */
export function repairArgs(settings: Settings): RepairArgs {
  return {
    ...settings.repair,
    agentNodeName: settings.env.nodeName,
    podName: settings.env.podName,
    path: settings.env.path,
  };
}

/** Which parts of the stop are on, and the installer's timeout: what the stop's bound adds up. */
export function stopBoundArgs(settings: Settings): StopBoundArgs {
  return {
    nodeReadiness: (settings.nodeReadiness?.conditionType ?? '') !== '',
    reconcileTimeoutMs: settings.install.reconcileTimeoutMs,
    ambient: settings.ambient.enabled,
  };
}

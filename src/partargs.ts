// Each part's own slice of the settings, cut here from the whole, in one place, as Istio's
// install-cni builds its per-part configs: a part is handed what it reads and nothing more, so
// it reads no other part's settings and a test hands it exactly what it needs. The whole
// Settings stops here and in src/agent.ts (eslint.config.js refuses it in the parts' folders).

import type { AmbientArgs } from './ambient/args.ts';
import type { Settings } from './config/settings.ts';
import type { InstallerArgs } from './install/installer.ts';
import type { NftBackendArgs } from './install/nftbackend.ts';
import type { PodLookupArgs } from './install/podlookup.ts';
import type { PluginTokenArgs } from './install/tokenrequest.ts';
import type { CleanupArgs } from './install/uninstall.ts';
import type { OrchClientArgs } from './orch/client.ts';
import { withSbinDirs } from './podnetns/program.ts';
import type { RepairArgs } from './repair/args.ts';
import type { StopBoundArgs } from './stopbound.ts';

/**
 * Repair's flags, which agent this is: its node, its pod (Events) and PATH (nsenter), and the
 * redirect backend the agent decided (src/install/nftbackend.ts), which in-place repair writes with.
 */
export function repairArgs(settings: Settings, nativeNftables = false): RepairArgs {
  return {
    ...settings.repair,
    agentNodeName: settings.env.nodeName,
    podName: settings.env.podName,
    path: settings.env.path,
    nativeNftables,
  };
}

/** Which parts of the stop are on, and the installer's timeout: what the stop's bound adds up. */
export function stopBoundArgs(settings: Settings): StopBoundArgs {
  return {
    nodeReadiness: settings.nodeReadiness.conditionType !== '',
    reconcileTimeoutMs: settings.install.reconcileTimeoutMs,
    ambient: settings.ambient.enabled,
    repair: settings.repair.enabled,
  };
}

/**
 * How the agent reaches the API server. Every part that calls it gets this, with the one
 * OrchSettings object of these settings: the request limiter is kept per that object, so all of
 * them wait on one bucket (src/orch/ratelimit.ts).
 */
export function orchClientArgs(settings: Settings): OrchClientArgs {
  return {
    orchconfig: settings.orchconfig,
    serviceHost: settings.env.orchServiceHost,
    servicePort: settings.env.orchServicePort,
    serviceAccountDir: settings.install.serviceAccountDir,
    orchCaFile: settings.install.orchCaFile,
    skipTlsVerify: settings.install.skipTlsVerify,
    limits: settings.orch,
  };
}

/** The stop's uninstall-or-upgrade decision: --cleanup-on-exit and the agent's own pod and node. */
export function cleanupArgs(settings: Settings): CleanupArgs {
  return {
    cleanupOnExit: settings.install.cleanupOnExit,
    podName: settings.env.podName,
    podNamespace: settings.env.podNamespace,
    nodeName: settings.env.nodeName,
    orch: orchClientArgs(settings),
  };
}

/** The plugin's pod lookups: where they are served, and for which node. */
export function podLookupArgs(settings: Settings): PodLookupArgs {
  return {
    address: settings.install.podLookupUdsAddress,
    nodeName: settings.env.nodeName,
    orch: orchClientArgs(settings),
  };
}

/** The plugin's own token: its file or its account, lifetime and audiences, and the agent's namespace. */
export function pluginTokenArgs(settings: Settings): PluginTokenArgs {
  const s = settings.install;
  return {
    pluginTokenFile: s.pluginTokenFile,
    pluginServiceAccount: s.pluginServiceAccount,
    pluginTokenExpirationMs: s.pluginTokenExpirationMs,
    pluginTokenAudiences: s.pluginTokenAudiences,
    serviceAccountDir: s.serviceAccountDir,
    podNamespace: settings.env.podNamespace,
    orch: orchClientArgs(settings),
  };
}

/**
 * The installer: its flags, the `cni` log scope's level (the plugin's entry carries it), the
 * API server and node our entry names, and ambient mode's keys of the entry when it is on.
 */
export function installerArgs(settings: Settings): InstallerArgs {
  const s = settings.install;
  const a = settings.ambient;
  return {
    chained: s.chained,
    cniConfName: s.cniConfName,
    meshOwnedCniConfig: s.meshOwnedCniConfig,
    meshOwnedCniConfigFilename: s.meshOwnedCniConfigFilename,
    cniNetDir: s.cniNetDir,
    mountedCniNetDir: s.mountedCniNetDir,
    cniBinDir: s.cniBinDir,
    mountedCniBinDir: s.mountedCniBinDir,
    cniBinariesDir: s.cniBinariesDir,
    cniNetworkConfig: s.cniNetworkConfig,
    cniNetworkConfigFile: s.cniNetworkConfigFile,
    orchcfgFileName: s.orchcfgFileName,
    orchconfigMode: s.orchconfigMode,
    orchCaFile: s.orchCaFile,
    skipTlsVerify: s.skipTlsVerify,
    serviceAccountDir: s.serviceAccountDir,
    pluginTokenFile: s.pluginTokenFile,
    pluginLogLevel: s.pluginLogLevel,
    logUdsAddress: s.logUdsAddress,
    podLookupUdsAddress: s.podLookupUdsAddress,
    excludeNamespaces: s.excludeNamespaces,
    reconcileIntervalMs: s.reconcileIntervalMs,
    reconcileTimeoutMs: s.reconcileTimeoutMs,
    cpuinfoPath: s.cpuinfoPath,
    cniScopeLevel: settings.logging.outputLevels.cni,
    env: {
      orchServiceHost: settings.env.orchServiceHost,
      orchServicePort: settings.env.orchServicePort,
      nodeName: settings.env.nodeName,
      hostIp: settings.env.hostIp,
    },
    ambient: a.enabled
      ? { pluginEventUdsAddress: a.pluginEventUdsAddress, enablementSelectors: a.enablementSelectors }
      : undefined,
  };
}

/** The redirect backend: the mode asked for, and the dirs the agent's runner finds nft in. */
export function nftBackendArgs(settings: Settings): NftBackendArgs {
  return { mode: settings.install.nativeNftables, dirs: withSbinDirs(settings.env.path).split(':') };
}

/**
 * Ambient mode: its flags, the namespaces the plugin leaves alone, where the host's /proc and
 * netns are (flags it shares with in-place repair), and the redirect backend the agent decided
 * (src/install/nftbackend.ts), which its host and in-pod rules follow.
 */
export function ambientArgs(settings: Settings, nativeNftables = false): AmbientArgs {
  return {
    ...settings.ambient,
    excludeNamespaces: settings.install.excludeNamespaces,
    hostProcDir: settings.repair.hostProcDir,
    hostNetnsPath: settings.repair.hostNetnsPath,
    nativeNftables,
  };
}

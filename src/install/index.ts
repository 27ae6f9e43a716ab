// The installer's entry for the agent. The folder, by job:
//   installer.ts      the component: passes at start, on watch events (watch.ts) and periodically,
//                     one at a time; readiness (watchdog.ts); uninstall or not on stop (uninstall.ts)
//   pass.ts           one pass: binaries (binaries.ts, once cpucheck.ts finds they can run here),
//                     the orchconfig (orchconfigsync.ts, orchconfig.ts; the plugin's token:
//                     tokenrequest.ts), and our entry in the CNI config:
//     plan.ts         the pure planner (plancontext.ts, planprimary.ts, plantakeout.ts,
//                     planmodes.ts, owned.ts, cniconfig.ts, libcni.ts, jsonspans.ts, records.ts): the net dir
//                     read through a view (netdirview.ts, filecache.ts, safefile.ts) -> steps
//     apply.ts        the applier: the steps, in order (atomicfile.ts, fd-pinned link targets)
//   template.ts       our plugin entry;  podlookup.ts  the plugin's pod lookups;  metrics.ts
//   nftbackend.ts     native nftables or iptables, decided once at start (nfthost.ts from nftprobe.ts)
import type { Component } from '../component.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import { Installer, type InstallerArgs, type InstallerOptions } from './installer.ts';

/**
 * The orchconfig gets `pluginToken`: the plugin's own token, never the agent's. `decideCleanup`:
 * the agent's one uninstall-or-upgrade decision, shared with ambient mode.
 * `binaryCheck`: the comparison of the installed binaries the agent began at its start.
 */
export async function startInstaller(
  args: InstallerArgs,
  pluginToken: PluginTokenSource,
  decideCleanup: InstallerOptions['decideCleanup'],
  binaryCheck?: InstallerOptions['binaryCheck'],
  nativeNftables = false,
): Promise<Component> {
  const installer = new Installer(args, {
    pluginToken,
    decideCleanup,
    ...(binaryCheck ? { binaryCheck } : {}),
    nativeNftables,
  });
  await installer.start();
  return installer;
}

// The install-cni process: logging, the monitoring server, the plugin log server, the repair
// controller, the plugin's pod lookup, the plugin's token, the installer and ControlZ, started in that order and
// stopped in reverse on SIGTERM/SIGINT. The pod lookup is up before the installer puts the
// plugin in place (else the first pods' lookups go to the API server), and reads the repair
// controller's watch when that is a watch of exactly this node's pods: one watch per node.

import type { Component } from './component.ts';
import type { Settings } from './config/settings.ts';
import { startInstaller } from './install/index.ts';
import { DEFAULT_POD_LOOKUP, startPodLookup } from './install/podlookup.ts';
import type { PodSource } from './orch/podsource.ts';
import { startPluginToken } from './install/tokenrequest.ts';
import { startControlz } from './monitoring/ctrlz.ts';
import { closeLogging, configureLogging, scope } from './monitoring/logging.ts';
import { startPluginLogServer } from './monitoring/logserver.ts';
import { startMonitoringServer, type Readiness } from './monitoring/server.ts';
import { RepairController } from './repair/controller.ts';
import { startRepair } from './repair/index.ts';

const log = scope('default');

export async function runAgent(settings: Settings): Promise<number> {
  configureLogging(settings.logging);
  const components: Component[] = [];
  let started = false;
  const readiness: Readiness = {
    notReadyReasons: () => (started ? components.flatMap((c) => c.notReadyReasons()) : ['starting']),
    notes: () => components.flatMap((c) => c.notes?.() ?? []),
  };
  // Signals that arrive while starting are kept and acted on once everything is up.
  const stopSignal = new Promise<NodeJS.Signals>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
  });
  const monitoring = await startMonitoringServer({ port: settings.monitoring.port, readiness });
  try {
    components.push(await startPluginLogServer(settings));
    const repair = await startRepair(settings);
    components.push(repair);
    components.push(await startPodLookup(settings, DEFAULT_POD_LOOKUP, nodePodWatch(settings, repair)));
    // The orchconfig on the node's disk gets the plugin's own short-lived token, minted here;
    // the agent keeps using its own token, which never leaves this pod.
    const pluginToken = await startPluginToken(settings);
    components.push(pluginToken);
    components.push(await startInstaller(settings, pluginToken));
    components.push(await startControlz(settings, { components: () => components }));
    started = true;
    log.info('install-cni started', { components: components.map((c) => c.name) });
    const signal = await stopSignal;
    log.info('stopping', { signal });
    await stopAll(components, signal);
    return 0;
  } catch (e) {
    log.error('install-cni failed', { error: e instanceof Error ? e.message : String(e) });
    await stopAll(components, 'SIGTERM');
    return 1;
  } finally {
    await monitoring.close();
    // Flush and close log files (the entry point exits right after).
    await closeLogging();
  }
}

async function stopAll(components: readonly Component[], signal: NodeJS.Signals): Promise<void> {
  for (const c of [...components].reverse()) {
    try {
      await c.stop(signal);
    } catch (e) {
      log.error(`stopping ${c.name} failed`, { error: e instanceof Error ? e.message : String(e) });
    }
  }
}

/** The repair controller's watch, when it watches exactly the pods of this node. */
function nodePodWatch(settings: Settings, repair: Component): PodSource | undefined {
  if (!(repair instanceof RepairController) || settings.env.nodeName === '') return undefined;
  const q = repair.query;
  return q.fieldSelector === `spec.nodeName=${settings.env.nodeName}` && q.labelSelector === '' ? repair.podSource : undefined;
}

// The install-cni process: logging, the monitoring server, the plugin log server, the pod
// watch(es), the repair controller, the plugin's pod lookup, the plugin's token, the installer,
// ControlZ and the node's readiness, started in that order and stopped in reverse on the first
// SIGTERM/SIGINT, within the stop's bound (stopbound.ts). The pod lookup is up before the
// installer puts the plugin in place (else the first pods' lookups go to the API server).
//
// The node's pod watch (spec.nodeName=NODE_NAME) is built here, once, before the components that
// read it (pod lookup, repair, ambient mode) and stopped after them: one watch per node, whichever
// are on. A reader that needs other pods gets a watch of its own, here too: repair with
// --repair-field-selectors/--repair-label-selectors or another --repair-node-name. Ambient mode
// (src/ambient/) starts before the installer, as Istio's does, and stops after it, with the
// installer's --cleanup-on-exit decision.

import type { Component } from './component.ts';
import type { Settings } from './config/settings.ts';
import { startInstaller } from './install/index.ts';
import { checkInstalledBinaries } from './install/binaries.ts';
import { startNftBackend } from './install/nftbackend.ts';
import { DEFAULT_POD_LOOKUP, startPodLookup } from './install/podlookup.ts';
import { clientNodeApi, type OrchApi } from './orch/api.ts';
import { orchKubeConfig } from './orch/client.ts';
import { orchContext } from './orch/ratelimit.ts';
import { nodePodSource, type PodSource } from './orch/podsource.ts';
import { startPluginToken } from './install/tokenrequest.ts';
import { startControlz } from './monitoring/ctrlz.ts';
import { closeLogging, configureLogging, scope } from './monitoring/logging.ts';
import { guardStdio } from './monitoring/logtargets.ts';
import { startPluginLogServer } from './monitoring/logserver.ts';
import { podPathCallsPart } from './podnetns/fscalls.ts';
import { AgentReadiness } from './monitoring/readiness.ts';
import { startMonitoringServer } from './monitoring/server.ts';
import { agentReached } from './monitoring/startup.ts';
import { repairPodSource, repairWatchesNode, startRepair } from './repair/index.ts';
import { disabledComponent } from './component.ts';
import { startAmbient, type AmbientComponent } from './ambient/index.ts';
import { decideCleanup, type CleanupDecision } from './install/uninstall.ts';
import { startNodeReadiness } from './node/index.ts';
import { nodeClient } from './node/nodeclient.ts';
import { stopBound } from './stopbound.ts';
import {
  ambientArgs,
  cleanupArgs,
  installerArgs,
  nftBackendArgs,
  orchClientArgs,
  pluginTokenArgs,
  podLookupArgs,
  repairArgs,
  stopBoundArgs,
} from './partargs.ts';
import type { RepairArgs } from './repair/args.ts';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';

const log = scope('default');

export async function runAgent(settings: Settings): Promise<number> {
  // Its name in ps, top and /proc/<pid>/comm (Node's main thread is "MainThread" there otherwise).
  process.title = 'install-cni';
  guardStdio();
  configureLogging(settings.logging);
  // The installer's first pass compares the installed plugin (~100 MB) with the image's: the
  // largest part of the time to ready after a restart. Begun now, it reads while the parts
  // before the installer start; the pass waits for it (docs/design.md "Start-up time").
  const binaryCheck = checkInstalledBinaries(settings.install.cniBinariesDir, settings.install.mountedCniBinDir);
  const components: Component[] = [];
  // "starting" until every part has started; each reason with since when (docs/observability.md "Start-up stages").
  const readiness = new AgentReadiness(() => components, { onFirstReady: () => agentReached('ready') });
  readiness.watch();
  // Signals that arrive while starting are kept and acted on once everything is up.
  const stopSignal = stopSignals();
  const monitoring = await startMonitoringServer({ port: settings.monitoring.port, readiness });
  try {
    // Calls on pod paths (netns opens) the kernel hangs on: named on /readyz until they return.
    components.push(podPathCallsPart());
    components.push(await startPluginLogServer(settings.install.logUdsAddress));
    // One API client for the agent's watches and repair (one connection pool, one read of the orchconfig).
    let api: OrchApi | undefined;
    let kc: KubeConfig | undefined;
    const orch = orchClientArgs(settings);
    const orchKc = () => (kc ??= orchKubeConfig(orch));
    const orchApi = () => (api ??= clientNodeApi(orchKc(), orchContext(orch.limits)));
    // The redirect backend, decided from the node once, before in-place repair or ambient mode
    // writes rules and our entry is written: all follow it, and /readyz says when
    // --native-nftables=true cannot be had here.
    const nft = await startNftBackend(nftBackendArgs(settings));
    components.push(nft);
    const nativeNftables = nft.choice.backend === 'nftables';
    const repair = repairArgs(settings, nativeNftables);
    const watches = podWatches(settings, repair, orchApi);
    components.push(...watches.components);
    components.push(watches.repair ? startRepair(repair, watches.repair, orchApi()) : disabledComponent('repair'));
    // One uninstall-or-upgrade decision on stop, for the installer and ambient mode alike (Istio's
    // ShouldStopCleanup): asked once, so the two never disagree (one keeping the plugin entry for an
    // upgrade while the other removes the node's probe rule).
    let decision: Promise<CleanupDecision> | undefined;
    const decide = () => (decision ??= decideCleanup(cleanupArgs(settings)));
    const ambient = ambientPart(settings, watches.node, orchApi, decide, nativeNftables);
    components.push(ambient ?? disabledComponent('ambient'));
    // With ambient on, a lookup hit carries the pod's namespace labels (the plugin's ambient decision).
    const lookupOptions = ambient
      ? { ...DEFAULT_POD_LOOKUP, namespaceLabels: ambient.namespaceLabels }
      : DEFAULT_POD_LOOKUP;
    components.push(await startPodLookup(podLookupArgs(settings), lookupOptions, watches.node));
    // The orchconfig on the node's disk gets the plugin's own short-lived token, minted here;
    // the agent keeps using its own token, which never leaves this pod.
    const pluginToken = await startPluginToken(pluginTokenArgs(settings));
    components.push(pluginToken);
    components.push(await startInstaller(installerArgs(settings), pluginToken, decide, binaryCheck, nativeNftables));
    components.push(await startControlz(settings.ctrlz, { components: () => components, readiness }));
    readiness.markStarted();
    agentReached('started');
    // Last, so its first pass reads the whole agent's readiness, and it stops first: on an
    // uninstall the condition turns False before the installer removes the plugin.
    if (settings.nodeReadiness.conditionType) components.push(nodeReadinessPart(settings, orchKc(), readiness, decide));
    log.info('install-cni started', { components: components.map((c) => c.name) });
    const signal = await stopSignal;
    const bound = stopBound(stopBoundArgs(settings));
    log.info('stopping', { signal, boundMs: bound.totalMs });
    return (await stopAll(components, signal, bound.totalMs)) ? 0 : 1;
  } catch (e) {
    log.error('install-cni failed', { error: e instanceof Error ? e.message : String(e) });
    await stopAll(components, 'SIGTERM', stopBound(stopBoundArgs(settings)).totalMs);
    return 1;
  } finally {
    readiness.stop();
    await monitoring.close();
    // Flush and close log files (the entry point exits right after).
    await closeLogging();
  }
}

/**
 * The first SIGTERM or SIGINT starts the stop. Every later one is absorbed and said: a Ctrl-C
 * under `npm start` arrives twice (the terminal's to the process group, and npm's forwarded
 * one), and a runtime may repeat its TERM; the default action of a second signal would end the
 * process part way through an uninstall. The listeners stay until the process exits: the stop
 * is held to its own deadline instead (stopAll), and the kubelet's SIGKILL comes after the grace
 * period, which is longer.
 */
function stopSignals(): Promise<NodeJS.Signals> {
  let first: NodeJS.Signals | undefined;
  return new Promise((resolve) => {
    const on = (signal: NodeJS.Signals) => {
      if (first === undefined) {
        first = signal;
        resolve(signal);
        return;
      }
      log.warn('already stopping; the stop runs to its end', { signal, stopping: first });
    };
    process.on('SIGTERM', on);
    process.on('SIGINT', on);
  });
}

/**
 * Stops the components in reverse order, within `boundMs` (src/stopbound.ts: the parts' own bounds
 * added up). False when the deadline came first: the part still stopping is named, the rest are
 * left, and the process exits. The uninstall's order makes a stop cut anywhere safe for the next
 * pod start (docs/installer.md "Stopping").
 */
async function stopAll(components: readonly Component[], signal: NodeJS.Signals, boundMs: number): Promise<boolean> {
  let current = '';
  const all = (async () => {
    for (const c of [...components].reverse()) {
      current = c.name;
      try {
        await c.stop(signal);
      } catch (e) {
        log.error(`stopping ${c.name} failed`, { error: e instanceof Error ? e.message : String(e) });
      }
    }
    return true;
  })();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), boundMs)));
  try {
    const done = await Promise.race([all, late]);
    if (!done)
      log.error('the stop did not finish within its bound; exiting without the rest', {
        signal,
        boundMs,
        stillStopping: current,
      });
    return done;
  } finally {
    clearTimeout(timer);
  }
}

interface PodWatches {
  /** The node's pod watch, when a component reads it. */
  readonly node: PodSource | undefined;
  /** The watch repair reads (the node's, or its own), when repair is on. */
  readonly repair: PodSource | undefined;
  /** The watches as components, started. */
  readonly components: readonly Component[];
}

/** The watches the parts that are on need: the node's once, another only for a reader of other pods. */
function podWatches(settings: Settings, repair: RepairArgs, orchApi: () => OrchApi): PodWatches {
  const node = settings.env.nodeName;
  const lookupReadsNode = settings.install.podLookupUdsAddress !== '' && node !== '';
  const repairReadsNode = repair.enabled && repairWatchesNode(repair);
  // Ambient mode needs it even with the lookup off (settings refuse ambient without NODE_NAME).
  const ambientReadsNode = settings.ambient.enabled && node !== '';
  // Its messages keep the scope they had before the watch was shared: repair's when repair reads it.
  const nodeWatch =
    lookupReadsNode || repairReadsNode || ambientReadsNode
      ? nodePodSource(orchApi(), node, repairReadsNode ? 'repair' : 'install')
      : undefined;
  const repairWatch = !repair.enabled ? undefined : repairReadsNode ? nodeWatch : repairPodSource(repair, orchApi());
  const components: Component[] = [];
  if (nodeWatch) components.push(watchComponent('node-pod-watch', nodeWatch));
  if (repairWatch && repairWatch !== nodeWatch) components.push(watchComponent('repair-pod-watch', repairWatch));
  return { node: nodeWatch, repair: repairWatch, components };
}

/** Ambient mode on the node's pod watch, when --ambient-enabled; it stops with the installer's cleanup decision. */
function ambientPart(
  settings: Settings,
  nodeWatch: PodSource | undefined,
  orchApi: () => OrchApi,
  decide: () => Promise<CleanupDecision>,
  nativeNftables: boolean,
): AmbientComponent | undefined {
  if (!settings.ambient.enabled) return undefined;
  if (!nodeWatch) throw new Error('internal: ambient mode without the node pod watch');
  return startAmbient(ambientArgs(settings, nativeNftables), {
    pods: nodeWatch,
    api: orchApi(),
    decideCleanup: decide,
  });
}

/** A watch as a part of the agent: started now, stopped after its readers (components stop in reverse). */
function watchComponent(name: string, source: PodSource): Component {
  source.start();
  return { name, notReadyReasons: () => [], status: () => source.status(), stop: () => source.stop() };
}

/** The node's condition and start-up taint (docs/node-readiness.md), kept from the agent's readiness. */
function nodeReadinessPart(
  settings: Settings,
  kc: KubeConfig,
  readiness: AgentReadiness,
  decide: () => Promise<CleanupDecision>,
): Component {
  const { nodeName, podName } = settings.env;
  return startNodeReadiness(settings.nodeReadiness, {
    client: nodeClient(kc, nodeName),
    nodeName,
    podName,
    notReadyReasons: () => readiness.notReadyReasons(),
    decideCleanup: decide,
  });
}

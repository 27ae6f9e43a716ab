// The repair controller (docs/repair.md): finds pods that started before mesh-cni was in place on
// their node (their validation init container exited 126) and repairs them in place
// (--repair-repair-pods), else labels or deletes them, as the --repair-* flags say. See
// controller.ts for the order of actions and the rate limit.
//
// The pods come from a watch the agent's wiring hands in (src/agent.ts): the node's pod watch,
// shared with the pod lookup, or repairPodSource's when repair asks for other pods than the node's.

import type { RepairArgs } from './args.ts';
import type { OrchApi } from '../orch/api.ts';
import { realClock } from '../orch/limits.ts';
import { PodSource } from '../orch/podsource.ts';
import { existsSync } from 'node:fs';
import {
  DEFAULT_TIMING,
  podQuery,
  RepairController,
  repairMode,
  type RepairControllerOptions,
  type RepairTiming,
} from './controller.ts';
import { inPlaceMissing, type InPlaceEnv } from './capabilities.ts';
import { InPlaceRepairer, podNetnsOf, type PodNetnsModule } from './inplace.ts';
import * as podnetns from '../podnetns/index.ts';
import { scope } from '../monitoring/logging.ts';

const log = scope('repair');

/** Repair watches exactly the pods of this node (so it can read the node's pod watch). */
export function repairWatchesNode(r: RepairArgs): boolean {
  const node = r.agentNodeName;
  return node !== '' && r.nodeName === node && r.fieldSelectors === '' && r.labelSelectors === '';
}

/** A watch of repair's own (not started): --repair-node-name and the operator's selectors. */
export function repairPodSource(r: RepairArgs, api: OrchApi, timing?: Partial<RepairTiming>): PodSource {
  const t = { ...DEFAULT_TIMING, ...timing };
  return new PodSource(api, null, {
    query: podQuery(r),
    pageSize: t.pageSize,
    requestTimeoutMs: t.requestTimeoutMs,
    watchTimeoutSeconds: t.watchTimeoutSeconds,
    silenceTimeoutMs: t.silenceTimeoutMs,
    healthyAfterMs: t.healthyWatchMs,
    backoff: { baseMs: t.watchBackoffBaseMs, maxMs: t.watchBackoffMaxMs },
    clock: realClock,
    logScope: 'repair',
  });
}

/**
 * In-place repair for this agent's life, decided once at start-up (--repair-repair-pods on):
 * the repairer over `podNetns` (src/podnetns/), or 'unavailable' after one warning naming what is
 * missing and what to add. `env` overrides where the check looks (tests).
 */
export function inPlaceFor(
  r: RepairArgs,
  podNetns: PodNetnsModule | null,
  env: Partial<InPlaceEnv> = {},
): Exclude<RepairControllerOptions['inPlace'], undefined> {
  const missing = inPlaceMissing({
    selfStatusPath: '/proc/self/status',
    hostProcDir: r.hostProcDir,
    // runInNetns searches the sbin dirs after PATH (a container's PATH may lack them): so does the check.
    path: podnetns.withSbinDirs(r.path),
    hostNetnsPath: r.hostNetnsPath,
    xtablesLock: '/run/xtables.lock',
    ...env,
  });
  if (!existsSync(r.validationBundle))
    missing.push(
      `the validation check ${r.validationBundle}, which proves a repair; the image has it beside the agent`,
    );
  if (podNetns === null) missing.push('the pod netns module (this build has none)');
  // Only the agent on a pod's node can find its netns. Watching other nodes' pods (every node's,
  // with no node name), agents would find no netns for them (final) and label/delete them at once,
  // before the pod's own agent repaired it in place.
  const node = r.agentNodeName;
  if (r.nodeName === '' || (node !== '' && r.nodeName !== node))
    missing.push(
      `the pods of this agent's node only (--repair-node-name ${JSON.stringify(r.nodeName)}, NODE_NAME ` +
        `${JSON.stringify(node)}): set NODE_NAME from the downward API (spec.nodeName) and leave --repair-node-name ` +
        'empty or equal to it',
    );
  if (missing.length > 0 || podNetns === null) {
    log.warn(
      `in-place repair (--repair-repair-pods) is off for this agent, which lacks: ${missing.join('; ')}. ` +
        'Broken pods are labelled/deleted as --repair-label-pods/--repair-delete-pods say ' +
        '(metric mesh_cni_repair_failures_total{type="repair",reason="no_capability"} per pod)',
    );
    return 'unavailable';
  }
  const nativeNftables = r.nativeNftables ?? false;
  log.info('in-place repair on', {
    hostProcDir: r.hostProcDir,
    hostNetnsPath: r.hostNetnsPath,
    backend: nativeNftables ? 'nftables' : 'iptables',
  });
  return new InPlaceRepairer({
    netns: podNetnsOf(podNetns, r),
    validationBundle: r.validationBundle,
    nativeNftables,
  });
}

/**
 * Starts repair on `pods` (repair.enabled must be set); whoever built the watch runs it.
 * `inPlace`: with --repair-repair-pods, the in-place repairer (tests give a fake); absent: the
 * real one over src/podnetns/ when the start-up check passes (inPlaceFor).
 */
export function startRepair(
  r: RepairArgs,
  pods: PodSource,
  api: OrchApi,
  timing?: Partial<RepairTiming>,
  inPlace?: RepairControllerOptions['inPlace'],
): RepairController {
  if (r.nodeName === '') {
    // Istio's default, but on a DaemonSet it means every agent repairs every pod.
    log.warn(
      'repairing pods of ALL nodes: neither --repair-node-name nor NODE_NAME is set; every agent that runs like this watches and acts on every pod of the cluster',
    );
  }
  const repairer = r.repairPods ? (inPlace ?? inPlaceFor(r, podnetns)) : undefined;
  if (repairMode(r) === 'report' && (repairer === undefined || repairer === 'unavailable')) {
    // --repair-enabled alone: an operator who meant repair to act learns it here, not per pod.
    log.warn(
      'repair is report only: broken pods are logged and counted, none is repaired, labelled or deleted; ' +
        '--repair-repair-pods, --repair-label-pods or --repair-delete-pods make it act',
    );
  }
  const controller = new RepairController({
    settings: r,
    api,
    pods,
    reporter: { host: r.agentNodeName || r.nodeName, instance: r.podName || 'mesh-cni' },
    ...(timing ? { timing } : {}),
    ...(repairer !== undefined ? { inPlace: repairer } : {}),
  });
  controller.start();
  return controller;
}

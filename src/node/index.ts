// The node's readiness for mesh pods (docs/node-readiness.md), when --node-readiness-condition
// names a condition: every readiness pass the agent compares its own readiness (what /readyz says)
// with the condition it last wrote on its node and writes the condition when its status changes;
// the first pass that finds it ready also takes the start-up taint (--startup-taint) off the node,
// once, with a resourceVersion precondition, and says so in a metric, a log line and an Event.
//
// Never re-tainted by us: NoSchedule keeps no running pod off the node, and a restart or upgrade
// leaves the plugin in place (pods scheduled meanwhile are redirected without the agent), so a
// taint on each restart would only stop scheduling. A stop that uninstalls sets the condition
// False (the Node Readiness Controller, in continuous mode, re-taints on that); a stop that keeps
// the plugin, and an agent that dies, leave the condition as it was: the plugin still works, and
// the DaemonSet pod's Ready condition (the kubelet's) tells whether the agent runs.

import type { CoreV1Event } from '@kubernetes/client-node';
import type { Component } from '../component.ts';
import type { NodeReadinessSettings } from '../config/settings.ts';
import { scope } from '../monitoring/logging.ts';
import { ApiError } from '../orch/errors.ts';
import * as metrics from './metrics.ts';
import type { NodeClient } from './nodeclient.ts';
import {
  conditionCurrent,
  conditionFromReadiness,
  conditionPatch,
  findCondition,
  taintRemovalPatch,
  taintText,
  UNINSTALLED,
  type DesiredCondition,
} from './plan.ts';

const log = scope('install');

/** One API call's longest wait: a pass that hangs would hold every later one back. */
export const CALL_TIMEOUT_MS = 10_000;
/** Reads and patches in one pass when the node keeps changing under the taint patch. */
const TAINT_ATTEMPTS = 3;

export interface NodeReadinessDeps {
  readonly client: NodeClient;
  readonly nodeName: string;
  /** Who records the Event: the agent's pod. */
  readonly podName: string;
  /** The agent's not-ready reasons as /readyz gives them; none: ready. */
  readonly notReadyReasons: () => readonly string[];
  /** Whether this stop uninstalls: the agent's one decision, shared with the installer. */
  readonly decideCleanup: () => Promise<{ readonly cleanup: boolean }>;
}

type TaintState = 'off' | 'waiting' | 'removed' | 'absent';

export function startNodeReadiness(settings: NodeReadinessSettings, deps: NodeReadinessDeps): Component {
  const type = settings.conditionType;
  const taint = settings.startupTaint;
  const stopping = new AbortController();
  let written: DesiredCondition | undefined;
  let taintState: TaintState = taint ? 'waiting' : 'off';
  let passes = 0;
  // What went wrong last, shown as notes until the same step succeeds.
  let conditionError: string | undefined;
  let taintError: string | undefined;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> = Promise.resolve();
  const callSignal = () => AbortSignal.any([stopping.signal, AbortSignal.timeout(CALL_TIMEOUT_MS)]);

  /** Writes `want` unless the node says it already; true once the node has it. */
  async function writeCondition(want: DesiredCondition, pass: number): Promise<boolean> {
    try {
      const node = await deps.client.getNode(callSignal());
      const current = findCondition(node, type);
      if (!conditionCurrent(current, want)) {
        await deps.client.patchStatus(conditionPatch(type, want, current, new Date()), callSignal());
        metrics.conditionWrites.inc({ status: want.status, result: 'success' });
        log.info('set the node condition', { node: deps.nodeName, condition: type, ...want, pass });
      }
      conditionError = undefined;
      return true;
    } catch (e) {
      metrics.conditionWrites.inc({ status: want.status, result: 'fail' });
      conditionError = `cannot set condition ${type} of node ${deps.nodeName}: ${message(e)}`;
      log.warn('cannot set the node condition; trying again next pass', { node: deps.nodeName, error: conditionError });
      return false;
    }
  }

  async function removeTaint(pass: number): Promise<void> {
    if (!taint) return;
    try {
      for (let attempt = 1; attempt <= TAINT_ATTEMPTS; attempt++) {
        const node = await deps.client.getNode(callSignal());
        const patch = taintRemovalPatch(node, taint);
        if (!patch) {
          taintState = 'absent';
          taintError = undefined;
          metrics.taintRemovals.inc({ result: 'absent' });
          log.info('the start-up taint is not on the node: nothing to remove', {
            node: deps.nodeName,
            taint: taintText(taint),
            pass,
          });
          return;
        }
        try {
          await deps.client.patchNode(patch, callSignal());
        } catch (e) {
          if (e instanceof ApiError && e.code === 409) {
            metrics.taintRemovals.inc({ result: 'conflict' });
            continue;
          }
          throw e;
        }
        taintState = 'removed';
        taintError = undefined;
        metrics.taintRemovals.inc({ result: 'removed' });
        metrics.taintRemovedAt.set(Date.now() / 1000);
        log.info('removed the start-up taint', { node: deps.nodeName, taint: taintText(taint), pass });
        recordEvent(node.metadata?.uid);
        return;
      }
      taintError = `the start-up taint of node ${deps.nodeName}: the node changed under ${TAINT_ATTEMPTS} patches in a row`;
    } catch (e) {
      metrics.taintRemovals.inc({ result: 'fail' });
      taintError = `cannot remove the start-up taint ${taintText(taint)} of node ${deps.nodeName}: ${message(e)}`;
      log.warn('cannot remove the start-up taint; trying again next pass', { node: deps.nodeName, error: taintError });
    }
  }

  function recordEvent(uid: string | undefined): void {
    const now = new Date();
    const event: CoreV1Event = {
      metadata: { name: `${deps.nodeName}.${now.getTime().toString(16)}`, namespace: 'default' },
      involvedObject: { apiVersion: 'v1', kind: 'Node', name: deps.nodeName, ...(uid ? { uid } : {}) },
      reason: 'StartupTaintRemoved',
      message: `mesh-cni's agent is ready: removed the start-up taint ${taintText(taint!)}`,
      type: 'Normal',
      action: 'RemoveTaint',
      source: { component: 'mesh-cni', host: deps.nodeName },
      reportingComponent: 'mesh-cni',
      reportingInstance: deps.podName || deps.nodeName,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
    deps.client.recordEvent(event, callSignal()).catch((e: unknown) => {
      log.warn('cannot record the taint removal as an Event', { node: deps.nodeName, error: message(e) });
    });
  }

  async function pass(): Promise<void> {
    const n = ++passes;
    const want = conditionFromReadiness(deps.notReadyReasons());
    if (!written || written.status !== want.status || written.reason !== want.reason) {
      if (await writeCondition(want, n)) written = want;
    }
    if (want.status === 'True' && taintState === 'waiting') await removeTaint(n);
  }

  const schedule = () => {
    if (stopping.signal.aborted) return;
    timer = setTimeout(() => {
      running = pass().finally(schedule);
    }, settings.intervalMs);
  };
  running = pass().finally(schedule);

  return {
    name: 'node-readiness',
    // Never part of the agent's readiness: the condition is made from it, and a node write that
    // fails must not take the pod out of its Service or restart it. It shows as a note.
    notReadyReasons: () => [],
    notes: () => [conditionError, taintError].filter((e) => e !== undefined),
    status: () => ({
      enabled: true,
      node: deps.nodeName,
      condition: type,
      written: written ? { status: written.status, reason: written.reason } : null,
      startupTaint: taint ? taintText(taint) : null,
      taint: taintState,
      passes,
      ...(conditionError ? { conditionError } : {}),
      ...(taintError ? { taintError } : {}),
    }),
    async stop() {
      stopping.abort();
      clearTimeout(timer);
      await running.catch(() => {});
      // The installer removes the plugin after this (components stop in reverse): the condition
      // turns False first, so nothing is scheduled onto a node that is about to lose it.
      const decision = await deps.decideCleanup().catch(() => ({ cleanup: false }));
      if (!decision.cleanup) return;
      try {
        const signal = AbortSignal.timeout(CALL_TIMEOUT_MS);
        const node = await deps.client.getNode(signal);
        await deps.client.patchStatus(conditionPatch(type, UNINSTALLED, findCondition(node, type), new Date()), signal);
        metrics.conditionWrites.inc({ status: 'False', result: 'success' });
        log.info('set the node condition', { node: deps.nodeName, condition: type, ...UNINSTALLED });
      } catch (e) {
        metrics.conditionWrites.inc({ status: 'False', result: 'fail' });
        log.warn('cannot set the node condition on uninstall', { node: deps.nodeName, error: message(e) });
      }
    },
  };
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

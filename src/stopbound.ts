// The longest a stop of the agent can take, part by part, from the bounds each part holds itself
// to. The agent holds the whole stop to this deadline, and the DaemonSet's
// terminationGracePeriodSeconds must be longer (docs/installer.md "Stopping"): a SIGKILL in the middle of an
// uninstall leaves the node part way, which the uninstall's order makes safe but not tidy.

import { STOP_GRACE_MS as AMBIENT_QUEUE_GRACE_MS } from './ambient/index.ts';
import { DECISION_DEADLINE_MS } from './install/uninstall.ts';
import { CALL_TIMEOUT_MS as NODE_CALL_MS } from './node/index.ts';
import { DEFAULT_TIMEOUT_MS as HOST_COMMAND_MS } from './podnetns/program.ts';
import { DEFAULT_TIMING as REPAIR_TIMING } from './repair/controller.ts';

/**
 * Host commands of ambient mode's stop, at most: a heal pass in flight (save, restore, ipset) and
 * the uninstall's removal (save, restore, ipset destroy) for each of IPv4 and IPv6.
 */
const AMBIENT_HOST_COMMANDS = 3 + 3 * 2;
/** Closing sockets and servers, flushing the log files: what has no bound of its own. */
const REST_MS = 5000;

/** What the bound reads of the settings: which parts are on, and the installer's own timeout. */
export interface StopBoundArgs {
  /** --node-readiness-condition is set: the condition is written on stop. */
  readonly nodeReadiness: boolean;
  /** --reconcile-timeout. */
  readonly reconcileTimeoutMs: number;
  /** --ambient-enabled. */
  readonly ambient: boolean;
  /** --repair-enabled. */
  readonly repair: boolean;
}

export interface StopBound {
  /** Asking whether this stop is an uninstall; asked once, shared by the parts below. */
  readonly decision: number;
  readonly nodeReadiness: number;
  /** Waiting for a running pass, then the uninstall: --reconcile-timeout each. */
  readonly installer: number;
  readonly ambient: number;
  /** Repairs under way finish their attempt (label, Event, delete) before they are cancelled. */
  readonly repair: number;
  readonly rest: number;
  readonly totalMs: number;
}

/** The stop's worst case in ms for the parts that are on, with what each part may take. */
export function stopBound(on: StopBoundArgs): StopBound {
  const parts = {
    decision: DECISION_DEADLINE_MS,
    nodeReadiness: on.nodeReadiness ? NODE_CALL_MS : 0,
    installer: 2 * on.reconcileTimeoutMs,
    ambient: on.ambient ? AMBIENT_QUEUE_GRACE_MS + AMBIENT_HOST_COMMANDS * HOST_COMMAND_MS : 0,
    repair: on.repair ? REPAIR_TIMING.stopGraceMs : 0,
    rest: REST_MS,
  };
  return { ...parts, totalMs: Object.values(parts).reduce((a, b) => a + b, 0) };
}

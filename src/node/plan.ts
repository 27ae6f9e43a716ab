// What the agent writes to its own node, worked out without I/O: the condition its readiness
// stands for, the patch that sets it (our condition only, by its type), and the patch that takes
// the start-up taint off with a resourceVersion precondition (docs/node-readiness.md).

import type { StartupTaint } from '../config/settings.ts';

export type ConditionStatus = 'True' | 'False' | 'Unknown';

/** A node condition as the API has it (V1NodeCondition with its times as strings, as JSON gives them). */
export interface NodeCondition {
  readonly type: string;
  readonly status: ConditionStatus | string;
  readonly reason?: string;
  readonly message?: string;
  readonly lastHeartbeatTime?: string;
  readonly lastTransitionTime?: string;
}

export interface NodeTaint {
  readonly key: string;
  readonly value?: string;
  readonly effect: string;
  readonly timeAdded?: string;
}

/** The parts of a Node the agent reads. */
export interface NodeView {
  readonly metadata?: { readonly name?: string; readonly uid?: string; readonly resourceVersion?: string };
  readonly spec?: { readonly taints?: readonly NodeTaint[] };
  readonly status?: { readonly conditions?: readonly NodeCondition[] };
}

/** What the condition should say: status and reason decide a write; the message goes along. */
export interface DesiredCondition {
  /** The agent says True or False only; Unknown is the node controller's, for a node gone silent. */
  readonly status: Exclude<ConditionStatus, 'Unknown'>;
  readonly reason: 'AgentReady' | 'AgentNotReady' | 'Uninstalled';
  readonly message: string;
}

/** Longest message written: /readyz has every reason, the node keeps a line an operator reads. */
const MAX_MESSAGE = 1024;

/** The condition the agent's readiness stands for (its reasons as /readyz gives them; none: ready). */
export function conditionFromReadiness(reasons: readonly string[]): DesiredCondition {
  if (reasons.length === 0)
    return {
      status: 'True',
      reason: 'AgentReady',
      message: "mesh-cni's agent is ready: its plugin is in place, pods started on this node are redirected",
    };
  const text = `mesh-cni's agent is not ready (its /readyz has the current reasons): ${reasons.join('; ')}`;
  return {
    status: 'False',
    reason: 'AgentNotReady',
    message: text.length > MAX_MESSAGE ? `${text.slice(0, MAX_MESSAGE - 3)}...` : text,
  };
}

/** What a stop that uninstalls leaves: the plugin is being removed, so new pods would start unredirected. */
export const UNINSTALLED: DesiredCondition = {
  status: 'False',
  reason: 'Uninstalled',
  message:
    'mesh-cni was removed from this node (its DaemonSet no longer targets it): pods started here are not redirected',
};

export function findCondition(node: NodeView, type: string): NodeCondition | undefined {
  return node.status?.conditions?.find((c) => c.type === type);
}

/**
 * Whether the node's condition already says what we want. Status and reason decide: a message
 * that changes with each not-ready reason would be a node write every pass while not ready (every
 * node watcher in the cluster hears each one).
 */
export function conditionCurrent(current: NodeCondition | undefined, want: DesiredCondition): boolean {
  return current !== undefined && current.status === want.status && current.reason === want.reason;
}

/**
 * The strategic merge patch of nodes/status that sets our condition alone: conditions merge by
 * type, so the kubelet's (Ready, MemoryPressure, ...) are untouched and no read-modify-write race
 * with its heartbeats can lose one. lastTransitionTime moves only when the status does.
 */
export function conditionPatch(
  type: string,
  want: DesiredCondition,
  current: NodeCondition | undefined,
  now: Date,
): { status: { conditions: NodeCondition[] } } {
  const at = now.toISOString().replace(/\.\d+Z$/, 'Z');
  const transition = current?.status === want.status && current.lastTransitionTime ? current.lastTransitionTime : at;
  return {
    status: {
      conditions: [
        {
          type,
          status: want.status,
          reason: want.reason,
          message: want.message,
          lastHeartbeatTime: at,
          lastTransitionTime: transition,
        },
      ],
    },
  };
}

/** Whether a node's taint is the one configured: key and effect, and the value when one was given. */
export function isStartupTaint(t: NodeTaint, want: StartupTaint): boolean {
  return t.key === want.key && t.effect === want.effect && (want.value === undefined || (t.value ?? '') === want.value);
}

/**
 * The merge patch that removes the start-up taint and nothing else, or undefined when the node
 * does not have it. Taints have no merge key, so the patch carries the whole remaining list; the
 * resourceVersion in it is a precondition (409 Conflict if the node changed since it was read), so
 * a taint added meanwhile by someone else is never dropped.
 */
export function taintRemovalPatch(
  node: NodeView,
  want: StartupTaint,
): { metadata: { resourceVersion: string }; spec: { taints: NodeTaint[] | null } } | undefined {
  const taints = node.spec?.taints ?? [];
  if (!taints.some((t) => isStartupTaint(t, want))) return undefined;
  const rv = node.metadata?.resourceVersion;
  if (!rv) throw new Error(`node ${node.metadata?.name ?? '?'} has no resourceVersion: cannot patch it safely`);
  const rest = taints.filter((t) => !isStartupTaint(t, want));
  return { metadata: { resourceVersion: rv }, spec: { taints: rest.length > 0 ? [...rest] : null } };
}

/** The taint as the kubelet's --register-with-taints and kubectl taint write it. */
export function taintText(t: StartupTaint): string {
  return `${t.key}${t.value !== undefined ? `=${t.value}` : ''}:${t.effect}`;
}

// Whether stopping means uninstall (take our entry, orchconfig and binary off the node) or a
// restart/upgrade (leave them, so no pod starts unredirected while the new agent comes up).
//
// --cleanup-on-exit=auto uninstalls only on positive evidence that no agent follows this one on
// this node: our DaemonSet is gone or being deleted, or it no longer targets this node (its
// nodeSelector, required node affinity or tolerations; nodematch.ts). Every other answer keeps
// the node as it is: a restart during a control-plane outage must not open a window in which
// pods start without the plugin. Transient answers (no answer, timeout, 429, 5xx) are asked again
// with backoff until a deadline well inside the pod's termination grace period; a SIGKILL before
// the answer also leaves everything in place. Each decision is logged and counted with its reason
// (mesh_cni_cleanup_decisions_total).

import { setTimeout as sleep } from 'node:timers/promises';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { V1DaemonSet, V1Node, V1Pod } from '@kubernetes/client-node';
import type { CleanupMode } from '../config/flags.ts';
import { scope } from '../monitoring/logging.ts';
import { ApiError } from '../orch/errors.ts';
import { apiRequest } from '../orch/request.ts';
import { orchKubeConfig, orchLimiter, type OrchClientArgs } from '../orch/client.ts';
import * as metrics from './metrics.ts';
import type { CleanupReason } from './metrics.ts';
import { daemonSetTargetsNode } from './nodematch.ts';

const log = scope('install');

export interface CleanupDecision {
  readonly cleanup: boolean;
  readonly why: string;
}

/** What the decision reads of the settings: --cleanup-on-exit, the agent's own pod and node, the API. */
export interface CleanupArgs {
  /** --cleanup-on-exit. */
  readonly cleanupOnExit: CleanupMode;
  /** POD_NAME and POD_NAMESPACE: the agent's own pod, whose DaemonSet is asked about. */
  readonly podName: string;
  readonly podNamespace: string;
  /** NODE_NAME: the node asked about when our pod names none. */
  readonly nodeName: string;
  readonly orch: OrchClientArgs;
}

export interface DecideOptions {
  /** How long to keep asking after transient answers, from the call. */
  readonly deadlineMs?: number;
  /** The longest one request may take (never past the deadline). */
  readonly attemptTimeoutMs?: number;
}

// The longest the decision keeps asking: one part of the stop's worst case (src/stopbound.ts),
// which the DaemonSet's terminationGracePeriodSeconds exceeds.
export const DECISION_DEADLINE_MS = 10_000;
const ATTEMPT_TIMEOUT_MS = 4000;
const BACKOFF_FIRST_MS = 200;
const BACKOFF_MAX_MS = 2000;

type ReasonedDecision = (
  | { readonly cleanup: true; readonly reason: CleanupReason<'uninstall'> }
  | { readonly cleanup: false; readonly reason: CleanupReason<'keep'> }
) & {
  readonly why: string;
  /** Worth asking again (no answer, timeout, 429, 5xx); with the server's Retry-After. */
  readonly transient?: { readonly retryAfterMs: number | undefined };
};

const KEEPING = 'keeping mesh-cni in place';

/** Decides, logs and counts the decision once. */
export async function decideCleanup(args: CleanupArgs, opts: DecideOptions = {}): Promise<CleanupDecision> {
  const { outcome, attempts } = await decide(args, opts);
  const decision = outcome.cleanup ? 'uninstall' : 'keep';
  metrics.cleanupDecisions.inc(
    outcome.cleanup ? { decision: 'uninstall', reason: outcome.reason } : { decision: 'keep', reason: outcome.reason },
  );
  const fields = { decision, reason: outcome.reason, why: outcome.why, attempts };
  if (!outcome.cleanup && outcome.reason !== 'flag' && outcome.reason !== 'daemonset_targets_node')
    log.warn('cannot tell whether this stop is an uninstall: keeping mesh-cni on this node', fields);
  else log.info('decided whether this stop is an uninstall', fields);
  return { cleanup: outcome.cleanup, why: outcome.why };
}

async function decide(
  args: CleanupArgs,
  opts: DecideOptions,
): Promise<{ outcome: ReasonedDecision; attempts: number }> {
  const mode = args.cleanupOnExit;
  if (mode === 'always')
    return { outcome: { cleanup: true, reason: 'flag', why: '--cleanup-on-exit=always' }, attempts: 0 };
  if (mode === 'never')
    return { outcome: { cleanup: false, reason: 'flag', why: '--cleanup-on-exit=never' }, attempts: 0 };
  const { podName, podNamespace } = args;
  if (!podName || !podNamespace) {
    const why = `POD_NAME/POD_NAMESPACE are not set, so our DaemonSet cannot be found: ${KEEPING} (set them from the downward API, as deploy/daemonset.yaml does)`;
    return { outcome: { cleanup: false, reason: 'no_pod_name', why }, attempts: 0 };
  }
  let kc: KubeConfig;
  try {
    kc = orchKubeConfig(args.orch);
  } catch (e) {
    const why = `cannot ask the API server whether this is an uninstall (${(e as Error).message}): ${KEEPING}`;
    return { outcome: { cleanup: false, reason: 'unreachable', why }, attempts: 0 };
  }
  const startedAt = Date.now();
  const deadline = startedAt + (opts.deadlineMs ?? DECISION_DEADLINE_MS);
  const ask: Ask = {
    kc,
    args,
    timeoutMs: () => Math.max(1, Math.min(opts.attemptTimeoutMs ?? ATTEMPT_TIMEOUT_MS, deadline - Date.now())),
  };
  for (let attempt = 1; ; attempt++) {
    const outcome = await askOnce(ask, podNamespace, podName);
    if (!outcome.transient) return { outcome, attempts: attempt };
    const backoff = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** (attempt - 1));
    const wait = Math.max(backoff / 2 + (Math.random() * backoff) / 2, outcome.transient.retryAfterMs ?? 0);
    if (Date.now() + wait >= deadline) {
      const took = ((Date.now() - startedAt) / 1000).toFixed(1);
      return {
        outcome: { ...outcome, why: `${outcome.why}; gave up after ${attempt} attempts in ${took} s: ${KEEPING}` },
        attempts: attempt,
      };
    }
    await sleep(wait);
  }
}

interface Ask {
  readonly kc: KubeConfig;
  readonly args: CleanupArgs;
  readonly timeoutMs: () => number;
}

/** One round of reads: our pod, its DaemonSet, this node. */
async function askOnce(ask: Ask, namespace: string, podName: string): Promise<ReasonedDecision> {
  const ns = encodeURIComponent(namespace);
  const podPath = `/api/v1/namespaces/${ns}/pods/${encodeURIComponent(podName)}`;
  const podRead = await read<V1Pod>(ask, podPath, `pod ${namespace}/${podName}`);
  if ('failed' in podRead) return podRead.failed;
  if ('notFound' in podRead)
    return {
      cleanup: false,
      reason: 'pod_not_found',
      why: `our pod ${namespace}/${podName} is not found (${podRead.notFound.message}), so neither is which DaemonSet is ours: ${KEEPING}`,
    };
  const pod = podRead.ok;
  const owner = pod.metadata?.ownerReferences?.find((o) => o.kind === 'DaemonSet');
  if (!owner)
    return {
      cleanup: false,
      reason: 'no_daemonset_owner',
      why: `pod ${namespace}/${podName} is not owned by a DaemonSet, so nothing says whether another agent follows: ${KEEPING} (use --cleanup-on-exit=always to uninstall on every stop)`,
    };
  const dsName = `DaemonSet ${namespace}/${owner.name}`;
  const dsRead = await read<V1DaemonSet>(
    ask,
    `/apis/apps/v1/namespaces/${ns}/daemonsets/${encodeURIComponent(owner.name)}`,
    dsName,
  );
  if ('failed' in dsRead) return dsRead.failed;
  if ('notFound' in dsRead) return { cleanup: true, reason: 'daemonset_gone', why: `${dsName} is gone: uninstall` };
  const ds = dsRead.ok;
  if (ds.metadata?.deletionTimestamp)
    return { cleanup: true, reason: 'daemonset_deleting', why: `${dsName} is being deleted: uninstall` };
  // The node our pod was bound to is the one whose evidence counts; NODE_NAME is configuration,
  // and one that names another node (not from the downward API) would judge the wrong node.
  const envNode = ask.args.nodeName;
  const podNode = pod.spec?.nodeName ?? '';
  if (envNode && podNode && envNode !== podNode)
    return {
      cleanup: false,
      reason: 'no_node_name',
      why: `${dsName} still exists, and NODE_NAME ${envNode} is not our pod's node ${podNode} (set NODE_NAME from spec.nodeName, as deploy/daemonset.yaml does): ${KEEPING}`,
    };
  const nodeName = podNode || envNode || '';
  if (!nodeName)
    return {
      cleanup: false,
      reason: 'no_node_name',
      why: `${dsName} still exists, and neither NODE_NAME nor our pod names this node, so whether it still targets the node cannot be asked: ${KEEPING}`,
    };
  const nodeRead = await read<V1Node>(ask, `/api/v1/nodes/${encodeURIComponent(nodeName)}`, `node ${nodeName}`);
  if ('failed' in nodeRead) return nodeRead.failed;
  if ('notFound' in nodeRead)
    return {
      cleanup: false,
      reason: 'node_not_found',
      why: `${dsName} still exists, and node ${nodeName} is not found (${nodeRead.notFound.message}): cannot tell whether the DaemonSet still targets it; ${KEEPING}`,
    };
  const verdict = daemonSetTargetsNode(ds.spec?.template?.spec, nodeRead.ok);
  switch (verdict.kind) {
    case 'targets':
      return {
        cleanup: false,
        reason: 'daemonset_targets_node',
        why: `${dsName} still exists and still targets node ${nodeName}: a restart or upgrade, ${KEEPING}`,
      };
    case 'not_targeted':
      return {
        cleanup: true,
        reason: verdict.reason,
        why: `${dsName} no longer targets this node (${verdict.why}): uninstall`,
      };
    case 'unsure':
      return {
        cleanup: false,
        reason: 'unsure_scheduling',
        why: `${dsName} still exists, and whether it still targets node ${nodeName} cannot be read (${verdict.why}): ${KEEPING}`,
      };
  }
}

type Read<T> = { readonly ok: T } | { readonly notFound: ApiError } | { readonly failed: ReasonedDecision };

/** A GET: the object, a 404 (what it means is the caller's), or what any other failure means. */
async function read<T>(ask: Ask, apiPath: string, what: string): Promise<Read<T>> {
  const signal = AbortSignal.timeout(ask.timeoutMs());
  try {
    const body = await apiRequest<T>(ask.kc, 'GET', apiPath, `reading ${what}`, {
      signal,
      limiter: orchLimiter(ask.args.orch),
    });
    if (typeof body !== 'object' || body === null || Array.isArray(body))
      return { failed: failure(new ApiError(`reading ${what}`, 200, 'the answer is not an object'), false) };
    return { ok: body };
  } catch (e) {
    const err = e instanceof ApiError ? e : new ApiError(`reading ${what}`, undefined, (e as Error).message);
    if (err.code === 404) return { notFound: err };
    return { failed: failure(err, signal.aborted) };
  }
}

/** What an answer other than 200/404 means: never an uninstall; retried when it may pass. */
function failure(e: ApiError, timedOut: boolean): ReasonedDecision {
  const cannot = `cannot ask the API server whether this is an uninstall (${e.message})`;
  if (e.code === undefined) {
    const reason = timedOut ? 'timeout' : 'unreachable';
    return { cleanup: false, reason, why: cannot, transient: { retryAfterMs: undefined } };
  }
  if (e.code === 401)
    return {
      cleanup: false,
      reason: 'unauthorized',
      why: `${cannot}: ${KEEPING}. If this is an uninstall, delete the DaemonSet and wait for its pods before its service account and RBAC`,
    };
  if (e.code === 403)
    return {
      cleanup: false,
      reason: 'forbidden',
      why: `${cannot}: ${KEEPING}. The agent needs pods get, daemonsets get in its namespace and nodes get (deploy/daemonset.yaml); if this is an uninstall, delete the DaemonSet and wait for its pods before its RBAC`,
    };
  const transient = { retryAfterMs: e.retryAfterMs };
  if (e.code === 429) return { cleanup: false, reason: 'throttled', why: cannot, transient };
  if (e.code >= 500) return { cleanup: false, reason: 'server_error', why: cannot, transient };
  return { cleanup: false, reason: 'client_error', why: `${cannot}: ${KEEPING}` };
}

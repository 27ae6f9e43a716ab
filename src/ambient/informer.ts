// The ambient informer: the node's pod watch and the namespace watch feed one work queue
// (`ambient`), whose reconcile keeps each pod's enrollment as its labels, its namespace's labels
// and its phase say (Istio's nodeagent/informers.go; docs/ambient.md "How pods are selected"):
// - an added pod is left alone: the plugin's ADD (or the start-up snapshot) enrolls it;
// - an update re-reads the pod from the watch's cache, then: enrolled (or pending) and now
//   terminal -> removed, with the pod as it was before (a terminal status may come without IPs,
//   kubernetes#125370); enrolled, still wanted and its IPs changed -> the probe ipset follows;
//   wanted but not enrolled (or pending) and has IPs -> enrolled; enrolled but no longer wanted
//   -> removed;
// - a deleted pod that was enrolled, pending or selected -> removed (isDelete).
// "Enrolled" and "pending" are the dataplane's own record (docs/ambient.md "What the agent counts as
// enrolled"), never the pod's redirection annotation: its owner can write that.
// A namespace added, or relabelled so that it flips a selector, queues all its pods as updates.
// The queue retries without end, backing off 5 ms -> 5 s per pod, as Istio's does (ztunnel may
// connect at any time), and drops a failure that says no retry helps (netns, rules).
//
// The decision is a pure function (decide); the queue, the pending events and the metric are
// the AmbientInformer around it.

import type { V1Namespace, V1Pod } from '@kubernetes/client-node';
import type { PodHandler } from '../orch/podsource.ts';
import type { NamespaceHandler } from '../orch/namespacesource.ts';
import { WorkQueue, type RetryVerdict } from '../orch/workqueue.ts';
import type { Clock } from '../orch/limits.ts';
import { combinations, knownCounter } from '../monitoring/metrics.ts';
import { scope } from '../monitoring/logging.ts';
import {
  ambientPodOf,
  isTerminal,
  labelSelectorMatches,
  neverAmbient,
  podIPs,
  sameIPs,
  type AmbientPodInfo,
  type EnablementSelector,
  type Redirection,
} from './enablement.ts';

const log = scope('ambient');

export type PodEventType = 'add' | 'update' | 'delete';

export type Action =
  | { readonly kind: 'none'; readonly why: string }
  | { readonly kind: 'add'; readonly pod: V1Pod }
  | { readonly kind: 'remove'; readonly pod: V1Pod; readonly isDelete: boolean }
  | { readonly kind: 'syncProbeIPs'; readonly pod: V1Pod };

export interface DecisionInput {
  readonly event: PodEventType;
  /** The pod before the first change not yet reconciled (update), for a terminal pod's IPs. */
  readonly old: V1Pod | undefined;
  /** The pod as the last event had it (a delete: its last state). */
  readonly latest: V1Pod;
  /** The pod in the watch's cache now (same UID), undefined when it is gone. */
  readonly current: V1Pod | undefined;
  /**
   * What the dataplane's own record says of this pod (its UID): enabled (ztunnel has it, its rules
   * are in), pending (some of ours may be in: rules written, ztunnel not yet), or nothing.
   */
  readonly record: Redirection | undefined;
  /** The enablement decision for a pod (its namespace's labels and the selectors applied). */
  readonly shouldBeEnabled: (pod: V1Pod) => boolean;
  /** A sidecar or host-network pod (neverAmbient): never enrolled, so never un-enrolled while it runs. */
  readonly neverOurs?: (pod: V1Pod) => boolean;
}

/** What to do for one pod event; pure (the table in this file's header). */
export function decide(i: DecisionInput): Action {
  if (i.event === 'add') return { kind: 'none', why: 'added: the plugin or the start-up snapshot enrolls it' };
  if (i.event === 'delete') {
    const was = i.record !== undefined || i.shouldBeEnabled(i.latest);
    // A termination folded into this delete may have left the pod without IPs (kubernetes#125370):
    // the removal takes the probe ipset entries out by IP, so the pod as it was before, as for a termination.
    const pod = podIPs(i.latest).length === 0 && podIPs(i.old).length > 0 ? i.old! : i.latest;
    return was ? { kind: 'remove', pod, isDelete: true } : { kind: 'none', why: 'deleted, was not in the mesh' };
  }
  const cur = i.current;
  if (!cur) return { kind: 'none', why: 'gone from the watch: its delete follows' };
  // Never enrolled, whatever any record says: a removal would find its netns and sweep every
  // MESH_* chain there, its sidecar's redirection included. (Its delete is told: that touches no rules.)
  if (i.neverOurs?.(cur)) return { kind: 'none', why: 'a sidecar or host-network pod: never enrolled' };
  const enrolled = i.record === 'enabled';
  const partial = i.record === 'pending';
  const terminal = isTerminal(cur);
  if ((enrolled || partial) && terminal) return { kind: 'remove', pod: i.old ?? cur, isDelete: true };
  if (terminal) return { kind: 'none', why: 'terminal' };
  const should = i.shouldBeEnabled(cur);
  if (enrolled && should) {
    const ips = podIPs(cur);
    if (ips.length > 0 && !sameIPs(ips, podIPs(i.old))) return { kind: 'syncProbeIPs', pod: cur };
    return { kind: 'none', why: 'enrolled as wanted' };
  }
  if (!should) {
    return enrolled || partial
      ? { kind: 'remove', pod: cur, isDelete: false }
      : { kind: 'none', why: 'not ambient, not enrolled' };
  }
  if (podIPs(cur).length === 0) return { kind: 'none', why: 'no IP yet' };
  return { kind: 'add', pod: cur };
}

/** What the reconcile asks of the dataplane (MeshDataplane, in part). */
export interface ReconcileDataplane {
  /** The dataplane's own record of the pod (by UID): the only "enrolled" the decision knows. */
  enrollment(uid: string): Redirection | undefined;
  addPodToMesh(pod: AmbientPodInfo, netnsPath: string | null): Promise<void>;
  removePodFromMesh(pod: AmbientPodInfo, isDelete: boolean): Promise<void>;
  syncHostProbeIPs(pod: AmbientPodInfo): Promise<void>;
}

/** The log line of each action done (the e2e test waits for them). */
const DONE = {
  add: 'ambient: enrolled',
  remove: 'ambient: removed',
  syncProbeIPs: 'ambient: probe IPs synced',
} as const;

/** An EnrollError (dataplane.ts) that says retrying cannot help (netns, rules). */
function nonRetryable(e: unknown): boolean {
  return e instanceof Error && e.name === 'EnrollError' && (e as { retryable?: unknown }).retryable === false;
}

const events = knownCounter({
  name: 'mesh_cni_ambient_reconcile_events_total',
  help:
    'Pod events the ambient informer reconciled, by type (add, and an update with nothing to do: counted as ' +
    'they come; update, delete: each attempt, retries again).',
  series: combinations({ type: ['add', 'update', 'delete'] satisfies PodEventType[] }),
});

/** Which selectors' namespace parts the labels match, one letter each (an empty part always matches). */
function namespaceMatches(
  selectors: readonly EnablementSelector[],
  labels: Readonly<Record<string, string>> | undefined,
): string {
  return selectors.map((s) => (labelSelectorMatches(s.namespaceSelector, labels) ? 'y' : 'n')).join('');
}

interface Pending {
  event: PodEventType;
  old: V1Pod | undefined;
  latest: V1Pod;
}

/** A later event for the same pod (UID) folded into the one waiting. */
function merge(prev: Pending | undefined, next: Pending): Pending {
  if (!prev) return next;
  if (next.event === 'delete' || prev.event === 'delete')
    return { event: 'delete', old: prev.old, latest: next.event === 'delete' ? next.latest : prev.latest };
  if (next.event === 'update')
    return { event: 'update', old: prev.event === 'add' ? prev.latest : prev.old, latest: next.latest };
  return { ...prev, latest: next.latest };
}

export interface AmbientInformerDeps {
  /** The node's pod watch's cache. */
  readonly pods: { get(namespace: string, name: string): V1Pod | undefined; pods(): V1Pod[] };
  /** Namespace labels; undefined while the namespace is not known. */
  readonly namespaceLabels: (name: string) => Readonly<Record<string, string>> | undefined;
  readonly selectors: readonly EnablementSelector[];
  /** isAmbientPod with the agent's rules and selectors. */
  readonly isAmbient: (pod: V1Pod, namespaceLabels: Readonly<Record<string, string>> | undefined) => boolean;
  /** neverAmbient with the agent's rules (default: the default sidecar annotation, host network). */
  readonly neverAmbient?: (pod: V1Pod) => boolean;
  readonly dataplane: ReconcileDataplane;
  readonly clock?: Clock;
}

/** Istio's informer queue: unbounded retries, 5 ms -> 5 s per key, 10 qps with a burst of 100. */
export const AMBIENT_QUEUE = {
  concurrency: 1,
  rate: { qps: 10, burst: 100 },
  backoff: { baseMs: 5, maxMs: 5000 },
} as const;

export class AmbientInformer {
  readonly #d: AmbientInformerDeps;
  /** The last state seen of each pod, by UID (a watch upsert says no old state). */
  readonly #known = new Map<string, V1Pod>();
  readonly #pending = new Map<string, Pending>();
  readonly #queue: WorkQueue<string>;
  readonly #never: (pod: V1Pod) => boolean;
  #started = false;

  constructor(deps: AmbientInformerDeps) {
    this.#d = deps;
    this.#never = deps.neverAmbient ?? ((pod) => neverAmbient(pod));
    this.#queue = new WorkQueue<string>({
      name: 'ambient',
      reconcile: (uid) => this.#reconcile(uid),
      ...AMBIENT_QUEUE,
      maxAttempts: Number.POSITIVE_INFINITY,
      ...(deps.clock ? { clock: deps.clock } : {}),
      onRetry: (uid, info) =>
        log.debug('ambient reconcile retried', { uid, attempt: info.attempt, delayMs: Math.round(info.delayMs) }),
    });
  }

  /** The pod watch's reader: events are kept until start(), then queued. */
  readonly podHandler: PodHandler = {
    upsert: (pod) => {
      const uid = pod.metadata?.uid ?? '';
      const old = this.#known.get(uid);
      this.#known.set(uid, pod);
      this.#enqueue(uid, { event: old ? 'update' : 'add', old, latest: pod });
    },
    remove: (pod) => {
      const uid = pod.metadata?.uid ?? '';
      const last = this.#known.get(uid) ?? pod;
      this.#known.delete(uid);
      this.#enqueue(uid, { event: 'delete', old: last, latest: pod });
    },
  };

  /**
   * The namespace watch's reader: a new namespace, or a relabel that flips a selector, re-checks its
   * pods. Per selector, not "any selector" (Istio's MatchesNamespace): with two selectors, a relabel
   * from one's namespace part to the other's keeps "some selector matches" yet changes which pods are.
   */
  readonly namespaceHandler: NamespaceHandler = {
    upsert: (ns: V1Namespace, old: V1Namespace | undefined) => {
      const name = ns.metadata?.name ?? '';
      const flipped =
        !old ||
        namespaceMatches(this.#d.selectors, old.metadata?.labels) !==
          namespaceMatches(this.#d.selectors, ns.metadata?.labels);
      if (flipped) this.enqueueNamespace(name);
    },
    remove: () => {},
  };

  /**
   * Queues the known pods of the namespace as updates (nothing changed in the pod itself), those
   * the decision would act on now: a namespace list at start names every namespace, and most pods
   * need nothing; whatever changes later brings its own event.
   */
  enqueueNamespace(name: string): number {
    let n = 0;
    for (const pod of this.#known.values()) {
      if (pod.metadata?.namespace !== name || !this.#actionable(pod)) continue;
      this.#enqueue(pod.metadata?.uid ?? '', { event: 'update', old: pod, latest: pod });
      n++;
    }
    return n;
  }

  /** Whether an update of the pod as it is would do something (or cannot be decided yet). */
  #actionable(pod: V1Pod): boolean {
    const labels = this.#d.namespaceLabels(pod.metadata?.namespace ?? '');
    if (labels === undefined) return true;
    const shouldBeEnabled = (p: V1Pod) => this.#d.isAmbient(p, labels);
    const i = { event: 'update', old: pod, latest: pod, current: pod, shouldBeEnabled } as const;
    return decide({ ...i, record: this.#recordOf(pod), neverOurs: this.#never }).kind !== 'none';
  }

  /**
   * Starts the queue (after the dataplane's start-up snapshot): what came meanwhile is queued,
   * and every pod once as an update, so a pod relabelled while the agent was down is caught up.
   */
  start(): void {
    this.#started = true;
    for (const pod of this.#known.values()) {
      if (!this.#actionable(pod)) continue;
      const uid = pod.metadata?.uid ?? '';
      this.#pending.set(uid, merge(this.#pending.get(uid), { event: 'update', old: pod, latest: pod }));
    }
    for (const uid of this.#pending.keys()) this.#queue.add(uid);
  }

  async stop(graceMs: number): Promise<void> {
    await this.#queue.stop(graceMs);
  }

  status() {
    return { ...this.#queue.status(), pendingEvents: this.#pending.size, knownPods: this.#known.size };
  }

  #enqueue(uid: string, p: Pending): void {
    if (uid === '') return;
    if (p.event === 'add' && !this.#pending.has(uid)) {
      // Nothing to do for an added pod (the plugin's ADD enrolls it): counted, never queued. A
      // later update of it finds the added state as its old one (#known).
      events.inc({ type: 'add' });
      return;
    }
    if (p.event === 'update' && !this.#pending.has(uid) && this.#nothingToDo(p)) {
      // Nothing to do for it now (most updates: status, conditions; a relist's every pod): no
      // turn of the queue, whose bucket would hold a real change behind them. Counted as it comes.
      events.inc({ type: 'update' });
      return;
    }
    this.#pending.set(uid, merge(this.#pending.get(uid), p));
    if (this.#started) this.#queue.add(uid);
  }

  /** An update that the decision, made now with the pod as the event has it, leaves alone. */
  #nothingToDo(p: Pending): boolean {
    const labels = this.#d.namespaceLabels(p.latest.metadata?.namespace ?? '');
    if (labels === undefined) return false;
    const shouldBeEnabled = (pod: V1Pod) => this.#d.isAmbient(pod, labels);
    const i = { event: 'update', old: p.old, latest: p.latest, current: p.latest, shouldBeEnabled } as const;
    return decide({ ...i, record: this.#recordOf(p.latest), neverOurs: this.#never }).kind === 'none';
  }

  #recordOf(pod: V1Pod): Redirection | undefined {
    return this.#d.dataplane.enrollment(pod.metadata?.uid ?? '');
  }

  async #reconcile(uid: string): Promise<RetryVerdict> {
    const p = this.#pending.get(uid);
    if (!p) return 'done';
    this.#pending.delete(uid);
    events.inc({ type: p.event });
    const ns = p.latest.metadata?.namespace ?? '';
    const cached = this.#d.pods.get(ns, p.latest.metadata?.name ?? '');
    const current = cached?.metadata?.uid === uid ? cached : undefined;
    const nsLabels = this.#d.namespaceLabels(ns);
    if (p.event === 'update' && current && nsLabels === undefined) {
      // Its namespace not seen yet (the namespace watch is behind): decide once it is.
      this.#pending.set(uid, merge(p, this.#pending.get(uid) ?? p));
      return 'retry';
    }
    const action = decide({
      event: p.event,
      old: p.old,
      latest: p.latest,
      current,
      record: this.#d.dataplane.enrollment(uid),
      shouldBeEnabled: (pod) => this.#d.isAmbient(pod, nsLabels),
      neverOurs: this.#never,
    });
    const pod = `${ns}/${p.latest.metadata?.name ?? ''}`;
    if (action.kind === 'none') {
      log.debug('ambient pod event: nothing to do', { pod, event: p.event, why: action.why });
      return 'done';
    }
    try {
      const info = ambientPodOf(action.pod);
      if (action.kind === 'add') await this.#d.dataplane.addPodToMesh(info, null);
      else if (action.kind === 'remove') await this.#d.dataplane.removePodFromMesh(info, action.isDelete);
      else await this.#d.dataplane.syncHostProbeIPs(info);
      log.info(DONE[action.kind], { pod, uid });
      return 'done';
    } catch (e) {
      const error = e instanceof Error ? e.message : String(e);
      if (action.kind === 'add' && nonRetryable(e)) {
        log.error('cannot enroll the pod into ambient mode; not retrying (the pod must be re-created)', { pod, error });
        return 'drop';
      }
      log.warn(`ambient ${action.kind} failed; retrying`, { pod, error });
      // A newer event meanwhile is folded in; else this one is tried again.
      this.#pending.set(uid, merge(p, this.#pending.get(uid) ?? p));
      return 'retry';
    }
  }
}

// The repair controller: the domain part of repair. Pods from the watch it is handed are checked
// with detectBroken; each broken state is acted on once (label, delete, both, or only reported).
// When, how often and how many at once is the work queue's job (src/orch/workqueue.ts, queue
// `repair`): at most --repair-concurrency repairs at once, one token of the --repair-qps bucket
// per attempt at one pod (its patch, delete and Event together, so --repair-qps is "pods per
// second" and the request rate is at most three times that), bounded, backed-off retries.
//
// Both --repair-label-pods and --repair-delete-pods: label first, then delete; the Event saying
// why is sent beside them (started before the delete). The label lands in the API server's audit
// log and on the final DELETED watch event, so whoever looks later sees which pods mesh-cni
// removed and why; deleting first would lose that.
//
// The watch is not the controller's: the agent's wiring hands it the node's pod watch, or one of
// its own when --repair-field-selectors/--repair-label-selectors ask for other pods (src/agent.ts).

import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { Component } from '../component.ts';
import type { RepairSettings } from '../config/settings.ts';
import { scope } from '../monitoring/logging.ts';
import type { OrchApi, PodQuery } from '../orch/api.ts';
import { toApiError, type ApiError } from '../orch/errors.ts';
import { detectBroken, hasLabel } from './detect.ts';
import { realClock, type Clock } from '../orch/limits.ts';
import { podsRepaired, podsSeenBroken, repairFailures, watchedPods, watchRestarts } from './metrics.ts';
import { WATCH_DEFAULTS, type PodSource } from '../orch/podsource.ts';
import { WorkQueue, type Outcome, type ReconcileContext } from '../orch/workqueue.ts';
import { escapeFieldValue } from '../config/selectors.ts';

const log = scope('repair');

export interface RepairTiming {
  /** Backoff of the list/watch loop (of a watch of repair's own). */
  readonly watchBackoffBaseMs: number;
  readonly watchBackoffMaxMs: number;
  /** Backoff between attempts at one pod. */
  readonly actionBackoffBaseMs: number;
  readonly actionBackoffMaxMs: number;
  /** Attempts at one pod per broken state (and per resync after giving up). */
  readonly maxAttempts: number;
  readonly requestTimeoutMs: number;
  readonly watchTimeoutSeconds: number;
  readonly silenceTimeoutMs: number;
  readonly healthyWatchMs: number;
  readonly resyncIntervalMs: number;
  readonly pageSize: number;
  /** On stop, how long in-flight repairs may take to finish before they are cancelled. */
  readonly stopGraceMs: number;
}

// The watch's own values are the pod source's defaults (WATCH_DEFAULTS, as the node's pod watch).
export const DEFAULT_TIMING: RepairTiming = {
  watchBackoffBaseMs: WATCH_DEFAULTS.backoff.baseMs,
  watchBackoffMaxMs: WATCH_DEFAULTS.backoff.maxMs,
  actionBackoffBaseMs: 500,
  actionBackoffMaxMs: 15_000,
  maxAttempts: 6,
  requestTimeoutMs: WATCH_DEFAULTS.requestTimeoutMs,
  watchTimeoutSeconds: WATCH_DEFAULTS.watchTimeoutSeconds,
  silenceTimeoutMs: WATCH_DEFAULTS.silenceTimeoutMs,
  healthyWatchMs: WATCH_DEFAULTS.healthyAfterMs,
  resyncIntervalMs: 300_000,
  pageSize: WATCH_DEFAULTS.pageSize,
  stopGraceMs: 10_000,
};

export type RepairMode = 'label' | 'delete' | 'label+delete' | 'report';

export interface RepairControllerOptions {
  readonly settings: RepairSettings;
  readonly api: OrchApi;
  /** The watch of the pods to look at; started and stopped by whoever built it. */
  readonly pods: PodSource;
  /** Names this agent in Events (source.host, reportingInstance). */
  readonly reporter: { readonly host: string; readonly instance: string };
  readonly timing?: Partial<RepairTiming>;
  readonly clock?: Clock;
}

/** What repair knows of one broken pod (by uid); whether it is queued or running is the queue's. */
interface BrokenPod {
  stateKey: string;
  why: string;
  /** The newest copy of the pod seen. */
  pod: V1Pod;
  labelled: boolean;
  evented: boolean;
  /** Nothing more to do for this broken state (repaired, gone, or report only). */
  done: boolean;
  /** Gone from the watch while its repair was under way: forgotten once that ends. */
  gone: boolean;
  /** The last failed step, for the give-up message. */
  lastError: StepError | undefined;
}

class StepError extends Error {
  readonly step: 'label' | 'delete' | 'event';
  override readonly cause: ApiError;
  constructor(step: StepError['step'], cause: ApiError) {
    super(cause.message);
    this.step = step;
    this.cause = cause;
  }
}

export function repairMode(s: Pick<RepairSettings, 'labelPods' | 'deletePods'>): RepairMode {
  if (s.labelPods && s.deletePods) return 'label+delete';
  if (s.deletePods) return 'delete';
  if (s.labelPods) return 'label';
  return 'report';
}

/**
 * The selectors sent to the API server: this node (when set), then the operator's extras as typed
 * (checked at start-up by src/config/selectors.ts): the API server judges them, not a copy of its parser.
 */
export function podQuery(s: Pick<RepairSettings, 'nodeName' | 'fieldSelectors' | 'labelSelectors'>) {
  const node = s.nodeName ? `spec.nodeName=${escapeFieldValue(s.nodeName)}` : '';
  return { fieldSelector: [node, s.fieldSelectors].filter((f) => f !== '').join(','), labelSelector: s.labelSelectors };
}

export class RepairController implements Component {
  readonly name = 'repair';
  /** The selectors of the watch, worked out once from the settings. */
  readonly query: PodQuery;
  readonly #s: RepairSettings;
  readonly #api: OrchApi;
  readonly #pods: PodSource;
  readonly #reporter: RepairControllerOptions['reporter'];
  readonly #t: RepairTiming;
  readonly #mode: RepairMode;
  readonly #queue: WorkQueue<string>;
  readonly #records = new Map<string, BrokenPod>();
  #stopping = false;
  #resyncTimer: NodeJS.Timeout | undefined;
  #eventSeq = 0;
  readonly #counts = {
    seenBroken: 0,
    labelled: 0,
    deleted: 0,
    reported: 0,
    alreadyDone: 0,
    replaced: 0,
    failedAttempts: 0,
    gaveUp: 0,
    resyncs: 0,
  };

  constructor(o: RepairControllerOptions) {
    this.#s = o.settings;
    this.query = podQuery(o.settings);
    this.#api = o.api;
    this.#pods = o.pods;
    this.#reporter = o.reporter;
    this.#t = { ...DEFAULT_TIMING, ...o.timing };
    this.#mode = repairMode(o.settings);
    this.#queue = new WorkQueue<string>({
      name: 'repair',
      reconcile: (uid, ctx) => this.#reconcile(uid, ctx),
      concurrency: o.settings.concurrency,
      rate: { qps: o.settings.qps, burst: o.settings.burst },
      backoff: { baseMs: this.#t.actionBackoffBaseMs, maxMs: this.#t.actionBackoffMaxMs },
      maxAttempts: this.#t.maxAttempts,
      clock: o.clock ?? realClock,
      onRetry: (uid, { attempt, delayMs }) => {
        const rec = this.#records.get(uid);
        if (!rec) return;
        const error = rec.lastError?.cause.message;
        const retryInMs = Math.round(delayMs);
        log.warn('repair attempt failed; retrying', {
          ...fields(rec.pod),
          step: rec.lastError?.step,
          attempt,
          retryInMs,
          error,
        });
      },
      onGiveUp: (uid, { attempts }) => this.#giveUp(uid, attempts),
    });
  }

  get mode(): RepairMode {
    return this.#mode;
  }

  /** Resolves after the watch's first full list (tests and the benchmark wait on it). */
  get synced(): Promise<void> {
    return this.#pods.synced;
  }

  start(): void {
    log.info('repair controller starting', {
      mode: this.#mode,
      fieldSelector: this.query.fieldSelector,
      labelSelector: this.query.labelSelector,
      qps: this.#s.qps,
      burst: this.#s.burst,
      concurrency: this.#s.concurrency,
    });
    // The pods already listed come at once; the watch's metrics are repair's as before it was shared.
    this.#pods.addHandler({
      upsert: (p) => this.#consider(p, false),
      remove: (p) => this.#forget(p),
      restarted: (reason) => watchRestarts.inc({ reason }),
      cacheSize: (n) => watchedPods.set(n),
    });
    const resync = () => {
      this.#resync();
      this.#resyncTimer = setTimeout(resync, this.#t.resyncIntervalMs);
      this.#resyncTimer.unref();
    };
    this.#resyncTimer = setTimeout(resync, this.#t.resyncIntervalMs);
    this.#resyncTimer.unref();
  }

  notReadyReasons(): readonly string[] {
    return [];
  }

  status(): Record<string, unknown> {
    const q = this.#queue.status();
    return {
      enabled: true,
      mode: this.#mode,
      query: this.query,
      watch: this.#pods.status(),
      counts: { ...this.#counts },
      queued: q.queued,
      inFlight: q.inFlight + q.waiting,
    };
  }

  async stop(_signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (this.#stopping) return;
    this.#stopping = true;
    clearTimeout(this.#resyncTimer);
    // Repairs already under way finish their current attempt (label, event, delete), so no pod
    // is left half-done; they are cancelled only if the API server does not answer in time.
    const { notStarted } = await this.#queue.stop(this.#t.stopGraceMs);
    log.info('repair controller stopped', { ...this.#counts, notStarted });
  }

  #resync(): void {
    this.#counts.resyncs++;
    for (const p of this.#pods.pods()) this.#consider(p, true);
  }

  #consider(pod: V1Pod, resync: boolean): void {
    // The watch outlives the controller (others read it): nothing new once stopping.
    if (this.#stopping) return;
    const uid = pod.metadata?.uid;
    if (!uid) return;
    const broken = detectBroken(pod, this.#s);
    const rec = this.#records.get(uid);
    if (rec) rec.pod = pod;
    if (!broken) return;
    if (this.#queue.has(uid)) return;
    // The same broken state again: done, or given up until a resync retries it.
    if (rec && rec.stateKey === broken.stateKey && (rec.done || !resync)) return;
    const f = { ...fields(pod), why: broken.why };
    if (!rec || rec.stateKey !== broken.stateKey) {
      this.#counts.seenBroken++;
      podsSeenBroken.inc();
    }
    // A retry of the same state (resync after giving up) keeps what was already done.
    const same = rec?.stateKey === broken.stateKey;
    const next: BrokenPod = {
      stateKey: broken.stateKey,
      why: broken.why,
      pod,
      labelled: same && rec.labelled,
      evented: same && rec.evented,
      done: false,
      gone: false,
      lastError: undefined,
    };
    this.#records.set(uid, next);
    if (this.#mode === 'report') {
      next.done = true;
      this.#counts.reported++;
      log.warn(
        'pod broken by the start-up race (report only: --repair-label-pods and --repair-delete-pods are off)',
        f,
      );
      return;
    }
    if (this.#mode === 'label' && hasLabel(pod, this.#s.labelKey, this.#s.labelValue)) {
      next.done = true;
      this.#counts.alreadyDone++;
      log.debug('broken pod already labelled', f);
      return;
    }
    const retrying = resync && rec !== undefined && !rec.done;
    log.info(retrying ? 'retrying repair of broken pod (resync)' : 'pod broken by the start-up race; repairing', {
      ...f,
      mode: this.#mode,
    });
    this.#queue.add(uid);
  }

  #forget(pod: V1Pod): void {
    const uid = pod.metadata?.uid;
    if (!uid) return;
    const rec = this.#records.get(uid);
    if (!rec) return;
    // A repair not started yet of a pod that is gone needs no request; one under way finishes on
    // its own (its next request finds the pod gone or replaced).
    if (this.#queue.has(uid) && !this.#queue.remove(uid)) rec.gone = true;
    else this.#records.delete(uid);
  }

  /** One attempt at one pod, for the queue. */
  async #reconcile(uid: string, ctx: ReconcileContext): Promise<Outcome> {
    const rec = this.#records.get(uid);
    if (!rec || rec.done) return 'done';
    try {
      await this.#repairOnce(rec, ctx);
      rec.done = true;
      if (rec.gone) this.#records.delete(uid);
      return 'done';
    } catch (e) {
      const err = e instanceof StepError ? e : new StepError('label', toApiError('repairing', e));
      rec.lastError = err;
      this.#counts.failedAttempts++;
      repairFailures.inc({ type: err.step, reason: err.cause.reason });
      // A client error other than 429 (403: RBAC, 422: invalid) will not change by retrying now.
      if (err.cause.reason === 'client_error') {
        this.#giveUp(uid, ctx.attempt);
        return 'drop';
      }
      return err.cause.retryAfterMs === undefined ? 'retry' : { retryAfterMs: err.cause.retryAfterMs };
    }
  }

  #giveUp(uid: string, attempts: number): void {
    const rec = this.#records.get(uid);
    if (!rec) return;
    const step = rec.lastError?.step ?? 'label';
    this.#counts.gaveUp++;
    repairFailures.inc({ type: step, reason: 'gave_up' });
    const error = rec.lastError?.cause.message;
    log.error('cannot repair broken pod; giving up until the next resync', {
      ...fields(rec.pod),
      step,
      attempts,
      error,
    });
    if (rec.gone) this.#records.delete(uid);
  }

  /** One attempt: the steps not done yet, in order label -> event -> delete. */
  async #repairOnce(rec: BrokenPod, ctx: ReconcileContext): Promise<void> {
    const pod = rec.pod;
    const signal = () => AbortSignal.any([ctx.signal, AbortSignal.timeout(this.#t.requestTimeoutMs)]);
    const f = fields(pod);
    const labelling = this.#mode === 'label' || this.#mode === 'label+delete';
    const deleting = this.#mode === 'delete' || this.#mode === 'label+delete';
    if (labelling && !rec.labelled) {
      if (hasLabel(pod, this.#s.labelKey, this.#s.labelValue)) {
        rec.labelled = true;
      } else {
        try {
          await this.#api.labelPod(pod, this.#s.labelKey, this.#s.labelValue, signal());
        } catch (e) {
          const err = toApiError('labelling', e);
          if (this.#gone(err, f)) return;
          throw new StepError('label', err);
        }
        rec.labelled = true;
        this.#counts.labelled++;
        podsRepaired.inc({ type: 'label' });
        log.info('labelled broken pod', { ...f, label: `${this.#s.labelKey}=${this.#s.labelValue}` });
      }
    }
    if (!rec.evented) {
      // Best effort, one try, sent beside the repair: a slow or lost Event must not hold back
      // the repair itself nor take a concurrency slot from the next broken pod.
      rec.evented = true;
      ctx.beside(
        this.#api.createEvent(pod.metadata!.namespace!, this.#event(pod, rec.why, deleting), signal()).then(
          () => {},
          (e: unknown) => {
            const err = toApiError('recording event', e);
            repairFailures.inc({ type: 'event', reason: err.reason });
            log.warn('cannot record the repair Event on the pod', { ...f, error: err.message });
          },
        ),
      );
    }
    if (deleting) {
      try {
        await this.#api.deletePod(pod, signal());
      } catch (e) {
        const err = toApiError('deleting', e);
        if (this.#gone(err, f)) return;
        throw new StepError('delete', err);
      }
      this.#counts.deleted++;
      podsRepaired.inc({ type: 'delete' });
      log.info('deleted broken pod so that it is recreated with traffic redirection', f);
    }
  }

  /** 404: the pod is already gone; 409 on our uid precondition: it was replaced. Both mean done. */
  #gone(err: ApiError, fields: Record<string, unknown>): boolean {
    if (err.code === 404) {
      this.#counts.alreadyDone++;
      log.info('broken pod already gone', fields);
      return true;
    }
    if (err.code === 409) {
      this.#counts.replaced++;
      log.info('broken pod was replaced by a new pod of the same name; leaving the new one alone', {
        ...fields,
        error: err.message,
      });
      return true;
    }
    return false;
  }

  #event(pod: V1Pod, why: string, deleting: boolean): CoreV1Event {
    const now = new Date();
    const name = pod.metadata!.name!;
    const action = deleting ? 'Deleting' : 'Labelled';
    const what =
      this.#mode === 'label+delete'
        ? `labelled ${this.#s.labelKey}=${this.#s.labelValue} and deleting it so that it is recreated with traffic redirection`
        : deleting
          ? 'deleting it so that it is recreated with traffic redirection'
          : `labelled ${this.#s.labelKey}=${this.#s.labelValue}`;
    const id = (BigInt(now.getTime()) * 1_000_000n + BigInt(this.#eventSeq++ % 1_000_000)).toString(16);
    return {
      metadata: { name: `${name}.${id}`, namespace: pod.metadata!.namespace! },
      involvedObject: {
        apiVersion: 'v1',
        kind: 'Pod',
        name,
        namespace: pod.metadata!.namespace!,
        uid: pod.metadata!.uid!,
        resourceVersion: pod.metadata?.resourceVersion,
      },
      reason: `MeshCniRepair${action}`,
      message: `mesh-cni repair: ${why}; ${what}`,
      type: 'Warning',
      source: { component: 'mesh-cni-repair', host: this.#reporter.host },
      reportingComponent: 'mesh-cni-repair',
      reportingInstance: this.#reporter.instance,
      action,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
  }
}

function fields(pod: V1Pod): { pod: string; uid: string | undefined } {
  return { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, uid: pod.metadata?.uid };
}

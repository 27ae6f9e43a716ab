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
// In-place repair (--repair-repair-pods, src/repair/inplace.ts; docs/repair.md "Repair in place")
// comes first when on: the pod's netns is found on this node, the plugin's rules are programmed in
// it and proven by the validation check run inside it; the pod keeps running, its init container
// passes on its next restart. Precedence:
// 1. in place, retried with the queue's backoff while a retry can help (no IP yet, iptables or
//    the proof failed), at most the queue's max attempts; a final failure (no netns of the pod
//    holding its IP, IP mismatch, a bad annotation, the process left its netns mid-repair) falls
//    through at once: waiting does not bring a gone sandbox back;
// 2. then the operator's label and/or delete, exactly as without in-place repair (so, label mode:
//    a pod already carrying the label is left alone, not tried in place again);
// 3. neither configured: a Warning Event, the metric and an error log say the pod stays broken.
// A pod repaired in place that breaks again (a new failed run of its validation container) is
// not repaired in place again: it goes straight to 2/3 with reason repair_did_not_hold. Repeated
// in-place repairs would hide exactly what Istio's users could not see (istio/istio#56587,
// #57332: "repaired" claimed while validation kept failing). A pod with restartPolicy Never is not
// repaired in place at all (will_not_restart): its init container never runs again, so only
// label/delete can help it (istio/istio#49210). A hostNetwork pod is refused by the repairer
// before any scan (host_network, final: inplace.ts): its netns is the node's. Missing
// capabilities (checked once at start-up, index.ts) turn in-place repair off for the process:
// reason no_capability per pod.
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
import { WorkQueue, type RetryVerdict, type ReconcileContext } from '../orch/workqueue.ts';
import { escapeFieldValue } from '../config/selectors.ts';
import type { InPlaceReason, InPlaceResult } from './inplace.ts';

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

/**
 * What the controller reads of repair's settings: what is broken, what to do about it and how
 * fast; where the host's netns are and the validation check are the in-place repairer's (index.ts).
 */
export type RepairControllerSettings = Omit<
  RepairSettings,
  'enabled' | 'hostProcDir' | 'hostNetnsPath' | 'validationBundle'
>;

export interface RepairControllerOptions {
  readonly settings: RepairControllerSettings;
  readonly api: OrchApi;
  /** The watch of the pods to look at; started and stopped by whoever built it. */
  readonly pods: PodSource;
  /** Names this agent in Events (source.host, reportingInstance). */
  readonly reporter: { readonly host: string; readonly instance: string };
  readonly timing?: Partial<RepairTiming>;
  readonly clock?: Clock;
  /**
   * In-place repair, used when settings.repairPods is on: the repairer, or 'unavailable' when the
   * start-up check found what it needs missing (every broken pod then falls through, no_capability).
   */
  readonly inPlace?: { repair(pod: V1Pod, signal?: AbortSignal): Promise<InPlaceResult> } | 'unavailable';
}

/** Where in-place repair stands for one broken state. */
type InPlaceState = 'off' | 'pending' | 'repaired' | 'failed';

/** An in-place attempt that failed and may do better next time: the queue retries it. */
class InPlaceRetry extends Error {}

/** The stop's grace ended during an in-place attempt: nothing decided, nothing counted. */
class InPlaceAborted extends Error {}

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
  inPlace: InPlaceState;
  /** Why in-place repair failed (the last attempt's reason when retrying). */
  inPlaceFailure: { reason: InPlaceReason; detail: string } | undefined;
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
  readonly #s: RepairControllerSettings;
  readonly #api: OrchApi;
  readonly #pods: PodSource;
  readonly #reporter: RepairControllerOptions['reporter'];
  readonly #t: RepairTiming;
  readonly #mode: RepairMode;
  readonly #queue: WorkQueue<string>;
  readonly #records = new Map<string, BrokenPod>();
  readonly #inPlace: RepairControllerOptions['inPlace'] | undefined;
  /** Pods (by uid) whose in-place repair was proven: a later broken state is repair_did_not_hold. */
  readonly #provenInPlace = new Set<string>();
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
    repairedInPlace: 0,
    inPlaceFellThrough: 0,
  };

  constructor(o: RepairControllerOptions) {
    this.#s = o.settings;
    this.query = podQuery(o.settings);
    this.#api = o.api;
    this.#pods = o.pods;
    this.#reporter = o.reporter;
    this.#t = { ...DEFAULT_TIMING, ...o.timing };
    this.#mode = repairMode(o.settings);
    this.#inPlace = o.settings.repairPods ? (o.inPlace ?? 'unavailable') : undefined;
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
        const error = rec.lastError?.cause.message ?? rec.inPlaceFailure?.detail;
        const retryInMs = Math.round(delayMs);
        log.warn('repair attempt failed; retrying', {
          ...fields(rec.pod),
          step: rec.lastError?.step ?? (rec.inPlace === 'pending' ? 'repair' : undefined),
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
      inPlace: this.#inPlace === undefined ? 'off' : this.#inPlace === 'unavailable' ? 'unavailable' : 'on',
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
      inPlace: this.#inPlace === undefined ? 'off' : this.#inPlace === 'unavailable' ? 'unavailable' : 'on',
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
    // is left half-done; they are cancelled only if the API server does not answer in time. An
    // in-place repair still running then has its programs killed, and is left for the next agent.
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
      inPlace: same ? rec.inPlace : 'off',
      inPlaceFailure: same ? rec.inPlaceFailure : undefined,
    };
    this.#records.set(uid, next);
    // Label mode: a pod that carries our label already was handed over (an earlier state fell
    // through, or it was labelled before in-place repair was on): not tried in place again, as a
    // labelled pod is not acted on again without in-place repair; a repair in place would also
    // leave a healthy pod labelled broken for whatever acts on the label.
    if (!same && this.#inPlace !== undefined && !this.#labelledAlready(pod)) this.#startInPlace(uid, next, f);
    if (this.#mode === 'report' && next.inPlace === 'off') {
      next.done = true;
      this.#counts.reported++;
      log.warn(
        'pod broken by the start-up race (report only: --repair-label-pods and --repair-delete-pods are off)',
        f,
      );
      return;
    }
    // Already labelled (label mode), and in place is not under way for this state: done.
    if (next.inPlace !== 'pending' && this.#labelledAlready(pod)) {
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

  /**
   * A new broken state with in-place repair on: pending, or failed at once (did not hold before,
   * or in-place repair unavailable); failures are counted here, once per pod and state.
   */
  #startInPlace(uid: string, rec: BrokenPod, f: Record<string, unknown>): void {
    const failed = (why: { reason: InPlaceReason; detail: string }) => {
      this.#inPlaceFailed(rec, why);
      if (why.reason === 'repair_did_not_hold')
        log.warn('pod repaired in place before is broken again; not repairing it in place again', f);
    };
    if (rec.pod.spec?.restartPolicy === 'Never') {
      // Its failed init container never runs again (the pod is Failed): rules programmed now let
      // nothing start, and a proof would claim a repair that changes nothing (istio/istio#49210).
      failed({
        reason: 'will_not_restart',
        detail:
          'restartPolicy Never: the validation container does not run again, so the pod cannot be repaired in place',
      });
    } else if (this.#provenInPlace.has(uid)) {
      failed({
        reason: 'repair_did_not_hold',
        detail: 'the pod was repaired in place and proven before, and its validation container failed again',
      });
    } else if (this.#inPlace === 'unavailable') {
      failed({
        reason: 'no_capability',
        detail: 'in-place repair is off for this agent: what it needs is missing (see the start-up warning)',
      });
    } else {
      rec.inPlace = 'pending';
    }
  }

  /** Label mode only, and the pod carries our label already (label+delete still deletes it). */
  #labelledAlready(pod: V1Pod): boolean {
    return this.#mode === 'label' && hasLabel(pod, this.#s.labelKey, this.#s.labelValue);
  }

  #inPlaceFailed(rec: BrokenPod, why: { reason: InPlaceReason; detail: string }): void {
    rec.inPlace = 'failed';
    rec.inPlaceFailure = why;
    this.#counts.inPlaceFellThrough++;
    repairFailures.inc({ type: 'repair', reason: why.reason });
    podsRepaired.inc({ type: 'repair', result: 'fail' });
  }

  #forget(pod: V1Pod): void {
    const uid = pod.metadata?.uid;
    if (!uid) return;
    this.#provenInPlace.delete(uid);
    const rec = this.#records.get(uid);
    if (!rec) return;
    // A repair not started yet of a pod that is gone needs no request; one under way finishes on
    // its own (its next request finds the pod gone or replaced).
    if (this.#queue.has(uid) && !this.#queue.remove(uid)) rec.gone = true;
    else this.#records.delete(uid);
  }

  /** One attempt at one pod, for the queue. */
  async #reconcile(uid: string, ctx: ReconcileContext): Promise<RetryVerdict> {
    const rec = this.#records.get(uid);
    if (!rec || rec.done) return 'done';
    try {
      await this.#repairOnce(rec, ctx);
      rec.done = true;
      if (rec.gone) this.#records.delete(uid);
      return 'done';
    } catch (e) {
      if (e instanceof InPlaceRetry) {
        this.#counts.failedAttempts++;
        return 'retry';
      }
      // Fail closed: the pod keeps its broken state, for the next agent to repair from the start.
      if (e instanceof InPlaceAborted) return 'done';
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
    const step = rec.lastError?.step ?? (rec.inPlace === 'pending' ? 'repair' : 'label');
    this.#counts.gaveUp++;
    repairFailures.inc({ type: step, reason: 'gave_up' });
    if (step === 'label' || step === 'delete') podsRepaired.inc({ type: step, result: 'fail' });
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
    if (rec.inPlace === 'pending' && (await this.#tryInPlace(rec, ctx, signal))) return;
    if (rec.inPlace === 'failed' && !rec.evented && this.#mode === 'report') {
      // Nothing to fall through to: the Event, the metric (counted at the failure) and this log
      // are what is left, so the pod is never broken and silent.
      rec.evented = true;
      log.error(
        'cannot repair broken pod in place, and neither --repair-label-pods nor --repair-delete-pods is on: ' +
          'it stays broken',
        { ...f, reason: rec.inPlaceFailure?.reason, error: rec.inPlaceFailure?.detail },
      );
      this.#sendEvent(ctx, pod, this.#inPlaceEvent(pod, rec), signal);
      return;
    }
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
        podsRepaired.inc({ type: 'label', result: 'success' });
        log.info('labelled broken pod', { ...f, label: `${this.#s.labelKey}=${this.#s.labelValue}` });
      }
    }
    if (!rec.evented) {
      rec.evented = true;
      const failed = rec.inPlaceFailure;
      const why =
        rec.inPlace === 'failed' && failed
          ? `${rec.why}; in-place repair failed (${failed.reason}: ${failed.detail})`
          : rec.why;
      this.#sendEvent(ctx, pod, this.#event(pod, why, deleting), signal);
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
      podsRepaired.inc({ type: 'delete', result: 'success' });
      log.info('deleted broken pod so that it is recreated with traffic redirection', f);
    }
  }

  /**
   * One in-place attempt. True: repaired and proven, nothing more to do. False: it failed for good
   * (counted), fall through. Throws InPlaceRetry when another attempt may do better.
   */
  async #tryInPlace(rec: BrokenPod, ctx: ReconcileContext, signal: () => AbortSignal): Promise<boolean> {
    const pod = rec.pod;
    const f = fields(pod);
    const repairer = this.#inPlace as Exclude<RepairControllerOptions['inPlace'], 'unavailable' | undefined>;
    let r: InPlaceResult;
    try {
      r = await repairer.repair(pod, ctx.signal);
    } catch (e) {
      r = { ok: false, reason: 'rules_failed', detail: (e as Error).message, final: false };
    }
    // Cut short by the stop (its programs killed): neither a repair nor a failure of the pod, so
    // no label, delete, Event or count is taken on it; the pod stays broken for the next agent.
    if (ctx.signal.aborted || (!r.ok && r.reason === 'aborted')) {
      log.info('in-place repair cut short by the stop; left for the next agent', { ...f, detail: clip(r.detail) });
      throw new InPlaceAborted(r.detail);
    }
    // The detail quotes what ran in the pod's netns (addresses, iptables, validation output), which
    // the pod can make as long as it likes: cut before it goes into logs and Events.
    r = { ...r, detail: clip(r.detail) };
    if (r.ok) {
      rec.inPlace = 'repaired';
      rec.inPlaceFailure = undefined;
      this.#provenInPlace.add(pod.metadata!.uid!);
      this.#counts.repairedInPlace++;
      podsRepaired.inc({ type: 'repair', result: 'success' });
      log.info('repaired broken pod in place: redirection programmed in its netns and proven', {
        ...f,
        detail: r.detail,
      });
      if (!rec.evented) {
        rec.evented = true;
        this.#sendEvent(ctx, pod, this.#inPlaceEvent(pod, rec, r.detail), signal);
      }
      return true;
    }
    rec.inPlaceFailure = { reason: r.reason, detail: r.detail };
    if (!r.final && ctx.attempt < this.#t.maxAttempts) throw new InPlaceRetry(r.detail);
    this.#inPlaceFailed(rec, rec.inPlaceFailure);
    log.warn('cannot repair broken pod in place; falling through', {
      ...f,
      reason: r.reason,
      error: r.detail,
      attempts: ctx.attempt,
      then: this.#mode,
    });
    return false;
  }

  /** Best effort, one try, sent beside the repair: a slow or lost Event must not hold back the
   *  repair itself nor take a concurrency slot from the next broken pod. */
  #sendEvent(ctx: ReconcileContext, pod: V1Pod, event: CoreV1Event, signal: () => AbortSignal): void {
    ctx.beside(
      this.#api.createEvent(pod.metadata!.namespace!, event, signal()).then(
        () => {},
        (e: unknown) => {
          const err = toApiError('recording event', e);
          repairFailures.inc({ type: 'event', reason: err.reason });
          log.warn('cannot record the repair Event on the pod', { ...fields(pod), error: err.message });
        },
      ),
    );
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
    const action = deleting ? 'Deleting' : 'Labelled';
    const what =
      this.#mode === 'label+delete'
        ? `labelled ${this.#s.labelKey}=${this.#s.labelValue} and deleting it so that it is recreated with traffic redirection`
        : deleting
          ? 'deleting it so that it is recreated with traffic redirection'
          : `labelled ${this.#s.labelKey}=${this.#s.labelValue}`;
    return this.#eventOf(pod, `MeshCniRepair${action}`, action, `mesh-cni repair: ${why}; ${what}`, 'Warning');
  }

  /** In place: Normal when repaired (detail: how), Warning with the reason when it failed (report mode). */
  #inPlaceEvent(pod: V1Pod, rec: BrokenPod, detail?: string): CoreV1Event {
    if (rec.inPlace === 'repaired') {
      return this.#eventOf(
        pod,
        'MeshCniRepairedInPlace',
        'RepairedInPlace',
        `mesh-cni repair: ${rec.why}; redirection programmed in the pod's network namespace and proven by the ` +
          `validation check run there (${detail ?? ''}); the next run of ${this.#s.initContainerName} passes`,
        'Normal',
      );
    }
    const failed = rec.inPlaceFailure;
    return this.#eventOf(
      pod,
      'MeshCniRepairInPlaceFailed',
      'RepairInPlaceFailed',
      `mesh-cni repair: ${rec.why}; in-place repair failed (${failed?.reason}: ${failed?.detail}); neither label ` +
        'nor delete is configured, so the pod stays without traffic redirection: delete it to have it recreated',
      'Warning',
    );
  }

  #eventOf(pod: V1Pod, reason: string, action: string, message: string, type: 'Normal' | 'Warning'): CoreV1Event {
    const now = new Date();
    const name = pod.metadata!.name!;
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
      reason,
      message,
      type,
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

/** Characters of an in-place detail kept for logs and Events. */
const MAX_DETAIL = 1000;

function clip(text: string): string {
  return text.length <= MAX_DETAIL
    ? text
    : `${text.slice(0, MAX_DETAIL)}... (${text.length - MAX_DETAIL} more characters)`;
}

function fields(pod: V1Pod): { pod: string; uid: string | undefined } {
  return { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, uid: pod.metadata?.uid };
}

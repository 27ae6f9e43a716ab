// The repair controller: pods from the PodSource are checked with detectBroken; each broken state
// is acted on once (label, delete, both, or only reported), by at most `concurrency` workers
// drawing from a token bucket, with bounded, backed-off retries.
//
// Both --repair-label-pods and --repair-delete-pods: label first, then delete; the Event saying
// why is sent beside them (started before the delete). The label lands in the API server's audit log and on the final DELETED watch event, so
// whoever looks later sees which pods mesh-cni removed and why; deleting first would lose that.
//
// The rate limit counts pod repairs (one token per attempt at one pod: its patch, delete and
// Event together), so --repair-qps is "pods per second" and the request rate is at most three
// times that.

import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';
import type { Component } from '../component.ts';
import type { RepairSettings } from '../config/settings.ts';
import { scope } from '../monitoring/logging.ts';
import type { OrchApi, PodQuery } from '../orch/api.ts';
import { toApiError, type ApiError } from '../orch/errors.ts';
import { detectBroken, hasLabel } from './detect.ts';
import { Backoff, TokenBucket, realClock, type Clock } from '../orch/limits.ts';
import { podsRepaired, podsSeenBroken, repairFailures, watchedPods, watchRestarts } from './metrics.ts';
import { PodSource, WATCH_DEFAULTS } from '../orch/podsource.ts';
import { escapeFieldValue } from '../config/selectors.ts';

const log = scope('repair');

export interface RepairTiming {
  /** Backoff of the list/watch loop. */
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

// The watch's own values are the pod source's defaults (WATCH_DEFAULTS, shared with the pod lookup).
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
  /** Names this agent in Events (source.host, reportingInstance). */
  readonly reporter: { readonly host: string; readonly instance: string };
  readonly timing?: Partial<RepairTiming>;
  readonly clock?: Clock;
}

type Phase = 'queued' | 'running' | 'done' | 'failed';

interface PodRecord {
  stateKey: string;
  why: string;
  phase: Phase;
  /** The newest copy of the pod seen. */
  pod: V1Pod;
  labelled: boolean;
  evented: boolean;
  removed: boolean;
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
  readonly #reporter: RepairControllerOptions['reporter'];
  readonly #t: RepairTiming;
  readonly #clock: Clock;
  readonly #mode: RepairMode;
  readonly #source: PodSource;
  readonly #bucket: TokenBucket;
  readonly #records = new Map<string, PodRecord>();
  readonly #queue: string[] = [];
  readonly #running = new Set<Promise<void>>();
  /** Events being recorded; they run beside the repair, not inside its concurrency slot. */
  readonly #events = new Set<Promise<void>>();
  /** Soft stop: no new repairs, no more retries. */
  readonly #stopping = new AbortController();
  /** Hard stop: in-flight requests are cancelled (after the grace period). */
  readonly #abort = new AbortController();
  #resyncTimer: NodeJS.Timeout | undefined;
  #eventSeq = 0;
  readonly #counts = { seenBroken: 0, labelled: 0, deleted: 0, reported: 0, alreadyDone: 0, replaced: 0, failedAttempts: 0, gaveUp: 0, resyncs: 0 };

  constructor(o: RepairControllerOptions) {
    this.#s = o.settings;
    this.query = podQuery(o.settings);
    this.#api = o.api;
    this.#reporter = o.reporter;
    this.#t = { ...DEFAULT_TIMING, ...o.timing };
    this.#clock = o.clock ?? realClock;
    this.#mode = repairMode(o.settings);
    this.#bucket = new TokenBucket(o.settings.qps, o.settings.burst, this.#clock);
    this.#source = new PodSource(
      o.api,
      { upsert: (p) => this.#consider(p, false), remove: (p) => this.#forget(p) },
      {
        query: this.query,
        pageSize: this.#t.pageSize,
        requestTimeoutMs: this.#t.requestTimeoutMs,
        watchTimeoutSeconds: this.#t.watchTimeoutSeconds,
        silenceTimeoutMs: this.#t.silenceTimeoutMs,
        healthyAfterMs: this.#t.healthyWatchMs,
        backoff: { baseMs: this.#t.watchBackoffBaseMs, maxMs: this.#t.watchBackoffMaxMs },
        clock: this.#clock,
        logScope: 'repair',
        onRestart: (reason) => watchRestarts.inc({ reason }),
        onCacheSize: (n) => watchedPods.set(n),
      },
    );
  }

  get mode(): RepairMode {
    return this.#mode;
  }

  /** The watch of the pods repair looks at, for others who need the same pods. */
  get podSource(): PodSource {
    return this.#source;
  }

  /** Resolves after the first full list (tests and the benchmark wait on it). */
  get synced(): Promise<void> {
    return this.#source.synced;
  }

  start(): void {
    log.info('repair controller starting', { mode: this.#mode, fieldSelector: this.query.fieldSelector, labelSelector: this.query.labelSelector, qps: this.#s.qps, burst: this.#s.burst, concurrency: this.#s.concurrency });
    this.#source.start();
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
    return {
      enabled: true,
      mode: this.#mode,
      query: this.query,
      watch: this.#source.status(),
      counts: { ...this.#counts },
      queued: this.#queue.length,
      inFlight: this.#running.size,
    };
  }

  async stop(_signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (this.#stopping.signal.aborted) return;
    this.#stopping.abort(new Error('repair controller stopping'));
    clearTimeout(this.#resyncTimer);
    await this.#source.stop();
    // Let repairs already under way finish their current attempt (label, event, delete), so no
    // pod is left half-done; cancel them only if the API server does not answer in time.
    const grace = setTimeout(() => this.#abort.abort(new Error('repair controller stopped')), this.#t.stopGraceMs);
    await Promise.allSettled([...this.#running]);
    await Promise.allSettled([...this.#events]);
    clearTimeout(grace);
    log.info('repair controller stopped', { ...this.#counts, notStarted: this.#queue.length });
  }

  #resync(): void {
    this.#counts.resyncs++;
    for (const p of this.#source.pods()) this.#consider(p, true);
  }

  #consider(pod: V1Pod, resync: boolean): void {
    const uid = pod.metadata?.uid;
    if (!uid) return;
    const broken = detectBroken(pod, this.#s);
    const rec = this.#records.get(uid);
    if (rec) rec.pod = pod;
    if (!broken) return;
    if (rec && (rec.phase === 'queued' || rec.phase === 'running')) return;
    if (rec && rec.stateKey === broken.stateKey && (rec.phase === 'done' || !resync)) return;
    const fields = { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, uid, why: broken.why };
    if (!rec || rec.stateKey !== broken.stateKey) {
      this.#counts.seenBroken++;
      podsSeenBroken.inc();
    }
    // A retry of the same state (resync after giving up) keeps what was already done.
    const same = rec?.stateKey === broken.stateKey;
    const next: PodRecord = { stateKey: broken.stateKey, why: broken.why, phase: 'queued', pod, labelled: same && rec.labelled, evented: same && rec.evented, removed: false };
    this.#records.set(uid, next);
    if (this.#mode === 'report') {
      next.phase = 'done';
      this.#counts.reported++;
      log.warn('pod broken by the start-up race (report only: --repair-label-pods and --repair-delete-pods are off)', fields);
      return;
    }
    if (this.#mode === 'label' && hasLabel(pod, this.#s.labelKey, this.#s.labelValue)) {
      next.phase = 'done';
      this.#counts.alreadyDone++;
      log.debug('broken pod already labelled', fields);
      return;
    }
    log.info(resync && rec?.phase === 'failed' ? 'retrying repair of broken pod (resync)' : 'pod broken by the start-up race; repairing', { ...fields, mode: this.#mode });
    this.#queue.push(uid);
    this.#pump();
  }

  #forget(pod: V1Pod): void {
    const uid = pod.metadata?.uid;
    if (!uid) return;
    const rec = this.#records.get(uid);
    if (!rec) return;
    // A queued repair of a pod that is gone needs no request; a running one finishes on its own.
    if (rec.phase === 'running') rec.removed = true;
    else this.#records.delete(uid);
  }

  #pump(): void {
    while (!this.#stopping.signal.aborted && this.#running.size < this.#s.concurrency && this.#queue.length > 0) {
      const uid = this.#queue.shift()!;
      const rec = this.#records.get(uid);
      if (!rec || rec.phase !== 'queued') continue;
      rec.phase = 'running';
      const job: Promise<void> = this.#work(rec).finally(() => {
        this.#running.delete(job);
        if (rec.removed) this.#records.delete(uid);
        this.#pump();
      });
      this.#running.add(job);
    }
  }

  async #work(rec: PodRecord): Promise<void> {
    const backoff = new Backoff({ baseMs: this.#t.actionBackoffBaseMs, maxMs: this.#t.actionBackoffMaxMs });
    const fields = () => ({ pod: `${rec.pod.metadata?.namespace}/${rec.pod.metadata?.name}`, uid: rec.pod.metadata?.uid });
    for (let attempt = 1; ; attempt++) {
      try {
        await this.#bucket.take(this.#stopping.signal);
      } catch {
        rec.phase = 'failed';
        return;
      }
      try {
        await this.#repairOnce(rec);
        rec.phase = 'done';
        return;
      } catch (e) {
        const err = e instanceof StepError ? e : new StepError('label', toApiError('repairing', e));
        this.#counts.failedAttempts++;
        repairFailures.inc({ type: err.step, reason: err.cause.reason });
        // A client error other than 429 (403: RBAC, 422: invalid) will not change by retrying now.
        const retryable = err.cause.reason !== 'client_error';
        if (!retryable || attempt >= this.#t.maxAttempts || this.#stopping.signal.aborted) {
          rec.phase = 'failed';
          this.#counts.gaveUp++;
          repairFailures.inc({ type: err.step, reason: 'gave_up' });
          log.error('cannot repair broken pod; giving up until the next resync', { ...fields(), step: err.step, attempts: attempt, error: err.cause.message });
          return;
        }
        const delay = backoff.next(err.cause.retryAfterMs);
        log.warn('repair attempt failed; retrying', { ...fields(), step: err.step, attempt, retryInMs: Math.round(delay), error: err.cause.message });
        try {
          await this.#clock.sleep(delay, this.#stopping.signal);
        } catch {
          rec.phase = 'failed';
          return;
        }
      }
    }
  }

  /** One attempt: the steps not done yet, in order label -> event -> delete. */
  async #repairOnce(rec: PodRecord): Promise<void> {
    const pod = rec.pod;
    const signal = () => AbortSignal.any([this.#abort.signal, AbortSignal.timeout(this.#t.requestTimeoutMs)]);
    const fields = { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, uid: pod.metadata?.uid };
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
          if (this.#gone(err, fields)) return;
          throw new StepError('label', err);
        }
        rec.labelled = true;
        this.#counts.labelled++;
        podsRepaired.inc({ type: 'label' });
        log.info('labelled broken pod', { ...fields, label: `${this.#s.labelKey}=${this.#s.labelValue}` });
      }
    }
    if (!rec.evented) {
      // Best effort, one try, sent beside the repair: a slow or lost Event must not hold back
      // the repair itself nor take a concurrency slot from the next broken pod.
      rec.evented = true;
      const sent = this.#api.createEvent(pod.metadata!.namespace!, this.#event(pod, rec.why, deleting), signal()).then(
        () => {},
        (e: unknown) => {
          const err = toApiError('recording event', e);
          repairFailures.inc({ type: 'event', reason: err.reason });
          log.warn('cannot record the repair Event on the pod', { ...fields, error: err.message });
        },
      );
      this.#events.add(sent);
      void sent.finally(() => this.#events.delete(sent));
    }
    if (deleting) {
      try {
        await this.#api.deletePod(pod, signal());
      } catch (e) {
        const err = toApiError('deleting', e);
        if (this.#gone(err, fields)) return;
        throw new StepError('delete', err);
      }
      this.#counts.deleted++;
      podsRepaired.inc({ type: 'delete' });
      log.info('deleted broken pod so that it is recreated with traffic redirection', fields);
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
      log.info('broken pod was replaced by a new pod of the same name; leaving the new one alone', { ...fields, error: err.message });
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
      involvedObject: { apiVersion: 'v1', kind: 'Pod', name, namespace: pod.metadata!.namespace!, uid: pod.metadata!.uid!, resourceVersion: pod.metadata?.resourceVersion },
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

// The agent's readiness as /readyz, ControlZ and the node's condition read it: "starting" until
// every part has started, then each part's not-ready reasons and notes, each line with since when
// it has been said (docs/observability.md "Metrics, readiness, health", "Start-up stages").
//
// Parts say why in words that carry counts and ages ("failed 3 time(s)", "for 12 s"), and a line
// is their text, not an identity: a line keeps its since while only its numbers change, and one
// that goes away and comes back starts again. "Since" is when the agent first saw the line, and it
// looks at least every second (so a since is never later than that), besides each /readyz and
// ControlZ request and each node readiness pass. The same look finds the first time the agent is
// ready, for mesh_cni_startup_duration_seconds{stage="ready"}.

import type { Component } from '../component.ts';

/** A reason or note, with since when it has been said (RFC 3339, UTC). */
export interface TimedLine {
  readonly text: string;
  readonly since: string;
}

/** What a part says now, each line with its since. */
export interface PartReadiness {
  readonly notReady: readonly TimedLine[];
  readonly notes: readonly TimedLine[];
}

/**
 * Readiness is read every `start` ms until first ready (the start-up metric's precision), in the
 * process's first `startFor` ms; every `steady` ms after that, ready or not.
 */
export const POLL_MS = { start: 100, startFor: 60_000, steady: 1000 } as const;

/** A line's shape: its text with every number alike, so counts and ages do not make a new line. */
const shapeOf = (text: string) => text.replace(/\d+/g, '0');

/** Since when each line of a list that is said again and again has been in it. */
export class SinceTracker {
  readonly #now: () => number;
  #held: { readonly text: string; readonly shape: string; readonly since: number }[] = [];

  constructor(now: () => number = Date.now) {
    this.#now = now;
  }

  observe(lines: readonly string[]): TimedLine[] {
    const left = [...this.#held];
    const take = (i: number) => (i < 0 ? undefined : left.splice(i, 1)[0]?.since);
    // The same text first, then the same shape: two lines of one shape each keep their own.
    const exact = lines.map((text) => take(left.findIndex((h) => h.text === text)));
    const now = this.#now();
    this.#held = lines.map((text, i) => {
      const shape = shapeOf(text);
      const since = exact[i] ?? take(left.findIndex((h) => h.shape === shape)) ?? now;
      return { text, shape, since };
    });
    return this.#held.map((h) => ({ text: h.text, since: new Date(h.since).toISOString() }));
  }
}

export interface AgentReadinessOptions {
  readonly now?: () => number;
  /** Called once, the first time the agent is found ready. */
  readonly onFirstReady?: () => void;
}

export class AgentReadiness {
  readonly #components: () => readonly Component[];
  readonly #o: AgentReadinessOptions;
  readonly #clocks = new WeakMap<Component, { readonly notReady: SinceTracker; readonly notes: SinceTracker }>();
  /** "starting" has been said since the process started. */
  readonly #starting: readonly TimedLine[] = [
    { text: 'starting', since: new Date(performance.timeOrigin).toISOString() },
  ];
  #started = false;
  #wasReady = false;
  #timer: NodeJS.Timeout | undefined;

  constructor(components: () => readonly Component[], o: AgentReadinessOptions = {}) {
    this.#components = components;
    this.#o = o;
  }

  /** Every part has started: from now on their reasons count, not "starting". */
  markStarted(): void {
    this.#started = true;
  }

  /** What one part says now, on the clocks /readyz reads too. */
  of(c: Component): PartReadiness {
    let clocks = this.#clocks.get(c);
    if (!clocks) {
      clocks = { notReady: new SinceTracker(this.#o.now), notes: new SinceTracker(this.#o.now) };
      this.#clocks.set(c, clocks);
    }
    return { notReady: clocks.notReady.observe(c.notReadyReasons()), notes: clocks.notes.observe(c.notes?.() ?? []) };
  }

  /** Empty when ready; else each reason with its since. */
  notReady(): TimedLine[] {
    if (!this.#started) return [...this.#starting];
    const lines = this.#components().flatMap((c) => this.of(c).notReady);
    if (lines.length === 0 && !this.#wasReady) {
      this.#wasReady = true;
      this.#o.onFirstReady?.();
    }
    return lines;
  }

  /** The reasons' text alone (the node's condition is made from it). */
  notReadyReasons(): string[] {
    return this.notReady().map((l) => l.text);
  }

  /** Lines worth knowing ready or not, with their since. */
  notes(): TimedLine[] {
    return this.#components().flatMap((c) => this.of(c).notes);
  }

  /** Reads readiness (POLL_MS) until stop(), so since and first ready are seen without a request. */
  watch(): void {
    const next = () => (!this.#wasReady && performance.now() < POLL_MS.startFor ? POLL_MS.start : POLL_MS.steady);
    const tick = () => {
      this.notReady();
      this.#timer = setTimeout(tick, next()).unref();
    };
    this.#timer ??= setTimeout(tick, next()).unref();
  }

  stop(): void {
    clearTimeout(this.#timer);
  }
}

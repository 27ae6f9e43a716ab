// Ambient's host probe path kept in place (docs/ambient.md "Host state that heals"). The node's probe rule
// and the probe sets with their entries are written at start-up and as pods come and go, and
// anyone on the node can take them away: a firewalld reload, another agent's full
// iptables-restore, an `ipset flush`. kubelet's probes of every ambient pod of the node then fail
// until they are back, and nothing tells us: iptables-legacy has no change notification at all.
// So this polls: every interval a backend reads what is ours, compares it to what it should be,
// and writes again what differs; each heal is counted and logged with what was missing.
//
// A writer that undoes us again and again is not fought in a loop: past maxHeals heals within
// windowMs, the checks back off (doubling per heal, capped) and readiness says why, until our
// state has been found intact calmPasses checks in a row. The backend is the seam for another
// way of writing the node's rules (native nftables): the loop, the bound and the metric stay.

import { scope } from '../monitoring/logging.ts';
import { combinations, knownCounter } from '../monitoring/metrics.ts';
import { realClock, type Clock } from '../orch/limits.ts';
import type { Family } from './podrules.ts';

const log = scope('ambient');

/** What a heal put back: the rule (chain and jump), a whole set, entries of a set. */
export type HealWhat = 'rule' | 'set' | 'entry';
export const HEAL_WHATS: readonly HealWhat[] = ['rule', 'set', 'entry'];

/** One thing of ours found missing or altered on the node. */
export interface HostDrift {
  readonly what: HealWhat;
  readonly family: Family;
  /** What was found, for the log: "the jump from nat POSTROUTING to MESH_POSTRT is gone". */
  readonly detail: string;
}

/** How the node's probe path is read and written: iptables + ipset (hostrules.ts) or nftables (hostnft.ts). */
export interface HostStateBackend {
  /** e.g. "iptables-nft + ipset", for the log. */
  readonly name: string;
  /** What of ours a person looks for on the node; default: iptables' chain and the ipsets. */
  readonly holds?: string;
  /** What of ours differs from what it should be; [] when all is there. Reads only. */
  inspect(): Promise<HostDrift[]>;
  /** Writes ours again (everything of ours, idempotently); touches nothing that is not ours. */
  repair(drift: readonly HostDrift[]): Promise<void>;
}

export interface HealTimings {
  /**
   * Between two checks while nothing is being fought. 10 s: kubelet probes every 10 s and acts
   * after 3 failures by default, so a removal healed within one interval (plus a check) costs a
   * pod at most two failed probes, never a restart; a check reads only the nat table and our
   * sets (4 short programs), cheap at that rate.
   */
  readonly intervalMs: number;
  /** More than maxHeals heals within windowMs is a fight: back off, and say not ready. */
  readonly maxHeals: number;
  readonly windowMs: number;
  /** The longest wait between checks while fighting (the wait doubles with each heal). */
  readonly maxBackoffMs: number;
  /** Checks in a row that found our state intact before a fight counts as over. */
  readonly calmPasses: number;
  /** Checks in a row that failed (a program that cannot run) before readiness says so. */
  readonly failuresBeforeNotReady: number;
}

export const DEFAULT_HEAL_TIMINGS: HealTimings = {
  intervalMs: 10_000,
  maxHeals: 3,
  windowMs: 120_000,
  maxBackoffMs: 300_000,
  calmPasses: 3,
  failuresBeforeNotReady: 3,
};

export interface HealOptions {
  readonly clock?: Clock;
  readonly timings?: Partial<HealTimings>;
}

export type PassOutcome = 'intact' | 'healed' | 'failed';

const heals = knownCounter({
  name: 'mesh_cni_ambient_host_heals_total',
  help:
    "Times the ambient host probe path was found changed by another writer and put back, by what: rule (the node's " +
    'MESH_POSTRT chain or its jump), set (a probe ipset gone), entry (enrolled pod IPs missing from a probe ipset).',
  series: combinations({ what: HEAL_WHATS }),
});

const describe = (d: HostDrift): string => `IPv${d.family} ${d.what}: ${d.detail}`;
const seconds = (ms: number): string => `${Math.round(ms / 1000)} s`;

export class HostHealer {
  readonly #backend: HostStateBackend;
  readonly #clock: Clock;
  readonly #t: HealTimings;
  readonly #stopping = new AbortController();
  #loop: Promise<void> | null = null;
  /** When each recent heal was (clock ms), oldest first, none older than windowMs. */
  #heals: number[] = [];
  #fighting = false;
  /** Heals since the fight began: the backoff's exponent. */
  #step = 0;
  #calm = 0;
  #failures = 0;
  #lastError = '';
  #lastMissing = '';
  #delay: number;

  constructor(backend: HostStateBackend, opts: HealOptions = {}) {
    this.#backend = backend;
    this.#clock = opts.clock ?? realClock;
    this.#t = { ...DEFAULT_HEAL_TIMINGS, ...opts.timings };
    this.#delay = this.#t.intervalMs;
  }

  /** How long the loop waits before its next check. */
  get nextDelayMs(): number {
    return this.#delay;
  }

  /** Checks every nextDelayMs until stop(); the first check one interval after this call. */
  start(): void {
    if (this.#loop !== null) throw new Error('the host probe healer was started already');
    const signal = this.#stopping.signal;
    this.#loop = (async () => {
      while (!signal.aborted) {
        try {
          await this.#clock.sleep(this.#delay, signal);
        } catch {
          return; // stopped
        }
        await this.pass();
      }
    })();
  }

  /** No check after this resolves (one under way is finished first: it may be writing). */
  async stop(): Promise<void> {
    this.#stopping.abort();
    await this.#loop;
  }

  /** One check, and a heal when something of ours is missing. Never rejects. */
  async pass(): Promise<PassOutcome> {
    let drift: HostDrift[];
    try {
      drift = await this.#backend.inspect();
      if (drift.length > 0) await this.#backend.repair(drift);
    } catch (e) {
      return this.#failed(e);
    }
    this.#failures = 0;
    this.#lastError = '';
    if (drift.length === 0) {
      this.#calm++;
      if (this.#fighting && this.#calm >= this.#t.calmPasses) {
        log.info('the host probe path has stayed in place again: checks back to their interval', {
          backend: this.#backend.name,
          intactChecks: this.#calm,
        });
        this.#fighting = false;
        this.#step = 0;
        this.#heals = [];
      }
      // Checking is cheap; only heals back off.
      this.#delay = this.#t.intervalMs;
      return 'intact';
    }
    this.#healed(drift);
    return 'healed';
  }

  #healed(drift: readonly HostDrift[]): void {
    const now = this.#clock.now();
    this.#calm = 0;
    this.#heals = this.#heals.filter((t) => now - t < this.#t.windowMs);
    this.#heals.push(now);
    for (const what of new Set(drift.map((d) => d.what))) heals.inc({ what });
    const missing = drift.map(describe);
    this.#lastMissing = missing.join('; ');
    if (!this.#fighting && this.#heals.length > this.#t.maxHeals) {
      this.#fighting = true;
      this.#step = 0;
      log.error(
        'the host probe path keeps being undone by another writer: healing it less often, and not ready until it stays',
        { backend: this.#backend.name, heals: this.#heals.length, windowS: this.#t.windowMs / 1000, missing },
      );
    }
    if (this.#fighting) this.#step = Math.min(this.#step + 1, 30);
    this.#delay = this.#fighting
      ? Math.min(this.#t.intervalMs * 2 ** this.#step, this.#t.maxBackoffMs)
      : this.#t.intervalMs;
    log.warn('the host probe path was changed by another writer; put back', {
      backend: this.#backend.name,
      missing,
      nextCheckS: this.#delay / 1000,
    });
  }

  #failed(e: unknown): PassOutcome {
    this.#failures++;
    this.#calm = 0;
    this.#lastError = e instanceof Error ? e.message : String(e);
    // Backs off as a fight does: a program that fails now will likely fail again at once.
    this.#delay = Math.min(this.#t.intervalMs * 2 ** Math.min(this.#failures, 30), this.#t.maxBackoffMs);
    log.error('cannot check or heal the host probe path', {
      backend: this.#backend.name,
      failuresInARow: this.#failures,
      error: this.#lastError,
      nextCheckS: this.#delay / 1000,
    });
    return 'failed';
  }

  /** Why the node's probe path cannot be trusted now; [] when it can. */
  notReadyReasons(): string[] {
    const out: string[] = [];
    if (this.#fighting) {
      out.push(
        `ambient: the host probe path (${this.#backend.holds ?? 'MESH_POSTRT, the mesh-inpod-probes ipsets'}) keeps being undone by another ` +
          `writer: ${this.#heals.length} heals within ${seconds(this.#t.windowMs)}, last missing: ${this.#lastMissing}; ` +
          `now healed at most every ${seconds(this.#delay)}, so kubelet probes of ambient pods fail in between. ` +
          `Find what rewrites the node's iptables, ipsets or nftables (a firewalld reload, a full iptables-restore, ` +
          `an nft flush ruleset) and make ` +
          `it keep them`,
      );
    }
    if (this.#failures >= this.#t.failuresBeforeNotReady) {
      out.push(
        `ambient: cannot check or heal the host probe path (${this.#failures} checks in a row): ${this.#lastError}`,
      );
    }
    return out;
  }
}

// What bounds and spreads the agent's own requests to the API server: one token bucket per agent
// (--orch-qps, --orch-burst) that every list, watch, GET and TokenRequest waits on. The agent runs
// on every node, so it is multiplied by the node count: docs/design.md "Fleet scale".

import type { OrchSettings } from '../config/settings.ts';
import { realClock, TokenBucket, type Clock } from './limits.ts';

/** How the pod source reads the state it then watches from (--orch-list-mode; the list is the flag table's). */
export type { ListMode } from '../config/flags.ts';

/** What one agent's connection to the API server carries besides the orchconfig. */
export interface OrchContext {
  readonly limiter: RequestLimiter;
  readonly settings: OrchSettings;
}

/** A client-side rate limit: take() resolves when the request may be sent. */
export interface RequestLimiter {
  take(signal?: AbortSignal): Promise<void>;
  /** Requests that had to wait for a token, and for how long in all (metrics, the bench). */
  readonly stats: { readonly taken: number; readonly delayed: number; readonly waitedMs: number };
}

export function requestLimiter(qps: number, burst: number, clock: Clock = realClock): RequestLimiter {
  const bucket = new TokenBucket(qps, burst, clock);
  const stats = { taken: 0, delayed: 0, waitedMs: 0 };
  return {
    stats,
    async take(signal) {
      const t0 = clock.now();
      const wait = bucket.wait();
      await bucket.take(signal);
      stats.taken++;
      if (wait > 0) {
        stats.delayed++;
        stats.waitedMs += clock.now() - t0;
      }
    },
  };
}

// One context per agent (its settings object), so the repair controller's, the pod lookup's and
// the token minter's connections share one bucket; a test or the fleet bench with many agents in
// one process gets one per agent. Whoever sends a request passes the limiter it waits on.
const bySettings = new WeakMap<OrchSettings, OrchContext>();

/** The limiter and list settings of the agent these settings are of. */
export function orchContext(settings: OrchSettings): OrchContext {
  let ctx = bySettings.get(settings);
  if (!ctx) bySettings.set(settings, (ctx = { limiter: requestLimiter(settings.qps, settings.burst), settings }));
  return ctx;
}

// How the agent's start went, stage by stage (docs/observability.md "Start-up stages"): one gauge,
// mesh_cni_startup_duration_seconds, the seconds from the process's start until a stage was
// first reached, set once. A gauge, not a histogram: each stage happens once per process, so a
// histogram would hold one observation in a dozen bucket series; the fleet's spread is a
// quantile() over the nodes' gauges. A stage not reached has no series (not 0, -1 or NaN, which
// averages and quantiles would take for a time): "not ready yet" is `unless` on the ready series.
//
// From the process's start: performance.now() counts from Node's time origin, taken as the
// process starts (before Node reads any script), on a monotonic clock; module load, the bundle's
// code cache and the settings all come after it and count.

import { Gauge } from 'prom-client';
import { describeLabels, registry } from './metrics.ts';

/** The agent's stages: every part started (src/agent.ts); first found ready (what /readyz says). */
export type AgentStage = 'started' | 'ready';
/** A watch's stages: its first list or watch sent, first answered (2xx), the whole state first read. */
export type WatchStage = 'first_request' | 'first_response' | 'initial_list';
/** The watches the agent's readiness waits on, by what they watch. */
export type StartupWatch = 'node_pods' | 'namespaces';

const gauge = new Gauge({
  name: 'mesh_cni_startup_duration_seconds',
  help:
    "Seconds from the agent process's start until it first reached a stage: started (every part started), " +
    'ready (first ready), and per watch (node_pods, namespaces) first_request, first_response (the first ' +
    'list or watch answered), initial_list (the whole state read). Set once; absent until reached.',
  labelNames: ['stage', 'watch'] as const,
  registers: [registry],
});

describeLabels('mesh_cni_startup_duration_seconds', {
  series: [],
  open: {},
  later: {
    values: {
      stage: ['started', 'ready', 'first_request', 'first_response', 'initial_list'] satisfies (
        AgentStage | WatchStage
      )[],
      watch: ['node_pods', 'namespaces'] satisfies StartupWatch[],
    },
    why: 'set once each stage is reached: a 0 would read as reached at once',
  },
});

const reached = new Map<string, number>();

/** Seconds since this process started, to the microsecond (what the clock gives). */
export function processSeconds(): number {
  return Math.round(performance.now() * 1000) / 1e6;
}

function reach(key: string, labels: { stage: string; watch?: string }): void {
  if (reached.has(key)) return;
  const s = processSeconds();
  reached.set(key, s);
  gauge.set(labels, s);
}

/** The agent reached `stage`: recorded the first time only. */
export function agentReached(stage: AgentStage): void {
  reach(stage, { stage });
}

/** `watch` reached `stage`: recorded the first time only (a relist later is no start-up). */
export function watchReached(watch: StartupWatch, stage: WatchStage): void {
  reach(`${watch}/${stage}`, { stage, watch });
}

/** The stages reached so far (`stage` or `watch/stage` -> seconds), for ControlZ. */
export function startupStages(): Record<string, number> {
  return Object.fromEntries(reached);
}

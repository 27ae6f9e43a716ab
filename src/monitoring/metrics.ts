// The agent's one Prometheus registry. Each part defines its own metrics next to its code and
// registers them here; /metrics serves this registry.

import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { buildInfo } from './buildinfo.ts';

export const registry = new Registry();
collectDefaultMetrics({ register: registry });
// prom-client names three gauges *_total, which promtool rejects (non-counters must not end in
// _total); each is the sum of a labelled gauge it also exports (nodejs_active_handles{type}...).
for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) {
  registry.removeSingleMetric(name);
}

const BUILD_INFO = 'mesh_cni_build_info';
new Gauge({
  name: BUILD_INFO,
  help: 'Build of the running install-cni: version, git commit and Node.js version; always 1.',
  labelNames: ['version', 'git_commit', 'node_version'] as const,
  registers: [registry],
  collect() {
    const b = buildInfo();
    this.set({ version: b.version, git_commit: b.gitCommit, node_version: b.nodeVersion }, 1);
  },
});

// Labelled metrics. A counter's series appears on its first increment, so an alert on the first
// error would have nothing to compare with: every value a label can take is listed with the
// metric, each series made at 0 when it is registered, and the code that counts can name only a
// listed one (a new value is added to the list or does not compile). A label whose values are
// not known in advance (a queue's name, a version) is open: listed with why, its series made by
// whoever knows the value. The metric reference (docs/metrics.md) is written from these lists.

/** One series: a value for each of the metric's labels. */
export type Series = Readonly<Record<string, string>>;

/** What a labelled metric's labels take, for the metric reference and its test. */
export interface LabelValues {
  /** The listed series: made at 0 at registration, or, with open labels, for each of their values. */
  readonly series: readonly Series[];
  /** Labels whose values are not listed, each with why. */
  readonly open: Readonly<Record<string, string>>;
  /** Listed values that have no series until set, and why (a gauge whose 0 would be a false reading). */
  readonly later?: { readonly values: Readonly<Record<string, readonly string[]>>; readonly why: string };
}

/** By metric name: every labelled mesh_cni_* metric of the registry has an entry. */
export const labelValues = new Map<string, LabelValues>();

/** Every combination of the values listed per label. */
export function combinations<const V extends Readonly<Record<string, readonly string[]>>>(
  values: V,
): { readonly [K in keyof V]: V[K][number] }[] {
  let out: Record<string, string>[] = [{}];
  for (const [label, vs] of Object.entries(values)) out = out.flatMap((s) => vs.map((v) => ({ ...s, [label]: v })));
  return out as { readonly [K in keyof V]: V[K][number] }[];
}

/** A counter that counts in listed series only. */
export interface KnownCounter<S extends Series, O extends string = never> {
  readonly name: string;
  inc(labels: S & Readonly<Record<O, string>>, by?: number): void;
  /** Makes each listed series at 0 for these values of the open labels (a queue's, when it is made). */
  zero(open: Readonly<Record<O, string>>): void;
}

/**
 * A counter whose series are listed: made at 0 now (with no open labels), counted only in one
 * of them. `open`: the labels whose values are not known in advance, each with why.
 */
export function knownCounter<const S extends Series, const O extends string = never>(o: {
  readonly name: string;
  readonly help: string;
  readonly series: readonly S[];
  readonly open?: Readonly<Record<O, string>>;
}): KnownCounter<S, O> {
  const open = (o.open ?? {}) as Readonly<Record<string, string>>;
  const labelNames = [...new Set([...o.series.flatMap((s) => Object.keys(s)), ...Object.keys(open)])];
  const counter = new Counter({ name: o.name, help: o.help, labelNames, registers: [registry] });
  const zero = (values: Series) => {
    for (const s of o.series) counter.inc({ ...s, ...values }, 0);
  };
  if (Object.keys(open).length === 0) zero({});
  labelValues.set(o.name, { series: o.series, open });
  return { name: o.name, inc: (labels, by) => counter.inc(labels, by), zero };
}

/** Says what a labelled metric that is not a KnownCounter (a gauge) takes. */
export function describeLabels(name: string, values: LabelValues): void {
  labelValues.set(name, values);
}

describeLabels(BUILD_INFO, {
  series: [],
  open: {
    version: "this binary's version",
    git_commit: 'the commit it was built from',
    node_version: 'the Node.js it runs on',
  },
});

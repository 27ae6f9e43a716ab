// The metric reference, docs/metrics.md, written from the agent's registry: every mesh_cni_*
// metric with its type, labels, the values each label takes (monitoring/metrics.ts labelValues),
// its help and Istio's counterpart. test/node/metrics-reference.test.ts fails when the file
// differs from what the code gives, so the reference cannot drift from the metrics.
//
//   node scripts/metrics-doc.ts          # rewrites docs/metrics.md

import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
// Every part the agent runs, so every metric it registers is here.
import '../src/agent.ts';
import { labelValues, registry, type LabelValues, type Series } from '../src/monitoring/metrics.ts';

export const METRICS_DOC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../docs/metrics.md');

/**
 * istio-cni's metrics (its cni/pkg/install, repair, nodeagent), each with ours or why none: the
 * names an operator moving dashboards and alerts over looks for.
 */
const ISTIO: readonly { readonly istio: string; readonly ours: string; readonly note: string }[] = [
  {
    istio: 'istio_cni_installs_total{result}',
    ours: 'mesh_cni_installs_total',
    note:
      'one per install pass, as Istio counts one per install attempt. Istio: `SUCCESS` when it finds the ' +
      'config valid before it waits for changes, else the step that failed and ended the attempt ' +
      '(`COPY_BINARIES_FAILURE`, `CREATE_KUBECONFIG_FAILURE`, `CREATE_CNI_CONFIG_FAILURE`). Ours: `success` ' +
      'when the pass ended with everything in place (written or found), `not_ready` when it waits without an ' +
      "error (no primary CNI config yet; Istio's install blocks there uncounted), else the pass's first problem " +
      '(`binaries_failed` for copy binaries; `token_missing`, `ca_missing`, `api_host_missing` for the ' +
      'kubeconfig, our orchconfig; the others for the CNI config). A pass goes on past a failed step, so all ' +
      'of its problems are in `mesh_cni_install_errors_total`',
  },
  { istio: 'istio_cni_install_ready', ours: 'mesh_cni_install_ready', note: 'the same: 1 when installed' },
  {
    istio: 'istio_cni_repair_pods_repaired_total{type,result}',
    ours: 'mesh_cni_repair_pods_repaired_total',
    note:
      'the same types (`repair`, `label`, `delete`); no `skip` result (Istio: a pod labelled already), as a pod ' +
      'labelled already is not acted on; why a step failed is in `mesh_cni_repair_failures_total`',
  },
  {
    istio: 'istio_cni_plugin_requests_total{response_code}',
    ours: 'mesh_cni_plugin_requests_total',
    note: "the same: the plugin's ambient ADDs by HTTP response code",
  },
  {
    istio: 'nodeagent_reconcile_events_total{type}',
    ours: 'mesh_cni_ambient_reconcile_events_total',
    note: 'the same event types, with the `mesh_cni_` prefix every metric here has',
  },
  {
    istio: 'ztunnel_connected',
    ours: 'mesh_cni_ztunnel_connections',
    note: 'the same count; the name says it counts (2 during a ztunnel update)',
  },
];

const code = (s: string) => `\`${s}\``;
const cell = (s: string) => s.replaceAll('|', '\\|').replaceAll('\n', ' ');

function distinct(series: readonly Series[], label: string): string[] {
  return [...new Set(series.map((s) => s[label]).filter((v): v is string => v !== undefined))];
}

/** The listed series in words: one list per label, or by the first label's value where the others depend on it. */
function describeSeries(series: readonly Series[]): string {
  const labels = [...new Set(series.flatMap((s) => Object.keys(s)))];
  if (labels.length === 0) return '';
  const perLabel = labels.map((l) => [l, distinct(series, l)] as const);
  const product = perLabel.reduce((n, [, vs]) => n * vs.length, 1);
  const list = (pairs: readonly (readonly [string, string[]])[]) =>
    pairs.map(([l, vs]) => `${code(l)}: ${vs.map(code).join(', ')}`).join('; ');
  if (product === series.length) return list(perLabel);
  const [first, ...rest] = labels as [string, ...string[]];
  return distinct(series, first)
    .map((v) => {
      const group = series.filter((s) => s[first] === v);
      return `${code(first)}=${code(v)}: ${list(rest.map((l) => [l, distinct(group, l)] as const))}`;
    })
    .join('<br>');
}

function describeValues(v: LabelValues): string {
  const parts = [describeSeries(v.series)];
  for (const [label, why] of Object.entries(v.open)) parts.push(`${code(label)}: open (${why})`);
  if (v.later) {
    const listed = Object.entries(v.later.values).map(([l, vs]) => `${code(l)}: ${vs.map(code).join(', ')}`);
    parts.push(`${listed.join('; ')} (no series until set: ${v.later.why})`);
  }
  return parts.filter((p) => p !== '').join('<br>');
}

interface Row {
  readonly name: string;
  readonly type: string;
  readonly labels: readonly string[];
  readonly values: string;
  readonly help: string;
}

/** The mesh_cni_* metrics of the registry as the reference lists them, by name. */
export async function metricRows(): Promise<Row[]> {
  const rows: Row[] = [];
  for (const m of await registry.getMetricsAsJSON()) {
    if (!m.name.startsWith('mesh_cni_')) continue;
    const metric = registry.getSingleMetric(m.name) as unknown as { labelNames?: readonly string[] };
    const labels = [...(metric.labelNames ?? [])];
    const values = labelValues.get(m.name);
    rows.push({
      name: m.name,
      type: String(m.type),
      labels,
      values: values ? describeValues(values) : '',
      help: m.help,
    });
  }
  return rows.sort((a, b) => a.name.localeCompare(b.name));
}

export async function metricsReference(): Promise<string> {
  const counterpart = new Map(ISTIO.map((i) => [i.ours, i.istio]));
  const rows = await metricRows();
  const lines = [
    '# Metrics',
    '',
    '<!-- Written by `node scripts/metrics-doc.ts` from the code; test/node/metrics-reference.test.ts fails when it',
    '     differs. Edit the metric (its help, its listed values) and run the script again. -->',
    '',
    "Every metric the agent serves on `/metrics` (`--monitoring-port`, 15014), besides Node.js's",
    'default `process_*` and `nodejs_*`. Every series of a labelled counter exists from start-up at 0, so',
    'an alert on the first increment has a series to compare with, except where a label is open: its',
    'values are not known in advance (a queue, a version), and its series are made when the value is.',
    '',
    '| metric | type | labels | label values | help | Istio |',
    '|---|---|---|---|---|---|',
    ...rows.map((r) =>
      [
        '',
        code(r.name),
        r.type,
        r.labels.map(code).join(', '),
        cell(r.values),
        cell(r.help),
        counterpart.has(r.name) ? code(counterpart.get(r.name)!) : '',
        '',
      ]
        .join(' | ')
        .trim(),
    ),
    '',
    "## Istio's istio-cni metrics",
    '',
    '| Istio | ours | how they compare |',
    '|---|---|---|',
    ...ISTIO.map((i) => `| ${code(i.istio)} | ${code(i.ours)} | ${cell(i.note)} |`),
    '',
  ];
  return lines.join('\n');
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  writeFileSync(METRICS_DOC, await metricsReference());
  console.log(`wrote ${METRICS_DOC}`);
}

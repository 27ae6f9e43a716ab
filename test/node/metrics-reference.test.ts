// The agent's metrics as an operator alerts on them: every listed series of a labelled counter is
// on /metrics from start-up at 0 (an alert on the first error needs a series to compare with),
// every labelled metric says what its labels take, and docs/metrics.md is what the code gives.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { METRICS_DOC, metricsReference } from '../../scripts/metrics-doc.ts';
import { labelValues, registry, type Series } from '../../src/monitoring/metrics.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { promtoolProblems } from '../helpers/observability.ts';

/** The labels of each sample in a Prometheus text exposition, by metric name. */
function samples(text: string): Map<string, Series[]> {
  const out = new Map<string, Series[]>();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? \S+$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k!] = v!;
    out.set(m[1]!, [...(out.get(m[1]!) ?? []), labels]);
  }
  return out;
}

const same = (a: Series, b: Series) =>
  Object.keys(a).length === Object.keys(b).length && Object.entries(a).every(([k, v]) => b[k] === v);
const show = (s: Series) => `{${Object.entries(s).map(([k, v]) => `${k}="${v}"`)}}`;

/** The listed series missing from the scrape; with open labels, for each of their values there. */
function missingSeries(scraped: Map<string, Series[]>): string[] {
  const missing: string[] = [];
  for (const [name, v] of labelValues) {
    const have = scraped.get(name) ?? [];
    const openLabels = Object.keys(v.open);
    // The open labels' values the scrape has (a queue's name): each listed series for each.
    const opens =
      openLabels.length === 0
        ? [{}]
        : [...new Map(have.map((s) => [JSON.stringify(openLabels.map((l) => s[l])), s])).values()].map((s) =>
            Object.fromEntries(openLabels.map((l) => [l, s[l]!])),
          );
    for (const open of opens)
      for (const s of v.series) {
        const want = { ...s, ...open };
        if (!have.some((h) => same(h, want))) missing.push(`${name}${show(want)}`);
      }
  }
  return missing;
}

describe('the metric reference', () => {
  it('says what every labelled metric of the agent takes, label by label', async () => {
    await import('../../src/agent.ts');
    const unsaid: string[] = [];
    for (const m of await registry.getMetricsAsJSON()) {
      if (!m.name.startsWith('mesh_cni_')) continue;
      const labels = (registry.getSingleMetric(m.name) as unknown as { labelNames?: string[] }).labelNames ?? [];
      if (labels.length === 0) continue;
      const v = labelValues.get(m.name);
      const said = new Set([
        ...(v?.series.flatMap((s) => Object.keys(s)) ?? []),
        ...Object.keys(v?.open ?? {}),
        ...Object.keys(v?.later?.values ?? {}),
      ]);
      for (const l of labels) if (!said.has(l)) unsaid.push(`${m.name}: ${l}`);
    }
    assert.deepEqual(unsaid, [], 'labels whose values are neither listed nor said to be open');
  });

  it('docs/metrics.md is what scripts/metrics-doc.ts writes from the code', async () => {
    const written = readFileSync(METRICS_DOC, 'utf8').split('\n');
    const wanted = (await metricsReference()).split('\n');
    const at = wanted.findIndex((l, i) => written[i] !== l);
    assert.ok(
      at < 0 && written.length === wanted.length,
      `docs/metrics.md is stale (run \`node scripts/metrics-doc.ts\`); line ${at + 1} is\n` +
        `${written[at] ?? '(none)'}\nwhere the code gives\n${wanted[at] ?? '(none)'}`,
    );
  });
});

describe("a running agent's /metrics right after start", () => {
  let tree: HostTree;
  let agent: AgentProcess;
  let body: string;
  before(async () => {
    tree = await makeHostTree();
    agent = spawnAgent(tree);
    const r = await agent.get('/metrics');
    assert.equal(r.status, 200);
    body = r.body;
  });
  after(async () => {
    await agent?.stop('SIGTERM');
    await tree?.remove();
  });

  it('has a series at 0 or more for every listed label value of every labelled counter', () => {
    assert.deepEqual(missingSeries(samples(body)), []);
  });

  it('has mesh_cni_installs_total, and promtool takes the exposition', async () => {
    assert.match(body, /^mesh_cni_installs_total\{result="success"\} \d+$/m);
    assert.equal(await promtoolProblems(body), '');
  });
});

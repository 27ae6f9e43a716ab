// One series' value from the agent's metrics registry (src/monitoring/metrics.ts), for tests that
// run the agent's parts in their own process and read what those counted.

import assert from 'node:assert/strict';
import { registry } from '../../src/monitoring/metrics.ts';

/** The value of metric `name`'s first series with all of `labels` (any series: none given); 0 when none has. */
export async function metricValue(name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = registry.getSingleMetric(name);
  assert.ok(m, `metric ${name} is registered`);
  const { values } = await m.get();
  const v = values.find((x) => Object.entries(labels).every(([k, want]) => x.labels[k] === want));
  return v?.value ?? 0;
}

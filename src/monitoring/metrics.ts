// The agent's one Prometheus registry. Each part defines its own metrics next to its code and
// registers them here; /metrics serves this registry.

import { Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { buildInfo } from './buildinfo.ts';

export const registry = new Registry();
collectDefaultMetrics({ register: registry });
// prom-client names three gauges *_total, which promtool rejects (non-counters must not end in
// _total); each is the sum of a labelled gauge it also exports (nodejs_active_handles{type}...).
for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) {
  registry.removeSingleMetric(name);
}

new Gauge({
  name: 'mesh_cni_build_info',
  help: 'Build of the running install-cni: version, git commit and Node.js version; always 1.',
  labelNames: ['version', 'git_commit', 'node_version'] as const,
  registers: [registry],
  collect() {
    const b = buildInfo();
    this.set({ version: b.version, git_commit: b.gitCommit, node_version: b.nodeVersion }, 1);
  },
});

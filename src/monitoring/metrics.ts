// The agent's one Prometheus registry. Each part defines its own metrics next to its code and
// registers them here; /metrics serves this registry.

import { Registry, collectDefaultMetrics } from 'prom-client';

export const registry = new Registry();
collectDefaultMetrics({ register: registry });

// The sidecar rule fixtures (test/node/fixtures/rules/<case>.json): a pod spec each, read by the
// iptables and the nftables renderer tests alike, so both render the same pods.

import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { PodLike } from '../../cni-plugin/redirect/spec.ts';
import { ROOT } from './cli.ts';

export const RULE_FIXTURES = path.join(ROOT, 'test/node/fixtures/rules');

export interface RuleFixture {
  readonly name: string;
  readonly description: string;
  readonly annotations: Record<string, string>;
  readonly proxyEnv?: Record<string, string>;
  /** The mesh-proxy container's securityContext (runAsUser/runAsGroup). */
  readonly proxySecurityContext?: { runAsUser?: number; runAsGroup?: number };
  /** Set for a pod spec that must be refused: what the error says. */
  readonly error?: string;
}

/** Every fixture, by name. */
export function ruleFixtures(): RuleFixture[] {
  return readdirSync(RULE_FIXTURES)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({
      name: f.replace(/\.json$/, ''),
      ...(JSON.parse(readFileSync(path.join(RULE_FIXTURES, f), 'utf8')) as Omit<RuleFixture, 'name'>),
    }));
}

/** The injected pod of fixture `f`: the app and the mesh-proxy container with its env and ids. */
export function fixturePod(f: RuleFixture): PodLike {
  return {
    metadata: { name: f.name, namespace: 'default', annotations: { 'sidecar.mesh.io/status': '{}', ...f.annotations } },
    spec: {
      containers: [
        { name: 'app' },
        {
          name: 'mesh-proxy',
          env: Object.entries(f.proxyEnv ?? {}).map(([name, value]) => ({ name, value })),
          ...(f.proxySecurityContext ? { securityContext: f.proxySecurityContext } : {}),
        },
      ],
    },
  };
}

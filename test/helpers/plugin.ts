// Drives mesh-cni the way a container runtime does: CNI_* env + our conflist entry with
// prevResult on stdin, one process per command.

import type { V1Pod } from '@kubernetes/client-node';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT } from './cli.ts';
import { cniEnv, run, type ChainEnv, type Run } from './netns.ts';

// The plugin under test: its sources under Node 24, or, with MESH_TEST_SHIPPED=1 (set by
// test/node/plugin-shipped.test.ts, which re-runs the plugin and validation suites so), the
// shipped executables whichever runtime built them (docs/design.md "Start-up time").
const SHIPPED = process.env.MESH_TEST_SHIPPED === '1';
export const MESH_CNI_SOURCE: readonly string[] = SHIPPED
  ? [path.join(ROOT, 'dist/bin/mesh-cni')]
  : [process.execPath, path.join(ROOT, 'bin/mesh-cni.js')];
export const MESH_VALIDATION_ARGV: readonly string[] = SHIPPED
  ? [path.join(ROOT, 'dist/mesh-validation')]
  : [process.execPath, path.join(ROOT, 'bin/mesh-validation.js')];

export interface PluginConf {
  cniVersion: string;
  orchconfig: string;
  logUds?: string;
  extra?: Record<string, unknown>;
}

export function pluginConfig(c: PluginConf, prevResult?: unknown): Record<string, unknown> {
  return {
    cniVersion: c.cniVersion,
    name: 'mcni-plg-net',
    type: 'mesh-cni',
    log_level: 'debug',
    log_uds_address: c.logUds ?? '',
    orch: {
      orchconfig: c.orchconfig,
      cni_bin_dir: '/opt/cni/bin',
      exclude_namespaces: ['mesh-system', 'kube-system'],
      node_name: 'node-1',
    },
    pod_lookup_timeout_ms: 3000,
    pod_lookup_attempt_timeout_ms: 500,
    iptables_flavour: 'nft',
    ...(c.extra ?? {}),
    ...(prevResult === undefined ? {} : { prevResult }),
  };
}

/** Runs mesh-cni (default: from source) with a runtime's env and stdin. */
export function meshCni(
  command: string,
  chain: ChainEnv,
  stdin: unknown,
  argv: readonly string[] = MESH_CNI_SOURCE,
  extraEnv: Record<string, string> = {},
): Promise<Run> {
  return run(argv[0]!, argv.slice(1), {
    env: cniEnv(command, chain, extraEnv),
    input: typeof stdin === 'string' ? stdin : JSON.stringify(stdin),
  });
}

export function k8sArgs(pod: V1Pod, containerId: string): string {
  return `IgnoreUnknown=1;K8S_POD_NAMESPACE=${pod.metadata!.namespace};K8S_POD_NAME=${pod.metadata!.name};K8S_POD_INFRA_CONTAINER_ID=${containerId};K8S_POD_UID=${pod.metadata!.uid ?? ''}`;
}

export function meshPod(
  namespace: string,
  name: string,
  annotations: Record<string, string> = {},
  extra: Partial<V1Pod['spec']> = {},
): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      namespace,
      name,
      annotations: {
        'sidecar.mesh.io/status': '{"initContainers":["mesh-validation"],"containers":["mesh-proxy"]}',
        ...annotations,
      },
    },
    spec: {
      containers: [
        { name: 'app', image: 'app:1' },
        { name: 'mesh-proxy', image: 'proxy:1' },
      ],
      ...extra,
    },
  };
}

/**
 * A temp dir, made on first use: a suite whose tests are all filtered out (--test-name-pattern)
 * runs no hooks, so a dir made when the suite is defined would never be removed.
 */
export function tempDir(): { readonly dir: string; remove(): void } {
  let made: string | undefined;
  return {
    get dir() {
      return (made ??= mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-')));
    },
    remove: () => {
      if (made) rmSync(made, { recursive: true, force: true });
    },
  };
}

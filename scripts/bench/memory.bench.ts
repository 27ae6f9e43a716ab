// The agent's resident memory against Node's own floor, in the same run (docs/design.md "Memory"):
// what the agent holds beyond the runtime it runs on, idle and with a node's pods in its watch,
// and where that memory is.
//
// Rows, each the median of ROUNDS runs, interleaved so load from other work falls on every row alike:
//   floor             `node -e "setInterval(() => {}, 1e3)"`: the same node binary, doing nothing
//                     and set nothing of the agent's; what any Node program costs
//   built-ins         the floor with the public built-in modules the agent loads (https, zlib, ...)
//                     required and nothing else: what its use of Node's own modules costs
//   idle              the agent bundle (built as dist/install-cni.js is, with its code cache as
//                     the image has it, and the DaemonSet's NODE_OPTIONS and GLIBC_TUNABLES)
//                     watching its node, no pod
//   PODS thin         PODS pods of a few hundred bytes (what most tests use)
//   PODS realistic    PODS injected pods of ~8 KB as the API server sends them: init and sidecar
//                     containers with env, probes, mounts, volumes, managedFields, annotations
// Each is read SETTLE_MS after its watch is up (lib/memory.ts: RSS, anonymous and file-backed
// pages, the JS heap, code space, external memory), then broken down over the floor: the node
// binary's pages the agent touched, heap used and unused, ArrayBuffers, other anonymous memory,
// and the pods' share of the heap (the cache).
//
//   npm run bench -- memory        (PODS=250 ROUNDS=5 SETTLE_MS=4000 by default; NODE_FLAGS=...
//                                   on the floor and the agent alike; AGENT_NODE_OPTIONS=... the
//                                   agent's NODE_OPTIONS instead of the DaemonSet's;
//                                   AGENT_GLIBC_TUNABLES=... its GLIBC_TUNABLES likewise)

import * as esbuild from 'esbuild';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1Pod } from '@kubernetes/client-node';
import { startTestApiServer, type TestApiServer } from '../../test/helpers/apiserver.ts';
import { scratchAgentFlags } from '../../test/helpers/agent.ts';
import { waitFor } from '../../test/helpers/poll.ts';
import { bundleOptions } from '../bundle-options.ts';
import { compileCacheEnv, makeCompileCache } from '../compile-cache.ts';
import {
  builtinsMemory,
  builtinsOf,
  floorMemory,
  medianMemory,
  NODE_FLAGS,
  printMemory,
  readMemory,
  shippedEnv,
  shippedNodeOptions,
  writePreload,
  type Memory,
} from './lib/memory.ts';

const PODS = Number(process.env.PODS ?? 250);
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const SETTLE_MS = Number(process.env.SETTLE_MS ?? 4000);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const MiB = 1024 * 1024;
const NODE = 'node-a';
/** The agent's NODE_OPTIONS, as the DaemonSet sets them. */
const AGENT_NODE_OPTIONS = process.env.AGENT_NODE_OPTIONS ?? shippedNodeOptions(root);
/** The agent's malloc settings, as the DaemonSet sets them. */
const AGENT_GLIBC_TUNABLES = process.env.AGENT_GLIBC_TUNABLES ?? shippedEnv(root, 'GLIBC_TUNABLES');

// ---------------------------------------------------------------- pods

/** A thin pod, as most tests make them. */
function thinPod(name: string): V1Pod {
  return {
    metadata: { name, namespace: 'default', uid: `uid-${name}`, labels: { app: 'thin' } },
    spec: { nodeName: NODE, containers: [{ name: 'app', image: 'registry.example/app:1' }] },
    status: { phase: 'Running', podIP: '198.18.0.10' },
  };
}

/** An injected pod as the API server returns it, ~8 KB of JSON. */
function realisticPod(name: string, i: number): V1Pod {
  const ip = `198.18.${(i >> 8) & 255}.${i & 255}`;
  const env = (n: number, prefix: string) =>
    Array.from({ length: n }, (_, k) => ({ name: `${prefix}_VAR_${k}`, value: `value-${k}-${name}` }));
  const mounts = [
    { name: 'workload-socket', mountPath: '/var/run/secrets/workload-spiffe-uds' },
    { name: 'credential-socket', mountPath: '/var/run/secrets/credential-uds' },
    { name: 'mesh-envoy', mountPath: '/etc/mesh/proxy' },
    { name: 'mesh-data', mountPath: '/var/lib/mesh/data' },
    { name: 'mesh-podinfo', mountPath: '/etc/mesh/pod' },
    { name: 'mesh-token', mountPath: '/var/run/secrets/tokens' },
    { name: 'kube-api-access', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true },
  ];
  const probe = { httpGet: { path: '/healthz/ready', port: 15021 }, periodSeconds: 15, failureThreshold: 4 };
  const managed = (manager: string, op: string) => ({
    manager,
    operation: op,
    apiVersion: 'v1',
    time: '2026-11-01T00:00:00Z',
    fieldsType: 'FieldsV1',
    fieldsV1: {
      'f:metadata': { 'f:labels': { '.': {}, 'f:app': {}, 'f:version': {} }, 'f:annotations': { '.': {} } },
      'f:spec': { 'f:containers': { 'k:{"name":"app"}': { '.': {}, 'f:image': {}, 'f:env': {}, 'f:ports': {} } } },
      'f:status': { 'f:conditions': { 'k:{"type":"Ready"}': { '.': {}, 'f:status': {} } }, 'f:podIP': {} },
    },
  });
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name,
      namespace: `team-${i % 7}`,
      uid: `0b7a4c9e-${String(i).padStart(4, '0')}-4d1e-9f3a-6c2b8e1d5a7f`,
      resourceVersion: String(1000 + i),
      creationTimestamp: '2026-11-01T00:00:00Z',
      generateName: `${name.replace(/-\d+$/, '')}-7d9f8c6b5-`,
      labels: {
        app: 'reviews',
        version: 'v2',
        'pod-template-hash': '7d9f8c6b5',
        'security.mesh.io/tlsMode': 'mesh',
        'service.mesh.io/canonical-name': 'reviews',
        'service.mesh.io/canonical-revision': 'v2',
      },
      annotations: {
        'kubectl.kubernetes.io/default-container': 'app',
        'kubectl.kubernetes.io/default-logs-container': 'app',
        'prometheus.io/path': '/stats/prometheus',
        'prometheus.io/port': '15020',
        'prometheus.io/scrape': 'true',
        'sidecar.mesh.io/status': JSON.stringify({
          initContainers: ['mesh-validation'],
          containers: ['mesh-proxy'],
          volumes: mounts.map((m) => m.name),
          imagePullSecrets: null,
          revision: 'default',
        }),
      },
      ownerReferences: [
        {
          apiVersion: 'apps/v1',
          kind: 'ReplicaSet',
          name: `reviews-v2-7d9f8c6b5`,
          uid: '5e1c2a3b-0000-4000-8000-000000000001',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
      managedFields: [managed('kube-controller-manager', 'Update'), managed('kubelet', 'Update')],
    },
    spec: {
      nodeName: NODE,
      serviceAccountName: 'reviews',
      restartPolicy: 'Always',
      terminationGracePeriodSeconds: 30,
      dnsPolicy: 'ClusterFirst',
      schedulerName: 'default-scheduler',
      securityContext: { fsGroup: 1337 },
      initContainers: [
        {
          name: 'mesh-validation',
          image: 'registry.example/mesh/proxyv2:1.28.0',
          args: ['mesh-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '--run-validation'],
          resources: { limits: { cpu: '2', memory: '1Gi' }, requests: { cpu: '10m', memory: '40Mi' } },
          securityContext: { runAsUser: 1337, runAsGroup: 1337, runAsNonRoot: true, readOnlyRootFilesystem: true },
          volumeMounts: mounts.slice(6),
        },
      ],
      containers: [
        {
          name: 'app',
          image: 'registry.example/bookinfo/reviews-v2:1.20.2',
          ports: [{ containerPort: 9080, protocol: 'TCP' }],
          env: env(8, 'APP'),
          resources: { requests: { cpu: '100m', memory: '128Mi' } },
          volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }, ...mounts.slice(6)],
        },
        {
          name: 'mesh-proxy',
          image: 'registry.example/mesh/proxyv2:1.28.0',
          args: ['proxy', 'sidecar', '--domain', '$(POD_NAMESPACE).svc.cluster.local', '--proxyLogLevel=warning'],
          ports: [
            { containerPort: 15090, name: 'http-envoy-prom', protocol: 'TCP' },
            { containerPort: 15021, name: 'status-port', protocol: 'TCP' },
          ],
          env: [
            { name: 'POD_NAME', valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.name' } } },
            { name: 'POD_NAMESPACE', valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.namespace' } } },
            { name: 'INSTANCE_IP', valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath: 'status.podIP' } } },
            ...env(14, 'MESH_META'),
          ],
          readinessProbe: probe,
          startupProbe: { ...probe, httpGet: { path: '/healthz/ready', port: 15021 }, failureThreshold: 600 },
          resources: { limits: { cpu: '2', memory: '1Gi' }, requests: { cpu: '100m', memory: '128Mi' } },
          securityContext: { runAsUser: 1337, runAsGroup: 1337, runAsNonRoot: true, readOnlyRootFilesystem: true },
          volumeMounts: mounts,
        },
      ],
      volumes: [
        { name: 'workload-socket', emptyDir: {} },
        { name: 'credential-socket', emptyDir: {} },
        { name: 'mesh-envoy', emptyDir: { medium: 'Memory' } },
        { name: 'mesh-data', emptyDir: {} },
        {
          name: 'mesh-podinfo',
          downwardAPI: {
            items: [
              { path: 'labels', fieldRef: { fieldPath: 'metadata.labels' } },
              { path: 'annotations', fieldRef: { fieldPath: 'metadata.annotations' } },
            ],
          },
        },
        {
          name: 'mesh-token',
          projected: {
            sources: [{ serviceAccountToken: { audience: 'mesh-ca', expirationSeconds: 43200, path: 't' } }],
          },
        },
        {
          name: 'kube-api-access',
          projected: {
            defaultMode: 420,
            sources: [
              { serviceAccountToken: { expirationSeconds: 3607, path: 'token' } },
              { configMap: { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] } },
            ],
          },
        },
        { name: 'tmp', emptyDir: {} },
      ],
      tolerations: [
        { key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 300 },
        { key: 'node.kubernetes.io/unreachable', operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 300 },
      ],
    },
    status: {
      phase: 'Running',
      hostIP: '10.0.0.5',
      podIP: ip,
      podIPs: [{ ip }],
      qosClass: 'Burstable',
      startTime: '2026-11-01T00:00:01Z',
      conditions: ['PodReadyToStartContainers', 'Initialized', 'Ready', 'ContainersReady', 'PodScheduled'].map(
        (type) => ({ type, status: 'True', lastTransitionTime: '2026-11-01T00:00:05Z' }),
      ),
      initContainerStatuses: [
        {
          name: 'mesh-validation',
          ready: true,
          restartCount: 0,
          image: 'registry.example/mesh/proxyv2:1.28.0',
          imageID: `registry.example/mesh/proxyv2@sha256:${'a'.repeat(64)}`,
          containerID: `containerd://${'b'.repeat(64)}`,
          state: { terminated: { exitCode: 0, reason: 'Completed', startedAt: '2026-11-01T00:00:02Z' } },
        },
      ],
      containerStatuses: ['app', 'mesh-proxy'].map((n) => ({
        name: n,
        ready: true,
        started: true,
        restartCount: 0,
        image: 'registry.example/mesh/proxyv2:1.28.0',
        imageID: `registry.example/mesh/proxyv2@sha256:${'c'.repeat(64)}`,
        containerID: `containerd://${'d'.repeat(64)}`,
        state: { running: { startedAt: '2026-11-01T00:00:04Z' } },
      })),
    },
  } as unknown as V1Pod;
}

// ---------------------------------------------------------------- processes

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const closed = new Promise((r) => child.once('close', r));
  child.kill('SIGTERM');
  await closed;
}

async function agent(bundle: string, preload: string, pods: readonly V1Pod[]): Promise<Memory> {
  const server: TestApiServer = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  for (const ns of new Set(['default', ...pods.map((p) => p.metadata!.namespace!)])) {
    server.upsertNamespace({ metadata: { name: ns } });
  }
  for (const p of pods) server.upsertPod(p);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-mem-agent-'));
  for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(dir, d));
  const kc = server.writeOrchconfig(path.join(dir, 'kc.json'));
  const out = path.join(dir, 'mem.json');
  const child = spawn(
    process.execPath,
    [
      ...NODE_FLAGS,
      '--import',
      preload,
      bundle,
      '--repair-enabled',
      '--repair-label-pods',
      ...scratchAgentFlags(dir, kc),
      ...['--log_output_level', 'all:none'],
    ],
    {
      stdio: ['ignore', 'ignore', 'inherit'],
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        NODE_NAME: NODE,
        POD_NAMESPACE: 'mesh-system',
        MEM_OUT: out,
        NODE_OPTIONS: AGENT_NODE_OPTIONS,
        ...(AGENT_GLIBC_TUNABLES ? { GLIBC_TUNABLES: AGENT_GLIBC_TUNABLES } : {}),
        ...compileCacheEnv(bundle),
      },
    },
  );
  try {
    const watching = () =>
      server.requests.some(
        (r) => r.method === 'GET' && r.path === '/api/v1/pods' && r.query.includes('watch=true') && r.status === 200,
      );
    await waitFor('the agent watching its pods', watching, { timeoutMs: 60_000, everyMs: 20 });
    await sleep(SETTLE_MS);
    return await readMemory(child.pid!, out);
  } finally {
    await stop(child);
    await server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- the bench

const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-mem-bench-'));
try {
  const preload = writePreload(dir);
  const bundle = path.join(dir, 'install-cni.js');
  const options = bundleOptions('esm', { version: 'bench', gitCommit: 'bench', buildTime: new Date().toISOString() });
  await esbuild.build({
    ...options,
    entryPoints: [path.join(root, 'src/cmd/install-cni-main.ts')],
    outfile: bundle,
    absWorkingDir: root,
    logLevel: 'error',
  });
  // Beside the bundle, as the build makes it for the image.
  makeCompileCache(bundle);
  const thin = Array.from({ length: PODS }, (_, i) => thinPod(`thin-${i}`));
  const real = Array.from({ length: PODS }, (_, i) => realisticPod(`reviews-v2-${i}`, i));
  const size = (ps: readonly V1Pod[]) => JSON.stringify(ps[0]).length;
  const builtins = builtinsOf(bundle, dir);
  const rows: [string, () => Promise<Memory>][] = [
    ['node floor (setInterval)', () => floorMemory(dir, preload, SETTLE_MS)],
    [`node + the agent's ${builtins.length} built-ins`, () => builtinsMemory(dir, preload, SETTLE_MS, builtins)],
    ['agent idle, no pod', () => agent(bundle, preload, [])],
    [`agent, ${PODS} thin pods (${size(thin)} B)`, () => agent(bundle, preload, thin)],
    [`agent, ${PODS} realistic pods (${(size(real) / 1024).toFixed(1)} KB)`, () => agent(bundle, preload, real)],
  ];
  const load0 = os.loadavg()[0]!;
  const runs = rows.map((): Memory[] => []);
  for (let r = 0; r < ROUNDS; r++) {
    for (let i = 0; i < rows.length; i++) runs[i]!.push(await rows[i]![1]());
  }
  const med = runs.map(medianMemory);
  const fl = med[0]!;
  const f = (x: number) => x.toFixed(1);
  console.log(
    `\nagent memory, median of ${ROUNDS} interleaved runs, read ${SETTLE_MS} ms after the watch is up ` +
      `(load ${load0.toFixed(2)} before, ${os.loadavg()[0]!.toFixed(2)} after; agent NODE_OPTIONS ` +
      `${JSON.stringify(AGENT_NODE_OPTIONS)}, GLIBC_TUNABLES ${JSON.stringify(AGENT_GLIBC_TUNABLES)}${NODE_FLAGS.length > 1 ? `, NODE_FLAGS ${NODE_FLAGS.slice(1).join(' ')}` : ''})`,
  );
  printMemory(
    rows.map(([name], i) => ({ name, m: med[i]! })),
    2,
  );
  const verdict = (ok: boolean) => (ok ? 'met' : 'MISSED');
  const idle = med[2]!.rss - fl.rss;
  const realRss = med[4]!.rss;
  // 70 MB = 66.8 MiB.
  console.log(`\ntargets:`);
  console.log(`  idle: floor + ${f(idle)} MiB (<= floor + 15: ${verdict(idle <= 15)})`);
  console.log(
    `  of which Node's built-ins the agent loads: +${f(med[1]!.rss - fl.rss)} MiB; the agent's own: +${f(med[2]!.rss - med[1]!.rss)} MiB`,
  );
  console.log(
    `  ${PODS} realistic pods: ${f(realRss)} MiB = ${f((realRss * MiB) / 1e6)} MB (<= 70 MB: ${verdict(realRss * MiB <= 70e6)})`,
  );
  console.log(
    `  per realistic pod held: ${f(((med[4]!.rss - med[2]!.rss) * 1024) / PODS)} KiB RSS, ${f(((med[4]!.heapUsed - med[2]!.heapUsed) * 1024) / PODS)} KiB heap`,
  );
} finally {
  await rm(dir, { recursive: true, force: true });
}

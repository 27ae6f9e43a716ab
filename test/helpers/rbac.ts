// The RBAC rules the manifests in deploy/ give a service account, as the test API server enforces
// them: tests run the agent and the plugin with exactly what deploy/ grants, so a call the
// manifests do not allow fails in the test as it would in a cluster.

import assert from 'node:assert/strict';
import type { RbacRule } from './apiserver.ts';
import type { K8sObject } from './podman-daemonset.ts';

interface PolicyRule {
  apiGroups?: string[];
  resources?: string[];
  verbs?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}

interface Binding extends K8sObject {
  roleRef: { apiGroup: string; kind: string; name: string };
  subjects?: { kind: string; name: string; namespace?: string }[];
}

/** Every rule bound to namespace/name: a RoleBinding's rules hold in its namespace only. */
export function rulesFor(objects: readonly K8sObject[], namespace: string, name: string): RbacRule[] {
  const out: RbacRule[] = [];
  for (const b of objects.filter((o): o is Binding => o.kind === 'RoleBinding' || o.kind === 'ClusterRoleBinding')) {
    if (!(b.subjects ?? []).some((s) => s.kind === 'ServiceAccount' && s.name === name && s.namespace === namespace))
      continue;
    const scoped = b.kind === 'RoleBinding' ? b.metadata.namespace : undefined;
    const role = objects.find(
      (o) =>
        o.kind === b.roleRef.kind &&
        o.metadata.name === b.roleRef.name &&
        (b.roleRef.kind === 'ClusterRole' || o.metadata.namespace === scoped),
    );
    assert.ok(
      role,
      `${b.kind} ${b.metadata.name} refers to a ${b.roleRef.kind} ${b.roleRef.name} that the manifests do not have`,
    );
    for (const r of (role.rules ?? []) as PolicyRule[]) {
      assert.equal(r.nonResourceURLs, undefined, 'no non-resource rules');
      out.push({
        verbs: r.verbs ?? [],
        apiGroups: r.apiGroups ?? [],
        resources: r.resources ?? [],
        ...(r.resourceNames ? { resourceNames: r.resourceNames } : {}),
        ...(scoped !== undefined ? { namespace: scoped } : {}),
      });
    }
  }
  return out;
}

/** Every right the account has through the bindings, one `verb group/resource[(names)][ in ns]` each, sorted. */
export function rights(objects: readonly K8sObject[], name: string): string[] {
  return rulesFor(objects, 'mesh-system', name)
    .flatMap((r) =>
      r.verbs.flatMap((v) =>
        r.apiGroups.flatMap((g) =>
          r.resources.map(
            (res) =>
              `${v} ${g || 'core'}/${res}${r.resourceNames ? `(${r.resourceNames.join(',')})` : ''}${r.namespace ? ` in ${r.namespace}` : ''}`,
          ),
        ),
      ),
    )
    .sort();
}

/** The exact rights deploy/ gives each account: the base, and with the repair-delete component or file. */
export const DEPLOYED_RIGHTS = {
  agent: [
    'create core/events',
    'create core/serviceaccounts/token(mesh-cni-plugin) in mesh-system',
    'get apps/daemonsets in mesh-system',
    'get core/nodes',
    'get core/pods',
    'list core/pods',
    'patch core/pods/status',
    'watch core/pods',
  ],
  agentWithDelete: [
    'create core/events',
    'create core/serviceaccounts/token(mesh-cni-plugin) in mesh-system',
    'delete core/pods',
    'get apps/daemonsets in mesh-system',
    'get core/nodes',
    'get core/pods',
    'list core/pods',
    'watch core/pods',
  ],
  plugin: ['get core/pods'],
} as const;

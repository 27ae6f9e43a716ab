// The manifests grant exactly what the agent uses, no more: checked by parsing them.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { ROOT } from '../helpers/cli.ts';

interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  rules?: Array<{ apiGroups?: string[]; resources?: string[]; verbs?: string[]; resourceNames?: string[]; nonResourceURLs?: string[] }>;
  roleRef?: { apiGroup: string; kind: string; name: string };
  subjects?: Array<{ kind: string; name: string; namespace?: string }>;
  spec?: { template?: { spec?: { serviceAccountName?: string } } };
}

function load(file: string): K8sObject[] {
  const docs = parseAllDocuments(readFileSync(path.join(ROOT, 'deploy', file), 'utf8'));
  for (const d of docs) assert.deepEqual(d.errors, [], `${file}: YAML errors`);
  return docs.map((d) => d.toJSON() as K8sObject).filter((o) => o !== null);
}

/** "group/resource" -> sorted verbs, merged over all rules of a role. */
function grants(role: K8sObject): Record<string, string[]> {
  const out: Record<string, Set<string>> = {};
  for (const r of role.rules ?? []) {
    assert.equal(r.resourceNames, undefined);
    assert.equal(r.nonResourceURLs, undefined);
    for (const g of r.apiGroups ?? []) {
      for (const res of r.resources ?? []) {
        for (const v of r.verbs ?? []) (out[`${g}/${res}`] ??= new Set()).add(v);
      }
    }
  }
  return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, [...v].sort()]));
}

function find(objs: K8sObject[], kind: string, name: string, namespace?: string): K8sObject {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name && x.metadata.namespace === namespace);
  assert.ok(o, `${kind} ${namespace ? `${namespace}/` : ''}${name} is missing`);
  return o;
}

const SA = [{ kind: 'ServiceAccount', name: 'mesh-cni', namespace: 'mesh-system' }];

describe('deploy RBAC', () => {
  const main = load('daemonset.yaml');
  const overlay = load('repair-delete-rbac.yaml');

  it('has the namespace and service account', () => {
    find(main, 'Namespace', 'mesh-system');
    find(main, 'ServiceAccount', 'mesh-cni', 'mesh-system');
  });

  it('ClusterRole: pods get/list/watch/patch (label mode), events create; nothing else', () => {
    assert.deepEqual(grants(find(main, 'ClusterRole', 'mesh-cni')), {
      '/pods': ['get', 'list', 'patch', 'watch'],
      '/events': ['create'],
    });
    const binding = find(main, 'ClusterRoleBinding', 'mesh-cni');
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'mesh-cni' });
    assert.deepEqual(binding.subjects, SA);
  });

  it('Role in mesh-system: apps/daemonsets get only (the cleanup decision)', () => {
    assert.deepEqual(grants(find(main, 'Role', 'mesh-cni', 'mesh-system')), { 'apps/daemonsets': ['get'] });
    const binding = find(main, 'RoleBinding', 'mesh-cni', 'mesh-system');
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'mesh-cni' });
    assert.deepEqual(binding.subjects, SA);
  });

  it('grants no delete, wildcard or secret access in the default manifest', () => {
    const roles = main.filter((o) => o.kind === 'ClusterRole' || o.kind === 'Role');
    assert.equal(roles.length, 2, 'one ClusterRole and one Role');
    for (const r of roles) {
      for (const [res, verbs] of Object.entries(grants(r))) {
        assert.ok(!verbs.includes('delete') && !verbs.includes('*') && !res.includes('*') && !res.endsWith('/secrets'), `${r.kind} ${r.metadata.name}: ${res} ${verbs.join(',')}`);
      }
    }
  });

  it('the delete overlay adds pods delete, nothing more, to the same service account', () => {
    assert.equal(overlay.length, 2);
    assert.deepEqual(grants(find(overlay, 'ClusterRole', 'mesh-cni-repair-delete')), { '/pods': ['delete'] });
    const binding = find(overlay, 'ClusterRoleBinding', 'mesh-cni-repair-delete');
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'mesh-cni-repair-delete' });
    assert.deepEqual(binding.subjects, SA);
  });

  it('runs the DaemonSet (when present) as that service account', () => {
    for (const ds of main.filter((o) => o.kind === 'DaemonSet')) {
      assert.equal(ds.spec?.template?.spec?.serviceAccountName, 'mesh-cni');
    }
  });
});

// The manifests grant exactly what each account uses, no more: checked by parsing the plain files
// (`kubectl apply -f deploy/daemonset.yaml [-f deploy/repair-delete-rbac.yaml]`); deploy.test.ts
// checks the kustomize render the same way.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { ROOT } from '../helpers/cli.ts';
import type { K8sObject } from '../helpers/podman-daemonset.ts';
import { DEPLOYED_RIGHTS, rights } from '../helpers/rbac.ts';

function load(file: string): K8sObject[] {
  const docs = parseAllDocuments(readFileSync(path.join(ROOT, 'deploy', file), 'utf8'));
  for (const d of docs) assert.deepEqual(d.errors, [], `${file}: YAML errors`);
  return docs.map((d) => d.toJSON() as K8sObject).filter((o) => o !== null);
}

/** What `kubectl apply -f a -f b` leaves: an object of the same kind, namespace and name in a later file replaces the earlier one. */
function applied(...files: K8sObject[][]): K8sObject[] {
  const byKey = new Map<string, K8sObject>();
  for (const o of files.flat()) byKey.set(`${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`, o);
  return [...byKey.values()];
}

describe('deploy RBAC', () => {
  const main = load('daemonset.yaml');
  const overlay = load('repair-delete-rbac.yaml');

  it('has the namespace and the two service accounts', () => {
    assert.ok(main.some((o) => o.kind === 'Namespace' && o.metadata.name === 'mesh-system'));
    const accounts = main
      .filter((o) => o.kind === 'ServiceAccount')
      .map((o) => `${o.metadata.namespace}/${o.metadata.name}`)
      .sort();
    assert.deepEqual(accounts, ['mesh-system/mesh-cni', 'mesh-system/mesh-cni-plugin']);
  });

  it("the agent: pods read, pods/status patch (labels), events create, its DaemonSet read and the plugin's token mint in mesh-system; no pods patch or delete", () => {
    assert.deepEqual(rights(main, 'mesh-cni'), DEPLOYED_RIGHTS.agent);
  });

  it('the plugin: pods get, nothing else', () => {
    assert.deepEqual(rights(main, 'mesh-cni-plugin'), DEPLOYED_RIGHTS.plugin);
  });

  it('no wildcard, secret or non-resource rule anywhere', () => {
    for (const r of [...main, ...overlay].filter((o) => o.kind === 'ClusterRole' || o.kind === 'Role')) {
      for (const rule of (r.rules ?? []) as {
        verbs: string[];
        resources?: string[];
        apiGroups?: string[];
        nonResourceURLs?: string[];
      }[]) {
        assert.equal(rule.nonResourceURLs, undefined);
        for (const field of [rule.verbs, rule.resources ?? [], rule.apiGroups ?? []])
          assert.ok(!field.includes('*'), `${r.metadata.name}: ${JSON.stringify(rule)}`);
        assert.ok(!(rule.resources ?? []).includes('secrets'), `${r.metadata.name} reads no secrets`);
      }
    }
  });

  it('the delete file, applied after the main one, gives the agent what the repair-delete component does: pods delete instead of pods/status patch', () => {
    const both = applied(main, overlay);
    assert.deepEqual(rights(both, 'mesh-cni'), DEPLOYED_RIGHTS.agentWithDelete);
    assert.deepEqual(rights(both, 'mesh-cni-plugin'), DEPLOYED_RIGHTS.plugin);
    // It changes the agent's ClusterRole alone: every other object is the main file's.
    assert.deepEqual(
      overlay.map((o) => `${o.kind}/${o.metadata.name}`),
      ['ClusterRole/mesh-cni'],
    );
    assert.deepEqual(
      overlay[0]!.metadata,
      main.find((o) => o.kind === 'ClusterRole' && o.metadata.name === 'mesh-cni')!.metadata,
    );
  });

  it("runs the DaemonSet as the agent's account", () => {
    for (const ds of main.filter((o) => o.kind === 'DaemonSet')) {
      assert.equal(
        (ds as { spec?: { template?: { spec?: { serviceAccountName?: string } } } }).spec?.template?.spec
          ?.serviceAccountName,
        'mesh-cni',
      );
    }
  });
});

// The test API server speaks enough of the real dialect: checked with raw HTTPS and with the real
// kubectl.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { apiRequest, openWatch, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';

function pod(name: string, node: string, labels: Record<string, string> = {}, ns = 'default'): V1Pod {
  return {
    metadata: { name, namespace: ns, labels },
    spec: { nodeName: node, containers: [{ name: 'app', image: 'busybox' }] },
    status: { phase: 'Running' },
  };
}

interface List {
  metadata: { resourceVersion: string; continue?: string };
  items: V1Pod[];
}

describe('test API server', () => {
  let s: TestApiServer;
  let dir: string;
  before(async () => {
    s = await startTestApiServer({ bookmarkIntervalMs: 100 });
    dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-apiserver-test-'));
  });
  after(async () => {
    await s.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('answers 401 Status without the bearer token', async () => {
    const r = await apiRequest({ ...s, token: 'wrong' }, 'GET', '/api/v1/pods');
    assert.equal(r.status, 401);
    assert.deepEqual((r.body as { kind: string; reason: string; code: number }).kind, 'Status');
    assert.equal((r.body as { reason: string }).reason, 'Unauthorized');
  });

  it('lists with field and label selectors, limit and continue', async () => {
    s.upsertPod(pod('a1', 'node-a', { app: 'web', tier: 'front' }));
    s.upsertPod(pod('a2', 'node-a', { app: 'db' }));
    s.upsertPod(pod('b1', 'node-b', { app: 'web' }));
    s.upsertPod(pod('c1', 'node-a', { app: 'web' }, 'other'));
    const names = async (q: string, base = '/api/v1/pods') => {
      const r = await apiRequest(s, 'GET', `${base}?${q}`);
      assert.equal(r.status, 200, r.text);
      return (r.body as List).items.map((p) => p.metadata!.name).sort();
    };
    assert.deepEqual(await names('fieldSelector=spec.nodeName%3Dnode-a'), ['a1', 'a2', 'c1']);
    assert.deepEqual(await names('fieldSelector=spec.nodeName%3Dnode-a', '/api/v1/namespaces/default/pods'), [
      'a1',
      'a2',
    ]);
    assert.deepEqual(await names('fieldSelector=metadata.name!%3Da1,spec.nodeName%3Dnode-a'), ['a2', 'c1']);
    assert.deepEqual(await names('fieldSelector=metadata.namespace%3Dother'), ['c1']);
    assert.deepEqual(await names(`labelSelector=${encodeURIComponent('app in (web,db),!tier')}`), ['a2', 'b1', 'c1']);
    assert.deepEqual(await names(`labelSelector=${encodeURIComponent('app==web,tier')}`), ['a1']);
    assert.deepEqual(await names(`labelSelector=${encodeURIComponent('app notin (web)')}`), ['a2']);
    assert.deepEqual(await names(`labelSelector=${encodeURIComponent('app!=web')}`), ['a2']);
    const bad = await apiRequest(s, 'GET', '/api/v1/pods?fieldSelector=spec.bogus%3Dx');
    assert.equal(bad.status, 400);
    assert.match((bad.body as { message: string }).message, /field label not supported/);

    const page1 = (await apiRequest(s, 'GET', '/api/v1/pods?limit=3')).body as List;
    assert.equal(page1.items.length, 3);
    assert.ok(page1.metadata.continue);
    const page2 = (await apiRequest(s, 'GET', `/api/v1/pods?limit=3&continue=${page1.metadata.continue}`)).body as List;
    assert.equal(page2.items.length, 1);
    assert.equal(page2.metadata.continue, undefined);
    assert.equal(page2.metadata.resourceVersion, page1.metadata.resourceVersion);
  });

  it('watches from a resourceVersion with bookmarks, selector exits as DELETED, and 410 once expired', async () => {
    const list = (await apiRequest(s, 'GET', '/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-w')).body as List;
    const w = openWatch(
      s,
      `/api/v1/pods?watch=true&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dnode-w&resourceVersion=${list.metadata.resourceVersion}`,
    );
    try {
      s.upsertPod(pod('w1', 'node-w'));
      await w.next((e) => e.type === 'ADDED' && (e.object.metadata as { name: string }).name === 'w1');
      s.upsertPod({ ...pod('w1', 'node-w'), status: { phase: 'Failed' } });
      await w.next((e) => e.type === 'MODIFIED');
      s.upsertPod(pod('w1', 'node-x'));
      await w.next((e) => e.type === 'DELETED');
      s.upsertPod(pod('x9', 'node-x'));
      await w.next((e) => e.type === 'BOOKMARK');
      assert.ok(
        !w.events.some((e) => (e.object.metadata as { name?: string }).name === 'x9'),
        'pods on other nodes are not sent',
      );
      s.expireResourceVersions();
      const err = await w.next((e) => e.type === 'ERROR');
      assert.equal((err.object as { code: number }).code, 410);
    } finally {
      w.close();
    }
    const old = await apiRequest(s, 'GET', `/api/v1/pods?resourceVersion=${list.metadata.resourceVersion}`);
    assert.equal(old.status, 410);
    const again = openWatch(s, `/api/v1/pods?watch=true&resourceVersion=${list.metadata.resourceVersion}`);
    try {
      const e = await again.next((e) => e.type === 'ERROR');
      assert.equal((e.object as { reason: string }).reason, 'Expired');
    } finally {
      again.close();
    }
  });

  it('patches labels with merge and strategic merge patches, and conflicts on a stale resourceVersion', async () => {
    const p = s.upsertPod(pod('patch-me', 'node-p', { keep: 'yes' }));
    const m = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/patch-me',
      { metadata: { labels: { a: '1' } } },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(m.status, 200, m.text);
    const sm = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/patch-me',
      { metadata: { labels: { b: '2', keep: null } } },
      { 'content-type': 'application/strategic-merge-patch+json' },
    );
    assert.equal(sm.status, 200, sm.text);
    assert.deepEqual(s.getPod('default', 'patch-me')!.metadata!.labels, { a: '1', b: '2' });
    const stale = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/patch-me',
      { metadata: { resourceVersion: p.metadata!.resourceVersion, labels: { c: '3' } } },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(stale.status, 409);
    const missing = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/nope',
      {},
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(missing.status, 404);
    // The status subresource is how a test plays the kubelet, and how the repair controller
    // labels: as on a real API server, it takes status, labels and annotations, never the spec.
    const st = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/patch-me/status',
      { status: { phase: 'Succeeded' }, metadata: { labels: { via: 'status' } }, spec: { nodeName: 'elsewhere' } },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(st.status, 200, st.text);
    assert.equal(s.getPod('default', 'patch-me')!.status!.phase, 'Succeeded');
    assert.equal(s.getPod('default', 'patch-me')!.metadata!.labels!.via, 'status');
    assert.equal(s.getPod('default', 'patch-me')!.spec!.nodeName, 'node-p');
    const wrongUid = await apiRequest(
      s,
      'PATCH',
      '/api/v1/namespaces/default/pods/patch-me/status',
      { metadata: { uid: 'not-this-pod', labels: { x: '1' } } },
      { 'content-type': 'application/merge-patch+json' },
    );
    assert.equal(wrongUid.status, 409, 'a uid in the patch is a precondition');
  });

  describe('RBAC per token and TokenRequest', () => {
    const CORE_POD_GET = [{ verbs: ['get'], apiGroups: [''], resources: ['pods'] }];
    it("answers 403 Status for what the token's rules do not allow, naming user, verb and resource", async () => {
      s.upsertPod(pod('rbac-1', 'node-r'));
      const reader = { ...s, token: s.serviceAccount('team-a', 'reader', CORE_POD_GET) };
      assert.equal((await apiRequest(reader, 'GET', '/api/v1/namespaces/default/pods/rbac-1')).status, 200);
      const list = await apiRequest(reader, 'GET', '/api/v1/pods');
      assert.equal(list.status, 403, list.text);
      assert.equal((list.body as { reason: string }).reason, 'Forbidden');
      assert.match(
        (list.body as { message: string }).message,
        /User "system:serviceaccount:team-a:reader" cannot list resource "pods" in API group ""/,
      );
      const patch = await apiRequest(
        reader,
        'PATCH',
        '/api/v1/namespaces/default/pods/rbac-1',
        { metadata: { labels: { x: '1' } } },
        { 'content-type': 'application/merge-patch+json' },
      );
      assert.equal(patch.status, 403);
      // pods does not cover pods/status, nor the other way round.
      const status = await apiRequest(
        reader,
        'PATCH',
        '/api/v1/namespaces/default/pods/rbac-1/status',
        { metadata: { labels: { x: '1' } } },
        { 'content-type': 'application/merge-patch+json' },
      );
      assert.equal(status.status, 403);
      assert.match((status.body as { message: string }).message, /cannot patch resource "pods\/status"/);
      s.setRules(reader.token, [{ verbs: ['patch'], apiGroups: [''], resources: ['pods/status'] }]);
      assert.equal(
        (
          await apiRequest(
            reader,
            'PATCH',
            '/api/v1/namespaces/default/pods/rbac-1/status',
            { metadata: { labels: { x: '1' } } },
            { 'content-type': 'application/merge-patch+json' },
          )
        ).status,
        200,
      );
      assert.equal(
        (
          await apiRequest(
            reader,
            'PATCH',
            '/api/v1/namespaces/default/pods/rbac-1',
            { metadata: { labels: { y: '1' } } },
            { 'content-type': 'application/merge-patch+json' },
          )
        ).status,
        403,
      );
      assert.equal(
        (await apiRequest(reader, 'GET', '/api/v1/namespaces/default/pods/rbac-1')).status,
        403,
        'rules were replaced',
      );
      // Namespaced rules (a Role) hold only in their namespace.
      s.setRules(reader.token, [
        { verbs: ['get'], apiGroups: ['apps'], resources: ['daemonsets'], namespace: 'mesh-system' },
      ]);
      s.upsertDaemonSet({ metadata: { name: 'ds', namespace: 'mesh-system' } });
      s.upsertDaemonSet({ metadata: { name: 'ds', namespace: 'default' } });
      assert.equal((await apiRequest(reader, 'GET', '/apis/apps/v1/namespaces/mesh-system/daemonsets/ds')).status, 200);
      assert.equal((await apiRequest(reader, 'GET', '/apis/apps/v1/namespaces/default/daemonsets/ds')).status, 403);
      // Discovery needs no rule (system:discovery is bound to every authenticated user).
      assert.equal((await apiRequest(reader, 'GET', '/api/v1')).status, 200);
    });

    it('mints a token for a service account (TokenRequest), bounded by resourceNames, with an expiry and the default audience', async () => {
      s.serviceAccount('mesh-system', 'minter', [
        {
          verbs: ['create'],
          apiGroups: [''],
          resources: ['serviceaccounts/token'],
          resourceNames: ['target'],
          namespace: 'mesh-system',
        },
      ]);
      const minter = { ...s, token: s.serviceAccount('mesh-system', 'minter') };
      s.serviceAccount('mesh-system', 'target', CORE_POD_GET);
      s.serviceAccount('mesh-system', 'other', [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }]);
      const before = Date.now();
      const r = await apiRequest(minter, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/target/token', {
        apiVersion: 'authentication.k8s.io/v1',
        kind: 'TokenRequest',
        spec: { expirationSeconds: 3600 },
      });
      assert.equal(r.status, 201, r.text);
      const tr = r.body as {
        kind: string;
        spec: { audiences: string[]; expirationSeconds: number };
        status: { token: string; expirationTimestamp: string };
      };
      assert.equal(tr.kind, 'TokenRequest');
      assert.deepEqual(tr.spec.audiences, ['https://kubernetes.default.svc.cluster.local']);
      const exp = Date.parse(tr.status.expirationTimestamp);
      assert.ok(exp >= before + 3599_000 && exp <= Date.now() + 3601_000, tr.status.expirationTimestamp);
      const minted = { ...s, token: tr.status.token };
      s.upsertPod(pod('rbac-2', 'node-r'));
      assert.equal(
        (await apiRequest(minted, 'GET', '/api/v1/namespaces/default/pods/rbac-2')).status,
        200,
        'the token acts as the account it was minted for',
      );
      assert.equal((await apiRequest(minted, 'GET', '/api/v1/pods')).status, 403);
      assert.deepEqual(s.issuedTokens().find((t) => t.token === tr.status.token)?.serviceAccount, 'mesh-system/target');
      // resourceNames: only that one account; and nowhere else.
      assert.equal(
        (await apiRequest(minter, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/other/token', { spec: {} }))
          .status,
        403,
      );
      assert.equal(
        (await apiRequest(minter, 'POST', '/api/v1/namespaces/default/serviceaccounts/target/token', { spec: {} }))
          .status,
        403,
      );
      // As the real validation: at least 10 minutes.
      assert.equal(
        (
          await apiRequest(minter, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/target/token', {
            spec: { expirationSeconds: 60 },
          })
        ).status,
        422,
      );
      // A token for an audience the server does not accept authenticates nobody.
      const aud = await apiRequest(minter, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/target/token', {
        spec: { audiences: ['vault'] },
      });
      assert.equal(aud.status, 201);
      assert.equal(
        (
          await apiRequest(
            { ...s, token: (aud.body as typeof tr).status.token },
            'GET',
            '/api/v1/namespaces/default/pods/rbac-2',
          )
        ).status,
        401,
      );
    });

    it('caps what it issues at tokenMaxSeconds, and refuses a token once it expired', async () => {
      s.tokenMaxSeconds = 1;
      try {
        const r = await apiRequest(s, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/mesh-cni-plugin/token', {
          spec: { expirationSeconds: 3600 },
        });
        assert.equal(r.status, 201, r.text);
        const tr = r.body as { spec: { expirationSeconds: number }; status: { token: string } };
        assert.equal(tr.spec.expirationSeconds, 1);
        const t = { ...s, token: tr.status.token };
        s.upsertPod(pod('rbac-3', 'node-r'));
        assert.equal(
          (await apiRequest(t, 'GET', '/api/v1/namespaces/default/pods/rbac-3')).status,
          200,
          'the plugin account is known and may get pods',
        );
        await new Promise((resolve) => setTimeout(resolve, 1100));
        assert.equal((await apiRequest(t, 'GET', '/api/v1/namespaces/default/pods/rbac-3')).status, 401);
      } finally {
        s.tokenMaxSeconds = undefined;
      }
    });
  });

  it('deletes with a uid precondition: 409 on mismatch, 404 when absent', async () => {
    const p = s.upsertPod(pod('del-me', 'node-d'));
    const wrong = await apiRequest(s, 'DELETE', '/api/v1/namespaces/default/pods/del-me', {
      preconditions: { uid: 'not-the-uid' },
    });
    assert.equal(wrong.status, 409);
    assert.match((wrong.body as { message: string }).message, /Precondition failed: UID/);
    const ok = await apiRequest(s, 'DELETE', '/api/v1/namespaces/default/pods/del-me', {
      preconditions: { uid: p.metadata!.uid },
    });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(s.getPod('default', 'del-me'), undefined);
    const gone = await apiRequest(s, 'DELETE', '/api/v1/namespaces/default/pods/del-me', {
      preconditions: { uid: p.metadata!.uid },
    });
    assert.equal(gone.status, 404);
    assert.equal((gone.body as { reason: string }).reason, 'NotFound');
  });

  it('stores events and serves daemonsets', async () => {
    const ev = await apiRequest(s, 'POST', '/api/v1/namespaces/default/events', {
      metadata: { generateName: 'x.' },
      reason: 'Test',
      message: 'hello',
    });
    assert.equal(ev.status, 201, ev.text);
    assert.ok(s.events().some((e) => e.reason === 'Test'));
    s.upsertDaemonSet({ metadata: { name: 'mesh-cni', namespace: 'mesh-system' } });
    assert.equal((await apiRequest(s, 'GET', '/apis/apps/v1/namespaces/mesh-system/daemonsets/mesh-cni')).status, 200);
    s.deleteDaemonSetFromStore('mesh-system', 'mesh-cni');
    assert.equal((await apiRequest(s, 'GET', '/apis/apps/v1/namespaces/mesh-system/daemonsets/mesh-cni')).status, 404);
  });

  it('injects Status faults with Retry-After a given number of times, and logs requests', async () => {
    s.faults.status = { code: 429, retryAfterSeconds: 2, paths: /\/pods$/, count: 2 };
    const before = s.requests.length;
    const a = await apiRequest(s, 'GET', '/api/v1/pods');
    assert.equal(a.status, 429);
    assert.equal(a.headers['retry-after'], '2');
    assert.equal((a.body as { details: { retryAfterSeconds: number } }).details.retryAfterSeconds, 2);
    assert.equal(
      (await apiRequest(s, 'GET', '/api/v1/namespaces/default/pods/a1')).status,
      200,
      'other paths are not hit',
    );
    assert.equal((await apiRequest(s, 'GET', '/api/v1/pods')).status, 429);
    assert.equal((await apiRequest(s, 'GET', '/api/v1/pods')).status, 200, 'the fault clears after count');
    assert.deepEqual(
      s.requests.slice(before).map((r) => r.status),
      [429, 200, 429, 200],
    );
  });

  it('goes silent, closes watches, and comes back on the same port after stop()', async () => {
    s.faults.silentWatches = true;
    const w = openWatch(s, '/api/v1/pods?watch=true&allowWatchBookmarks=true');
    try {
      await new Promise((r) => setTimeout(r, 300));
      s.upsertPod(pod('silent', 'node-s'));
      await new Promise((r) => setTimeout(r, 300));
      assert.equal(w.events.length, 0, 'a silent watch sends nothing, not even bookmarks');
      s.faults.silentWatches = false;
      s.closeWatches();
      await assert.rejects(
        w.next(() => false, 2000),
        /ended/,
      );
    } finally {
      w.close();
    }
    const port = s.port;
    await s.stop();
    await assert.rejects(apiRequest(s, 'GET', '/version'));
    await s.start();
    assert.equal(s.port, port);
    assert.equal((await apiRequest(s, 'GET', '/version')).status, 200);
  });

  it('works with the real kubectl: get, get -w, label, delete', async () => {
    const kc = s.writeOrchconfig(path.join(dir, 'kubeconfig.json'));
    const kubectl = (args: string[]) =>
      new Promise<{ code: number | null; out: string; err: string }>((resolve, reject) => {
        const c = spawn('kubectl', ['--kubeconfig', kc, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
        let out = '';
        let err = '';
        c.stdout.on('data', (d: Buffer) => (out += d.toString()));
        c.stderr.on('data', (d: Buffer) => (err += d.toString()));
        const t = setTimeout(() => c.kill('SIGKILL'), 20_000);
        c.on('error', reject);
        c.on('close', (code) => {
          clearTimeout(t);
          resolve({ code, out, err });
        });
      });
    s.upsertPod(pod('kube-1', 'node-k', { app: 'k' }));
    const get = await kubectl(['get', 'pods', '-l', 'app=k']);
    assert.equal(get.code, 0, get.err);
    assert.match(get.out, /^NAME\s+READY\s+STATUS/m);
    assert.match(get.out, /^kube-1\s+0\/1\s+Running/m);

    // get -w: the initial list, then a pod added meanwhile arrives as a new row.
    const watcher = spawn(
      'kubectl',
      ['--kubeconfig', kc, 'get', 'pods', '-w', '-l', 'app=k', '--request-timeout=30s'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    try {
      let out = '';
      const seen = (re: RegExp) =>
        new Promise<void>((resolve, reject) => {
          const t = setTimeout(
            () => reject(new Error(`kubectl get -w never printed ${re}; got ${JSON.stringify(out)}`)),
            15_000,
          );
          const check = () => {
            if (re.test(out)) {
              clearTimeout(t);
              resolve();
            }
          };
          watcher.stdout.on('data', (d: Buffer) => {
            out += d.toString();
            check();
          });
          check();
        });
      await seen(/kube-1/);
      s.upsertPod(pod('kube-2', 'node-k', { app: 'k' }));
      await seen(/kube-2/);
    } finally {
      watcher.kill('SIGTERM');
    }

    const label = await kubectl(['label', 'pod', 'kube-1', 'repaired=yes']);
    assert.equal(label.code, 0, label.err);
    assert.equal(s.getPod('default', 'kube-1')!.metadata!.labels!.repaired, 'yes');
    const del = await kubectl(['delete', 'pod', 'kube-1', '--timeout=10s']);
    assert.equal(del.code, 0, del.err);
    assert.match(del.out, /deleted/);
    assert.equal(s.getPod('default', 'kube-1'), undefined);
    const bad = await kubectl(['get', 'pods']);
    assert.equal(bad.code, 0);
    const noauth = s.writeOrchconfig(path.join(dir, 'bad.json'), { token: 'nope' });
    const denied = await new Promise<number | null>((resolve) => {
      spawn('kubectl', ['--kubeconfig', noauth, 'get', 'pods'], { stdio: 'ignore' }).on('close', resolve);
    });
    assert.notEqual(denied, 0);
  });
});

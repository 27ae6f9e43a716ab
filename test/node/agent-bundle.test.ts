// The shipped agent, dist/install-cni.js (built by `npm test`'s pretest), against the test API
// server. The other agent tests run the TypeScript sources; the bundle differs in what it leaves
// out of @kubernetes/client-node (scripts/slim-client-node.ts), so its API paths are run here:
// in-cluster config with a service-account token, the watch, merge patch (pods/status), delete
// with a uid precondition, events, TokenRequest for the plugin's token, the two reads of
// --cleanup-on-exit=auto, and the error for a kubeconfig feature the bundle leaves out. The agent
// runs with exactly the rights deploy/ gives it (plus pods delete, as the repair-delete component).

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { eventually } from '../helpers/poll.ts';
import { brokenPod } from '../helpers/pods.ts';
import { ROOT } from '../helpers/cli.ts';
import { LEFT_OUT } from '../../scripts/slim-client-node.ts';
import { DEPLOY_DIR, kustomize } from '../helpers/podman-daemonset.ts';
import { rulesFor } from '../helpers/rbac.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';

const defer = cleanupAfterEach();

async function setUp(): Promise<{ api: TestApiServer; t: HostTree }> {
  const api = await startTestApiServer({ bookmarkIntervalMs: 200 });
  defer(() => api.close());
  const rules = [
    ...rulesFor(kustomize(DEPLOY_DIR).objects, 'mesh-system', 'mesh-cni'),
    { verbs: ['delete'], apiGroups: [''], resources: ['pods'] },
  ];
  const t = await makeHostTree({ token: api.serviceAccount('mesh-system', 'mesh-cni', rules), ca: api.caPem });
  defer(() => t.remove());
  await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  return { api, t };
}

function bundled(t: HostTree, flags: Record<string, string>, env: Record<string, string>): AgentProcess {
  const a = spawnAgent(t, flags, env, 'bundle');
  defer(() => a.stop('SIGKILL'));
  return a;
}

describe('the shipped agent bundle (dist/install-cni.js)', () => {
  it('stubs every name client-node (and node-fetch) use from the modules it leaves out', async () => {
    const dirs = ['node_modules/@kubernetes/client-node/dist', 'node_modules/node-fetch/lib'];
    const files = (
      await Promise.all(
        dirs.map(async (d) =>
          (await fs.readdir(path.join(ROOT, d))).filter((f) => /\.js$/.test(f)).map((f) => path.join(ROOT, d, f)),
        ),
      )
    ).flat();
    const used = new Map<string, Set<string>>();
    for (const file of files) {
      const text = await fs.readFile(file, 'utf8');
      for (const mod of Object.keys(LEFT_OUT)) {
        const q = mod.replace(/[-/]/g, '\\$&');
        const names = used.get(mod) ?? used.set(mod, new Set()).get(mod)!;
        for (const m of text.matchAll(new RegExp(`import \\{([^}]*)\\} from '${q}'`, 'g')))
          for (const n of m[1]!.split(',')) names.add(n.trim().split(/\\s+as\\s+/)[0]!);
        for (const m of text.matchAll(
          new RegExp(
            `(?:import \\* as (\\w+) from '${q}'|var (\\w+) = (?:_interopDefault\\()?require\\('${q}'\\))`,
            'g',
          ),
        )) {
          const ns = m[1] ?? m[2]!;
          for (const p of text.matchAll(new RegExp(`\\b${ns}\\.(\\w+)`, 'g'))) names.add(p[1]!);
        }
      }
    }
    for (const [mod, names] of used) {
      assert.ok(names.size > 0, `${mod} is still imported by client-node or node-fetch (else drop it from LEFT_OUT)`);
      for (const n of names)
        assert.ok(
          LEFT_OUT[mod]!.names.includes(n),
          `${mod}.${n} is used but not stubbed in scripts/slim-client-node.ts`,
        );
    }
  });

  it('repairs through the service account: watch, label, delete with the uid, event; asks for its DaemonSet on SIGTERM', async () => {
    const { api, t } = await setUp();
    api.upsertDaemonSet({ metadata: { name: 'mesh-cni-node', namespace: 'mesh-system' } });
    api.upsertPod({
      metadata: {
        name: 'mesh-cni-node-x',
        namespace: 'mesh-system',
        ownerReferences: [
          { apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'mesh-cni-node', uid: 'u1', controller: true },
        ],
      },
      spec: { nodeName: 'node-1', containers: [{ name: 'install-cni' }] },
    });
    const env = {
      KUBERNETES_SERVICE_HOST: api.host,
      KUBERNETES_SERVICE_PORT: String(api.port),
      NODE_NAME: 'node-1',
      POD_NAME: 'mesh-cni-node-x',
      POD_NAMESPACE: 'mesh-system',
    };
    const a = bundled(
      t,
      {
        'repair-enabled': 'true',
        'repair-label-pods': 'true',
        'repair-delete-pods': 'true',
        'cleanup-on-exit': 'auto',
      },
      env,
    );
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    const broken = api.upsertPod(brokenPod('raced', { node: 'node-1' }));
    await eventually(() => api.listPods().every((p) => p.metadata?.name !== 'raced'), 'the broken pod deleted', 10_000);
    const sent = (method: string, re: RegExp) => api.requests.filter((r) => r.method === method && re.test(r.path));
    assert.equal(sent('PATCH', /\/pods\/raced\/status$/).length, 1, 'labelled once');
    assert.equal(
      sent('POST', /\/serviceaccounts\/mesh-cni-plugin\/token$/)[0]?.status,
      201,
      "minted the plugin's token",
    );
    assert.deepEqual(
      api.requests.filter((r) => r.status === 403).map((r) => `${r.method} ${r.path}`),
      [],
      'nothing beyond its rights',
    );
    assert.equal(sent('DELETE', /\/pods\/raced$/).length, 1, 'deleted once');
    assert.equal(sent('DELETE', /\/pods\/raced$/)[0]!.status, 200);
    assert.ok(
      api.requests.some((r) => r.method === 'GET' && r.path === '/api/v1/pods' && /watch=true/.test(r.query)),
      'watched',
    );
    await eventually(() => sent('POST', /\/events$/).length >= 1, 'an event recorded');
    // Same name, new uid: the delete precondition of an old repair must never hit it.
    const again = api.upsertPod({ ...brokenPod('raced', { node: 'node-1' }), status: { phase: 'Running' } });
    assert.notEqual(again.metadata?.uid, broken.metadata?.uid);
    assert.equal(await a.stop('SIGTERM'), 0);
    assert.match(
      String(a.logs.find((r) => r.msg === 'leaving mesh-cni installed')?.why),
      /DaemonSet mesh-system\/mesh-cni-node still exists/,
    );
    assert.doesNotMatch(a.stderr(), /DEP0169|DeprecationWarning/, 'no deprecation noise on stderr');
  });

  it('keeps its connections to the API server alive across repairs, and trusts a rotated CA', async () => {
    const { api, t } = await setUp();
    const env = { KUBERNETES_SERVICE_HOST: api.host, KUBERNETES_SERVICE_PORT: String(api.port), NODE_NAME: 'node-1' };
    const a = bundled(t, { 'repair-enabled': 'true', 'repair-label-pods': 'true', 'repair-delete-pods': 'true' }, env);
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    const before = api.connections();
    for (let i = 0; i < 60; i++) api.upsertPod(brokenPod(`burst-${i}`, { node: 'node-1' }));
    await eventually(
      () => !api.listPods().some((p) => p.metadata?.name?.startsWith('burst-')),
      '60 broken pods deleted',
      20_000,
    );
    const used = api.connections() - before;
    // 60 labels + 60 deletes + 60 events, 16 repairs at a time with their events beside them: about
    // one connection per concurrent request, not one per request.
    assert.ok(used <= 40, `${used} TLS handshakes for 180 requests`);
    // The API server moves to a certificate from a new CA and the kubelet updates the projected
    // ca.crt: the kept connections are cut, new ones must trust the new CA, and repairs go on.
    const newCa = await api.rotateCertificate();
    await t.rotate({ 'ca.crt': newCa });
    api.upsertPod(brokenPod('after-rotation', { node: 'node-1' }));
    await eventually(
      () => !api.listPods().some((p) => p.metadata?.name === 'after-rotation'),
      'repaired after the CA rotation',
      15_000,
    );
  });

  it('says which kubeconfig feature is left out when an orchconfig needs it (oidc auth-provider)', async () => {
    const { api, t } = await setUp();
    // An expired id-token with a refresh token: client-node's oidc provider goes to openid-client.
    const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
    const expired = `${b64({ alg: 'none' })}.${b64({ exp: 1 })}.sig`;
    const kc = {
      apiVersion: 'v1',
      kind: 'Config',
      'current-context': 'c',
      clusters: [
        {
          name: 'c',
          cluster: {
            server: `https://${api.host}:${api.port}`,
            'certificate-authority-data': Buffer.from(api.caPem).toString('base64'),
          },
        },
      ],
      users: [
        {
          name: 'u',
          user: {
            'auth-provider': {
              name: 'oidc',
              config: {
                'client-id': 'x',
                'id-token': expired,
                'refresh-token': 'r',
                'idp-issuer-url': 'https://127.0.0.1:1',
              },
            },
          },
        },
      ],
      contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
    };
    const file = path.join(t.root, 'oidc-kubeconfig.json');
    await fs.writeFile(file, JSON.stringify(kc));
    const a = bundled(
      t,
      {
        'repair-enabled': 'true',
        'repair-label-pods': 'true',
        orchconfig: file,
        log_output_level: 'default:info,repair:debug',
      },
      { NODE_NAME: 'node-1' },
    );
    const rec = await a.waitForLog(
      (r) => /built without openid-client/.test(JSON.stringify(r)),
      'the left-out auth-provider named',
      15_000,
    );
    assert.match(JSON.stringify(rec), /oidc auth-provider/);
    assert.equal(a.child.exitCode, null, 'the agent keeps running (and retrying) rather than crashing');
  });
});

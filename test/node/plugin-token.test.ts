// The node's disk holds no cluster-wide write credential. The agent mints the plugin's
// own short-lived token (TokenRequest, mesh-cni-plugin: pods get only) and puts that, never its
// own token, into the orchconfig in the host's CNI net dir; it refreshes the token at 50-80% of
// its lifetime, keeps the old one while refreshing fails, and says so on /readyz and in a metric.
// Against the test API server with the exact RBAC deploy/ grants each account.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import {
  fileTokenSource,
  PluginTokenMinter,
  refreshDelayMs,
  serviceAccountOfToken,
  tokenRequestMint,
} from '../../src/install/tokenrequest.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import {
  apiRequest,
  startTestApiServer,
  unsignedJwt as jwt,
  type TestApiServer,
  type TokenRequestAnswer,
} from '../helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { promtoolProblems } from '../helpers/observability.ts';
import { DEPLOY_DIR, kustomize, type K8sObject } from '../helpers/podman-daemonset.ts';
import { waitFor } from '../helpers/poll.ts';
import { testPod } from '../helpers/pods.ts';
import { rulesFor } from '../helpers/rbac.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const defer = cleanupAfterEach();

let manifests: K8sObject[];
before(() => {
  manifests = kustomize(DEPLOY_DIR).objects;
  configureLogging(
    { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
    { write: () => {} },
  );
});
after(() => configureLogging({ asJson: false, outputLevels: buildSettings({}, {}).logging.outputLevels }));

/** A test API server that knows both accounts with exactly deploy/'s rules; returns the agent's token. */
async function cluster(): Promise<{ api: TestApiServer; agentToken: string }> {
  const api = await startTestApiServer({ bookmarkIntervalMs: 200 });
  defer(() => api.close());
  api.serviceAccount('mesh-system', 'mesh-cni-plugin', rulesFor(manifests, 'mesh-system', 'mesh-cni-plugin'));
  const agentToken = api.serviceAccount('mesh-system', 'mesh-cni', rulesFor(manifests, 'mesh-system', 'mesh-cni'));
  return { api, agentToken };
}

/** A minter of the plugin's token as the agent has it, against a server that grants 2 s (refreshed after 1-1.6 s). */
async function shortLivedMinter(api: TestApiServer, agentToken: string): Promise<PluginTokenMinter> {
  const kc = orchKubeConfig(
    orchClientArgs(
      buildSettings({ orchconfig: api.writeOrchconfig(path.join(await tmp(), 'agent.kc'), { token: agentToken }) }, {}),
    ),
  );
  api.tokenMaxSeconds = 2;
  const minter = new PluginTokenMinter(
    tokenRequestMint(kc, {
      namespace: 'mesh-system',
      serviceAccount: 'mesh-cni-plugin',
      expirationSeconds: 3600,
      audiences: [],
      agentToken: async () => agentToken,
    }),
    { account: 'service account mesh-system/mesh-cni-plugin', retryBaseMs: 100, retryMaxMs: 200 },
  );
  defer(() => minter.stop());
  return minter;
}

async function metric(name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  return (m?.values ?? [])
    .filter((v) => Object.entries(labels).every(([k, val]) => v.labels[k] === val))
    .reduce((n, v) => n + v.value, 0);
}

const orchToken = (file: string) =>
  (JSON.parse(readFileSync(file, 'utf8')) as { users: { user: { token: string } }[] }).users[0]!.user.token;

/** Every file under dir whose bytes contain needle. */
async function filesHolding(dir: string, needle: string): Promise<string[]> {
  const hits: string[] = [];
  for (const e of await fs.readdir(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    const file = path.join(e.parentPath, e.name);
    if ((await fs.readFile(file)).includes(Buffer.from(needle))) hits.push(file);
  }
  return hits;
}

describe("the plugin's token", () => {
  it('refreshes at 50-80% of the lifetime, spread by the random draw', () => {
    assert.equal(refreshDelayMs(3_600_000, 0), 1_800_000);
    assert.equal(refreshDelayMs(3_600_000, 1), 2_880_000);
    assert.equal(refreshDelayMs(3_600_000, 0.5), 2_340_000);
    assert.equal(refreshDelayMs(1000, 7), 800, 'a draw out of range is clamped');
    assert.equal(refreshDelayMs(-5, 0.5), 0, 'an already expired token is refreshed at once');
  });

  it("is minted with the agent's rights from deploy/ for mesh-cni-plugin alone, for the asked lifetime and the default audience, and can only get pods", async () => {
    const { api, agentToken } = await cluster();
    const kc = orchKubeConfig(
      orchClientArgs(
        buildSettings(
          { orchconfig: api.writeOrchconfig(path.join(await tmp(), 'agent.kc'), { token: agentToken }) },
          {},
        ),
      ),
    );
    const mint = tokenRequestMint(kc, {
      namespace: 'mesh-system',
      serviceAccount: 'mesh-cni-plugin',
      expirationSeconds: 3600,
      audiences: [],
    });
    const t = await mint(AbortSignal.timeout(5000));
    const issued = api.issuedTokens();
    assert.deepEqual(
      issued.map((i) => [i.serviceAccount, i.audiences]),
      [['mesh-system/mesh-cni-plugin', ['https://kubernetes.default.svc.cluster.local']]],
    );
    assert.equal(issued[0]!.token, t.token);
    assert.ok(Math.abs(t.expiresAt - (Date.now() + 3600_000)) < 5000, 'expiry from the answer');
    assert.notEqual(t.token, agentToken);
    // What the plugin does (get its pod) works; nothing else does.
    api.upsertPod(testPod('app-0'));
    const plugin = { ...api, token: t.token };
    assert.equal((await apiRequest(plugin, 'GET', '/api/v1/namespaces/default/pods/app-0')).status, 200);
    assert.equal((await apiRequest(plugin, 'GET', '/api/v1/pods')).status, 403);
    assert.equal(
      (
        await apiRequest(
          plugin,
          'PATCH',
          '/api/v1/namespaces/default/pods/app-0',
          { metadata: { labels: { x: '1' } } },
          { 'content-type': 'application/merge-patch+json' },
        )
      ).status,
      403,
    );
    assert.equal(
      (
        await apiRequest(
          plugin,
          'PATCH',
          '/api/v1/namespaces/default/pods/app-0/status',
          { metadata: { labels: { x: '1' } } },
          { 'content-type': 'application/merge-patch+json' },
        )
      ).status,
      403,
    );
    assert.equal(
      (
        await apiRequest(plugin, 'POST', '/api/v1/namespaces/mesh-system/serviceaccounts/mesh-cni-plugin/token', {
          spec: {},
        })
      ).status,
      403,
    );
    // The agent may mint for that one account only (resourceNames), and only in its namespace.
    await assert.rejects(
      tokenRequestMint(kc, {
        namespace: 'mesh-system',
        serviceAccount: 'mesh-cni',
        expirationSeconds: 3600,
        audiences: [],
      })(AbortSignal.timeout(5000)),
      /HTTP 403/,
    );
    await assert.rejects(
      tokenRequestMint(kc, {
        namespace: 'kube-system',
        serviceAccount: 'mesh-cni-plugin',
        expirationSeconds: 3600,
        audiences: [],
      })(AbortSignal.timeout(5000)),
      /HTTP 403/,
    );
  });

  it("times the refresh by the lifetime granted, not by the API server's clock (a node clock 50 minutes behind)", async () => {
    const { api, agentToken } = await cluster();
    api.clockSkewMs = 3_000_000;
    const kc = orchKubeConfig(
      orchClientArgs(
        buildSettings(
          { orchconfig: api.writeOrchconfig(path.join(await tmp(), 'agent.kc'), { token: agentToken }) },
          {},
        ),
      ),
    );
    const t = await tokenRequestMint(kc, {
      namespace: 'mesh-system',
      serviceAccount: 'mesh-cni-plugin',
      expirationSeconds: 3600,
      audiences: [],
    })(AbortSignal.timeout(5000));
    // The token dies 3600 s from now whatever the clocks say; its timestamp would say 6600 s here.
    assert.ok(
      Math.abs(t.expiresAt - (Date.now() + 3_600_000)) < 5000,
      `expires in ${Math.round((t.expiresAt - Date.now()) / 1000)} s`,
    );
  });

  it("asks for the configured audiences and lifetime; refuses a lifetime under the API server's 10 minutes", async () => {
    const { api, agentToken } = await cluster();
    const settings = buildSettings(
      {
        orchconfig: api.writeOrchconfig(path.join(await tmp(), 'agent.kc'), { token: agentToken }),
        'plugin-token-audiences': 'mesh-cni,other',
        'plugin-token-expiration': '20m',
      },
      {},
    );
    assert.equal(settings.install.pluginTokenExpirationMs, 1_200_000);
    const mint = tokenRequestMint(orchKubeConfig(orchClientArgs(settings)), {
      namespace: 'mesh-system',
      serviceAccount: settings.install.pluginServiceAccount,
      expirationSeconds: settings.install.pluginTokenExpirationMs / 1000,
      audiences: settings.install.pluginTokenAudiences,
    });
    const t = await mint(AbortSignal.timeout(5000));
    assert.deepEqual(api.issuedTokens().at(-1)?.audiences, ['mesh-cni', 'other']);
    assert.ok(Math.abs(t.expiresAt - (Date.now() + 1_200_000)) < 5000);
    // Why the default is the API server's own audience: a token for another one is no use there.
    api.upsertPod(testPod('aud-0'));
    assert.equal(
      (await apiRequest({ ...api, token: t.token }, 'GET', '/api/v1/namespaces/default/pods/aud-0')).status,
      401,
    );
    assert.throws(() => buildSettings({ 'plugin-token-expiration': '5m' }, {}), /--plugin-token-expiration/);
    // A token on the node's disk lives a day at most: 24h is taken, anything longer refused.
    assert.equal(buildSettings({ 'plugin-token-expiration': '24h' }, {}).install.pluginTokenExpirationMs, 86_400_000);
    assert.throws(() => buildSettings({ 'plugin-token-expiration': '24h1s' }, {}), /--plugin-token-expiration.*24h/);
    assert.throws(() => buildSettings({ 'plugin-token-expiration': '500h' }, {}), /--plugin-token-expiration/);
    assert.throws(() => buildSettings({ 'plugin-service-account': 'Not_A_Name' }, {}), /--plugin-service-account/);
  });

  it('has a series for every failure reason before the first failure, so an alert can fire on it', async () => {
    const m = (await registry.getMetricsAsJSON()).find(
      (x) => x.name === 'mesh_cni_plugin_token_refresh_failures_total',
    );
    const reasons = (m?.values ?? []).map((v) => v.labels.reason).sort();
    for (const reason of ['client_error', 'refused', 'server_error', 'throttled', 'unreachable'])
      assert.ok(reasons.includes(reason), `no series for reason="${reason}" (have ${reasons.join(', ')})`);
  });

  it('keeps the old token while refreshing fails, counts the failures, says why on readiness once it is late or expired, and recovers', async () => {
    const { api, agentToken } = await cluster();
    const minter = await shortLivedMinter(api, agentToken);
    let changes = 0;
    minter.onChange(() => changes++);
    await minter.start();
    const first = await minter.current();
    assert.ok('token' in first);
    assert.deepEqual(minter.notReadyReasons(), []);
    await waitFor('a refresh', () => api.issuedTokens().length >= 2, 5000);
    await waitFor('the listener told', () => changes >= 2, 2000);
    const second = await minter.current();
    assert.ok('token' in second && second.token !== first.token, 'a new token');

    const failuresBefore = await metric('mesh_cni_plugin_token_refresh_failures_total', { reason: 'server_error' });
    api.faults.status = { code: 500, paths: /\/serviceaccounts\/mesh-cni-plugin\/token$/ };
    const reasons = await waitFor(
      'readiness to say the token is late',
      () => minter.notReadyReasons().length > 0 && minter.notReadyReasons(),
      5000,
    );
    assert.match(reasons[0]!, /plugin's token \(service account mesh-system\/mesh-cni-plugin\) (expires|expired)/);
    assert.match(reasons[0]!, /HTTP 500/);
    assert.deepEqual(await minter.current(), second, 'the old token stays in use');
    await waitFor('readiness to say it expired', () => /expired at/.test(minter.notReadyReasons()[0] ?? ''), 5000);
    assert.ok(
      (await metric('mesh_cni_plugin_token_refresh_failures_total', { reason: 'server_error' })) - failuresBefore >= 2,
      'failures counted',
    );

    delete api.faults.status;
    await waitFor('ready again after a good refresh', () => minter.notReadyReasons().length === 0, 5000);
    const third = await minter.current();
    assert.ok('token' in third && third.token !== second.token);
    assert.ok((await metric('mesh_cni_plugin_token_expiry_timestamp_seconds')) * 1000 > Date.now());
    assert.equal(await promtoolProblems(await registry.metrics()), '');
  });

  it('a refused refresh keeps the old token in use and says why on readiness at once; the next good one clears it', async () => {
    const { api, agentToken } = await cluster();
    const minter = await shortLivedMinter(api, agentToken);
    await minter.start();
    const first = await minter.current();
    assert.ok('token' in first);
    const refusedBefore = await metric('mesh_cni_plugin_token_refresh_failures_total', { reason: 'refused' });
    api.faults.tokenAnswer = (ans) => ({ ...ans, status: { ...ans.status, token: agentToken } });
    const reasons = await waitFor(
      'readiness to say the answer was refused',
      () => minter.notReadyReasons().length > 0 && minter.notReadyReasons(),
      5000,
    );
    assert.match(reasons[0]!, /holds the agent's own token; not written to the node/);
    assert.deepEqual(await minter.current(), first, 'the old token stays in use');
    assert.ok((await metric('mesh_cni_plugin_token_refresh_failures_total', { reason: 'refused' })) > refusedBefore);
    delete api.faults.tokenAnswer;
    await waitFor('ready again after a good answer', () => minter.notReadyReasons().length === 0, 5000);
    const next = await minter.current();
    assert.ok('token' in next && next.token !== first.token && next.token !== agentToken);
  });

  it('once the old token expired, a failing API server is retried on the backoff alone, not at the retry floor', async () => {
    let clock = Date.now();
    let calls = 0;
    const minter = new PluginTokenMinter(
      async () => {
        calls++;
        if (calls === 1) return { token: 'short-lived', expiresAt: clock + 1000 };
        throw new Error('connect ECONNREFUSED');
      },
      {
        account: 'service account mesh-system/mesh-cni-plugin',
        now: () => clock,
        random: () => 1,
        retryBaseMs: 20,
        retryMaxMs: 10_000,
      },
    );
    defer(() => minter.stop());
    await minter.start();
    clock += 60_000; // the token expired long ago when the refreshes fail
    await waitFor('four failed refreshes', () => (minter.status() as { failures: number }).failures >= 4, 5000);
    await minter.stop();
    const st = minter.status() as { failures: number; nextAttemptInMs: number };
    assert.equal(st.nextAttemptInMs, 20 * 2 ** (st.failures - 1), 'the doubled step, not the 20 ms floor');
    assert.match(minter.notReadyReasons()[0]!, /expired at .*refreshing failed \d+ time\(s\), last: .*ECONNREFUSED/);
  });

  it("a token file (--plugin-token-file) is used as given, but never the agent's own token", async () => {
    const dir = await tmp();
    const own = path.join(dir, 'own-token');
    const given = path.join(dir, 'plugin-token');
    await fs.writeFile(own, 'agent-secret\n');
    await fs.writeFile(given, 'plugin-secret\n');
    assert.deepEqual(await fileTokenSource(given, own).current(), { token: 'plugin-secret' });
    await fs.writeFile(given, 'agent-secret');
    assert.match(
      ((await fileTokenSource(given, own).current()) as { missing: string }).missing,
      /holds the agent's own token/,
    );
    assert.throws(
      () => buildSettings({ 'plugin-token-file': '/var/run/secrets/kubernetes.io/serviceaccount/token' }, {}),
      /--plugin-token-file.*agent's own service-account token/,
    );
    // Another token of the agent's own account (by its sub claim) is refused as well.
    await fs.writeFile(own, jwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni', n: 1 }));
    await fs.writeFile(given, jwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni', n: 2 }));
    assert.match(
      ((await fileTokenSource(given, own).current()) as { missing: string }).missing,
      /a token of the agent's own service account \(mesh-system\/mesh-cni\)/,
    );
    await fs.writeFile(given, jwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni-plugin' }));
    assert.ok('token' in (await fileTokenSource(given, own).current()), "the plugin's account is taken");
  });

  describe('a TokenRequest answer is input: its token goes to the node only if it is what was asked for', () => {
    const PLUGIN = 'system:serviceaccount:mesh-system:mesh-cni-plugin';
    const claimsOf = (token: string) =>
      JSON.parse(Buffer.from(token.split('.')[1]!, 'base64url').toString('utf8')) as Record<string, unknown>;
    /** The answer with its token's claims changed (the token re-made: no signature is checked here). */
    const reclaim =
      (change: (c: Record<string, unknown>) => Record<string, unknown>) =>
      (a: TokenRequestAnswer): TokenRequestAnswer => ({
        ...a,
        status: { ...a.status, token: jwt(change(claimsOf(a.status.token))) },
      });
    const withToken =
      (token: (a: TokenRequestAnswer) => string) =>
      (a: TokenRequestAnswer): TokenRequestAnswer => ({ ...a, status: { ...a.status, token: token(a) } });
    // The agent's own token as the kubelet projects it: a JWT of its account (mesh-system/mesh-cni).
    const agentJwt = jwt({
      sub: 'system:serviceaccount:mesh-system:mesh-cni',
      aud: ['https://kubernetes.default.svc.cluster.local'],
    });

    async function mintThrough(
      tamper: (a: TokenRequestAnswer) => unknown,
      opts: { audiences?: string[]; agentToken?: string } = {},
    ): Promise<{ token: string; expiresAt: number }> {
      const { api, agentToken } = await cluster();
      api.faults.tokenAnswer = tamper;
      const kc = orchKubeConfig(
        orchClientArgs(
          buildSettings(
            { orchconfig: api.writeOrchconfig(path.join(await tmp(), 'agent.kc'), { token: agentToken }) },
            {},
          ),
        ),
      );
      return tokenRequestMint(kc, {
        namespace: 'mesh-system',
        serviceAccount: 'mesh-cni-plugin',
        expirationSeconds: 3600,
        audiences: opts.audiences ?? [],
        agentToken: async () => opts.agentToken ?? agentJwt,
      })(AbortSignal.timeout(5000));
    }

    const refused: [
      string,
      (a: TokenRequestAnswer) => unknown,
      RegExp,
      { audiences?: string[]; agentToken?: string }?,
    ][] = [
      ["the agent's own token", withToken(() => agentJwt), /holds the agent's own token/],
      [
        "the agent's own opaque token (--orchconfig's)",
        withToken(() => 'agent-static-token'),
        /holds the agent's own token/,
        { agentToken: 'agent-static-token' },
      ],
      [
        "another token of the agent's own account",
        reclaim((c) => ({ ...c, sub: 'system:serviceaccount:mesh-system:mesh-cni' })),
        /holds a token of the agent's own service account \(mesh-system\/mesh-cni\)/,
      ],
      [
        'a token of another account',
        reclaim((c) => ({ ...c, sub: 'system:serviceaccount:kube-system:admin' })),
        /holds a token of service account kube-system\/admin, not of mesh-system\/mesh-cni-plugin/,
      ],
      [
        'a token that is no service-account JWT',
        withToken(() => 'opaque-bearer-token'),
        /is not a token of service account mesh-system\/mesh-cni-plugin/,
      ],
      [
        'a token of a node, not of a service account',
        reclaim((c) => ({ ...c, sub: 'system:node:node-1' })),
        /is not a token of service account mesh-system\/mesh-cni-plugin/,
      ],
      [
        'a token living a year where an hour was asked for',
        reclaim((c) => ({ ...c, exp: (c.iat as number) + 365 * 86400 })),
        /lives 31536000 s, longer than the 3600 s asked for/,
      ],
      ['a token without exp', reclaim(({ exp: _exp, ...c }) => c), /has no exp and iat claims/],
      [
        "an expirationTimestamp a day off the token's exp",
        (a: TokenRequestAnswer) => ({
          ...a,
          status: { ...a.status, expirationTimestamp: new Date(Date.now() + 86_400_000).toISOString() },
        }),
        /status.expirationTimestamp .* is not the token's exp/,
      ],
      [
        'a token for an audience other than the one asked for',
        reclaim((c) => ({ ...c, aud: ['https://kubernetes.default.svc.cluster.local'] })),
        /is for the audiences \["https:\/\/kubernetes.default.svc.cluster.local"\], not the \["mesh-cni"\] asked for/,
        { audiences: ['mesh-cni'] },
      ],
      [
        'a token of 20 KiB',
        reclaim((c) => ({ ...c, pad: 'x'.repeat(20 * 1024) })),
        /is \d+ bytes, more than a service-account token's 16384/,
      ],
      [
        'a token with a line break in it',
        withToken((a) => `${a.status.token}\r\nX-Injected: 1`),
        /holds characters no bearer token has/,
      ],
    ];
    for (const [what, tamper, why, opts] of refused) {
      it(`refuses ${what}`, async () => {
        await assert.rejects(mintThrough(tamper, opts), (e: Error) => {
          assert.match(e.message, /the TokenRequest answer for service account mesh-system\/mesh-cni-plugin/);
          assert.match(e.message, why);
          assert.equal(e.name, 'TokenRefusedError');
          return true;
        });
      });
    }

    it("takes the token's lifetime from its own claims, not from spec.expirationSeconds beside it", async () => {
      const t = await mintThrough((a) => ({ ...a, spec: { ...a.spec, expirationSeconds: 1e12 } }));
      assert.equal(claimsOf(t.token).sub, PLUGIN);
      assert.ok(
        Math.abs(t.expiresAt - (Date.now() + 3_600_000)) < 5000,
        `expires ${new Date(t.expiresAt).toISOString()}`,
      );
    });
  });

  it('the account a token is of is read from its sub claim, and nothing else passes for one', () => {
    assert.deepEqual(serviceAccountOfToken(jwt({ sub: 'system:serviceaccount:mesh-system:mesh-cni' })), {
      namespace: 'mesh-system',
      name: 'mesh-cni',
    });
    assert.equal(serviceAccountOfToken(jwt({ sub: 'system:node:node-1' })), null);
    assert.equal(serviceAccountOfToken(jwt({ sub: 'system:serviceaccount:a:b:c' })), null);
    assert.equal(serviceAccountOfToken(jwt({})), null);
    assert.equal(serviceAccountOfToken('sa-mesh-system-mesh-cni-opaque'), null);
    assert.equal(serviceAccountOfToken('a.!!!not-base64-json.c'), null);
  });

  it('the agent puts a replaced --plugin-token-file into the orchconfig at once (its dir is watched)', async () => {
    const t = await makeHostTree();
    defer(() => t.remove());
    await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    const a = spawnAgent(t, { 'reconcile-interval': '1h', 'cleanup-on-exit': 'never' });
    defer(() => a.stop('SIGKILL'));
    await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
    const orchconfig = path.join(t.netDir, 'ZZZ-mesh-cni-orchconfig');
    assert.equal(orchToken(orchconfig), 'plugin-token-1');
    const file = t.flags['plugin-token-file']!;
    await fs.writeFile(`${file}.new`, 'plugin-token-2\n');
    await fs.rename(`${file}.new`, file);
    // The periodic pass is an hour away: only a watch of the file's dir can do this.
    await waitFor('the new token in the orchconfig', () => orchToken(orchconfig) === 'plugin-token-2', 3000);
    assert.deepEqual(await filesHolding(t.netDir, '"token-1"'), [], "the agent's own token (token-1) is not there");
  });

  describe('the agent', () => {
    async function agentOn(
      api: TestApiServer,
      agentToken: string,
      flags: Record<string, string> = {},
    ): Promise<{ a: AgentProcess; t: HostTree }> {
      const t = await makeHostTree({ token: agentToken, ca: api.caPem });
      defer(() => t.remove());
      await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      const a = spawnAgent(
        t,
        { 'cleanup-on-exit': 'never', ...flags },
        {
          KUBERNETES_SERVICE_HOST: api.host,
          KUBERNETES_SERVICE_PORT: String(api.port),
          POD_NAMESPACE: 'mesh-system',
          NODE_NAME: 'node-1',
        },
      );
      defer(() => a.stop('SIGKILL'));
      return { a, t };
    }

    it("writes the plugin's minted token into the orchconfig (0600); the agent's own token is nowhere on the node's disk", async () => {
      const { api, agentToken } = await cluster();
      const { a, t } = await agentOn(api, agentToken);
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
      const orchconfig = path.join(t.netDir, 'ZZZ-mesh-cni-orchconfig');
      const token = orchToken(orchconfig);
      assert.equal((await fs.stat(orchconfig)).mode & 0o777, 0o600);
      assert.equal(
        api.issuedTokens().find((i) => i.token === token)?.serviceAccount,
        'mesh-system/mesh-cni-plugin',
        'the orchconfig holds a minted plugin token',
      );
      assert.deepEqual(await filesHolding(t.netDir, agentToken), [], "no file in the net dir holds the agent's token");
      assert.deepEqual(await filesHolding(t.binDir, agentToken), [], "no file in the bin dir holds the agent's token");
      assert.deepEqual(
        api.requests.filter((r) => r.status === 403).map((r) => `${r.method} ${r.path}`),
        [],
        "the agent stays within deploy/'s rights",
      );
      // Every part ready (the pod lookup's watch may list a moment after the installer is done).
      let last = { status: 0, body: '' };
      await waitFor('/readyz 200', async () => (last = await a.get('/readyz')).status === 200, {
        timeoutMs: 5000,
        context: () => last.body,
      });
    });

    it("refuses to start when --plugin-service-account is the agent's own account (its token's sub), and mints nothing", async () => {
      const { api } = await cluster();
      // A token shaped as the kubelet projects it (only its claims are read, never verified).
      const agentJwt = jwt({
        sub: 'system:serviceaccount:mesh-system:mesh-cni',
        aud: ['https://kubernetes.default.svc.cluster.local'],
      });
      const { a, t } = await agentOn(api, agentJwt, {
        'plugin-service-account': 'mesh-cni',
        'reconcile-interval': '1h',
      });
      const failed = await a.waitForLog((r) => r.msg === 'install-cni failed', 'the refusal');
      assert.match(
        String(failed.error),
        /--plugin-service-account mesh-cni is the agent's own service account \(mesh-system\/mesh-cni\)/,
      );
      assert.equal(await a.stop('SIGTERM'), 1);
      assert.deepEqual(api.issuedTokens(), [], 'no token minted');
      assert.deepEqual(
        api.requests.filter((r) => r.path.endsWith('/token')),
        [],
        'no TokenRequest sent',
      );
      assert.deepEqual(await filesHolding(t.netDir, agentJwt), []);
    });

    it("writes no token a TokenRequest answer hands back that is not the plugin's (here the agent's own): /readyz 503 with why and what to do, counted; written once the answers are right", async () => {
      const { api, agentToken } = await cluster();
      api.faults.tokenAnswer = (ans) => ({ ...ans, status: { ...ans.status, token: agentToken } });
      const { a, t } = await agentOn(api, agentToken, { 'reconcile-interval': '1h' });
      const orchconfig = path.join(t.netDir, 'ZZZ-mesh-cni-orchconfig');
      const notReady = await waitFor(
        '/readyz 503 naming the refused token',
        async () => {
          const r = await a.get('/readyz');
          return r.status === 503 && /refused|holds the agent's own token/.test(r.body) && r.body;
        },
        8000,
      );
      assert.match(
        notReady,
        /the TokenRequest answer for service account mesh-system\/mesh-cni-plugin holds the agent's own token; not written to the node\. Find what answers TokenRequests/,
      );
      assert.ok(!notReady.includes(agentToken), 'the reason never shows the token');
      assert.match(
        (await a.get('/metrics')).body,
        /^mesh_cni_plugin_token_refresh_failures_total\{reason="refused"\} [1-9]/m,
      );
      assert.equal(await fs.stat(orchconfig).catch(() => null), null, 'no orchconfig written');
      assert.deepEqual(await filesHolding(t.root, agentToken).then((f) => f.filter((x) => !x.startsWith(t.saDir))), []);

      delete api.faults.tokenAnswer;
      await waitFor(
        'the plugin token in the orchconfig',
        () =>
          fs.stat(orchconfig).then(
            () => true,
            () => false,
          ),
        8000,
      );
      assert.equal(
        api.issuedTokens().find((i) => i.token === orchToken(orchconfig))?.serviceAccount,
        'mesh-system/mesh-cni-plugin',
      );
      await waitFor('/readyz 200', async () => (await a.get('/readyz')).status === 200, 8000);
    });

    it('refreshes the token in the orchconfig before it expires, and turns /readyz 503 with the reason while it cannot', async () => {
      const { api, agentToken } = await cluster();
      api.tokenMaxSeconds = 2;
      const { a, t } = await agentOn(api, agentToken);
      await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready');
      const orchconfig = path.join(t.netDir, 'ZZZ-mesh-cni-orchconfig');
      const first = orchToken(orchconfig);
      await waitFor('a refreshed token in the orchconfig', () => orchToken(orchconfig) !== first, 5000);
      assert.equal((await fs.stat(orchconfig)).mode & 0o777, 0o600);
      api.faults.status = { code: 503, paths: /\/serviceaccounts\/mesh-cni-plugin\/token$/ };
      const held = orchToken(orchconfig);
      const notReady = await waitFor(
        '/readyz 503 naming the token',
        async () => {
          const r = await a.get('/readyz');
          return r.status === 503 && /plugin's token/.test(r.body) && r.body;
        },
        8000,
      );
      assert.match(notReady, /mesh-system\/mesh-cni-plugin/);
      assert.equal(orchToken(orchconfig), held, 'the old token stays while refreshing fails');
      assert.match(
        (await a.get('/metrics')).body,
        /^mesh_cni_plugin_token_refresh_failures_total\{reason="server_error"\} [1-9]/m,
      );
      delete api.faults.status;
      await waitFor('/readyz 200 again', async () => (await a.get('/readyz')).status === 200, 8000);
      // The new token is written by the pass its arrival triggers, just after.
      await waitFor('a new token in the orchconfig', () => orchToken(orchconfig) !== held, 3000);
    });
  });
});

async function tmp(): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-token-'));
  defer(() => fs.rm(dir, { recursive: true, force: true }));
  return dir;
}

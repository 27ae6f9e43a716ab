// --vklog: the agent's API requests logged in scope klog (docs/observability.md "Logs"), against
// the test HTTPS API server: nothing at -v 0-3; at 4 one line a request (method, path with query,
// status, latency); at 8 the bodies too (a watch: its events). A token never appears in any line at
// any level: not the bearer token the agent sends, not the token a TokenRequest answers with, not a
// JWT in an answer that is not JSON.

import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { buildSettings } from '../../src/config/settings.ts';
import { resetLogging, configureLogging } from '../../src/monitoring/logging.ts';
import { clientNodeApi, type WatchEventType } from '../../src/orch/api.ts';
import { apiRequest, apiWatch } from '../../src/orch/request.ts';
import { redactBody } from '../../src/orch/requestlog.ts';
import { tokenRequestMint } from '../../src/install/tokenrequest.ts';
import { PLUGIN_SERVICE_ACCOUNT, startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { captureSink } from '../helpers/observability.ts';
import { meshPod, tempDir } from '../helpers/plugin.ts';
import { waitFor } from '../helpers/poll.ts';

const JWT = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.c2lnbmF0dXJl';

interface Run {
  readonly lines: string[];
  readonly minted: string;
}

describe('--vklog: API request logging', () => {
  const tmp = tempDir();
  let api: TestApiServer;
  let kc: KubeConfig;
  let plain: http.Server;
  let plainKc: KubeConfig;
  const runs = new Map<number, Run>();

  /** Every kind of call the agent makes, at verbosity v, everything else at debug. */
  async function exercise(v: number): Promise<Run> {
    const sink = captureSink();
    configureLogging(buildSettings({ vklog: String(v), log_output_level: 'all:debug' }, {}).logging, sink);
    const orch = clientNodeApi(kc);
    const signal = AbortSignal.timeout(10_000);
    const pod = api.upsertPod(meshPod('shop', `cart-${v}`));
    const q = { fieldSelector: 'metadata.namespace=shop', labelSelector: '' };
    const list = await orch.list('pods', { ...q, limit: 50 }, signal);
    await orch.labelPod(pod, 'mesh.io/vklog', String(v), signal);
    const involvedObject = { kind: 'Pod', namespace: 'shop', name: pod.metadata!.name! };
    const event = { metadata: { generateName: 'vklog-' }, involvedObject, reason: 'Test', message: 'hello' };
    await orch.createEvent('shop', event, signal);
    // A watch from the list's version: its events are the label change and anything after.
    const events: WatchEventType[] = [];
    const watchQuery = { ...q, resourceVersion: list.resourceVersion, timeoutSeconds: 30 };
    const controller = await orch.watch(
      'pods',
      watchQuery,
      (type) => events.push(type),
      () => {},
    );
    await waitFor('a watch event', () => events.find((t) => t === 'MODIFIED'));
    controller.abort();
    // A TokenRequest: its answer holds the plugin's token.
    const { namespace, name: serviceAccount } = PLUGIN_SERVICE_ACCOUNT;
    const mint = tokenRequestMint(kc, { namespace, serviceAccount, expirationSeconds: 3600, audiences: [] });
    const { token: minted } = await mint(signal);
    // A refusal (404 with a Status), and an answer that is not JSON with a JWT in it.
    await assert.rejects(orch.deletePod(meshPod('shop', 'gone'), signal), /404/);
    await assert.rejects(apiRequest(plainKc, 'GET', '/not-json', 'reading a broken answer'), /not JSON/);
    await resetLogging();
    return { lines: sink.lines, minted };
  }

  before(async () => {
    api = await startTestApiServer();
    kc = new KubeConfig();
    kc.loadFromFile(api.writeOrchconfig(path.join(tmp.dir, 'orchconfig')));
    plain = http.createServer((_req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(`{"status":{"token":"${JWT}`);
    });
    await new Promise<void>((r) => plain.listen(0, '127.0.0.1', r));
    const { port } = plain.address() as AddressInfo;
    plainKc = new KubeConfig();
    plainKc.loadFromOptions({
      // http: client-node allows it only with skipTLSVerify.
      clusters: [{ name: 'c', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }],
      users: [{ name: 'u', token: JWT }],
      contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
      currentContext: 'x',
    });
    for (let v = 0; v <= 10; v++) runs.set(v, await exercise(v));
  });
  after(async () => {
    await resetLogging();
    await new Promise<void>((r) => plain?.close(() => r()));
    await api?.close();
    tmp.remove();
  });

  const klogLines = (v: number) => runs.get(v)!.lines.filter((l) => l.split('\t')[2] === 'klog');
  /** The records of scope klog at verbosity v: message and fields (console values unquoted). */
  const records = (v: number) =>
    klogLines(v).map((l) => {
      const cols = l.replace(/\n$/, '').split('\t');
      const fields: Record<string, string> = {};
      for (const [, k, v] of (cols[4] ?? '').matchAll(/([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)/g)) {
        fields[k!] = v!.startsWith('"') ? (JSON.parse(v!) as string) : v!;
      }
      return { level: cols[1], msg: cols[3], fields };
    });
  const request = (v: number, method: string, p: RegExp) =>
    records(v).find((r) => r.msg === 'API request' && r.fields.method === method && p.test(r.fields.path ?? ''));

  it('logs no request at --vklog 0 to 3', () => {
    for (const v of [0, 1, 2, 3]) assert.deepEqual(klogLines(v), [], `--vklog ${v}`);
  });

  it('logs each request at --vklog 4: method, path with query, status, latency, no body', () => {
    const expected: [string, RegExp, string][] = [
      ['GET', /^\/api\/v1\/pods\?fieldSelector=metadata\.namespace%3Dshop&limit=50$/, '200'],
      ['PATCH', /^\/api\/v1\/namespaces\/shop\/pods\/cart-4\/status$/, '200'],
      ['POST', /^\/api\/v1\/namespaces\/shop\/events$/, '201'],
      ['GET', /^\/api\/v1\/pods\?watch=true&fieldSelector=metadata\.namespace%3Dshop&resourceVersion=\d+&/, '200'],
      ['POST', /^\/api\/v1\/namespaces\/mesh-system\/serviceaccounts\/mesh-cni-plugin\/token$/, '201'],
      ['DELETE', /^\/api\/v1\/namespaces\/shop\/pods\/gone$/, '404'],
      ['GET', /^\/not-json$/, '200'],
    ];
    for (const [method, p, status] of expected) {
      const r = request(4, method, p);
      assert.ok(r, `no record of ${method} ${p} in ${klogLines(4).join('')}`);
      assert.equal(r.level, 'info');
      assert.deepEqual(Object.keys(r.fields), ['method', 'path', 'status', 'latencyMs']);
      assert.equal(r.fields.status, status);
      assert.match(r.fields.latencyMs!, /^\d+$/);
    }
    assert.equal(records(4).length, expected.length, klogLines(4).join(''));
  });

  it("adds the bodies at --vklog 8, a watch's events too, with the TokenRequest's token redacted", () => {
    const patch = request(8, 'PATCH', /\/pods\/cart-8\/status$/)!;
    const uid = api.getPod('shop', 'cart-8')!.metadata!.uid;
    assert.deepEqual(JSON.parse(patch.fields.requestBody!), { metadata: { uid, labels: { 'mesh.io/vklog': '8' } } });
    assert.equal((JSON.parse(patch.fields.responseBody!) as { metadata: { name: string } }).metadata.name, 'cart-8');
    type List = { items: { metadata: { name: string } }[] };
    const list = JSON.parse(request(8, 'GET', /limit=50$/)!.fields.responseBody!) as List;
    assert.ok(list.items.some((p) => p.metadata.name === 'cart-8'));
    const mint = request(8, 'POST', /\/token$/)!;
    const asked = { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } };
    assert.deepEqual(JSON.parse(mint.fields.requestBody!), asked);
    const answer = JSON.parse(mint.fields.responseBody!) as { status: { token: string; expirationTimestamp: string } };
    assert.equal(answer.status.token, '[redacted]');
    assert.match(answer.status.expirationTimestamp, /^\d{4}-/);
    assert.match(request(8, 'DELETE', /\/gone$/)!.fields.responseBody!, /"code":404/);
    assert.match(request(8, 'GET', /^\/not-json$/)!.fields.responseBody!, /^<\d+ bytes, not JSON: not logged>$/);
    const events = records(8).filter((r) => r.msg === 'API watch event');
    const modified = (e: (typeof events)[number]) =>
      (JSON.parse(e.fields.body!) as { type: string }).type === 'MODIFIED';
    assert.ok(
      events.some((e) => /watch=true/.test(e.fields.path!) && modified(e)),
      klogLines(8).join(''),
    );
    assert.equal(request(7, 'PATCH', /\/pods\/cart-7\/status$/)!.fields.requestBody, undefined);
    assert.equal(records(7).filter((r) => r.msg === 'API watch event').length, 0);
  });

  it('never logs a token, at any --vklog', () => {
    for (const [v, run] of runs) {
      if (v >= 4) assert.ok(run.lines.length > 0, `--vklog ${v} logged nothing`);
      for (const secret of [api.token, run.minted, JWT, 'c2VjcmV0LXRva2Vu']) {
        const leak = run.lines.find((l) => l.includes(secret));
        assert.equal(leak, undefined, `--vklog ${v}: a line holds a token: ${leak}`);
      }
    }
  });
});

describe('redactBody', () => {
  it('replaces secrets by key and JWTs anywhere, keeps the rest, cuts long bodies', () => {
    const body = {
      status: { token: 'abc', expirationTimestamp: 't' },
      spec: { automountServiceAccountToken: true, note: `x ${JWT} y` },
      password: 'p',
      items: ['a'],
    };
    assert.deepEqual(JSON.parse(redactBody(JSON.stringify(body))), {
      status: { token: '[redacted]', expirationTimestamp: 't' },
      spec: { automountServiceAccountToken: true, note: 'x [redacted] y' },
      password: '[redacted]',
      items: ['a'],
    });
    assert.equal(redactBody(`token ${JWT}`), `<${6 + JWT.length} bytes, not JSON: not logged>`);
    assert.equal(redactBody(''), '');
    const long = redactBody(JSON.stringify({ a: 'x'.repeat(20_000) }));
    assert.match(long, /^\{"a":"x{10234} \[truncated 9768 chars\]$/);
  });
});

// JSON.parse reads any depth, but writing a body back (redaction, JSON.stringify)
// recurses: an answer or a watch event nested a few thousand deep threw out of the response's
// 'end'/'data' handler at --vklog 8, an uncaught exception that took the agent down.
describe('--vklog 8: a body nested too deep to write back', () => {
  const deep = `{"kind":"Pod","spec":${'['.repeat(20_000)}${']'.repeat(20_000)}}`;

  it('redactBody says it by its length, never throws', () => {
    assert.equal(redactBody(deep), `<${deep.length} bytes, JSON nested too deep: not logged>`);
  });

  it('the request and the watch still get their answer', async () => {
    const server = http.createServer((req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(req.url?.includes('watch=true') ? `{"type":"ADDED","object":${deep}}\n` : deep);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [
        { name: 'c', server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, skipTLSVerify: true },
      ],
      users: [{ name: 'u', token: JWT }],
      contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
      currentContext: 'x',
    });
    const sink = captureSink();
    configureLogging(buildSettings({ vklog: '8', log_output_level: 'all:debug' }, {}).logging, sink);
    try {
      const got = await apiRequest<{ kind: string }>(kc, 'GET', '/deep', 'reading a deep answer');
      assert.equal(got.kind, 'Pod');
      const events: unknown[] = [];
      await new Promise<unknown>((resolve, reject) => {
        apiWatch(kc, '/api/v1/pods', 'watching deep pods', {}, (e) => events.push(e.type), resolve).catch(reject);
      });
      assert.deepEqual(events, ['ADDED']);
    } finally {
      await resetLogging();
      await new Promise<void>((r) => server.close(() => r()));
    }
    const bodies = sink.lines.filter((l) => /\t(?:API request|API watch event)\t.* (?:responseBody|body)=/.test(l));
    assert.equal(bodies.length, 2, sink.text());
    for (const l of bodies) assert.match(l, /bytes, JSON nested too deep: not logged>/);
  });
});

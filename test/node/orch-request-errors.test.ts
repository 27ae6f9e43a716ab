// An API answer that is not JSON: the error says so, where, and how long the answer was, never
// its text. The text may be a token (a TokenRequest answer cut short), and this error reaches
// /readyz through the plugin token's last error, which anyone who can read /readyz sees.

import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { apiRequest } from '../../src/orch/request.ts';

const SECRET = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.sig';
const answers = [`{"status":{"token":"${SECRET}`, `token ${SECRET}`, `{"a":1} ${SECRET}`];
let server: http.Server;
let kc: KubeConfig;
before(async () => {
  server = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(answers[Number(req.url!.slice(1))]);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [
      { name: 'c', server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, skipTLSVerify: true },
    ],
    users: [{ name: 'u', token: 't' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
});
after(() => new Promise<void>((r) => server.close(() => r())));

describe('an answer that is not JSON', () => {
  for (const [i, a] of answers.entries()) {
    it(`is said by kind and place only (${i})`, async () => {
      await assert.rejects(apiRequest(kc, 'GET', `/${i}`, 'reading something'), (e: Error) => {
        assert.match(e.message, /answer is not JSON/);
        assert.doesNotMatch(e.message, /c2VjcmV0|eyJhbGci|token|status/);
        assert.match(e.message, new RegExp(`${Buffer.byteLength(a)} bytes`));
        return true;
      });
    });
  }
});

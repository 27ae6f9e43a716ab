import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Counter } from 'prom-client';
import type { Component } from '../../src/component.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { toOpenMetrics, wantsOpenMetrics } from '../../src/monitoring/openmetrics.ts';
import { AgentReadiness } from '../../src/monitoring/readiness.ts';
import { startMonitoringServer, type MonitoringServer } from '../../src/monitoring/server.ts';
import { run } from '../helpers/netns.ts';
import { promtoolProblems, request } from '../helpers/observability.ts';

// A counter of the kind every part defines, to see it in both formats.
const probe = new Counter({
  name: 'mesh_cni_test_probe_total',
  help: 'Test counter.',
  labelNames: ['reason'] as const,
  registers: [registry],
});
probe.inc({ reason: 'x' }, 3);

describe('monitoring server', () => {
  let reasons: string[] = ['installer: waiting for a primary CNI config in /host/etc/cni/net.d'];
  let server: MonitoringServer;
  let base: string;
  before(async () => {
    const installer: Component = {
      name: 'installer',
      notReadyReasons: () => reasons,
      status: () => ({}),
      stop: async () => {},
    };
    const readiness = new AgentReadiness(() => [installer]);
    readiness.markStarted();
    server = await startMonitoringServer({ port: 0, host: '127.0.0.1', readiness });
    base = `http://127.0.0.1:${server.port}`;
  });
  after(() => server.close());

  it('serves Prometheus text that promtool accepts, with build info and process metrics', async () => {
    const r = await request(`${base}/metrics`);
    assert.equal(r.status, 200);
    assert.match(String(r.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    assert.match(
      r.body,
      /^mesh_cni_build_info\{version="\d+\.\d+\.\d+[^"]*",git_commit="[0-9a-f]{40}|unknown",node_version="v24\.[^"]+"\} 1$/m,
    );
    assert.match(r.body, /^process_resident_memory_bytes \d+/m);
    assert.match(r.body, /^# TYPE mesh_cni_test_probe_total counter$/m);
    assert.equal(await promtoolProblems(r.body), '');
  });

  it('serves OpenMetrics when the scraper asks for it, without changing the Prometheus output', async () => {
    const r = await request(`${base}/metrics`, {
      headers: { accept: 'application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1' },
    });
    assert.equal(r.status, 200);
    assert.match(String(r.headers['content-type']), /^application\/openmetrics-text; version=1\.0\.0/);
    assert.match(r.body, /^# TYPE mesh_cni_test_probe counter$/m);
    assert.match(r.body, /^mesh_cni_test_probe_total\{reason="x"\} 3$/m);
    assert.ok(r.body.endsWith('# EOF\n'));
    // A strict OpenMetrics parser (Debian python3-prometheus-client) reads every family.
    const py = await run(
      '/usr/bin/python3',
      [
        '-c',
        [
          'import sys',
          'from prometheus_client.openmetrics.parser import text_string_to_metric_families as p',
          'print(len(list(p(sys.stdin.read()))))',
        ].join('\n'),
      ],
      { input: r.body },
    );
    assert.equal(py.code, 0, py.stderr);
    assert.ok(Number(py.stdout) > 10, py.stdout);
    // The registry itself is unchanged: the next Prometheus scrape still says *_total.
    const again = await request(`${base}/metrics`);
    assert.match(again.body, /^# TYPE mesh_cni_test_probe_total counter$/m);
    assert.equal(await promtoolProblems(again.body), '');
  });

  it('answers /readyz 503 with the reasons, then 200 once every part is ready', async () => {
    let r = await request(`${base}/readyz`);
    assert.equal(r.status, 503);
    assert.match(r.body, /- installer: waiting for a primary CNI config/);
    reasons = [];
    r = await request(`${base}/readyz`);
    assert.equal(r.status, 200);
    assert.equal(r.body, 'ready\n');
  });

  it('answers /healthz, HEAD without a body, 404 for other paths and 405 for other methods', async () => {
    assert.equal((await request(`${base}/healthz`)).status, 200);
    const head = await request(`${base}/metrics`, { method: 'HEAD' });
    assert.equal(head.status, 200);
    assert.equal(head.body, '');
    assert.equal((await request(`${base}/nope`)).status, 404);
    assert.equal((await request(`${base}/toString`)).status, 404);
    const post = await request(`${base}/metrics`, { method: 'POST', body: 'x' });
    assert.equal(post.status, 405);
    assert.equal(post.headers.allow, 'GET, HEAD');
  });

  it('survives a malformed request target', async () => {
    const reply = await new Promise<string>((resolve, reject) => {
      const s = net.connect(server.port, '127.0.0.1');
      let got = '';
      s.on('data', (d) => (got += d.toString()));
      s.on('end', () => resolve(got));
      s.on('error', reject);
      s.setTimeout(5000, () => s.destroy(new Error('timeout')));
      s.end('GET http://[ HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
    });
    assert.match(reply, /^HTTP\/1\.1 (404|400)/);
    assert.equal((await request(`${base}/healthz`)).status, 200);
  });

  it('says which port is taken when it cannot listen', async () => {
    await assert.rejects(
      startMonitoringServer({
        port: server.port,
        host: '127.0.0.1',
        readiness: { notReady: () => [], notes: () => [] },
      }),
      /cannot serve metrics on 127\.0\.0\.1:\d+: EADDRINUSE; choose a free --monitoring-port/,
    );
  });
});

describe('openmetrics conversion', () => {
  it('negotiates on the Accept header', () => {
    assert.equal(wantsOpenMetrics(undefined), false);
    assert.equal(wantsOpenMetrics('text/plain'), false);
    assert.equal(wantsOpenMetrics('application/openmetrics-text; version=1.0.0'), true);
    assert.equal(wantsOpenMetrics('application/openmetrics-text;q=0, text/plain'), false);
  });

  it('names counter families without _total, drops blank lines and ends with # EOF', () => {
    const text = [
      '# HELP a_total A "quoted" help.',
      '# TYPE a_total counter',
      'a_total 1',
      '',
      '# HELP b B.',
      '# TYPE b counter',
      'b{x="1"} 2',
      '',
      '# HELP g G.',
      '# TYPE g gauge',
      'g 0.5',
      '',
      '# HELP u U.',
      '# TYPE u untyped',
      'u 1',
      '',
    ].join('\n');
    assert.equal(
      toOpenMetrics(text),
      [
        '# HELP a A \\"quoted\\" help.',
        '# TYPE a counter',
        'a_total 1',
        '# HELP b B.',
        '# TYPE b counter',
        'b_total{x="1"} 2',
        '# HELP g G.',
        '# TYPE g gauge',
        'g 0.5',
        '# HELP u U.',
        '# TYPE u unknown',
        'u 1',
        '# EOF',
        '',
      ].join('\n'),
    );
  });
});

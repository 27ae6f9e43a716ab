import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { after, before, describe, it } from 'node:test';
import type { Component } from '../../src/component.ts';
import { maskedArgs, maskedEnvironment } from '../../src/config/environ.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startControlz } from '../../src/monitoring/ctrlz.ts';
import { configureLogging, scope } from '../../src/monitoring/logging.ts';
import { captureSink, request } from '../helpers/observability.ts';

const installerLike: Component = {
  name: 'installer',
  notReadyReasons: () => ['no primary CNI config in /host/etc/cni/net.d yet'],
  status: () => ({
    primaryConfig: '/host/etc/cni/net.d/10-bridge.conflist',
    lastReconcile: '2026-01-01T00:00:00.000Z',
    errors: [],
  }),
  stop: async () => {},
};
const broken: Component = {
  name: 'broken',
  notReadyReasons: () => [],
  status: () => {
    throw new Error('boom');
  },
  stop: async () => {},
};

describe('ControlZ API', () => {
  const sink = captureSink();
  let ctrlz: Component;
  let base: string;
  const json = async (p: string) => {
    const r = await request(base + p);
    assert.equal(r.status, 200, r.body);
    assert.match(String(r.headers['content-type']), /^application\/json/);
    return JSON.parse(r.body) as unknown;
  };
  const put = (p: string, body: string, type = 'application/json') =>
    request(base + p, { method: 'PUT', headers: { 'content-type': type }, body });

  before(async () => {
    process.env.MESH_TEST_ORCH_TOKEN = 's3cret-token';
    process.env.MESH_TEST_PLAIN = 'plain <b>value</b>';
    configureLogging(buildSettings({ log_caller: 'repair' }, {}).logging, sink);
    ctrlz = await startControlz(buildSettings({ ctrlz_address: 'localhost', ctrlz_port: '0' }, {}).ctrlz, {
      components: () => [installerLike, broken, ctrlz],
    });
    const st = ctrlz.status() as { listening: boolean; port: number };
    assert.equal(st.listening, true);
    base = `http://localhost:${st.port}`; // localhost may resolve to ::1 first on other hosts
  });
  after(async () => {
    await ctrlz.stop('SIGTERM');
    delete process.env.MESH_TEST_ORCH_TOKEN;
    delete process.env.MESH_TEST_PLAIN;
  });

  it('logs the port it got for --ctrlz_port 0', () => {
    const line = sink.lines.find((l) => l.includes('\tControlZ listening\t'));
    assert.match(line ?? '', new RegExp(`port=${(ctrlz.status() as { port: number }).port}\\b`));
  });

  it('serves a self-contained page with a strict content security policy', async () => {
    const r = await request(base + '/');
    assert.equal(r.status, 200);
    assert.match(String(r.headers['content-type']), /^text\/html/);
    assert.match(
      String(r.headers['content-security-policy']),
      /default-src 'none'; connect-src 'self'; script-src 'sha256-/,
    );
    assert.doesNotMatch(r.body, /(src|href)\s*=|@import|url\(|https?:\/\//i);
  });

  it('lists every scope with its levels', async () => {
    const scopes = (await json('/api/scopes')) as {
      name: string;
      output_level: string;
      stack_trace_level: string;
      log_caller: boolean;
    }[];
    assert.equal(scopes.length, 13);
    assert.deepEqual(
      scopes.find((s) => s.name === 'repair'),
      { name: 'repair', output_level: 'info', stack_trace_level: 'none', log_caller: true },
    );
  });

  it('changes a scope level with immediate effect', async () => {
    assert.equal(scope('install').enabled('debug'), false);
    const r = await put('/api/scopes/install', '{"output_level":"debug","stack_trace_level":"error"}');
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(JSON.parse(r.body), {
      name: 'install',
      output_level: 'debug',
      stack_trace_level: 'error',
      log_caller: false,
    });
    assert.equal(scope('install').enabled('debug'), true);
    scope('install').debug('now visible');
    assert.ok(sink.lines.some((l) => l.includes('\tinstall\tnow visible')));
    assert.ok(
      sink.lines.some(
        (l) =>
          l.includes('\tControlZ: changing scope levels\t') &&
          l.includes(
            'scope_name=install output_level=debug stack_trace_level=error from=install:info stack_trace_from=install:none',
          ),
      ),
    );
    const all = await put('/api/scopes/all', '{"output_level":"warn"}');
    assert.equal(all.status, 200);
    assert.equal(scope('repair').enabled('info'), false);
    assert.equal((await put('/api/scopes/all', '{"output_level":"info"}')).status, 200);
  });

  it('rejects bad changes with a clear status and message', async () => {
    const cases: [Promise<{ status: number; body: string }>, number, RegExp][] = [
      [
        put('/api/scopes/install', '{"output_level":"loud"}'),
        400,
        /output_level must be one of none, error, warn, info, debug; got "loud"/,
      ],
      [put('/api/scopes/install', 'not json'), 400, /expected a JSON object/],
      [put('/api/scopes/install', '{}'), 400, /give output_level/],
      [put('/api/scopes/nope', '{"output_level":"info"}'), 404, /no scope "nope"; scopes are all, ambient/],
      [put('/api/scopes/install', 'output_level=debug', 'application/x-www-form-urlencoded'), 415, /application\/json/],
      [put('/api/scopes/install', JSON.stringify({ output_level: 'x'.repeat(20_000) })), 413, /larger than/],
      [request(base + '/api/scopes', { method: 'DELETE' }), 405, /method DELETE not allowed on \/api\/scopes; use GET/],
      [request(base + '/api/nothing'), 404, /not found/],
      [
        request(base + '/api/proc', { headers: { host: 'attacker.example:9876' } }),
        403,
        /host "attacker.example" not allowed/,
      ],
    ];
    for (const [p, status, message] of cases) {
      const r = await p;
      assert.equal(r.status, status, r.body);
      assert.match(r.body, message);
    }
    assert.equal(scope('install').enabled('info'), true, 'nothing changed');
  });

  it('shows process info with masked args', async () => {
    process.argv.push('--orch-token=abc123', '--api-key', 'k', '--log_output_level', 'default:info');
    try {
      const p = (await json('/api/proc')) as {
        pid: number;
        node_version: string;
        uptime_seconds: number;
        memory: { rss: number };
        args: string[];
        build: { version: string };
      };
      assert.equal(p.pid, process.pid);
      assert.equal(p.node_version, process.version);
      assert.ok(p.uptime_seconds > 0 && p.memory.rss > 0);
      assert.deepEqual(p.args.slice(-5), [
        '--orch-token=******',
        '--api-key',
        '******',
        '--log_output_level',
        'default:info',
      ]);
      assert.match(p.build.version, /^\d+\.\d+\.\d+/);
    } finally {
      process.argv.splice(-5);
    }
  });

  it('shows the environment with secrets masked', async () => {
    const env = (await json('/api/env')) as Record<string, string>;
    assert.equal(env.MESH_TEST_ORCH_TOKEN, '******');
    assert.equal(env.MESH_TEST_PLAIN, 'plain <b>value</b>');
    assert.ok(!JSON.stringify(env).includes('s3cret'));
  });

  it("shows each component's readiness and status, even when status() throws", async () => {
    const cs = (await json('/api/components')) as {
      name: string;
      ready: boolean;
      not_ready_reasons: string[];
      not_ready: { reason: string; since: string }[];
      status: Record<string, unknown>;
    }[];
    const since = cs[0]?.not_ready[0]?.since ?? '';
    assert.match(since, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.deepEqual(cs[0], {
      name: 'installer',
      ready: false,
      not_ready_reasons: ['no primary CNI config in /host/etc/cni/net.d yet'],
      not_ready: [{ reason: 'no primary CNI config in /host/etc/cni/net.d yet', since }],
      notes: [],
      status: installerLike.status(),
    });
    assert.deepEqual(cs[1]?.status, { error: 'status() failed: boom' });
    assert.equal(cs[2]?.name, 'ctrlz');
  });

  it('shows the current metrics', async () => {
    const r = await request(base + '/api/metrics');
    assert.equal(r.status, 200);
    assert.match(r.body, /^mesh_cni_build_info\{/m);
  });

  it('keeps the agent running without ControlZ when the port is taken', async () => {
    const port = String((ctrlz.status() as { port: number }).port);
    const second = await startControlz(buildSettings({ ctrlz_address: 'localhost', ctrlz_port: port }, {}).ctrlz, {
      components: () => [],
    });
    assert.deepEqual(second.notReadyReasons(), []);
    assert.match(
      String(second.status().error),
      /cannot serve ControlZ on localhost:\d+: EADDRINUSE; choose another --ctrlz_port/,
    );
  });

  it('listens on every address for *', async () => {
    const any = await startControlz(buildSettings({ ctrlz_address: '*', ctrlz_port: '0' }, {}).ctrlz, {
      components: () => [],
    });
    try {
      const r = await request(`http://127.0.0.1:${(any.status() as { port: number }).port}/api/scopes`, {
        headers: { host: 'node-1.example:9876' },
      });
      assert.equal(r.status, 200);
    } finally {
      await any.stop('SIGTERM');
    }
  });
});

describe('secret masking', () => {
  it('masks env names with TOKEN, SECRET, PASSWORD, KEY or CERT', () => {
    assert.deepEqual(
      maskedEnvironment({ B_PASSWORD: 'x', A: '1', ssh_key: 'y', TLS_CERT_FILE: '/c', MY_SECRET: 'z', HOME: '/root' }),
      {
        A: '1',
        B_PASSWORD: '******',
        HOME: '/root',
        MY_SECRET: '******',
        TLS_CERT_FILE: '******',
        ssh_key: '******',
      },
    );
  });
  it('masks values of secret-looking flags in both spellings', () => {
    assert.deepEqual(maskedArgs(['node', 'x.js', '--token', 't', '--client-cert=/p', '--token', '--other', 'v']), [
      'node',
      'x.js',
      '--token',
      '******',
      '--client-cert=******',
      '--token',
      '--other',
      'v',
    ]);
  });
});

describe('ControlZ level changes on record', () => {
  const sink = captureSink();
  let ctrlz: Component;
  let base: string;
  const put = (p: string, body: string) =>
    request(base + p, { method: 'PUT', headers: { 'content-type': 'application/json' }, body });
  const changes = () => sink.lines.filter((l) => l.includes('\tControlZ: changing scope levels\t'));

  before(async () => {
    ctrlz = await startControlz(buildSettings({ ctrlz_address: 'localhost', ctrlz_port: '0' }, {}).ctrlz, {
      components: () => [],
    });
    base = `http://localhost:${(ctrlz.status() as { port: number }).port}`;
  });
  after(() => ctrlz.stop('SIGTERM'));

  it('logs a change with every scope at none, in a record no level silences', async () => {
    configureLogging(buildSettings({ log_output_level: 'all:none' }, {}).logging, sink);
    const r = await put('/api/scopes/cni', '{"output_level":"debug"}');
    assert.equal(r.status, 200, r.body);
    assert.equal(scope('monitoring').enabled('error'), false, 'monitoring is still at none');
    const [line, ...more] = changes();
    assert.deepEqual(more, []);
    assert.match(
      line ?? '',
      /^\S+Z\tinfo\tmonitoring\tControlZ: changing scope levels\tscope_name=cni output_level=debug from=cni:none client=127\.0\.0\.1:\d+ /,
    );
  });

  it('logs the change that silences every scope before it applies', async () => {
    configureLogging(buildSettings({ log_output_level: 'all:info' }, {}).logging, sink);
    sink.lines.length = 0;
    const r = await put('/api/scopes/all', '{"output_level":"none","stack_trace_level":"none"}');
    assert.equal(r.status, 200, r.body);
    assert.equal(scope('monitoring').enabled('error'), false);
    assert.equal(changes().length, 1, sink.text());
    assert.match(
      changes()[0]!,
      /\tscope_name=all output_level=none stack_trace_level=none from=ambient:info,.*,validation:info stack_trace_from=ambient:none,.*,validation:none client=/,
    );
  });

  it('names the local user who made the change', async () => {
    configureLogging(buildSettings({ log_output_level: 'all:none' }, {}).logging, sink);
    sink.lines.length = 0;
    // An unprivileged user on the node: the agent runs as root, so uid 65534 is someone else.
    const port = (ctrlz.status() as { port: number }).port;
    const script = `import http.client as h; c=h.HTTPConnection('127.0.0.1', ${port}); c.request('PUT', '/api/scopes/install', '{"output_level":"debug"}', {'content-type': 'application/json', 'host': 'localhost'}); print(c.getresponse().status)`;
    // Not spawnSync: the server answering it runs on this event loop.
    const r = await promisify(execFile)('/usr/bin/python3', ['-c', script], {
      uid: 65534,
      gid: 65534,
      encoding: 'utf8',
      timeout: 10_000,
    });
    assert.equal(r.stdout.trim(), '200', r.stderr);
    assert.match(
      changes()[0] ?? '',
      /\tscope_name=install output_level=debug from=install:none client=127\.0\.0\.1:\d+ client_uid=65534$/m,
    );
  });
});

describe('ControlZ write switch (--ctrlz_write)', () => {
  const sink = captureSink();
  const running: Component[] = [];
  before(() => configureLogging(buildSettings({}, {}).logging, sink));
  after(async () => {
    for (const c of running) await c.stop('SIGTERM');
  });
  async function start(flags: Record<string, string>) {
    const c = await startControlz(buildSettings({ ctrlz_port: '0', ...flags }, {}).ctrlz, { components: () => [] });
    running.push(c);
    const base = `http://127.0.0.1:${(c.status() as { port: number }).port}`;
    const headers = { host: 'localhost', 'content-type': 'application/json' };
    return {
      c,
      info: async () =>
        JSON.parse((await request(base + '/api/controlz', { headers })).body) as { writable: boolean; reason: string },
      change: () => request(base + '/api/scopes/repair', { method: 'PUT', headers, body: '{"output_level":"debug"}' }),
    };
  }

  it('writes by default on loopback', async () => {
    const z = await start({ ctrlz_address: 'localhost' });
    assert.equal((await z.info()).writable, true);
    assert.equal((await z.change()).status, 200);
    assert.equal(z.c.status().writable, true);
  });

  it('is read-only by default when it listens beyond loopback', async () => {
    const z = await start({ ctrlz_address: '*' });
    const info = await z.info();
    assert.equal(info.writable, false);
    assert.match(info.reason, /listens on \* .*--ctrlz_write=true/);
    const changes = () => sink.lines.filter((l) => l.includes('ControlZ: changing scope levels')).length;
    const before = changes();
    const r = await z.change();
    assert.equal(r.status, 403);
    assert.match(r.body, /ControlZ is read-only/);
    assert.equal(changes(), before, 'nothing changed, nothing to log');
  });

  it('is read-only with --ctrlz_write=false, and writes beyond loopback only when told, with a warning', async () => {
    const off = await start({ ctrlz_address: 'localhost', ctrlz_write: 'false' });
    assert.equal((await off.change()).status, 403);
    assert.match((await off.info()).reason, /--ctrlz_write=false/);
    const on = await start({ ctrlz_address: '*', ctrlz_write: 'true' });
    assert.equal((await on.change()).status, 200);
    assert.ok(
      sink.lines.some((l) => /\twarn\tmonitoring\tControlZ lets anyone who can reach it change log levels\t/.test(l)),
      sink.text(),
    );
  });

  it('refuses a value other than auto, true or false', () => {
    assert.throws(() => buildSettings({ ctrlz_write: 'maybe' }, {}), /--ctrlz_write/);
  });
});

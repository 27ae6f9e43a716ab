// ControlZ on --ctrlz_address:--ctrlz_port: a small page and a JSON API to read and change scope
// levels at run time, and to see process info, the masked environment, metrics and each part's
// state. ControlZ is for looking, not for running the node: if it cannot listen, the agent logs
// why and goes on without it.

import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import { buildInfo } from '../cmd/buildinfo.ts';
import type { Component } from '../component.ts';
import { maskedArgs, maskedEnvironment } from '../config/environ.ts';
import { LOG_LEVELS, type LogLevel, type LogScope } from '../config/flags.ts';
import type { Settings } from '../config/settings.ts';
import { CONTROLZ_CSP, CONTROLZ_PAGE } from './ctrlz-page.ts';
import { SCOPES } from '../config/flags.ts';
import { callerScopes, scope, scopeLevels, setScopeLevel, setStacktraceLevel, stacktraceLevels } from './logging.ts';
import { registry } from './metrics.ts';

const log = scope('monitoring');
const MAX_BODY = 16 * 1024;

export interface ControlzDeps {
  /** The agent's parts, for their status. */
  readonly components: () => readonly Component[];
}

class HttpError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

interface Reply {
  readonly status?: number;
  readonly type: string;
  readonly body: string;
}

const json = (v: unknown, status = 200): Reply => ({ status, type: 'application/json; charset=utf-8', body: JSON.stringify(v, null, 2) + '\n' });

function scopeView(name: LogScope) {
  return {
    name,
    output_level: scopeLevels()[name],
    stack_trace_level: stacktraceLevels()[name],
    log_caller: callerScopes().includes(name),
  };
}

function parseLevel(field: string, v: unknown): LogLevel | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'string' || !(LOG_LEVELS as readonly string[]).includes(v)) {
    throw new HttpError(400, `${field} must be one of ${LOG_LEVELS.join(', ')}; got ${JSON.stringify(v)}`);
  }
  return v as LogLevel;
}

/** PUT /api/scopes/<name> (`all` sets every scope): {"output_level"?, "stack_trace_level"?}. */
function updateScope(name: string, body: string): Reply {
  const targets: LogScope[] = name === 'all' ? [...SCOPES] : (SCOPES as readonly string[]).includes(name) ? [name as LogScope] : [];
  if (targets.length === 0) throw new HttpError(404, `no scope ${JSON.stringify(name)}; scopes are all, ${SCOPES.join(', ')}`);
  let req: unknown;
  try {
    req = JSON.parse(body);
  } catch {
    throw new HttpError(400, 'expected a JSON object like {"output_level":"debug"}');
  }
  if (!req || typeof req !== 'object' || Array.isArray(req)) throw new HttpError(400, 'expected a JSON object like {"output_level":"debug"}');
  const r = req as Record<string, unknown>;
  const output = parseLevel('output_level', r.output_level);
  const stack = parseLevel('stack_trace_level', r.stack_trace_level);
  if (output === undefined && stack === undefined) throw new HttpError(400, 'give output_level and/or stack_trace_level');
  for (const t of targets) {
    if (output !== undefined) setScopeLevel(t, output);
    if (stack !== undefined) setStacktraceLevel(t, stack);
  }
  log.info('scope levels changed via ControlZ', { scope_name: name, ...(output ? { output_level: output } : {}), ...(stack ? { stack_trace_level: stack } : {}) });
  return json(name === 'all' ? targets.map(scopeView) : scopeView(targets[0] as LogScope));
}

function procInfo() {
  const b = buildInfo();
  return {
    pid: process.pid,
    ppid: process.ppid,
    hostname: os.hostname(),
    uptime_seconds: process.uptime(),
    node_version: process.version,
    platform: b.platform,
    build: { version: b.version, git_commit: b.gitCommit },
    memory: process.memoryUsage(),
    cpu_usage_us: process.cpuUsage(),
    cwd: process.cwd(),
    args: maskedArgs(),
    exec_args: process.execArgv,
  };
}

function componentsView(components: readonly Component[]) {
  return components.map((c) => {
    const reasons = c.notReadyReasons();
    let status: Record<string, unknown>;
    try {
      status = c.status();
    } catch (e) {
      status = { error: `status() failed: ${(e as Error).message}` };
    }
    return { name: c.name, ready: reasons.length === 0, not_ready_reasons: reasons, status };
  });
}

async function route(method: string, pathname: string, body: () => Promise<string>, deps: ControlzDeps): Promise<Reply> {
  const get = method === 'GET' || method === 'HEAD';
  const only = (ok: boolean, allow: string) => {
    if (!ok) throw Object.assign(new HttpError(405, `method ${method} not allowed on ${pathname}; use ${allow}`), { allow });
  };
  if (pathname === '/' || pathname === '/index.html') {
    only(get, 'GET');
    return { type: 'text/html; charset=utf-8', body: CONTROLZ_PAGE };
  }
  if (pathname === '/api/scopes') {
    only(get, 'GET');
    return json(SCOPES.map(scopeView));
  }
  const m = /^\/api\/scopes\/([^/]+)$/.exec(pathname);
  if (m) {
    const name = decodeURIComponent(m[1] ?? '');
    if (get) {
      if (!(SCOPES as readonly string[]).includes(name)) throw new HttpError(404, `no scope ${JSON.stringify(name)}`);
      return json(scopeView(name as LogScope));
    }
    only(method === 'PUT' || method === 'POST', 'GET, PUT');
    return updateScope(name, await body());
  }
  const views: Record<string, () => Promise<Reply>> = {
    '/api/proc': async () => json(procInfo()),
    '/api/env': async () => json(maskedEnvironment()),
    '/api/args': async () => json(maskedArgs()),
    '/api/components': async () => json(componentsView(deps.components())),
    '/api/metrics': async () => ({ type: 'text/plain; charset=utf-8', body: await registry.metrics() }),
  };
  const view = Object.hasOwn(views, pathname) ? views[pathname] : undefined;
  if (!view) throw new HttpError(404, `not found: ${pathname}`);
  only(get, 'GET');
  return view();
}

function readBody(req: http.IncomingMessage): Promise<string> {
  // A state change must come from script that could send JSON: a plain cross-site form cannot.
  if (!/^application\/json\b/i.test(req.headers['content-type'] ?? '')) {
    return Promise.reject(new HttpError(415, 'send the body as application/json'));
  }
  return new Promise((resolve, reject) => {
    let size = 0;
    const chunks: Buffer[] = [];
    const onData = (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY) return void chunks.push(c);
      // Answer 413 and read the rest into nothing, so the client gets the answer.
      req.off('data', onData);
      req.resume();
      chunks.length = 0;
      reject(new HttpError(413, `body larger than ${MAX_BODY} bytes`));
    };
    req.on('data', onData);
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]', '::1']);

/** The host to listen on: `*` means every address. */
export function listenHost(address: string): string | undefined {
  return address === '*' || address === '' ? undefined : address;
}

export interface ControlzServer {
  readonly port: number;
  readonly host: string;
  close(): Promise<void>;
}

export async function serveControlz(address: string, port: number, deps: ControlzDeps): Promise<ControlzServer> {
  const host = listenHost(address);
  const loopbackOnly = host !== undefined && LOOPBACK_HOSTS.has(host);
  const server = http.createServer((req, res) => {
    const send = (r: Reply, extra: Record<string, string> = {}) => {
      res.writeHead(r.status ?? 200, {
        'content-type': r.type,
        'cache-control': 'no-store',
        'x-content-type-options': 'nosniff',
        'content-security-policy': CONTROLZ_CSP,
        'referrer-policy': 'no-referrer',
        ...extra,
      });
      res.end(req.method === 'HEAD' ? undefined : r.body);
    };
    const fail = (e: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (e instanceof HttpError) {
        const allow = (e as HttpError & { allow?: string }).allow;
        send({ status: e.status, type: 'text/plain; charset=utf-8', body: e.message + '\n' }, allow ? { allow } : {});
      } else {
        log.error('ControlZ request failed', { path: req.url, error: e instanceof Error ? e.message : String(e) });
        send({ status: 500, type: 'text/plain; charset=utf-8', body: 'internal error\n' });
      }
    };
    // Bound to loopback, only loopback names may reach us: a DNS-rebinding page cannot.
    const hostname = (req.headers.host ?? '').replace(/:\d+$/, '').toLowerCase();
    if (loopbackOnly && !LOOPBACK_HOSTS.has(hostname)) return fail(new HttpError(403, `host ${JSON.stringify(hostname)} not allowed; ControlZ listens on ${address} only`));
    const url = URL.parse(req.url ?? '/', 'http://localhost');
    if (!url) return fail(new HttpError(400, 'bad request target'));
    route(req.method ?? 'GET', url.pathname, () => readBody(req), deps).then((r) => send(r), fail);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(new Error(`cannot serve ControlZ on ${address}:${port}: ${e.code ?? e.message}; choose another --ctrlz_port or --ctrlz_address`, { cause: e })));
    server.listen(port, host, () => resolve());
  });
  const bound = server.address() as AddressInfo;
  return {
    port: bound.port,
    host: bound.address,
    close: () => new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    }),
  };
}

export async function startControlz(settings: Settings, deps: ControlzDeps): Promise<Component> {
  const { address, port } = settings.ctrlz;
  let server: ControlzServer;
  try {
    server = await serveControlz(address, port, deps);
  } catch (e) {
    log.error('ControlZ is off', { error: (e as Error).message });
    const error = (e as Error).message;
    return { name: 'ctrlz', notReadyReasons: () => [], status: () => ({ enabled: true, listening: false, error }), stop: async () => {} };
  }
  log.info('ControlZ listening', { address, host: server.host, port: server.port, url: `http://${address === '*' ? 'localhost' : address}:${server.port}/` });
  return {
    name: 'ctrlz',
    notReadyReasons: () => [],
    status: () => ({ enabled: true, listening: true, address, port: server.port }),
    stop: () => server.close(),
  };
}

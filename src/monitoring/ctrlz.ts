// ControlZ on --ctrlz_address:--ctrlz_port: a small page and a JSON API to read and change scope
// levels at run time, and to see process info, the masked environment, metrics and each part's
// state. ControlZ is for looking, not for running the node: if it cannot listen, the agent logs
// why and goes on without it.
//
// Who can reach it: the agent runs on the host network, so on loopback every process of the
// node can (any user, and every other host-network pod); with `*` everyone who can reach the
// node. It has no login (as Istio's ControlZ): so changes are allowed only where --ctrlz_write
// says (by default only on loopback), and each change is logged, with the client's uid when the
// kernel names it, before it applies, in a record no level can silence.

import type http from 'node:http';
import os from 'node:os';
import { isObject } from '../../cni-plugin/shared/json.ts';
import { buildInfo } from './buildinfo.ts';
import type { Component } from '../component.ts';
import { maskedArgs, maskedEnvironment } from '../config/environ.ts';
import { LOG_LEVELS, type CtrlzWriteMode, type LogLevel, type LogScope } from '../config/flags.ts';
import { CONTROLZ_CSP, CONTROLZ_PAGE } from './ctrlz-page.ts';
import { boundedHttpServer, HTTP_BOUNDS, listenTcp } from './httpbounds.ts';
import { SCOPES } from '../config/flags.ts';
import {
  callerScopes,
  logAlways,
  scope,
  scopeLevels,
  setScopeLevel,
  setStacktraceLevel,
  stacktraceLevels,
  type Fields,
} from './logging.ts';
import { registry } from './metrics.ts';
import { loopbackPeerUid } from './peer.ts';
import { AgentReadiness, type PartReadiness } from './readiness.ts';
import { startupStages } from './startup.ts';

const log = scope('monitoring');
const MAX_BODY = 16 * 1024;

export interface ControlzDeps {
  /** The agent's parts, for their status. */
  readonly components: () => readonly Component[];
  /** The clocks /readyz reads, so a reason has one since in both; else ControlZ keeps its own. */
  readonly readiness?: { of(c: Component): PartReadiness };
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

const json = (v: unknown, status = 200): Reply => ({
  status,
  type: 'application/json; charset=utf-8',
  body: JSON.stringify(v, null, 2) + '\n',
});

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

/** Whether level changes are allowed, and why (shown by the page and in a refusal). */
export interface WriteAccess {
  readonly writable: boolean;
  readonly reason: string;
}

export function writeAccess(address: string, mode: CtrlzWriteMode): WriteAccess {
  const host = listenHost(address);
  const loopbackOnly = host !== undefined && LOOPBACK_HOSTS.has(host);
  if (mode === 'true')
    return {
      writable: true,
      reason: `level changes allowed (--ctrlz_write=true)${loopbackOnly ? '' : `, though ControlZ listens on ${address}, beyond loopback`}`,
    };
  if (mode === 'false') return { writable: false, reason: 'ControlZ is read-only (--ctrlz_write=false)' };
  return loopbackOnly
    ? { writable: true, reason: `level changes allowed: ControlZ listens on ${address} only (--ctrlz_write=auto)` }
    : {
        writable: false,
        reason: `ControlZ is read-only: it listens on ${address} (beyond loopback), and --ctrlz_write=auto allows level changes on loopback only; pass --ctrlz_write=true to allow them`,
      };
}

/** PUT /api/scopes/<name> (`all` sets every scope): {"output_level"?, "stack_trace_level"?}. */
function updateScope(name: string, body: string, client: () => Fields): Reply {
  const targets: LogScope[] =
    name === 'all' ? [...SCOPES] : (SCOPES as readonly string[]).includes(name) ? [name as LogScope] : [];
  if (targets.length === 0)
    throw new HttpError(404, `no scope ${JSON.stringify(name)}; scopes are all, ${SCOPES.join(', ')}`);
  let req: unknown;
  try {
    req = JSON.parse(body);
  } catch {
    throw new HttpError(400, 'expected a JSON object like {"output_level":"debug"}');
  }
  if (!isObject(req)) throw new HttpError(400, 'expected a JSON object like {"output_level":"debug"}');
  const r = req;
  const output = parseLevel('output_level', r.output_level);
  const stack = parseLevel('stack_trace_level', r.stack_trace_level);
  if (output === undefined && stack === undefined)
    throw new HttpError(400, 'give output_level and/or stack_trace_level');
  // On record first, whatever the levels are or are about to be: a change that silences every
  // scope must not silence itself.
  const was = (levels: Readonly<Record<LogScope, LogLevel>>) => targets.map((t) => `${t}:${levels[t]}`).join(',');
  logAlways('monitoring', 'info', 'ControlZ: changing scope levels', {
    scope_name: name,
    ...(output ? { output_level: output } : {}),
    ...(stack ? { stack_trace_level: stack } : {}),
    ...(output ? { from: was(scopeLevels()) } : {}),
    ...(stack ? { stack_trace_from: was(stacktraceLevels()) } : {}),
    ...client(),
  });
  for (const t of targets) {
    if (output !== undefined) setScopeLevel(t, output);
    if (stack !== undefined) setStacktraceLevel(t, stack);
  }
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
    startup_seconds: startupStages(),
  };
}

function componentsView(components: readonly Component[], readiness: { of(c: Component): PartReadiness }) {
  return components.map((c) => {
    const { notReady, notes } = readiness.of(c);
    const reasons = notReady.map((r) => r.text);
    let status: Record<string, unknown>;
    try {
      status = c.status();
    } catch (e) {
      status = { error: `status() failed: ${(e as Error).message}` };
    }
    return {
      name: c.name,
      ready: reasons.length === 0,
      not_ready_reasons: reasons,
      not_ready: notReady.map((r) => ({ reason: r.text, since: r.since })),
      notes: notes.map((n) => ({ note: n.text, since: n.since })),
      status,
    };
  });
}

interface RequestContext {
  readonly body: () => Promise<string>;
  /** Fields naming the client: address:port and, on loopback, the uid owning its socket. */
  readonly client: () => Fields;
  readonly access: WriteAccess;
}

async function route(
  method: string,
  pathname: string,
  ctx: RequestContext,
  deps: Required<ControlzDeps>,
): Promise<Reply> {
  const get = method === 'GET' || method === 'HEAD';
  const only = (ok: boolean, allow: string) => {
    if (!ok)
      throw Object.assign(new HttpError(405, `method ${method} not allowed on ${pathname}; use ${allow}`), { allow });
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
    if (!ctx.access.writable) throw new HttpError(403, ctx.access.reason);
    return updateScope(name, await ctx.body(), ctx.client);
  }
  const views: Record<string, () => Promise<Reply>> = {
    '/api/controlz': async () => json(ctx.access),
    '/api/proc': async () => json(procInfo()),
    '/api/env': async () => json(maskedEnvironment()),
    '/api/args': async () => json(maskedArgs()),
    '/api/components': async () => json(componentsView(deps.components(), deps.readiness)),
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
const isLoopback = (a: string | undefined) =>
  a !== undefined && (a === '::1' || a.startsWith('127.') || a.startsWith('::ffff:127.'));

/** The host to listen on: `*` means every address. */
export function listenHost(address: string): string | undefined {
  return address === '*' || address === '' ? undefined : address;
}

export interface ControlzServer {
  readonly port: number;
  readonly host: string;
  close(): Promise<void>;
}

export async function serveControlz(
  address: string,
  port: number,
  deps: ControlzDeps,
  access: WriteAccess = writeAccess(address, 'auto'),
): Promise<ControlzServer> {
  const host = listenHost(address);
  const loopbackOnly = host !== undefined && LOOPBACK_HOSTS.has(host);
  const withClocks = { ...deps, readiness: deps.readiness ?? new AgentReadiness(deps.components) };
  const server = boundedHttpServer((req, res) => {
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
    if (loopbackOnly && !LOOPBACK_HOSTS.has(hostname))
      return fail(
        new HttpError(403, `host ${JSON.stringify(hostname)} not allowed; ControlZ listens on ${address} only`),
      );
    const url = URL.parse(req.url ?? '/', 'http://localhost');
    if (!url) return fail(new HttpError(400, 'bad request target'));
    const client = (): Fields => {
      const { remoteAddress, remotePort, localPort } = req.socket;
      const uid =
        remotePort !== undefined && localPort !== undefined && isLoopback(remoteAddress)
          ? loopbackPeerUid(remotePort, localPort)
          : undefined;
      return {
        client: `${remoteAddress ?? '?'}:${remotePort ?? '?'}`,
        ...(uid !== undefined ? { client_uid: uid } : {}),
      };
    };
    route(req.method ?? 'GET', url.pathname, { body: () => readBody(req), client, access }, withClocks).then(
      (r) => send(r),
      fail,
    );
  }, HTTP_BOUNDS.ctrlzMaxConnections);
  return listenTcp(server, port, host, {
    what: 'ControlZ',
    where: `${address}:${port}`,
    fix: 'choose another --ctrlz_port or --ctrlz_address',
  });
}

/** What ControlZ reads of the settings (--ctrlz_address, --ctrlz_port, --ctrlz_write): src/agent.ts hands it over. */
export interface ControlzArgs {
  readonly address: string;
  readonly port: number;
  readonly write: CtrlzWriteMode;
}

export async function startControlz(args: ControlzArgs, deps: ControlzDeps): Promise<Component> {
  const { address, port } = args;
  const access = writeAccess(address, args.write);
  let server: ControlzServer;
  try {
    server = await serveControlz(address, port, deps, access);
  } catch (e) {
    log.error('ControlZ is off', { error: (e as Error).message });
    const error = (e as Error).message;
    return {
      name: 'ctrlz',
      notReadyReasons: () => [],
      status: () => ({ enabled: true, listening: false, error }),
      stop: async () => {},
    };
  }
  log.info('ControlZ listening', {
    address,
    host: server.host,
    port: server.port,
    url: `http://${address === '*' ? 'localhost' : address}:${server.port}/`,
    writable: access.writable,
  });
  if (access.writable && !writeAccess(address, 'auto').writable) {
    log.warn('ControlZ lets anyone who can reach it change log levels', {
      address,
      port: server.port,
      reason: access.reason,
    });
  }
  return {
    name: 'ctrlz',
    notReadyReasons: () => [],
    status: () => ({ enabled: true, listening: true, address, port: server.port, writable: access.writable }),
    stop: () => server.close(),
  };
}

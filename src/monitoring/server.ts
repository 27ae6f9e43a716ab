// The monitoring HTTP server on --monitoring-port: /metrics, /readyz, /healthz.

import type http from 'node:http';
import { boundedHttpServer, listenTcp } from './httpbounds.ts';
import { registry } from './metrics.ts';
import { scope } from './logging.ts';
import { OPENMETRICS_CONTENT_TYPE, toOpenMetrics, wantsOpenMetrics } from './openmetrics.ts';
import type { TimedLine } from './readiness.ts';

const log = scope('monitoring');

/** What /readyz shows (readiness.ts): each line with since when it has been said. */
export interface Readiness {
  /** Empty when ready; otherwise one reason a line. */
  notReady(): readonly TimedLine[];
  /** Lines /readyz adds, ready or not (e.g. config files the installer passed over). */
  notes(): readonly TimedLine[];
}

export interface MonitoringServer {
  readonly port: number;
  close(): Promise<void>;
}

/** Connections held at once on the monitoring port; one more closes the oldest (httpbounds.ts). */
export const MONITORING_MAX_CONNECTIONS = 64;

export async function startMonitoringServer(opts: {
  port: number;
  host?: string;
  readiness: Readiness;
}): Promise<MonitoringServer> {
  const server = boundedHttpServer((req, res) => {
    const send = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    // An absolute-form or malformed request target must not throw out of the handler.
    const pathname = URL.parse(req.url ?? '/', 'http://localhost')?.pathname ?? '';
    const route = Object.hasOwn(ROUTES, pathname) ? ROUTES[pathname] : undefined;
    if (!route) return send(404, `not found: ${pathname}\n`);
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return send(405, `method ${req.method} not allowed\n`);
    }
    route(send, opts.readiness, req).catch((e: unknown) => {
      log.error('monitoring request failed', { path: pathname, error: String(e) });
      if (!res.headersSent) send(500, 'internal error\n');
    });
  }, MONITORING_MAX_CONNECTIONS);
  const { port, close } = await listenTcp(server, opts.port, opts.host, {
    what: 'metrics',
    where: `${opts.host ?? '*'}:${opts.port}`,
    fix: 'choose a free --monitoring-port',
  });
  log.info('monitoring server listening', { port });
  return { port, close };
}

type Send = (status: number, body: string, type?: string) => void;

const ROUTES: Record<string, (send: Send, readiness: Readiness, req: http.IncomingMessage) => Promise<void>> = {
  '/metrics': async (send, _readiness, req) => {
    const text = await registry.metrics();
    if (wantsOpenMetrics(req.headers.accept)) send(200, toOpenMetrics(text), OPENMETRICS_CONTENT_TYPE);
    else send(200, text, registry.contentType);
  },
  '/healthz': async (send) => send(200, 'ok\n'),
  // One line each, the since last: a reason's words come first, as before they had a since.
  '/readyz': async (send, readiness) => {
    const timed = (l: TimedLine) => `${l.text} (since ${l.since})`;
    const reasons = readiness.notReady();
    const notes = readiness
      .notes()
      .map((n) => `note: ${timed(n)}\n`)
      .join('');
    if (reasons.length === 0) send(200, `ready\n${notes}`);
    else send(503, `not ready:\n${reasons.map((r) => `- ${timed(r)}`).join('\n')}\n${notes}`);
  },
};

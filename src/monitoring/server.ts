// The monitoring HTTP server on --monitoring-port: /metrics, /readyz, /healthz.

import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { registry } from './metrics.ts';
import { scope } from './logging.ts';

const log = scope('monitoring');

export interface Readiness {
  /** Empty when ready; otherwise one reason a line, shown by /readyz. */
  notReadyReasons(): readonly string[];
}

export interface MonitoringServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function startMonitoringServer(opts: { port: number; host?: string; readiness: Readiness }): Promise<MonitoringServer> {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const send = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    const route = ROUTES[url.pathname];
    if (!route) return send(404, `not found: ${url.pathname}\n`);
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return send(405, `method ${req.method} not allowed\n`);
    }
    route(send, opts.readiness).catch((e: unknown) => {
      log.error('monitoring request failed', { path: url.pathname, error: String(e) });
      if (!res.headersSent) send(500, 'internal error\n');
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  log.info('monitoring server listening', { port });
  return {
    port,
    close: () => new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    }),
  };
}

type Send = (status: number, body: string, type?: string) => void;

const ROUTES: Record<string, (send: Send, readiness: Readiness) => Promise<void>> = {
  '/metrics': async (send) => send(200, await registry.metrics(), registry.contentType),
  '/healthz': async (send) => send(200, 'ok\n'),
  '/readyz': async (send, readiness) => {
    const reasons = readiness.notReadyReasons();
    if (reasons.length === 0) send(200, 'ready\n');
    else send(503, `not ready:\n${reasons.map((r) => `- ${r}`).join('\n')}\n`);
  },
};

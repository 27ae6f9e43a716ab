// Bounds for the agent's HTTP servers (the monitoring port, on every address by default, and
// ControlZ): without them Node waits 60 s for a request's headers (checked every 30 s), 5 min
// for its body, and holds any number of connections, so one client opening connections or
// sending its headers a byte at a time could keep the kubelet's /readyz probe from an answer.
// Both listen on TCP the same way too (listenTcp), failing with what to do.

import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { holdSlots } from './unixsocket.ts';

export const HTTP_BOUNDS = {
  /** A request's headers must be in within this. */
  headersTimeoutMs: 5_000,
  /** The whole request (our routes take no body) within this. */
  requestTimeoutMs: 10_000,
  /** Idle keep-alive connections go after this (a scraper or probe comes back on a new one). */
  keepAliveTimeoutMs: 2_000,
  /** How often the two timeouts above are checked (Node's default, 30 s, would stretch them). */
  checkIntervalMs: 1_000,
  /** Request line and headers together; a probe or scrape sends a few hundred bytes. */
  maxHeaderSize: 8 * 1024,
  /** ControlZ's connection cap (one or two browsers). */
  ctrlzMaxConnections: 32,
} as const;

/** Those bounds as Node's server options, for a server whose connections are capped elsewhere (listenUnix). */
export const BOUNDED_SERVER_OPTIONS: http.ServerOptions = {
  headersTimeout: HTTP_BOUNDS.headersTimeoutMs,
  requestTimeout: HTTP_BOUNDS.requestTimeoutMs,
  keepAliveTimeout: HTTP_BOUNDS.keepAliveTimeoutMs,
  connectionsCheckingInterval: HTTP_BOUNDS.checkIntervalMs,
  maxHeaderSize: HTTP_BOUNDS.maxHeaderSize,
};

/**
 * An HTTP server with those bounds, holding at most `maxConnections`: one more closes the
 * oldest (unixsocket.ts's slots), so held connections cannot lock a new one out; a probe's
 * connection is new, the ones holding slots the oldest.
 */
export function boundedHttpServer(
  handler: http.RequestListener,
  maxConnections: number,
  onEvict?: (socket: Socket) => void,
): http.Server {
  const server = http.createServer(BOUNDED_SERVER_OPTIONS, handler);
  holdSlots(server, { maxConnections, onEvict });
  return server;
}

/** A server listening on a TCP port: where it is, and its close, which ends open connections too. */
export interface Listening {
  readonly port: number;
  readonly host: string;
  close(): Promise<void>;
}

/**
 * Listens on `host`:`port` (every address when host is undefined). A failure says which server,
 * where and what to do: `cannot serve <what> on <where>: EADDRINUSE; <fix>`.
 */
export async function listenTcp(
  server: http.Server,
  port: number,
  host: string | undefined,
  said: { readonly what: string; readonly where: string; readonly fix: string },
): Promise<Listening> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        new Error(`cannot serve ${said.what} on ${said.where}: ${e.code ?? e.message}; ${said.fix}`, { cause: e }),
      ),
    );
    server.listen(port, host, () => resolve());
  });
  const bound = server.address() as AddressInfo;
  return {
    port: bound.port,
    host: bound.address,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

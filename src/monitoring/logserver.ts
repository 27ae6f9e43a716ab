// The plugin log server on --log-uds-address: the CNI plugin, run by the container runtime once
// per pod, connects, writes its log lines (one JSON object each, see pluginrecord.ts) and closes;
// the agent prints each in scope `cni`. Anything on the node that can reach the socket may send
// anything, so every resource is bounded: line length, concurrent connections, idle time.

import { lstat, mkdir, chmod, unlink, stat } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Counter, Gauge } from 'prom-client';
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';
import { LineSplitter } from './lines.ts';
import { logRecord, scope } from './logging.ts';
import { registry } from './metrics.ts';
import { parsePluginLine } from './pluginrecord.ts';

const log = scope('monitoring');

export interface LogServerLimits {
  /** Longest line kept (the plugin sends at most 16 KiB); longer ones are dropped whole. */
  readonly maxLineBytes: number;
  /** Concurrent connections; more are closed at once (a runtime starts few pods at a time). */
  readonly maxConnections: number;
  /** A connection silent this long is closed (a plugin run takes well under a second). */
  readonly idleTimeoutMs: number;
}

export const DEFAULT_LIMITS: LogServerLimits = { maxLineBytes: 64 * 1024, maxConnections: 256, idleTimeoutMs: 10_000 };

const DROP_REASONS = ['oversized', 'invalid_json', 'invalid_record'] as const;
type DropReason = (typeof DROP_REASONS)[number];

const metrics = {
  lines: new Counter({ name: 'mesh_cni_plugin_log_lines_received_total', help: 'Lines read from the CNI plugin log socket, printed or dropped.', registers: [registry] }),
  dropped: new Counter({
    name: 'mesh_cni_plugin_log_lines_dropped_total',
    help: 'Plugin log lines dropped: oversized (longer than the line limit), invalid_json, invalid_record (JSON but not a log record).',
    labelNames: ['reason'] as const,
    registers: [registry],
  }),
  bytes: new Counter({ name: 'mesh_cni_plugin_log_received_bytes_total', help: 'Bytes read from the CNI plugin log socket.', registers: [registry] }),
  connections: new Counter({
    name: 'mesh_cni_plugin_log_connections_total',
    help: 'Connections to the plugin log socket: accepted, or rejected because the connection limit was reached.',
    labelNames: ['result'] as const,
    registers: [registry],
  }),
  idle: new Counter({ name: 'mesh_cni_plugin_log_connections_idle_closed_total', help: 'Plugin log connections closed by the agent after the idle timeout.', registers: [registry] }),
  open: new Gauge({ name: 'mesh_cni_plugin_log_connections_open', help: 'Plugin log connections open now.', registers: [registry] }),
};
for (const reason of DROP_REASONS) metrics.dropped.inc({ reason }, 0);
for (const result of ['accepted', 'rejected']) metrics.connections.inc({ result }, 0);

/** Creates the socket's directory (0750) and clears a stale socket; refuses to remove anything else. */
async function prepareSocketPath(address: string): Promise<void> {
  const dir = path.dirname(address);
  const created = await mkdir(dir, { recursive: true, mode: 0o750 });
  if (created !== undefined) await chmod(dir, 0o750); // mkdir's mode is filtered by the umask.
  const existing = await lstat(address).catch((e: NodeJS.ErrnoException) => {
    if (e.code === 'ENOENT') return undefined;
    throw e;
  });
  if (!existing) return;
  if (!existing.isSocket()) {
    throw new Error(`cannot serve plugin logs on ${address}: it exists and is not a socket; remove it or choose another --log-uds-address`);
  }
  // A socket left by an agent that was killed; a live agent on this node would be replaced by us.
  await unlink(address);
  log.info('removed stale plugin log socket', { path: address });
}

function listen(server: net.Server, address: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (e: NodeJS.ErrnoException) =>
      reject(new Error(`cannot serve plugin logs on ${address}: ${e.code ?? e.message}; check --log-uds-address and that its directory is writable`, { cause: e }));
    server.once('error', onError);
    // bind() runs inside listen(): with this umask the socket is 0600 from its first moment.
    const umask = process.umask(0o177);
    try {
      server.listen(address, () => {
        server.off('error', onError);
        resolve();
      });
    } finally {
      process.umask(umask);
    }
  });
}

function handleLine(line: Buffer): void {
  const text = line.toString('utf8', 0, line.length > 0 && line[line.length - 1] === 13 ? line.length - 1 : line.length);
  if (text.trim() === '') return;
  metrics.lines.inc();
  const r = parsePluginLine(text);
  if (!r.ok) {
    drop(r.reason);
    return;
  }
  logRecord('cni', r.entry.level, r.entry.msg, r.entry.fields, r.entry.time);
}

function drop(reason: DropReason): void {
  metrics.dropped.inc({ reason });
  log.debug('dropped a plugin log line', { reason });
}

export async function startPluginLogServer(settings: Settings, limits: LogServerLimits = DEFAULT_LIMITS): Promise<Component> {
  const address = settings.install.logUdsAddress;
  if (address === '') return disabledComponent('plugin-log-server');
  await prepareSocketPath(address);

  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    metrics.connections.inc({ result: 'accepted' });
    sockets.add(socket);
    metrics.open.set(sockets.size);
    const lines = new LineSplitter(limits.maxLineBytes, handleLine, () => {
      metrics.lines.inc();
      drop('oversized');
    });
    socket.setTimeout(limits.idleTimeoutMs, () => {
      metrics.idle.inc();
      socket.destroy();
    });
    socket.on('data', (chunk: Buffer) => {
      metrics.bytes.inc(chunk.length);
      lines.push(chunk);
    });
    socket.on('end', () => {
      lines.end();
      socket.end();
    });
    socket.on('error', (e) => log.debug('plugin log connection failed', { error: e.message }));
    socket.on('close', () => {
      sockets.delete(socket);
      metrics.open.set(sockets.size);
    });
  });
  server.maxConnections = limits.maxConnections;
  server.on('drop', () => metrics.connections.inc({ result: 'rejected' }));
  server.on('error', (e) => log.error('plugin log server failed', { path: address, error: e.message }));
  await listen(server, address);
  await chmod(address, 0o600);
  const ours = await stat(address);
  log.info('plugin log server listening', { path: address });

  return {
    name: 'plugin-log-server',
    notReadyReasons: () => [],
    status: () => ({ address, connections: sockets.size, limits }),
    stop: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
      // Remove the socket only if it is still ours (a newer agent may have replaced it).
      const now = await stat(address).catch(() => undefined);
      if (now && now.ino === ours.ino && now.dev === ours.dev) await unlink(address).catch(() => {});
    },
  };
}

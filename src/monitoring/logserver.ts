// The plugin log server on --log-uds-address: the CNI plugin, run by the container runtime once
// per pod, connects, writes its log lines (one JSON object each, see pluginrecord.ts) and closes;
// the agent prints each in scope `cni`. Anything on the node that can reach the socket may send
// anything, so every resource is bounded: line length, concurrent connections, idle time.

import net from 'node:net';
import { Counter, Gauge } from 'prom-client';
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';
import { LineSplitter } from './lines.ts';
import { logRecord, scope } from './logging.ts';
import { registry } from './metrics.ts';
import { listenUnix } from './unixsocket.ts';
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
  const close = await listenUnix(server, address, 'plugin logs', '--log-uds-address');
  log.info('plugin log server listening', { path: address });

  return {
    name: 'plugin-log-server',
    notReadyReasons: () => [],
    status: () => ({ address, connections: sockets.size, limits }),
    stop: close,
  };
}

// The plugin log server on --log-uds-address: the CNI plugin, run by the container runtime once
// per pod, connects, writes its log lines (one JSON object each, see pluginrecord.ts) and closes;
// the agent prints each in scope `cni`. Anything on the node that can reach the socket may send
// anything, so every resource is bounded:
//   - memory: a partial line per connection (line cap) and across connections (a total budget;
//     the connection that would go over it is closed); whole lines are parsed from the read
//     buffer and never held;
//   - read rate: over it, every connection pauses until the next tick, leaving the rest in the
//     sender's socket buffer. Every byte read costs a read buffer that the GC frees only later,
//     so the rate, not only what is held, is what keeps RSS below the DaemonSet's limit in a flood;
//   - time: a connection idle too long, one whose line does not end soon after it began (the
//     plugin writes each line in one write), and one older than any plugin run are closed;
//   - connections: at the limit, a new one closes the oldest, never one still waiting for its
//     first read (see unixsocket.ts).
// Once it listens, the records plugin runs wrote to a file while no agent listened are printed
// too, and the file removed (logreplay.ts).

import net from 'node:net';
import { Counter, Gauge } from 'prom-client';
import { disabledComponent, type Component } from '../component.ts';
import { LineSplitter } from './lines.ts';
import { ReadPacer } from './pacer.ts';
import { logRecord, scope } from './logging.ts';
import { combinations, knownCounter, registry } from './metrics.ts';
import { listenUnix } from './unixsocket.ts';
import { parsePluginBytes } from './pluginrecord.ts';
import { replayPluginLogFiles } from './logreplay.ts';
import { prepareCacheDir } from '../../cni-plugin/shared/cachedir.ts';
import { PLUGIN_LOG_SCOPE } from '../../cni-plugin/shared/pluginlog.ts';

const log = scope('monitoring');

export interface LogServerLimits {
  /** Longest line kept (the plugin sends at most 16 KiB); longer ones are dropped whole. */
  readonly maxLineBytes: number;
  /** Partial lines held across all connections. */
  readonly maxBufferedBytes: number;
  /** Bytes read a second across all connections (a node's plugin runs send a few KiB a pod). */
  readonly maxBytesPerSecond: number;
  /** Concurrent connections; one more closes the oldest (a runtime starts few pods at a time). */
  readonly maxConnections: number;
  /** A connection silent this long is closed (a plugin run takes well under a second). */
  readonly idleTimeoutMs: number;
  /** A line must end this soon after its first byte arrived. */
  readonly lineTimeoutMs: number;
  /** A connection is closed this long after it opened: longer than any plugin run (its API lookup gives up after 10 s). */
  readonly maxConnectionMs: number;
}

export const DEFAULT_LIMITS: LogServerLimits = {
  maxLineBytes: 64 * 1024,
  maxBufferedBytes: 4 * 1024 * 1024,
  maxBytesPerSecond: 16 * 1024 * 1024,
  maxConnections: 256,
  idleTimeoutMs: 10_000,
  lineTimeoutMs: 2_000,
  maxConnectionMs: 60_000,
};

const DROP_REASONS = ['oversized', 'invalid_json', 'invalid_record'] as const;
type DropReason = (typeof DROP_REASONS)[number];
const CLOSE_REASONS = ['evicted', 'rejected', 'idle', 'line_timeout', 'lifetime', 'over_budget'] as const;
type CloseReason = (typeof CLOSE_REASONS)[number];

const metrics = {
  lines: new Counter({
    name: 'mesh_cni_plugin_log_lines_received_total',
    help: 'Lines read from the CNI plugin log socket, printed or dropped.',
    registers: [registry],
  }),
  dropped: knownCounter({
    name: 'mesh_cni_plugin_log_lines_dropped_total',
    help: 'Plugin log lines dropped: oversized (longer than the line limit), invalid_json, invalid_record (JSON but not a log record).',
    series: combinations({ reason: DROP_REASONS }),
  }),
  bytes: new Counter({
    name: 'mesh_cni_plugin_log_received_bytes_total',
    help: 'Bytes read from the CNI plugin log socket.',
    registers: [registry],
  }),
  connections: new Counter({
    name: 'mesh_cni_plugin_log_connections_total',
    help: 'Connections accepted on the plugin log socket.',
    registers: [registry],
  }),
  closed: knownCounter({
    name: 'mesh_cni_plugin_log_connections_closed_total',
    help: 'Plugin log connections closed by the agent: evicted (the oldest, for a new one over the connection limit), rejected (a new one over the limit while every open one waits for its first read), idle, line_timeout (a line not ended in time), lifetime, over_budget (partial lines over the total memory budget).',
    series: combinations({ reason: CLOSE_REASONS }),
  }),
  open: new Gauge({
    name: 'mesh_cni_plugin_log_connections_open',
    help: 'Plugin log connections open now.',
    registers: [registry],
  }),
  buffered: new Gauge({
    name: 'mesh_cni_plugin_log_buffered_bytes',
    help: 'Bytes of partial plugin log lines held now, across connections.',
    registers: [registry],
  }),
  pauses: new Counter({
    name: 'mesh_cni_plugin_log_read_pauses_total',
    help: 'Times a plugin log connection had to wait its turn to be read because the read rate limit was reached.',
    registers: [registry],
  }),
};

function handleLine(line: Buffer): void {
  const r = parsePluginBytes(line);
  if (r === null) return;
  metrics.lines.inc();
  if (!r.ok) {
    drop(r.reason);
    return;
  }
  logRecord(PLUGIN_LOG_SCOPE, r.entry.level, r.entry.msg, r.entry.fields, r.entry.time);
}

function drop(reason: DropReason): void {
  metrics.dropped.inc({ reason });
  log.debug('dropped a plugin log line', { reason });
}

// The read rate may burst to this many milliseconds' worth: a plugin run's few lines never wait.
const BURST_MS = 100;
// What a line costs on top of its bytes, in bytes of the read rate: parsing (and printing) a line
// costs far more than reading its bytes, and a flood of tiny lines is the CPU-bound kind. At the
// default rate this is at most 32 000 lines a second.
const LINE_COST = 512;

/** The server on `address` (--log-uds-address, handed over by src/agent.ts); empty: off. */
export async function startPluginLogServer(
  address: string,
  limits: LogServerLimits = DEFAULT_LIMITS,
): Promise<Component> {
  if (address === '') return disabledComponent('plugin-log-server');

  const sockets = new Set<net.Socket>();
  let buffered = 0;
  const setBuffered = (delta: number) => {
    buffered += delta;
    metrics.buffered.set(buffered);
  };
  const pacer = new ReadPacer(limits.maxBytesPerSecond, BURST_MS, () => metrics.pauses.inc());

  const server = net.createServer((socket) => {
    metrics.connections.inc();
    sockets.add(socket);
    metrics.open.set(sockets.size);
    pacer.admit(socket);
    let linesRead = 0;
    const lines = new LineSplitter(
      limits.maxLineBytes,
      (line) => {
        linesRead++;
        handleLine(line);
      },
      () => {
        metrics.lines.inc();
        drop('oversized');
      },
    );
    let held = 0;
    let lineTimer: NodeJS.Timeout | null = null;
    const cut = (reason: CloseReason) => {
      metrics.closed.inc({ reason });
      socket.destroy();
    };
    const lifetime = setTimeout(() => cut('lifetime'), limits.maxConnectionMs);
    // Time spent waiting for its turn to be read is ours, not the sender's (the idle timer too).
    const lineTimeout = () => {
      if (pacer.holds(socket)) lineTimer = setTimeout(lineTimeout, limits.lineTimeoutMs);
      else cut('line_timeout');
    };
    socket.setTimeout(limits.idleTimeoutMs, () => {
      if (pacer.holds(socket))
        socket.setTimeout(limits.idleTimeoutMs); // counts again from now
      else cut('idle');
    });
    socket.on('data', (chunk: Buffer) => {
      metrics.bytes.inc(chunk.length);
      linesRead = 0;
      lines.push(chunk);
      pacer.charge(socket, chunk.length + linesRead * LINE_COST);
      const now = lines.buffered;
      if (now !== held) {
        if (now > held && buffered + now - held > limits.maxBufferedBytes) {
          lines.reset();
          setBuffered(-held);
          held = 0;
          return cut('over_budget');
        }
        setBuffered(now - held);
        held = now;
      }
      if (lines.inLine && lineTimer === null) lineTimer = setTimeout(lineTimeout, limits.lineTimeoutMs);
      else if (!lines.inLine && lineTimer !== null) {
        clearTimeout(lineTimer);
        lineTimer = null;
      }
    });
    socket.on('end', () => {
      lines.end();
      socket.end();
    });
    socket.on('error', (e) => log.debug('plugin log connection failed', { error: e.message }));
    socket.on('close', () => {
      clearTimeout(lifetime);
      if (lineTimer !== null) clearTimeout(lineTimer);
      lines.reset();
      setBuffered(-held);
      held = 0;
      sockets.delete(socket);
      pacer.forget(socket);
      metrics.open.set(sockets.size);
    });
  });
  const close = await listenUnix(server, address, 'plugin logs', '--log-uds-address', {
    maxConnections: limits.maxConnections,
    onEvict: () => metrics.closed.inc({ reason: 'evicted' }),
    unserved: (s) => pacer.owesFirstRead(s),
    onReject: () => metrics.closed.inc({ reason: 'rejected' }),
  });
  log.info('plugin log server listening', { path: address });
  // Now that plugin runs reach the socket again: what they wrote while none did.
  const replay = replayPluginLogFiles(address, limits.maxLineBytes);
  try {
    // Where the plugin, as root, remembers the host's iptables flavour: a 0700 dir of our own.
    prepareCacheDir(address);
  } catch (e) {
    log.warn("cannot make the plugin's cache directory; the plugin detects the iptables flavour on every ADD", {
      error: (e as Error).message,
    });
  }

  return {
    name: 'plugin-log-server',
    notReadyReasons: () => [],
    status: () => ({
      address,
      connections: sockets.size,
      bufferedBytes: buffered,
      waitingToRead: { new: pacer.waitingNew, all: pacer.waiting },
      replay: replay.status(),
      limits,
    }),
    stop: async () => {
      await replay.done;
      pacer.stop();
      await close();
    },
  };
}

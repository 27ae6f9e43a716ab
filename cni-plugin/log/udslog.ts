// Plugin logs to the agent over its unix socket (`log_uds_address` in our conflist entry, the
// agent's --log-uds-address), which prints them in scope `cni`. The wire format (one JSON
// record a line, at most 16 KiB) is cni-plugin/shared/pluginlog.ts; lines below the entry's
// `log_level` are not sent.
//
// Never blocks or fails the plugin: connect and write are fire-and-forget on an unref'd socket
// (one refused as untrusted, shared/trustedpath.ts, gets nothing, and stderr says why);
// flush() waits at most a few ms and then lets the process exit, dropping what is unsent. The
// socket is the runtime's own (unixsocket.ts): node:net under Bun costs ~3 ms of CPU to load.

import { connectUnix, type UnixSocket } from '../unixsocket.ts';
import { LEVEL_RANK as RANK, type EmitLevel as Level, type LogLevel } from '../shared/loglevels.ts';
import { PLUGIN_LOG_MAX_LINE as MAX_LINE, PLUGIN_LOG_SCOPE, type PluginLogRecord } from '../shared/pluginlog.ts';
import { fixTrust } from '../shared/trustedpath.ts';

export interface LogContext {
  command: string;
  containerID: string;
  pod: { namespace: string; name: string } | null;
}

export class UdsLog {
  readonly #lines: string[] = [];
  #socket: UnixSocket | null = null;
  #connected = false;
  #failed = false;
  /** A flush waiting for the connection to open or fail. */
  #waiting: (() => void) | null = null;
  readonly #address: string;
  readonly #threshold: number;
  readonly context: LogContext;
  /** Also mirror lines to stderr (the runtime keeps plugin stderr in its own log). */
  readonly #stderrLevel: number;

  constructor(address: string, level: LogLevel, context: LogContext, stderrLevel: LogLevel = 'error') {
    this.#address = address;
    this.#threshold = RANK[level];
    this.context = context;
    this.#stderrLevel = RANK[stderrLevel];
  }

  log(level: Level, msg: string, fields: Record<string, unknown> = {}): void {
    if (RANK[level] > this.#threshold && RANK[level] > this.#stderrLevel) return;
    const { command, containerID, pod } = this.context;
    // One record, one time: the truncated form is the same record with its msg cut and marked.
    const rec = {
      time: new Date().toISOString(),
      level,
      msg,
      scope: PLUGIN_LOG_SCOPE,
      command,
      containerID,
      pod,
    } satisfies PluginLogRecord;
    let line = JSON.stringify({ ...rec, ...fields } satisfies PluginLogRecord);
    if (line.length > MAX_LINE) {
      line = JSON.stringify({ ...rec, msg: msg.slice(0, 4096), truncated: true } satisfies PluginLogRecord);
    }
    if (RANK[level] <= this.#stderrLevel)
      process.stderr.write(
        `mesh-cni: ${level}: ${msg}${Object.keys(fields).length ? ' ' + JSON.stringify(fields) : ''}\n`,
      );
    if (RANK[level] > this.#threshold || this.#address === '' || this.#failed) return;
    this.#lines.push(line + '\n');
    this.#pump();
  }

  error(msg: string, fields?: Record<string, unknown>): void {
    this.log('error', msg, fields);
  }
  warn(msg: string, fields?: Record<string, unknown>): void {
    this.log('warn', msg, fields);
  }
  info(msg: string, fields?: Record<string, unknown>): void {
    this.log('info', msg, fields);
  }
  debug(msg: string, fields?: Record<string, unknown>): void {
    this.log('debug', msg, fields);
  }

  #pump(): void {
    if (this.#socket === null) {
      const settled = () => {
        const w = this.#waiting;
        this.#waiting = null;
        w?.();
      };
      this.#socket = connectUnix(
        this.#address,
        {
          open: () => {
            this.#connected = true;
            this.#pump();
            settled();
          },
          data: () => {},
          error: () => {
            this.#failed = true;
            this.#lines.length = 0;
            settled();
          },
          close: () => {},
          // Log lines name pods and what was done to them: not for whoever may be answering there.
          refused: (reason) => {
            this.#failed = true;
            this.#lines.length = 0;
            process.stderr.write(
              `mesh-cni: error: not sending logs to ${this.#address}: ${reason}; ${fixTrust('--log-uds-address')}\n`,
            );
            settled();
          },
        },
        { unref: true },
      );
      return;
    }
    if (!this.#connected) return;
    while (this.#lines.length > 0) this.#socket.write(this.#lines.shift()!);
  }

  /** Gives queued lines up to `maxMs` to reach the socket, then closes it. */
  flush(maxMs = 5): Promise<void> {
    const s = this.#socket;
    if (s === null || this.#failed) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        s.destroy();
        resolve();
      };
      const timer = setTimeout(done, maxMs);
      const finish = () => (this.#failed ? done() : s.end(done));
      if (this.#connected) finish();
      else this.#waiting = finish;
    });
  }
}

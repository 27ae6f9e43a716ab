// Plugin logs to the agent over its unix socket (`log_uds_address` in our conflist entry, the
// agent's --log-uds-address), which prints them in scope `cni`. The wire format (one JSON
// record a line, at most 16 KiB) is cni-plugin/shared/pluginlog.ts; lines below the entry's
// `log_level` are not sent.
//
// Never blocks or fails the plugin: connect and write are fire-and-forget on an unref'd socket
// (one refused as untrusted, shared/trustedpath.ts, gets nothing, and stderr says why);
// flush() waits at most a few ms and then lets the process exit, dropping what is unsent. The
// socket is the runtime's own (unixsocket.ts): node:net under Bun costs ~3 ms of CPU to load.
// When the socket cannot be reached (no agent listening), the records are appended at flush()
// to the file beside it that the agent prints when it starts (fallbackfile.ts); a refused
// socket gets no file either: its directory is no more to be trusted than the socket.

import { connectUnix, type UnixSocket } from '../unixsocket.ts';
import { LEVEL_RANK as RANK, type EmitLevel as Level, type LogLevel } from '../shared/loglevels.ts';
import { PLUGIN_LOG_MAX_LINE as MAX_LINE, PLUGIN_LOG_SCOPE, type PluginLogRecord } from '../shared/pluginlog.ts';
import { fixTrust } from '../shared/trustedpath.ts';
import { appendToFallbackFile } from './fallbackfile.ts';

export interface LogContext {
  command: string;
  containerID: string;
  pod: { namespace: string; name: string } | null;
}

export class UdsLog {
  readonly #lines: string[] = [];
  #socket: UnixSocket | null = null;
  /** file: the socket could not be reached, lines wait for the file; off: lines are dropped. */
  #state: 'socket' | 'open' | 'file' | 'off' = 'socket';
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
    if (RANK[level] > this.#threshold || this.#address === '' || this.#state === 'off') return;
    this.#lines.push(line + '\n');
    if (this.#state !== 'file') this.#pump();
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
            this.#state = 'open';
            this.#pump();
            settled();
          },
          data: () => {},
          // What was written is gone; what was not, and what comes, waits for the file.
          error: () => {
            this.#state = 'file';
            settled();
          },
          close: () => {},
          // Log lines name pods and what was done to them: not for whoever may be answering there.
          refused: (reason) => {
            this.#state = 'off';
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
    if (this.#state !== 'open') return;
    while (this.#lines.length > 0) this.#socket.write(this.#lines.shift()!);
  }

  /**
   * Gives queued lines up to `maxMs` to reach the socket, then closes it. When it could not be
   * reached, or not connected in that time, appends them to the file instead (synchronously).
   */
  flush(maxMs = 5): Promise<void> {
    const s = this.#socket;
    if (this.#state === 'file') this.#toFile();
    if (s === null || this.#state === 'off' || this.#state === 'file') return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        s.destroy();
        resolve();
      };
      // Not connected in time: nothing was sent, so the file gets it all (no record twice).
      const timer = setTimeout(() => {
        this.#waiting = null;
        if (this.#state === 'socket') {
          this.#state = 'file';
          this.#toFile();
        }
        done();
      }, maxMs);
      const finish = () => {
        if (this.#state === 'file') this.#toFile();
        if (this.#state === 'open') s.end(done);
        else done();
      };
      if (this.#state === 'open') finish();
      else this.#waiting = finish;
    });
  }

  #toFile(): void {
    const why = appendToFallbackFile(this.#address, this.#lines);
    this.#lines.length = 0;
    if (why !== null)
      process.stderr.write(`mesh-cni: warn: the agent's log socket ${this.#address} cannot be reached, and ${why}\n`);
  }
}

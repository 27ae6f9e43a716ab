// Scoped structured logging on pino. Every module logs through a scope of the seed
// (`scope('install').info(...)`); levels per scope come from --log_output_level and can be
// changed at run time (ControlZ). Output: one JSON object a line with --log_as_json, else a
// console line: `<time>\t<level>\t<scope>\t<message>\t<key=value ...>`.

import { pino, type Logger as PinoLogger } from 'pino';
import type { LogLevel, LogScope } from '../config/flags.ts';
import { LOG_SCOPES } from '../config/flags.ts';
import type { LoggingSettings } from '../config/settings.ts';

export type Fields = Record<string, unknown>;

export interface Logger {
  error(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  debug(msg: string, fields?: Fields): void;
  enabled(level: Exclude<LogLevel, 'none'>): boolean;
}

const SCOPES = LOG_SCOPES.filter((s): s is LogScope => s !== 'all');
const RANK: Record<LogLevel, number> = { none: 0, error: 1, warn: 2, info: 3, debug: 4 };

interface Sink {
  write(line: string): void;
}

interface State {
  levels: Record<LogScope, LogLevel>;
  asJson: boolean;
  root: PinoLogger;
}

function makeRoot(asJson: boolean, sink: Sink): PinoLogger {
  const dest = asJson ? sink : { write: (line: string) => sink.write(toConsoleLine(line)) };
  return pino(
    {
      level: 'debug',
      base: null,
      messageKey: 'msg',
      timestamp: () => `,"time":"${new Date().toISOString()}"`,
      formatters: { level: (label) => ({ level: label }) },
    },
    dest,
  );
}

/** JSON record from pino -> the stable console line. */
export function toConsoleLine(json: string): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const { time, level, scope, msg, ...rest } = rec;
  const kv = Object.entries(rest)
    .map(([k, v]) => `${k}=${typeof v === 'string' && !/[\s"=]/.test(v) && v !== '' ? v : JSON.stringify(v)}`)
    .join(' ');
  return `${String(time)}\t${String(level)}\t${String(scope)}\t${String(msg)}${kv ? '\t' + kv : ''}\n`;
}

const stdoutSink: Sink = { write: (line) => process.stdout.write(line) };

const state: State = {
  levels: Object.fromEntries(SCOPES.map((s) => [s, 'info'])) as Record<LogScope, LogLevel>,
  asJson: false,
  root: makeRoot(false, stdoutSink),
};

/** Applies the logging settings; `sink` lets tests and ControlZ capture output. */
export function configureLogging(settings: Pick<LoggingSettings, 'asJson' | 'outputLevels'>, sink: Sink = stdoutSink): void {
  state.levels = { ...settings.outputLevels };
  state.asJson = settings.asJson;
  state.root = makeRoot(settings.asJson, sink);
}

export function scopeLevels(): Readonly<Record<LogScope, LogLevel>> {
  return { ...state.levels };
}

export function setScopeLevel(scope: LogScope, level: LogLevel): void {
  state.levels[scope] = level;
}

const loggers = new Map<LogScope, Logger>();

export function scope(name: LogScope): Logger {
  let logger = loggers.get(name);
  if (!logger) {
    const on = (level: Exclude<LogLevel, 'none'>) => RANK[state.levels[name]] >= RANK[level];
    const emit = (level: Exclude<LogLevel, 'none'>) => (msg: string, fields?: Fields) => {
      if (on(level)) state.root[level]({ scope: name, ...fields }, msg);
    };
    logger = { error: emit('error'), warn: emit('warn'), info: emit('info'), debug: emit('debug'), enabled: on };
    loggers.set(name, logger);
  }
  return logger;
}

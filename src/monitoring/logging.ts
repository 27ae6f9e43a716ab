// Scoped structured logging on pino. Every module logs through a scope of the seed
// (`scope('install').info(...)`); levels per scope come from --log_output_level and can be
// changed at run time (ControlZ). Output: one JSON object a line with --log_as_json, else a
// console line: `<time>\t<level>\t<scope>\t<message>\t<key=value ...>` (see README, Observability).

import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino, stdSerializers, type Logger as PinoLogger } from 'pino';
import type { LogLevel, LogScope } from '../config/flags.ts';
import { scopesAt } from '../config/flags.ts';
import type { LoggingSettings } from '../config/settings.ts';
import { openLogOutputs, stdoutOutput, type LogOutput } from './logtargets.ts';

export type Fields = Record<string, unknown>;
export type EmitLevel = Exclude<LogLevel, 'none'>;

export interface Logger {
  error(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  debug(msg: string, fields?: Fields): void;
  enabled(level: EmitLevel): boolean;
}

const RANK: Record<LogLevel, number> = { none: 0, error: 1, warn: 2, info: 3, debug: 4 };
const ROOT_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

interface Sink {
  write(line: string): void;
}

interface State {
  levels: Record<LogScope, LogLevel>;
  stacktrace: Record<LogScope, LogLevel>;
  caller: Set<LogScope>;
  vklog: number;
  asJson: boolean;
  root: PinoLogger;
  outputs: LogOutput[];
}

// Plugin records keep the time the plugin wrote them; pino asks this when it stamps a record.
let timeOverride: string | undefined;

function makeRoot(asJson: boolean, sink: Sink): PinoLogger {
  const dest = asJson ? sink : { write: (line: string) => sink.write(toConsoleLine(line)) };
  return pino(
    {
      level: 'debug',
      base: null,
      messageKey: 'msg',
      timestamp: () => `,"time":"${timeOverride ?? new Date().toISOString()}"`,
      formatters: { level: (label) => ({ level: label }) },
      serializers: { error: stdSerializers.err, err: stdSerializers.err },
    },
    dest,
  );
}

// Matching control characters is the point here: they must not reach a console line raw.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/g;
const escapeControl = (s: string) => s.replace(CONTROL, (c) => (c === '\u007f' ? '\\u007f' : JSON.stringify(c).slice(1, -1)));
// Values printed bare: no blanks, quotes, `=`, backslashes or control characters.
// eslint-disable-next-line no-control-regex
const BARE = /^[^\s"=\\\u0000-\u001f\u007f]+$/;

function consoleValue(v: unknown): string {
  if (typeof v === 'string' && BARE.test(v)) return v;
  return JSON.stringify(v) ?? String(v);
}

/**
 * JSON record from pino -> the stable console line. Control characters in the message are
 * escaped (`\n`, `\t`), so one record is always one line and the tab-separated columns hold even
 * when a pod's plugin sends hostile text; field values with spaces, quotes or `=` are JSON-quoted.
 */
export function toConsoleLine(json: string): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const { time, level, scope, msg, ...rest } = rec;
  const kv = Object.entries(rest).map(([k, v]) => `${escapeControl(k)}=${consoleValue(v)}`).join(' ');
  return `${String(time)}\t${String(level)}\t${String(scope)}\t${escapeControl(String(msg))}${kv ? '\t' + kv : ''}\n`;
}

const stdoutSink: Sink = stdoutOutput;

const state: State = {
  levels: scopesAt('info'),
  stacktrace: scopesAt('none'),
  caller: new Set(),
  vklog: 0,
  asJson: false,
  root: makeRoot(false, stdoutSink),
  outputs: [],
};

type ConfigurableSettings = Pick<LoggingSettings, 'asJson' | 'outputLevels'> & Partial<LoggingSettings>;

/**
 * Applies the logging settings: levels, stack-trace levels, caller scopes, format and outputs
 * (--log_target, --log_rotate). `sink` replaces the outputs (tests capture lines with it).
 * Throws, naming the flag, when an output cannot be opened.
 */
export function configureLogging(settings: ConfigurableSettings, sink?: Sink): void {
  const outputs = sink ? [] : openLogOutputs({
    targets: settings.targets ?? ['stdout'],
    rotate: settings.rotate ?? '',
    rotateMaxAgeDays: settings.rotateMaxAgeDays ?? 0,
    rotateMaxBackups: settings.rotateMaxBackups ?? 0,
    rotateMaxSizeMb: settings.rotateMaxSizeMb ?? 100,
  });
  const fanOut: Sink = sink ?? (outputs.length === 1 && outputs[0] ? outputs[0] : { write: (line) => { for (const o of outputs) o.write(line); } });
  const previous = state.outputs;
  state.levels = { ...settings.outputLevels };
  state.stacktrace = { ...(settings.stacktraceLevels ?? scopesAt('none')) };
  state.caller = new Set(settings.caller ?? []);
  state.vklog = settings.vklog ?? 0;
  state.asJson = settings.asJson;
  state.outputs = outputs;
  state.root = makeRoot(settings.asJson, fanOut);
  for (const o of previous) void o.close();
}

/** Flushes and closes file outputs (the agent calls it last, after its final log line). */
export async function closeLogging(): Promise<void> {
  const outputs = state.outputs;
  state.outputs = [];
  state.root = makeRoot(state.asJson, stdoutSink);
  await Promise.all(outputs.map((o) => o.close()));
}

export function scopeLevels(): Readonly<Record<LogScope, LogLevel>> {
  return { ...state.levels };
}

export function setScopeLevel(scope: LogScope, level: LogLevel): void {
  state.levels[scope] = level;
}

export function stacktraceLevels(): Readonly<Record<LogScope, LogLevel>> {
  return { ...state.stacktrace };
}

export function setStacktraceLevel(scope: LogScope, level: LogLevel): void {
  state.stacktrace[scope] = level;
}

/** Scopes that log their caller's file:line (--log_caller). */
export function callerScopes(): readonly LogScope[] {
  return [...state.caller];
}

/** `src/install/x.ts:12` for the frame that called the logger (frames below `fn` are skipped). */
function callerOf(fn: (...args: never[]) => unknown): string | undefined {
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, fn);
  const frame = holder.stack?.split('\n')[1];
  const m = frame && /\(?((?:file:\/\/)?[^\s()]+):(\d+):\d+\)?$/.exec(frame);
  if (!m || !m[1]) return undefined;
  const file = m[1].startsWith('file://') ? fileURLToPath(m[1]) : m[1];
  const rel = path.relative(ROOT_DIR, file);
  return `${rel.startsWith('..') ? file : rel}:${m[2]}`;
}

function stackOf(fn: (...args: never[]) => unknown): string {
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, fn);
  return (holder.stack ?? '').split('\n').slice(1).map((l) => l.trim()).join('\n');
}

function write(name: LogScope, level: EmitLevel, msg: string, fields: Fields | undefined, from: (...args: never[]) => unknown): void {
  let rec: Fields = fields ? { ...fields, scope: name } : { scope: name };
  if (state.caller.has(name)) rec = { caller: callerOf(from), ...rec };
  const stackAt = state.stacktrace[name];
  if (stackAt !== 'none' && RANK[level] <= RANK[stackAt]) rec.stack = stackOf(from);
  state.root[level](rec, msg);
}

const loggers = new Map<LogScope, Logger>();

export function scope(name: LogScope): Logger {
  let logger = loggers.get(name);
  if (!logger) {
    const on = (level: EmitLevel) => RANK[state.levels[name]] >= RANK[level];
    const emit = (level: EmitLevel) => {
      const fn = (msg: string, fields?: Fields) => {
        if (on(level)) write(name, level, msg, fields, fn);
      };
      return fn;
    };
    logger = { error: emit('error'), warn: emit('warn'), info: emit('info'), debug: emit('debug'), enabled: on };
    loggers.set(name, logger);
  }
  return logger;
}

/**
 * Logs a record written elsewhere (the CNI plugin) with its own time, when its scope's level
 * lets it through. `time` must already be an ISO-8601 string.
 */
export function logRecord(name: LogScope, level: EmitLevel, msg: string, fields: Fields, time?: string): void {
  if (RANK[state.levels[name]] < RANK[level]) return;
  timeOverride = time;
  try {
    write(name, level, msg, fields, logRecord);
  } finally {
    timeOverride = undefined;
  }
}

/**
 * Logs a record whatever the scope levels say (`none` included), to the same outputs as every
 * other record: for what must be on record however logging is set, such as a change of the
 * levels themselves (one that sets every scope to `none` would otherwise silence its own record).
 */
export function logAlways(name: LogScope, level: EmitLevel, msg: string, fields?: Fields): void {
  write(name, level, msg, fields, logAlways);
}

/**
 * Verbose client logging, as klog's `V(n)`: messages of verbosity `v` go to scope klog at info
 * when `v <= --vklog`. Verbosity 0 messages always pass (the klog scope's level still applies).
 */
export function klogV(v: number): Pick<Logger, 'info'> & { readonly enabled: boolean } {
  const enabled = v <= state.vklog && scope('klog').enabled('info');
  return { enabled, info: enabled ? scope('klog').info : () => {} };
}

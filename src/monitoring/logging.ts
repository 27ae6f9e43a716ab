// Scoped structured logging. Every module logs through one of the log scopes
// (docs/flags.md "Log scopes"; `scope('install').info(...)`); levels per scope come from
// --log_output_level and can be changed at run time (ControlZ). Output: one JSON object a line with
// --log_as_json (made by pino), else a console line written here directly:
// `<time>\t<level>\t<scope>\t<message>\t<key=value ...>` (see docs/observability.md, "Logs").
// Either line goes to the outputs of logtargets.ts (--log_target, --log_rotate).

import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino, stdSerializers, type Logger as PinoLogger } from 'pino';
import { LEVEL_RANK, type EmitLevel, type LogLevel } from '../../cni-plugin/shared/loglevels.ts';
import type { LogScope } from '../config/flags.ts';
import { SCOPES, scopesAt } from '../config/flags.ts';
import type { LoggingSettings } from '../config/settings.ts';
import { openLogOutputs, stdoutOutput, type LogOutput } from './logtargets.ts';

export type { EmitLevel };
export type Fields = Record<string, unknown>;

export interface Logger {
  error(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  debug(msg: string, fields?: Fields): void;
  enabled(level: EmitLevel): boolean;
}

/** Where formatted lines go: the outputs, or a test's capture. */
interface Sink {
  write(line: string): void;
}

const ROOT_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

// ---- the console line ---------------------------------------------------------------------------

// Matching control characters is the point here: they must not reach a line raw. C1 controls
// too (U+0080-U+009F): a terminal that reads them runs U+009B as CSI, and NEL (U+0085) and the
// Unicode line separators start a new line where a sender (a pod's annotation, quoted in a plugin
// record) could forge a record.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/;
// eslint-disable-next-line no-control-regex
const CONTROL_ALL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g;
const escapeChar = (c: string) =>
  c < '\u007f' ? JSON.stringify(c).slice(1, -1) : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
const escapeControl = (s: string) => (CONTROL.test(s) ? s.replace(CONTROL_ALL, escapeChar) : s);
// What JSON.stringify leaves raw of those (DEL, C1, line separators), escaped: still the same JSON.
const RAW_IN_JSON = /[\u007f-\u009f\u2028\u2029]/;
const RAW_IN_JSON_ALL = /[\u007f-\u009f\u2028\u2029]/g;
const escapeJson = (s: string) => (RAW_IN_JSON.test(s) ? s.replace(RAW_IN_JSON_ALL, escapeChar) : s);
// Names and values printed bare: no blanks, quotes, `=`, backslashes or control characters.
// eslint-disable-next-line no-control-regex
const BARE = /^[^\s"=\\\u0000-\u001f\u007f-\u009f]+$/;

// Set by the record itself (columns), never printed as fields.
const COLUMNS = new Set(['time', 'level', 'scope', 'msg']);

// What JSON.stringify cannot write (a bigint, a cycle, a toJSON that throws) is written by pino's
// own safe serializer, exactly as in a JSON line (keys sorted there, depth and breadth limited):
// one record of a pino logger whose line is taken synchronously, as `{"level":"info","v":<json>}`.
let spelled = '';
const safeSerializer = pino(
  { level: 'info', base: null, timestamp: false, formatters: { level: (label) => ({ level: label }) } },
  { write: (line: string) => void (spelled = line) },
);
const SPELLED_HEAD = '{"level":"info","v":';

function pinoJson(v: unknown): string | undefined {
  spelled = '';
  safeSerializer.info({ v });
  if (!spelled.startsWith(SPELLED_HEAD)) return undefined;
  // Read back and written again as the console always had it: index keys ("2") come first.
  return JSON.stringify(JSON.parse(spelled.slice(SPELLED_HEAD.length, -2)));
}

/**
 * A field value as the console prints it: what pino would write into the JSON line (same
 * serializers for `error`/`err`, non-finite numbers as null, undefined/functions/symbols left
 * out), bare when that is a bare string, else as JSON. undefined: the field is left out.
 */
function consoleValue(key: string, v: unknown): string | undefined {
  if (key === 'error' || key === 'err') v = stdSerializers.err(v as Error);
  switch (typeof v) {
    case 'string':
      return BARE.test(v) ? v : escapeJson(JSON.stringify(v));
    case 'number':
      return Number.isFinite(v) ? String(v) : 'null';
    case 'boolean':
    case 'bigint':
      return String(v);
    case 'undefined':
    case 'function':
    case 'symbol':
      return undefined;
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(v);
  } catch {
    json = pinoJson(v);
  }
  // An object that turns into a string (a Date): printed as that string would be.
  if (json !== undefined && json.charCodeAt(0) === 34) return consoleValue('', JSON.parse(json) as string);
  return json === undefined ? undefined : escapeJson(json);
}

/** A field name: bare, else JSON-quoted with DEL (as names always had it), C1 and line separators escaped. */
const nameOf = (k: string) => (BARE.test(k) ? k : escapeJson(JSON.stringify(k)));

/**
 * One console line: control characters in the message are escaped (`\n`, `\t`), so one record is
 * always one line and the tab-separated columns hold even when a pod's plugin sends hostile text;
 * field names and values with blanks, quotes, `=`, `\` or control characters are JSON-quoted.
 */
function consoleLine(time: string, level: EmitLevel, name: LogScope, msg: string, fields: Fields): string {
  let kv = '';
  for (const k in fields) {
    if (!Object.hasOwn(fields, k) || COLUMNS.has(k)) continue;
    const v = consoleValue(k, fields[k]);
    if (v === undefined) continue;
    kv += `${kv === '' ? '\t' : ' '}${nameOf(k)}=${v}`;
  }
  return `${time}\t${level}\t${name}\t${escapeControl(msg)}${kv}\n`;
}

// ---- the configured logging of the process ------------------------------------------------------

interface Config {
  readonly levels: Record<LogScope, LogLevel>;
  readonly stacktrace: Record<LogScope, LogLevel>;
  readonly caller: ReadonlySet<LogScope>;
  readonly vklog: number;
  /** The JSON writer (pino, writing to `sink`); null: console lines. */
  readonly json: PinoLogger | null;
  readonly sink: Sink;
  /** What configureLogging opened: closed when replaced. */
  readonly outputs: readonly LogOutput[];
}

function jsonWriter(sink: Sink): PinoLogger {
  // No timestamp of pino's: each record brings its `time` first (a plugin record keeps its own).
  // pino leaves DEL, C1 controls and line separators raw in strings: escaped, the same JSON.
  return pino(
    {
      level: 'debug',
      base: null,
      messageKey: 'msg',
      timestamp: false,
      formatters: { level: (label) => ({ level: label }) },
      serializers: { error: stdSerializers.err, err: stdSerializers.err },
    },
    { write: (line: string) => sink.write(escapeJson(line)) },
  );
}

function defaults(): Config {
  return {
    levels: scopesAt('info'),
    stacktrace: scopesAt('none'),
    caller: new Set(),
    vklog: 0,
    json: null,
    sink: stdoutOutput,
    outputs: [],
  };
}

// One configured logging per process: every scope's logger reads it, so a reconfiguration
// (start-up, ControlZ, a test) takes effect at once everywhere.
let current: Config = defaults();

type ConfigurableSettings = Pick<LoggingSettings, 'asJson' | 'outputLevels'> & Partial<LoggingSettings>;

/**
 * Applies the logging settings: levels, stack-trace levels, caller scopes, format and outputs
 * (--log_target, --log_rotate). `sink` replaces the outputs (tests capture lines with it).
 * Throws, naming the flag, when an output cannot be opened.
 */
export function configureLogging(settings: ConfigurableSettings, sink?: Sink): void {
  const outputs = sink
    ? []
    : openLogOutputs({
        targets: settings.targets ?? ['stdout'],
        rotate: settings.rotate ?? '',
        rotateMaxAgeDays: settings.rotateMaxAgeDays ?? 0,
        rotateMaxBackups: settings.rotateMaxBackups ?? 0,
        rotateMaxSizeMb: settings.rotateMaxSizeMb ?? 100,
      });
  const fanOut: Sink =
    sink ??
    (outputs.length === 1 && outputs[0]
      ? outputs[0]
      : {
          write: (line) => {
            for (const o of outputs) o.write(line);
          },
        });
  const previous = current.outputs;
  current = {
    levels: { ...settings.outputLevels },
    stacktrace: { ...(settings.stacktraceLevels ?? scopesAt('none')) },
    caller: new Set(settings.caller ?? []),
    vklog: settings.vklog ?? 0,
    json: settings.asJson ? jsonWriter(fanOut) : null,
    sink: fanOut,
    outputs,
  };
  for (const o of previous) void o.close();
}

/** Flushes and closes the outputs (the agent calls it last, after its final log line); later lines go to stdout. */
export async function closeLogging(): Promise<void> {
  const { outputs } = current;
  current = { ...current, json: current.json && jsonWriter(stdoutOutput), sink: stdoutOutput, outputs: [] };
  await Promise.all(outputs.map((o) => o.close()));
}

/** Back to the logging a process starts with (console, every scope at info, stdout), for tests. */
export async function resetLogging(): Promise<void> {
  const { outputs } = current;
  current = defaults();
  await Promise.all(outputs.map((o) => o.close()));
}

export function scopeLevels(): Readonly<Record<LogScope, LogLevel>> {
  return { ...current.levels };
}

export function setScopeLevel(name: LogScope, level: LogLevel): void {
  current.levels[name] = level;
}

export function stacktraceLevels(): Readonly<Record<LogScope, LogLevel>> {
  return { ...current.stacktrace };
}

export function setStacktraceLevel(name: LogScope, level: LogLevel): void {
  current.stacktrace[name] = level;
}

/** Scopes that log their caller's file:line (--log_caller). */
export function callerScopes(): readonly LogScope[] {
  return [...current.caller];
}

// ---- writing a record ---------------------------------------------------------------------------

type Caller = (...args: never[]) => unknown;

/** `src/install/x.ts:12` for the frame that called the logger (frames below `fn` are skipped). */
function callerOf(fn: Caller): string | undefined {
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, fn);
  const frame = holder.stack?.split('\n')[1];
  const m = frame && /\(?((?:file:\/\/)?[^\s()]+):(\d+):\d+\)?$/.exec(frame);
  if (!m || !m[1]) return undefined;
  const file = m[1].startsWith('file://') ? fileURLToPath(m[1]) : m[1];
  const rel = path.relative(ROOT_DIR, file);
  return `${rel.startsWith('..') ? file : rel}:${m[2]}`;
}

function stackOf(fn: Caller): string {
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, fn);
  return (holder.stack ?? '')
    .split('\n')
    .slice(1)
    .map((l) => l.trim())
    .join('\n');
}

/** Writes one record; `from` is the logging function called (the caller's frame is the one above it). */
function write(name: LogScope, level: EmitLevel, msg: string, fields: Fields | undefined, time: string, from: Caller) {
  const c = current;
  const withCaller = c.caller.has(name);
  const stackAt = c.stacktrace[name];
  const withStack = stackAt !== 'none' && LEVEL_RANK[level] <= LEVEL_RANK[stackAt];
  // Key order: (time,) caller, the fields, (scope,) stack. pino writes the keys after the level,
  // so a JSON line starts `{"level":..,"time":..`; a field named like a column never replaces it.
  if (c.json === null) {
    let rec = fields ?? {};
    if (withCaller || withStack) {
      rec = withCaller ? { caller: callerOf(from), ...fields } : { ...fields };
      if (withStack) rec.stack = stackOf(from);
    }
    c.sink.write(consoleLine(time, level, name, msg, rec));
    return;
  }
  const rec: Fields = withCaller ? { time, caller: callerOf(from), ...fields } : { time, ...fields };
  rec.time = time;
  rec.scope = name;
  if (Object.hasOwn(rec, 'level')) delete rec.level;
  if (Object.hasOwn(rec, 'msg')) delete rec.msg;
  if (withStack) rec.stack = stackOf(from);
  c.json[level](rec, msg);
}

function makeLogger(name: LogScope): Logger {
  const on = (level: EmitLevel) => LEVEL_RANK[current.levels[name]] >= LEVEL_RANK[level];
  const emit = (level: EmitLevel) => {
    const fn = (msg: string, fields?: Fields) => {
      if (on(level)) write(name, level, msg, fields, new Date().toISOString(), fn);
    };
    return fn;
  };
  return { error: emit('error'), warn: emit('warn'), info: emit('info'), debug: emit('debug'), enabled: on };
}

// One logger a scope, made once: each reads the process's configured logging when it writes.
const LOGGERS = new Map<LogScope, Logger>(SCOPES.map((s) => [s, makeLogger(s)]));

export function scope(name: LogScope): Logger {
  return LOGGERS.get(name) as Logger;
}

/**
 * Logs a record written elsewhere (the CNI plugin) with its own time, when its scope's level
 * lets it through. `time` must already be an ISO-8601 string; without it, now.
 */
export function logRecord(name: LogScope, level: EmitLevel, msg: string, fields: Fields, time?: string): void {
  if (LEVEL_RANK[current.levels[name]] < LEVEL_RANK[level]) return;
  write(name, level, msg, fields, time ?? new Date().toISOString(), logRecord);
}

/**
 * Logs a record whatever the scope levels say (`none` included), to the same outputs as every
 * other record: for what must be on record however logging is set, such as a change of the
 * levels themselves (one that sets every scope to `none` would otherwise silence its own record).
 */
export function logAlways(name: LogScope, level: EmitLevel, msg: string, fields?: Fields): void {
  write(name, level, msg, fields, new Date().toISOString(), logAlways);
}

/**
 * Verbose client logging, as klog's `V(n)`: messages of verbosity `v` go to scope klog at info
 * when `v <= --vklog`. Verbosity 0 messages always pass (the klog scope's level still applies).
 */
export function klogV(v: number): Pick<Logger, 'info'> & { readonly enabled: boolean } {
  const klog = scope('klog');
  const enabled = v <= current.vklog && klog.enabled('info');
  return { enabled, info: enabled ? klog.info : () => {} };
}

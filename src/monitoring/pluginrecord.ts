// One line the CNI plugin sent over the log socket -> what the agent logs in scope `cni`.
// The wire format: cni-plugin/shared/pluginlog.ts. One JSON object a line with
// `time`, `level`, `msg`, `command`, `containerID`, `pod: {namespace, name}` and flat extra
// fields. Also read, for other senders: `message`, `pod_namespace`/`pod_name`, `container_id`.
// The same lines come from the socket (logserver.ts) and from the plugin's log file written while
// the agent was down (logreplay.ts): both go through parsePluginBytes.

import { isObject } from '../../cni-plugin/shared/json.ts';
import type { EmitLevel } from '../../cni-plugin/shared/loglevels.ts';
import type { Fields } from './logging.ts';

export interface PluginEntry {
  readonly level: EmitLevel;
  readonly msg: string;
  /** ISO-8601; undefined when the record had no usable time (the agent's time is used). */
  readonly time: string | undefined;
  /** `pod` ("namespace/name") first, then `containerID`, then the rest in the sender's order. */
  readonly fields: Fields;
}

export type ParseResult =
  | { readonly ok: true; readonly entry: PluginEntry }
  | { readonly ok: false; readonly reason: 'invalid_json' | 'invalid_record' };

const LEVELS: Record<string, EmitLevel> = {
  error: 'error',
  err: 'error',
  fatal: 'error',
  panic: 'error',
  critical: 'error',
  warn: 'warn',
  warning: 'warn',
  info: 'info',
  notice: 'info',
  debug: 'debug',
  trace: 'debug',
};

// Keys the agent sets itself (the record's columns, the pod and container it reads from them):
// never copied from the plugin.
const CONSUMED = new Set([
  'time',
  'level',
  'msg',
  'message',
  'scope',
  'pod',
  'pod_namespace',
  'pod_name',
  'containerID',
  'container_id',
  // Set by the agent on a record read from the plugin's log file; never taken from a sender.
  'replayed',
  '__proto__',
]);

// What the plugin sends: already canonical, so no Date round trip (a third of the parse cost).
const CANONICAL_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

function isoTime(v: unknown): string | undefined {
  if (typeof v === 'string' && CANONICAL_TIME.test(v)) return v;
  if (typeof v !== 'string' && typeof v !== 'number') return undefined;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? undefined : d.toISOString();
}

function podOf(rec: Record<string, unknown>): string | undefined {
  const p = rec.pod;
  if (isObject(p)) {
    const { namespace, name } = p;
    if (typeof name === 'string' && name !== '')
      return typeof namespace === 'string' && namespace !== '' ? `${namespace}/${name}` : name;
  }
  if (typeof p === 'string' && p !== '') return p;
  const ns = rec.pod_namespace;
  const name = rec.pod_name;
  if (typeof name === 'string' && name !== '') return typeof ns === 'string' && ns !== '' ? `${ns}/${name}` : name;
  return undefined;
}

export function parsePluginLine(line: string): ParseResult {
  let rec: unknown;
  try {
    rec = JSON.parse(line);
  } catch {
    return { ok: false, reason: 'invalid_json' };
  }
  if (!isObject(rec)) return { ok: false, reason: 'invalid_record' };
  const r = rec as Record<string, unknown>;
  const msg = typeof r.msg === 'string' ? r.msg : r.message;
  if (typeof msg !== 'string') return { ok: false, reason: 'invalid_record' };
  const rawLevel = typeof r.level === 'string' ? r.level.toLowerCase() : 'info';
  const level = Object.hasOwn(LEVELS, rawLevel) ? (LEVELS[rawLevel] as EmitLevel) : 'info';
  const fields: Fields = {};
  const pod = podOf(r);
  if (pod !== undefined) fields.pod = pod;
  const containerID = r.containerID ?? r.container_id;
  if (typeof containerID === 'string' && containerID !== '') fields.containerID = containerID;
  if (level === 'info' && rawLevel !== 'info' && rawLevel !== 'notice') fields.plugin_level = r.level;
  for (const [k, v] of Object.entries(r)) if (!CONSUMED.has(k)) fields[k] = v;
  return { ok: true, entry: { level, msg, time: isoTime(r.time), fields } };
}

/** One line as read (without its '\n'; a trailing '\r' is dropped): null when blank. */
export function parsePluginBytes(line: Buffer): ParseResult | null {
  const text = line.toString(
    'utf8',
    0,
    line.length > 0 && line[line.length - 1] === 13 ? line.length - 1 : line.length,
  );
  return text.trim() === '' ? null : parsePluginLine(text);
}

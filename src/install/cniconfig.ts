// Pure functions over CNI config files: which file the runtime reads, and that file with our
// plugin entry put in or taken out. These take and return text; the planner (plan.ts) reads the
// net dir through its view (netdirview.ts), and the applier (apply.ts) writes.
//
// A conflist is edited as text (see jsonspans.ts): our entry is spliced in after the last plugin
// and spliced out again, so the primary CNI's bytes, formatting and unknown fields stay as they
// were, and taking our entry out gives back exactly what the primary CNI wrote.

import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { arrayElements, lineIndent, objectMembers, skipWs, valueEnd, type Span } from './jsonspans.ts';
import { describeParseError } from '../../cni-plugin/shared/parseerror.ts';
import { isObject as isJsonObject } from '../../cni-plugin/shared/json.ts';
import { PLUGIN_TYPE } from '../../cni-plugin/shared/netconf.ts';

/** The `type` of our plugin entry (the plugin's own, cni-plugin/shared/): how we recognise it in any config. */
export { PLUGIN_TYPE };
/** What libcni reads from the net dir, as the runtime does. */
export const CONFIG_EXTENSIONS: readonly string[] = ['.conf', '.conflist', '.json'];

export class CniConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CniConfigError';
  }
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type JsonObject = { [k: string]: Json };

export type ParsedConfig =
  | { readonly kind: 'conflist'; readonly value: JsonObject; readonly plugins: readonly JsonObject[] }
  | { readonly kind: 'conf'; readonly value: JsonObject };

export function isConfigFile(name: string): boolean {
  return CONFIG_EXTENSIONS.includes(path.extname(name));
}

export function isOurs(plugin: Json | undefined): boolean {
  return isJsonObject(plugin) && plugin.type === PLUGIN_TYPE;
}

/**
 * The config files to try as the primary, in the runtime's order. With `confName`: that file,
 * else its other form (`X.conflist` for `X.conf` and the other way round, as Istio does: our
 * own uninstall gives a .conflist back as the .conf it was). Else every config file in byte
 * order, leaving out our own files; the first one libcniVerdict accepts is the primary.
 */
export function primaryCandidates(fileNames: readonly string[], opts: { confName: string; ownFiles: ReadonlySet<string> }): string[] {
  const names = new Set(fileNames);
  if (opts.confName) {
    const found = [opts.confName, otherForm(opts.confName)].find((n) => n !== null && names.has(n));
    return found ? [found] : [];
  }
  const candidates = fileNames.filter((n) => isConfigFile(n) && !opts.ownFiles.has(n));
  return candidates.sort(byteOrder);
}

/**
 * Go's sort.Strings order, which libcni sorts the dir by: the names' UTF-8 bytes. Not JS's `<`
 * (UTF-16 code units: U+10000 before U+E000, the other way round in bytes), not locale. Every
 * place that orders file names uses this.
 */
export function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** `X.conf` <-> `X.conflist`; null for any other name. */
export function otherForm(fileName: string): string | null {
  const ext = path.extname(fileName);
  if (ext === '.conf') return fileName + 'list';
  if (ext === '.conflist') return fileName.slice(0, -'list'.length);
  return null;
}

/** The primary for a list of names alone (no contents read): the first candidate. */
export function choosePrimary(fileNames: readonly string[], opts: { confName: string; ownFiles: ReadonlySet<string> }): string | null {
  return primaryCandidates(fileNames, opts)[0] ?? null;
}

/**
 * Whether the runtime would load this file, judged as libcni does (ConfListFromFile for a
 * .conflist, ConfFromFile -> ConfListFromConf for a .conf/.json: the calls CRI-O and containerd
 * make per file; CRI-O passes over a file that fails, containerd's go-cni stops at it). `pluginDir`: a conflist whose network name libcni also looks up as
 * a directory of more plugin .conf files, appended after the listed ones. Reasons name what is
 * wrong, never the file's contents.
 */
export type Verdict =
  | { readonly ok: true; readonly kind: 'conf' | 'conflist'; readonly pluginDir?: string; readonly listed?: boolean }
  | { readonly ok: false; readonly reason: string };

/** Go's encoding/json refuses input nested deeper than this ("exceeded max depth"). */
export const GO_MAX_NESTING = 10000;

/**
 * Thrown when a file cannot be judged at all (the judging itself failed, not the file): the
 * search for the primary must stop there, never pass the file over, as the runtime may load it.
 */
export class CannotJudgeError extends Error {
  constructor(fileName: string, cause: unknown) {
    super(`cannot tell whether the runtime loads ${fileName} (${(cause as Error)?.name ?? 'error'} while judging it); not installing until it changes`);
    this.name = 'CannotJudgeError';
  }
}

export function libcniVerdict(text: string, fileName: string): Verdict {
  let value: unknown;
  try {
    // No reviver: V8 runs a reviver recursively and overflows its stack long before Go's
    // nesting limit, which would pass over a file libcni loads.
    value = JSON.parse(text);
  } catch (e) {
    if (!(e instanceof SyntaxError)) throw new CannotJudgeError(fileName, e);
    return { ok: false, reason: describeParseError(e, text, 'JSON') };
  }
  try {
    return judge(text, value, fileName);
  } catch (e) {
    throw new CannotJudgeError(fileName, e);
  }
}

/**
 * One pass over text JSON.parse took, without recursion: how deep it nests and whether a number
 * literal (any, duplicate keys included: Go decodes each) is beyond a 64-bit float.
 */
function scanLiterals(text: string): { depth: number; huge: boolean } {
  let depth = 0;
  let max = 0;
  let huge = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++;
    } else if (c === '{' || c === '[') {
      depth++;
      if (depth > max) max = depth;
    } else if (c === '}' || c === ']') {
      depth--;
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      let j = i + 1;
      while (j < text.length && /[0-9eE.+-]/.test(text[j]!)) j++;
      if (!Number.isFinite(Number(text.slice(i, j)))) huge = true;
      i = j - 1;
    }
  }
  return { depth: max, huge };
}

function judge(text: string, value: unknown, fileName: string): Verdict {
  const bad = (reason: string): Verdict => ({ ok: false, reason });
  const { depth, huge } = scanLiterals(text);
  if (depth > GO_MAX_NESTING) return bad(`nested deeper than ${GO_MAX_NESTING} levels, which Go's decoder refuses`);
  // libcni decodes every file into a map of Go values (float64 for numbers) at least once.
  if (huge) return bad("a number too large for a 64-bit float (1e400 and the like), which Go's decoder refuses");
  if (path.extname(fileName) === '.conflist') {
    // NetworkConfFromBytes: a JSON object (JSON null is an empty map there, so: no name).
    if (Array.isArray(value) || (typeof value !== 'object' && value !== null)) return bad(`not a JSON object (a ${jsonKind(value)})`);
    const list = (value ?? {}) as JsonObject;
    if (!Object.hasOwn(list, 'name')) return bad('a .conflist needs a "name"');
    if (typeof list.name !== 'string') return bad('"name" is not a string');
    if (Object.hasOwn(list, 'cniVersion') && typeof list.cniVersion !== 'string') return bad('"cniVersion" is not a string');
    if (Object.hasOwn(list, 'cniVersions')) {
      const vs = list.cniVersions;
      if (!Array.isArray(vs)) return bad('"cniVersions" is not a list');
      const i = vs.findIndex((v) => typeof v !== 'string' || !isCniVersion(v));
      if (i >= 0) return bad(`"cniVersions"[${i}] is not a version`);
      // Only then is cniVersion parsed, and an empty one is skipped.
      if (typeof list.cniVersion === 'string' && !isCniVersion(list.cniVersion)) return bad('"cniVersion" is not a version');
    }
    for (const key of ['disableCheck', 'disableGC', 'loadOnlyInlinedPlugins']) {
      if (!Object.hasOwn(list, key)) continue;
      const v = list[key];
      if (typeof v !== 'boolean' && !(typeof v === 'string' && ['true', 'false'].includes(v.toLowerCase()))) return bad(`"${key}" is neither true nor false`);
    }
    const inlinedOnly = list.loadOnlyInlinedPlugins === true || (typeof list.loadOnlyInlinedPlugins === 'string' && list.loadOnlyInlinedPlugins.toLowerCase() === 'true');
    if (!Object.hasOwn(list, 'plugins')) {
      // libcni then loads the plugins from the <name>/ dir only; the I/O side looks there.
      return inlinedOnly ? bad('no "plugins" list (and "loadOnlyInlinedPlugins" is true)') : { ok: true, kind: 'conflist', pluginDir: list.name, listed: false };
    }
    const plugins = list.plugins;
    if (!Array.isArray(plugins)) return bad('"plugins" is not a list');
    if (plugins.length === 0) return bad('"plugins" is empty');
    for (const [i, p] of plugins.entries()) {
      // Each plugin is re-marshalled from the map before it is decoded: keys deduplicated
      // (the last wins) and sorted.
      const why = pluginProblem(remarshalled(p));
      if (why) return bad(`plugins[${i}]: ${why}`);
    }
    return inlinedOnly ? { ok: true, kind: 'conflist', listed: true } : { ok: true, kind: 'conflist', pluginDir: list.name, listed: true };
  }
  // ConfFromFile decodes the text as written (every duplicate key, in order), then
  // ConfListFromConf decodes it again re-marshalled: the file must pass both.
  const why = pluginProblem(asWritten(text)) ?? pluginProblem(remarshalled(value as Json));
  return why ? bad(why) : { ok: true, kind: 'conf' };
}

/**
 * libcni's version.ParseVersion: empty (taken as 0.1.0), or `x`, `x.y`, `x.y.z` where each
 * part is what Go's strconv.Atoi takes: an optional sign and decimal digits within int64.
 */
function isCniVersion(v: string): boolean {
  if (v === '') return true;
  const parts = v.split('.');
  return parts.length <= 3 && parts.every((p) => /^[+-]?\d+$/.test(p) && BigInt(p) >= -(2n ** 63n) && BigInt(p) < 2n ** 63n);
}

function jsonKind(v: unknown): string {
  return Array.isArray(v) ? 'list' : v === null ? 'null' : typeof v;
}

/**
 * A JSON value as Go's decoder walks it into a struct: an object is its members in the order
 * the decoder meets them, duplicate keys included (each one is decoded, the last value that is
 * not null stays, and a member of the wrong type fails the decode wherever it stands).
 */
/** How deep pluginProblem looks into a plugin (plugin, dns, nameservers, an item: 4), with room. */
const LOOK_DEPTH = 8;

type GoJson =
  | { readonly kind: 'object'; readonly members: readonly (readonly [string, GoJson])[] }
  | { readonly kind: 'array'; readonly items: readonly GoJson[] }
  | { readonly kind: 'scalar'; readonly value: null | boolean | number | string };

/** The text as written. Only for text JSON.parse already took. */
function asWritten(text: string, start = skipWs(text, 0), depth = 0): GoJson {
  const c = text[start];
  // pluginProblem looks no deeper than a few levels: below that only the kind matters, and
  // stopping there keeps a deep (libcni-loadable) value from overflowing the stack.
  if (depth >= LOOK_DEPTH && (c === '{' || c === '[')) return c === '{' ? { kind: 'object', members: [] } : { kind: 'array', items: [] };
  if (c === '{') return { kind: 'object', members: objectMembers(text, start).map((m) => [m.key, asWritten(text, m.value.start, depth + 1)] as const) };
  if (c === '[') return { kind: 'array', items: arrayElements(text, start).map((s) => asWritten(text, s.start, depth + 1)) };
  return { kind: 'scalar', value: JSON.parse(text.slice(start, valueEnd(text, start))) as null | boolean | number | string };
}

/** A value as Go's json.Marshal writes a map: keys once each, sorted by their UTF-8 bytes. */
function remarshalled(v: Json, depth = 0): GoJson {
  if (Array.isArray(v)) return { kind: 'array', items: depth >= LOOK_DEPTH ? [] : v.map((x) => remarshalled(x, depth + 1)) };
  if (typeof v === 'object' && v !== null) {
    if (depth >= LOOK_DEPTH) return { kind: 'object', members: [] };
    const keys = Object.keys(v).sort(byteOrder);
    return { kind: 'object', members: keys.map((k) => [k, remarshalled(v[k]!, depth + 1)] as const) };
  }
  return { kind: 'scalar', value: v };
}

/** Go matches a key to a struct field ignoring case by Unicode simple folding (ſ is s, K is k). */
function fold(key: string): string {
  return key.toLowerCase().replaceAll('ſ', 's');
}

/** The members of an object whose key is the field `name` to Go, in order. */
function fieldValues(obj: GoJson & { kind: 'object' }, name: string): GoJson[] {
  const want = fold(name);
  return obj.members.filter(([k]) => fold(k) === want).map(([, v]) => v);
}

const isNull = (v: GoJson): boolean => v.kind === 'scalar' && v.value === null;
const isString = (v: GoJson): boolean => v.kind === 'scalar' && (v.value === null || typeof v.value === 'string');
const isObject = (v: GoJson): v is GoJson & { kind: 'object' } => v.kind === 'object';
const isStringList = (v: GoJson): boolean => isNull(v) || (v.kind === 'array' && v.items.every(isString));

/**
 * Why one plugin config would not decode into libcni's types.PluginConf (a JSON object or
 * null, field names matched ignoring case, each typed field of its type) or has no "type";
 * null when it would load.
 */
function pluginProblem(v: GoJson): string | null {
  if (isNull(v)) return 'no "type" (which plugin to run)';
  if (v.kind === 'array') return 'not a JSON object (a list)';
  if (v.kind === 'scalar') return `not a JSON object (a ${jsonKind(v.value)})`;
  for (const name of ['cniVersion', 'name', 'type']) {
    if (!fieldValues(v, name).every(isString)) return `"${name}" is not a string`;
  }
  for (const ipam of fieldValues(v, 'ipam')) {
    if (isNull(ipam)) continue;
    if (!isObject(ipam)) return '"ipam" is not an object';
    if (!fieldValues(ipam, 'type').every(isString)) return '"ipam.type" is not a string';
  }
  for (const dns of fieldValues(v, 'dns')) {
    if (isNull(dns)) continue;
    if (!isObject(dns)) return '"dns" is not an object';
    if (!fieldValues(dns, 'domain').every(isString)) return '"dns.domain" is not a string';
    for (const list of ['nameservers', 'search', 'options']) {
      if (!fieldValues(dns, list).every(isStringList)) return `"dns.${list}" is not a list of strings`;
    }
  }
  for (const caps of fieldValues(v, 'capabilities')) {
    const ok = isNull(caps) || (isObject(caps) && caps.members.every(([, c]) => c.kind === 'scalar' && (c.value === null || typeof c.value === 'boolean')));
    if (!ok) return '"capabilities" is not an object of true/false';
  }
  for (const prev of fieldValues(v, 'prevResult')) {
    if (!isNull(prev) && !isObject(prev)) return '"prevResult" is not an object';
  }
  for (const att of fieldValues(v, 'cni.dev/valid-attachments')) {
    if (isNull(att)) continue;
    if (att.kind !== 'array' || !att.items.every((a) => isNull(a) || isObject(a))) return '"cni.dev/valid-attachments" is not a list of objects';
    for (const [i, a] of att.items.entries()) {
      if (!isObject(a)) continue;
      for (const name of ['containerID', 'ifname']) {
        if (!fieldValues(a, name).every(isString)) return `"cni.dev/valid-attachments"[${i}].${name} is not a string`;
      }
    }
  }
  // The last type that is not null stays: an empty one after a good one leaves none.
  const type = fieldValues(v, 'type').filter((t) => !isNull(t)).at(-1);
  if (type === undefined || type.kind !== 'scalar' || type.value === '') return 'no "type" (which plugin to run)';
  return null;
}

/** `10-flannel.conf` -> `10-flannel.conflist`. */
export function conflistName(fileName: string): string {
  const ext = path.extname(fileName);
  return ext === '.conflist' ? fileName : fileName.slice(0, fileName.length - ext.length) + '.conflist';
}

/** Parses a config as the runtime would: .conflist needs plugins, .conf/.json needs a type. */
export function parseCniConfig(text: string, fileName: string): ParsedConfig {
  if (!isConfigFile(fileName)) {
    throw new CniConfigError(`${fileName} is no .conf, .conflist or .json file, so no runtime reads it; not editing it`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    // Never the parser's message as it is: it quotes the text, which may be a token.
    throw new CniConfigError(`cannot parse ${fileName}: ${describeParseError(e, text, 'JSON')}`);
  }
  // What the runtime would not load is no config to edit, whatever else holds.
  const verdict = libcniVerdict(text, fileName);
  if (!verdict.ok) throw new CniConfigError(`${fileName}: ${verdict.reason}`);
  if (!isJsonObject(value)) {
    throw new CniConfigError(`${fileName} is not a JSON object`);
  }
  const obj = value as JsonObject;
  if (path.extname(fileName) === '.conflist') {
    const plugins = obj.plugins;
    if (!Array.isArray(plugins) || plugins.length === 0) {
      throw new CniConfigError(`${fileName} has no "plugins" list; a .conflist needs at least one plugin`);
    }
    plugins.forEach((p, i) => {
      if (!isJsonObject(p) || typeof p.type !== 'string' || p.type === '') {
        throw new CniConfigError(`${fileName}: plugins[${i}] has no "type"; every plugin needs one`);
      }
    });
    return { kind: 'conflist', value: obj, plugins: plugins as JsonObject[] };
  }
  if (typeof obj.type !== 'string' || obj.type === '') {
    throw new CniConfigError(`${fileName} has no "type"; a single-plugin config needs one`);
  }
  return { kind: 'conf', value: obj };
}

export interface Rewrite {
  readonly fileName: string;
  readonly text: string;
  /** The file the primary CNI wrote, when it differs from fileName (a .conf made a .conflist). */
  readonly replaces?: string;
}

/**
 * The primary config with exactly one entry of ours, last in its plugins; null when it already
 * is so (nothing to write). A single-plugin config becomes a conflist named `<base>.conflist`.
 */
export function withOurEntry(text: string, fileName: string, entry: JsonObject): Rewrite | null {
  const parsed = parseCniConfig(text, fileName);
  if (parsed.kind === 'conf') {
    const conflist: JsonObject = { cniVersion: parsed.value.cniVersion ?? '1.0.0', name: parsed.value.name ?? path.basename(fileName, path.extname(fileName)), plugins: [parsed.value, entry] };
    return { fileName: conflistName(fileName), text: JSON.stringify(conflist, null, 2) + '\n', replaces: fileName };
  }
  const plugins = parsed.plugins;
  const last = plugins[plugins.length - 1];
  if (plugins.filter(isOurs).length === 1 && isOurs(last) && isDeepStrictEqual(last, entry)) return null;
  const out = appendElement(spliceOutOurs(text), entry);
  check(out, fileName, [...plugins.filter((p) => !isOurs(p)), entry]);
  return { fileName, text: out };
}

/** The config without any entry of ours; null when it has none. Only conflists carry our entry. */
export function withoutOurEntry(text: string, fileName: string): string | null {
  const parsed = parseCniConfig(text, fileName);
  if (parsed.kind !== 'conflist' || !parsed.plugins.some(isOurs)) return null;
  const out = spliceOutOurs(text);
  const rest = parsed.plugins.filter((p) => !isOurs(p));
  if (rest.length > 0) check(out, fileName, rest);
  return out;
}

/**
 * Our own config for standalone mode (--chained-cni-plugin=false), in the form its name
 * promises: a conflist for a .conflist, a single-plugin config (type at the top) for a .conf or
 * .json, as a runtime reads each.
 */
export function standaloneConfig(entry: JsonObject, fileName: string, cniVersion = '1.0.0'): string {
  const body = path.extname(fileName) === '.conflist' ? { cniVersion, name: PLUGIN_TYPE, plugins: [entry] } : { cniVersion, name: PLUGIN_TYPE, ...entry };
  return JSON.stringify(body, null, 2) + '\n';
}

/** The text with every plugin entry of ours spliced out of the plugins list. */
function spliceOutOurs(text: string): string {
  let out = text;
  for (;;) {
    const { spans } = pluginSpans(out);
    const i = spans.findIndex((s) => isOurs(JSON.parse(out.slice(s.start, s.end)) as Json));
    if (i < 0) return out;
    out = removeElement(out, spans, i);
  }
}

function pluginSpans(text: string): { open: number; spans: Span[] } {
  const top = skipWs(text, 0);
  const plugins = objectMembers(text, top).filter((m) => m.key === 'plugins').at(-1);
  if (!plugins) throw new CniConfigError('no plugins list');
  return { open: plugins.value.start, spans: arrayElements(text, plugins.value.start) };
}

function removeElement(text: string, spans: readonly Span[], i: number): string {
  const el = spans[i]!;
  // Take the element with the separator before it (or after it, for the first one), so the
  // text left is what it was before the element was appended.
  if (i > 0) return text.slice(0, spans[i - 1]!.end) + text.slice(el.end);
  const next = spans[1];
  return next ? text.slice(0, el.start) + text.slice(next.start) : text.slice(0, el.start) + text.slice(el.end);
}

function appendElement(text: string, entry: JsonObject): string {
  const { open, spans } = pluginSpans(text);
  const last = spans.at(-1);
  const multiline = text.slice(open, (spans[0] ?? last)?.start ?? open).includes('\n');
  if (!last) {
    // Every plugin was ours: put the entry back inside the now empty list.
    return text.slice(0, open + 1) + JSON.stringify(entry) + text.slice(open + 1);
  }
  if (!multiline) return text.slice(0, last.end) + ', ' + JSON.stringify(entry) + text.slice(last.end);
  const indent = lineIndent(text, last.start);
  const unit = indentUnit(text, open, last.start);
  const body = JSON.stringify(entry, null, unit).replaceAll('\n', '\n' + indent);
  return text.slice(0, last.end) + ',\n' + indent + body + text.slice(last.end);
}

/** The indentation step the file uses: element indent minus the plugins line's indent. */
function indentUnit(text: string, open: number, elementStart: number): string {
  const outer = lineIndent(text, open);
  const inner = lineIndent(text, elementStart);
  const step = inner.startsWith(outer) ? inner.slice(outer.length) : '';
  return step.length > 0 ? step : '  ';
}

/** Defence in depth: never hand back text whose plugins are not exactly what we meant. */
function check(text: string, fileName: string, expected: readonly Json[]): void {
  const parsed = JSON.parse(text) as JsonObject;
  if (!isDeepStrictEqual(parsed.plugins, expected)) {
    throw new Error(`internal: rewriting ${fileName} would not give the expected plugins list; leaving it untouched`);
  }
}

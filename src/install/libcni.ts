// Which config files the runtime loads, judged as libcni does (ConfListFromFile for a
// .conflist, ConfFromFile -> ConfListFromConf for a .conf or .json), and the order it reads the
// dir in. Pure: text in, verdict out; the planner (planprimary.ts) passes over what fails.

import path from 'node:path';
import { describeParseError } from '../../cni-plugin/shared/parseerror.ts';
import { byteOrder } from '../config/cnifiles.ts';
import type { Json, JsonObject } from './json.ts';
import { arrayElements, objectMembers, skipWs, valueEnd } from './jsonspans.ts';

/** The dir's order (src/config/cnifiles.ts), for the installer's files that sort names. */
export { byteOrder };

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
    super(
      `cannot tell whether the runtime loads ${fileName} (${(cause as Error)?.name ?? 'error'} while judging it); not installing until it changes`,
    );
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
    if (Array.isArray(value) || (typeof value !== 'object' && value !== null))
      return bad(`not a JSON object (a ${jsonKind(value)})`);
    const list = (value ?? {}) as JsonObject;
    if (!Object.hasOwn(list, 'name')) return bad('a .conflist needs a "name"');
    if (typeof list.name !== 'string') return bad('"name" is not a string');
    if (Object.hasOwn(list, 'cniVersion') && typeof list.cniVersion !== 'string')
      return bad('"cniVersion" is not a string');
    if (Object.hasOwn(list, 'cniVersions')) {
      const vs = list.cniVersions;
      if (!Array.isArray(vs)) return bad('"cniVersions" is not a list');
      const i = vs.findIndex((v) => typeof v !== 'string' || !isCniVersion(v));
      if (i >= 0) return bad(`"cniVersions"[${i}] is not a version`);
      // Only then is cniVersion parsed, and an empty one is skipped.
      if (typeof list.cniVersion === 'string' && !isCniVersion(list.cniVersion))
        return bad('"cniVersion" is not a version');
    }
    for (const key of ['disableCheck', 'disableGC', 'loadOnlyInlinedPlugins']) {
      if (!Object.hasOwn(list, key)) continue;
      const v = list[key];
      if (typeof v !== 'boolean' && !(typeof v === 'string' && ['true', 'false'].includes(v.toLowerCase())))
        return bad(`"${key}" is neither true nor false`);
    }
    const inlinedOnly =
      list.loadOnlyInlinedPlugins === true ||
      (typeof list.loadOnlyInlinedPlugins === 'string' && list.loadOnlyInlinedPlugins.toLowerCase() === 'true');
    if (!Object.hasOwn(list, 'plugins')) {
      // libcni then loads the plugins from the <name>/ dir only; the I/O side looks there.
      return inlinedOnly
        ? bad('no "plugins" list (and "loadOnlyInlinedPlugins" is true)')
        : { ok: true, kind: 'conflist', pluginDir: list.name, listed: false };
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
    return inlinedOnly
      ? { ok: true, kind: 'conflist', listed: true }
      : { ok: true, kind: 'conflist', pluginDir: list.name, listed: true };
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
  return (
    parts.length <= 3 && parts.every((p) => /^[+-]?\d+$/.test(p) && BigInt(p) >= -(2n ** 63n) && BigInt(p) < 2n ** 63n)
  );
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
  if (depth >= LOOK_DEPTH && (c === '{' || c === '['))
    return c === '{' ? { kind: 'object', members: [] } : { kind: 'array', items: [] };
  if (c === '{')
    return {
      kind: 'object',
      members: objectMembers(text, start).map((m) => [m.key, asWritten(text, m.value.start, depth + 1)] as const),
    };
  if (c === '[')
    return { kind: 'array', items: arrayElements(text, start).map((s) => asWritten(text, s.start, depth + 1)) };
  return {
    kind: 'scalar',
    value: JSON.parse(text.slice(start, valueEnd(text, start))) as null | boolean | number | string,
  };
}

/** A value as Go's json.Marshal writes a map: keys once each, sorted by their UTF-8 bytes. */
function remarshalled(v: Json, depth = 0): GoJson {
  if (Array.isArray(v))
    return { kind: 'array', items: depth >= LOOK_DEPTH ? [] : v.map((x) => remarshalled(x, depth + 1)) };
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
    const ok =
      isNull(caps) ||
      (isObject(caps) &&
        caps.members.every(([, c]) => c.kind === 'scalar' && (c.value === null || typeof c.value === 'boolean')));
    if (!ok) return '"capabilities" is not an object of true/false';
  }
  for (const prev of fieldValues(v, 'prevResult')) {
    if (!isNull(prev) && !isObject(prev)) return '"prevResult" is not an object';
  }
  for (const att of fieldValues(v, 'cni.dev/valid-attachments')) {
    if (isNull(att)) continue;
    if (att.kind !== 'array' || !att.items.every((a) => isNull(a) || isObject(a)))
      return '"cni.dev/valid-attachments" is not a list of objects';
    for (const [i, a] of att.items.entries()) {
      if (!isObject(a)) continue;
      for (const name of ['containerID', 'ifname']) {
        if (!fieldValues(a, name).every(isString)) return `"cni.dev/valid-attachments"[${i}].${name} is not a string`;
      }
    }
  }
  // The last type that is not null stays: an empty one after a good one leaves none.
  const type = fieldValues(v, 'type')
    .filter((t) => !isNull(t))
    .at(-1);
  if (type === undefined || type.kind !== 'scalar' || type.value === '') return 'no "type" (which plugin to run)';
  return null;
}

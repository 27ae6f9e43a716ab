// Pure functions over CNI config files: which file the runtime reads, and that file with our
// plugin entry put in or taken out. These take and return text; the planner (plan.ts) reads the
// net dir through its view (netdirview.ts), and the applier (apply.ts) writes.
//
// A conflist is edited as text (see jsonspans.ts): our entry is spliced in after the last plugin
// and spliced out again, so the primary CNI's bytes, formatting and unknown fields stay as they
// were, and taking our entry out gives back exactly what the primary CNI wrote.

import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { arrayElements, lineIndent, objectMembers, skipWs, type Span } from './jsonspans.ts';
import { CONFIG_EXTENSIONS } from '../config/cnifiles.ts';
import type { Json, JsonObject } from './json.ts';
import { byteOrder, libcniVerdict } from './libcni.ts';
import { describeParseError } from '../../cni-plugin/shared/parseerror.ts';
import { isObject as isJsonObject } from '../../cni-plugin/shared/json.ts';
import { PLUGIN_TYPE } from '../../cni-plugin/shared/netconf.ts';

/** The `type` of our plugin entry (the plugin's own, cni-plugin/shared/): how we recognise it in any config. */
export { PLUGIN_TYPE };
/** Which files the runtime loads, judged as libcni does, and the dir's order: libcni.ts. */
export { byteOrder, CannotJudgeError, GO_MAX_NESTING, libcniVerdict, type Verdict } from './libcni.ts';
/** What libcni reads from the net dir, as the runtime does: src/config/cnifiles.ts. */
export { CONFIG_EXTENSIONS };

export class CniConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CniConfigError';
  }
}

export type { Json, JsonObject };

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
export function primaryCandidates(
  fileNames: readonly string[],
  opts: { confName: string; ownFiles: ReadonlySet<string> },
): string[] {
  const names = new Set(fileNames);
  if (opts.confName) {
    const found = [opts.confName, otherForm(opts.confName)].find((n) => n !== null && names.has(n));
    return found ? [found] : [];
  }
  const candidates = fileNames.filter((n) => isConfigFile(n) && !opts.ownFiles.has(n));
  return candidates.sort(byteOrder);
}

/** `X.conf` <-> `X.conflist`; null for any other name. */
export function otherForm(fileName: string): string | null {
  const ext = path.extname(fileName);
  if (ext === '.conf') return fileName + 'list';
  if (ext === '.conflist') return fileName.slice(0, -'list'.length);
  return null;
}

/** The primary for a list of names alone (no contents read): the first candidate. */
export function choosePrimary(
  fileNames: readonly string[],
  opts: { confName: string; ownFiles: ReadonlySet<string> },
): string | null {
  return primaryCandidates(fileNames, opts)[0] ?? null;
}

/** `10-flannel.conf` -> `10-flannel.conflist`. */
export function conflistName(fileName: string): string {
  const ext = path.extname(fileName);
  return ext === '.conflist' ? fileName : fileName.slice(0, fileName.length - ext.length) + '.conflist';
}

/** Parses a config as the runtime would: .conflist needs plugins, .conf/.json needs a type. */
export function parseCniConfig(text: string, fileName: string): ParsedConfig {
  if (!isConfigFile(fileName)) {
    throw new CniConfigError(
      `${fileName} is no .conf, .conflist or .json file, so no runtime reads it; not editing it`,
    );
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
    const conflist: JsonObject = {
      cniVersion: parsed.value.cniVersion ?? '1.0.0',
      name: parsed.value.name ?? path.basename(fileName, path.extname(fileName)),
      plugins: [parsed.value, entry],
    };
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
  const body =
    path.extname(fileName) === '.conflist'
      ? { cniVersion, name: PLUGIN_TYPE, plugins: [entry] }
      : { cniVersion, name: PLUGIN_TYPE, ...entry };
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
  const plugins = objectMembers(text, top)
    .filter((m) => m.key === 'plugins')
    .at(-1);
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

// Label and field selectors, parsed and matched the way the API server does
// (k8s.io/apimachinery labels.Parse and fields.ParseSelector), so a selector the API server would
// reject is rejected at start-up instead of failing every list call later. The test API server
// uses the same module to filter what it serves.

import type { V1Pod } from '@kubernetes/client-node';

export type LabelOp = 'exists' | '!exists' | '=' | '!=' | 'in' | 'notin' | 'gt' | 'lt';

export interface LabelRequirement {
  readonly key: string;
  readonly op: LabelOp;
  readonly values: readonly string[];
}

export interface FieldRequirement {
  readonly field: string;
  readonly op: '=' | '!=';
  readonly value: string;
}

export class SelectorError extends Error {
  constructor(kind: 'label' | 'field', selector: string, why: string) {
    super(`invalid ${kind} selector ${JSON.stringify(selector)}: ${why}`);
    this.name = 'SelectorError';
  }
}

// Label syntax as the API server checks it: optional DNS-subdomain prefix, name of at most 63.
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

export function isLabelKey(key: string): boolean {
  const i = key.indexOf('/');
  const prefix = i < 0 ? '' : key.slice(0, i);
  const name = i < 0 ? key : key.slice(i + 1);
  return LABEL_NAME.test(name) && (i < 0 || (prefix.length <= 253 && DNS_SUBDOMAIN.test(prefix)));
}

export function isLabelValue(value: string): boolean {
  return value === '' || LABEL_NAME.test(value);
}

type Token =
  | { kind: 'id'; text: string }
  | { kind: 'op'; text: '!' | '=' | '==' | '!=' | '>' | '<' | ',' | '(' | ')' };

function tokenize(sel: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < sel.length) {
    const c = sel[i]!;
    if (/\s/.test(c)) {
      i++;
    } else if (sel.startsWith('==', i) || sel.startsWith('!=', i)) {
      out.push({ kind: 'op', text: sel.slice(i, i + 2) as '==' | '!=' });
      i += 2;
    } else if ('!=><,()'.includes(c)) {
      out.push({ kind: 'op', text: c as '!' | '=' | '>' | '<' | ',' | '(' | ')' });
      i++;
    } else {
      let j = i;
      while (j < sel.length && !/[\s!=><,()]/.test(sel[j]!)) j++;
      out.push({ kind: 'id', text: sel.slice(i, j) });
      i = j;
    }
  }
  return out;
}

/** Parses a label selector (`a=b,c!=d,e in (f,g),!h,i`); empty selects everything. */
export function parseLabelSelector(sel: string): LabelRequirement[] {
  const toks = tokenize(sel);
  const fail = (why: string): never => {
    throw new SelectorError('label', sel, why);
  };
  const reqs: LabelRequirement[] = [];
  let p = 0;
  const peek = () => toks[p];
  const id = (what: string): string => {
    const t = toks[p++];
    if (!t || t.kind !== 'id') return fail(`expected ${what}${t ? `, found ${JSON.stringify(t.text)}` : ' at the end'}`);
    return t.text;
  };
  const key = (): string => {
    const k = id('a label key');
    if (!isLabelKey(k)) fail(`${JSON.stringify(k)} is not a valid label key ([prefix/]name, name of at most 63 letters, digits, -, _ or .)`);
    return k;
  };
  const value = (): string => {
    const t = peek();
    // An empty value (`a=` or `a in ()`) is legal.
    if (!t || t.kind === 'op') return '';
    p++;
    if (!isLabelValue(t.text)) fail(`${JSON.stringify(t.text)} is not a valid label value (at most 63 letters, digits, -, _ or ., alphanumeric at both ends)`);
    return t.text;
  };
  while (p < toks.length) {
    let req: LabelRequirement;
    const first = peek()!;
    if (first.kind === 'op' && first.text === '!') {
      p++;
      req = { key: key(), op: '!exists', values: [] };
    } else {
      const k = key();
      const t = peek();
      if (!t || (t.kind === 'op' && t.text === ',')) {
        req = { key: k, op: 'exists', values: [] };
      } else if (t.kind === 'op' && (t.text === '=' || t.text === '==' || t.text === '!=')) {
        p++;
        req = { key: k, op: t.text === '!=' ? '!=' : '=', values: [value()] };
      } else if (t.kind === 'op' && (t.text === '>' || t.text === '<')) {
        p++;
        const v = id('a number');
        if (!/^-?\d+$/.test(v)) fail(`${JSON.stringify(v)} is not an integer (${k} ${t.text} needs one)`);
        req = { key: k, op: t.text === '>' ? 'gt' : 'lt', values: [v] };
      } else if (t.kind === 'id' && (t.text === 'in' || t.text === 'notin')) {
        p++;
        const open = toks[p++];
        if (!open || open.kind !== 'op' || open.text !== '(') fail(`expected ( after ${t.text}`);
        const values: string[] = [];
        for (;;) {
          values.push(value());
          const sep = toks[p++];
          if (sep && sep.kind === 'op' && sep.text === ')') break;
          if (!sep || sep.kind !== 'op' || sep.text !== ',') fail(`expected , or ) in the value set of ${k}`);
        }
        req = { key: k, op: t.text, values };
      } else {
        return fail(`unexpected ${JSON.stringify(t.text)} after ${k}; expected =, ==, !=, in, notin, >, < or ,`);
      }
    }
    reqs.push(req);
    const sep = toks[p];
    if (sep === undefined) break;
    if (sep.kind !== 'op' || sep.text !== ',') fail(`expected , between requirements, found ${JSON.stringify(sep.text)}`);
    p++;
    if (p === toks.length) fail('trailing comma');
  }
  return reqs;
}

export function matchesLabels(reqs: readonly LabelRequirement[], labels: Readonly<Record<string, string>> | undefined): boolean {
  const l = labels ?? {};
  return reqs.every((r) => {
    const has = Object.hasOwn(l, r.key);
    const v = l[r.key];
    switch (r.op) {
      case 'exists':
        return has;
      case '!exists':
        return !has;
      case '=':
      case 'in':
        return has && r.values.includes(v!);
      case '!=':
      case 'notin':
        return !has || !r.values.includes(v!);
      case 'gt':
      case 'lt': {
        if (!has || !/^-?\d+$/.test(v!)) return false;
        const n = Number(v);
        const lim = Number(r.values[0]);
        return r.op === 'gt' ? n > lim : n < lim;
      }
    }
  });
}

export function formatLabelSelector(reqs: readonly LabelRequirement[]): string {
  return reqs
    .map((r) => {
      switch (r.op) {
        case 'exists':
          return r.key;
        case '!exists':
          return `!${r.key}`;
        case 'in':
        case 'notin':
          return `${r.key} ${r.op} (${r.values.join(',')})`;
        case 'gt':
          return `${r.key}>${r.values[0]}`;
        case 'lt':
          return `${r.key}<${r.values[0]}`;
        default:
          return `${r.key}${r.op}${r.values[0]}`;
      }
    })
    .join(',');
}

/** The pod fields the API server accepts in a field selector (pkg/registry/core/pod ToSelectableFields). */
export const POD_FIELDS: Readonly<Record<string, (pod: V1Pod) => string>> = {
  'metadata.name': (p) => p.metadata?.name ?? '',
  'metadata.namespace': (p) => p.metadata?.namespace ?? '',
  'spec.nodeName': (p) => p.spec?.nodeName ?? '',
  'spec.restartPolicy': (p) => p.spec?.restartPolicy ?? '',
  'spec.schedulerName': (p) => p.spec?.schedulerName ?? '',
  'spec.serviceAccountName': (p) => p.spec?.serviceAccountName ?? '',
  'spec.hostNetwork': (p) => String(p.spec?.hostNetwork ?? false),
  'status.phase': (p) => p.status?.phase ?? '',
  'status.podIP': (p) => p.status?.podIP ?? '',
  'status.nominatedNodeName': (p) => p.status?.nominatedNodeName ?? '',
};

/** Parses a pod field selector (`spec.nodeName=n1,metadata.name!=x`; `\` escapes `,`, `=`, `!`, `\`). */
export function parseFieldSelector(sel: string): FieldRequirement[] {
  const fail = (why: string): never => {
    throw new SelectorError('field', sel, why);
  };
  if (sel.trim() === '') return [];
  // Split on unescaped commas, keeping escapes for the next step.
  const parts: string[] = [];
  let cur = '';
  for (let i = 0; i < sel.length; i++) {
    const c = sel[i]!;
    if (c === '\\' && i + 1 < sel.length) {
      cur += c + sel[i + 1];
      i++;
    } else if (c === ',') {
      parts.push(cur);
      cur = '';
    } else {
      cur += c;
    }
  }
  parts.push(cur);
  return parts.map((part) => {
    const m = /^(.*?)(!=|==|=)(.*)$/s.exec(firstUnescapedOp(part) ?? '');
    if (!m) return fail(`${JSON.stringify(part)} is not field=value, field==value or field!=value`);
    const opAt = m[1]!.length;
    const field = part.slice(0, opAt).trim();
    const op = m[2] === '!=' ? '!=' : '=';
    const raw = part.slice(opAt + m[2]!.length);
    if (!Object.hasOwn(POD_FIELDS, field)) {
      fail(`field label not supported: ${JSON.stringify(field)}; pods support ${Object.keys(POD_FIELDS).join(', ')}`);
    }
    return { field, op, value: unescapeField(raw, fail) };
  });
}

/** The part with escaped characters blanked out, so the operator search ignores them. */
function firstUnescapedOp(part: string): string | undefined {
  let out = '';
  for (let i = 0; i < part.length; i++) {
    if (part[i] === '\\' && i + 1 < part.length) {
      out += '__';
      i++;
    } else {
      out += part[i];
    }
  }
  return out;
}

function unescapeField(raw: string, fail: (why: string) => never): string {
  let out = '';
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i]!;
    if (c === '\\') {
      const n = raw[i + 1];
      if (n === undefined || !'\\,=!'.includes(n)) fail(`invalid escape sequence \\${n ?? ''} in ${JSON.stringify(raw)}`);
      out += n;
      i++;
    } else if (c === '=' || c === '!') {
      fail(`unescaped ${c} in value ${JSON.stringify(raw)} (write \\${c})`);
    } else {
      out += c;
    }
  }
  return out;
}

export function matchesFields(reqs: readonly FieldRequirement[], pod: V1Pod): boolean {
  return reqs.every((r) => {
    const get = POD_FIELDS[r.field];
    const v = get ? get(pod) : '';
    return r.op === '=' ? v === r.value : v !== r.value;
  });
}

export function formatFieldSelector(reqs: readonly FieldRequirement[]): string {
  const esc = (s: string) => s.replace(/[\\,=!]/g, (c) => `\\${c}`);
  return reqs.map((r) => `${r.field}${r.op}${esc(r.value)}`).join(',');
}

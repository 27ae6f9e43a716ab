// The start-up check of --repair-label-selectors and --repair-field-selectors: parsed the way
// the API server parses them (k8s.io/apimachinery labels.Parse, fields.ParseSelector, and the
// pod field names it takes), so a typo fails at start-up instead of every list and watch call.
// The agent then sends each selector as the operator typed it and the API server judges; only
// the test API server (test/helpers/selectors.ts) matches pods against the requirements here.

import { qualifiedNameProblem } from './k8snames.ts';

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

export function isLabelKey(key: string): boolean {
  return qualifiedNameProblem(key) === undefined;
}

export function isLabelValue(value: string): boolean {
  return value === '' || LABEL_NAME.test(value);
}

const INT64_MAX = 2n ** 63n - 1n;

/** A Gt/Lt bound: a label value that is a 64-bit integer (Go's strconv.ParseInt(v, 10, 64)). */
function isInt64(v: string): boolean {
  return /^\d+$/.test(v) && BigInt(v) <= INT64_MAX;
}

type Token = { kind: 'id'; text: string } | { kind: 'op'; text: '!' | '=' | '==' | '!=' | '>' | '<' | ',' | '(' | ')' };

// Only these four separate tokens, as in the API server's lexer: any other space (a vertical
// tab, a no-break space) is part of the key or value, which then fails the label syntax.
const SPACE = ' \t\r\n';
const SPECIAL = '!=><,()';

function tokenize(sel: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < sel.length) {
    const c = sel[i]!;
    if (SPACE.includes(c)) {
      i++;
    } else if (sel.startsWith('==', i) || sel.startsWith('!=', i)) {
      out.push({ kind: 'op', text: sel.slice(i, i + 2) as '==' | '!=' });
      i += 2;
    } else if (SPECIAL.includes(c)) {
      out.push({ kind: 'op', text: c as '!' | '=' | '>' | '<' | ',' | '(' | ')' });
      i++;
    } else {
      let j = i;
      while (j < sel.length && !SPACE.includes(sel[j]!) && !SPECIAL.includes(sel[j]!)) j++;
      out.push({ kind: 'id', text: sel.slice(i, j) });
      i = j;
    }
  }
  return out;
}

const KEY_RULE = 'at most 63 letters, digits, -, _ or .';
const VALUE_RULE = `${KEY_RULE}, alphanumeric at both ends`;

/** Parses a label selector (`a=b,c!=d,e in (f,g),!h,i,j>1`); empty selects everything. */
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
    if (!t || t.kind !== 'id') {
      return fail(`expected ${what}${t ? `, found ${JSON.stringify(t.text)}` : ' at the end'}`);
    }
    return t.text;
  };
  const key = (): string => {
    const k = id('a label key');
    if (!isLabelKey(k)) {
      fail(`${JSON.stringify(k)} is not a valid label key ([prefix/]name, name of ${KEY_RULE})`);
    }
    return k;
  };
  const checkValue = (v: string): string => {
    if (!isLabelValue(v)) fail(`${JSON.stringify(v)} is not a valid label value (${VALUE_RULE})`);
    return v;
  };
  const value = (): string => {
    const t = peek();
    // An empty value (`a=` or `a in ()`) is legal.
    if (!t || t.kind === 'op') return '';
    p++;
    return checkValue(t.text);
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
        const v = checkValue(id('a number'));
        if (!isInt64(v)) fail(`${JSON.stringify(v)} is not an integer (${k} ${t.text} needs one of 64 bits)`);
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
    if (sep.kind !== 'op' || sep.text !== ',') {
      fail(`expected , between requirements, found ${JSON.stringify(sep.text)}`);
    }
    p++;
    if (p === toks.length) fail('trailing comma');
  }
  return reqs;
}

/**
 * The pod fields the API server takes in a field selector (its Pod field-label conversion).
 * Deliberately not its legacy alias spec.host, nor status.podIPs, which no pod field answers.
 */
export const POD_SELECTOR_FIELDS: readonly string[] = [
  'metadata.name',
  'metadata.namespace',
  'spec.nodeName',
  'spec.restartPolicy',
  'spec.schedulerName',
  'spec.serviceAccountName',
  'spec.hostNetwork',
  'status.phase',
  'status.podIP',
  'status.nominatedNodeName',
];

const TERM_OPS = ['!=', '==', '='] as const;

/**
 * Parses a pod field selector (`spec.nodeName=n1,metadata.name!=x`) as the API server does:
 * terms split on unescaped commas, empty terms skipped, each split at its first operator, the
 * field name taken exactly (no spaces trimmed), `\` escaping `\`, `,` and `=` in the value.
 */
export function parseFieldSelector(sel: string): FieldRequirement[] {
  const fail = (why: string): never => {
    throw new SelectorError('field', sel, why);
  };
  const terms: string[] = [];
  let start = 0;
  for (let i = 0; i < sel.length; i++) {
    if (sel[i] === '\\') i++;
    else if (sel[i] === ',') {
      terms.push(sel.slice(start, i));
      start = i + 1;
    }
  }
  terms.push(sel.slice(start));
  const reqs: FieldRequirement[] = [];
  for (const term of terms) {
    if (term === '') continue;
    let at = -1;
    let op: (typeof TERM_OPS)[number] | undefined;
    for (let i = 0; i < term.length && op === undefined; i++) {
      op = TERM_OPS.find((o) => term.startsWith(o, i));
      at = i;
    }
    if (op === undefined) return fail(`${JSON.stringify(term)} is not field=value, field==value or field!=value`);
    const field = term.slice(0, at);
    if (!POD_SELECTOR_FIELDS.includes(field)) {
      const why = POD_SELECTOR_FIELDS.includes(field.trim())
        ? ' (the API server takes the field name as typed: no spaces around it)'
        : `; pods support ${POD_SELECTOR_FIELDS.join(', ')}`;
      fail(`field label not supported: ${JSON.stringify(field)}${why}`);
    }
    reqs.push({ field, op: op === '!=' ? '!=' : '=', value: unescapeFieldValue(term.slice(at + op.length), fail) });
  }
  return reqs;
}

function unescapeFieldValue(raw: string, fail: (why: string) => never): string {
  let out = '';
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i]!;
    if (c === '\\') {
      const n = raw[i + 1];
      if (n === undefined || !'\\,='.includes(n)) {
        fail(`invalid escape sequence \\${n ?? ''} in ${JSON.stringify(raw)}`);
      }
      out += n;
      i++;
    } else if (c === '=') {
      fail(`unescaped = in value ${JSON.stringify(raw)} (write \\=)`);
    } else {
      out += c;
    }
  }
  return out;
}

/** A literal field-selector value, escaped (`\`, `,`, `=`) as fields.EscapeValue does. */
export function escapeFieldValue(value: string): string {
  return value.replace(/[\\,=]/g, (c) => `\\${c}`);
}

// Where things are in a JSON text: the spans of an object's members and an array's elements.
// The installer edits the primary CNI config as text, splicing our entry in and out, so that
// every byte the primary CNI wrote stays as it was and removing our entry gives back exactly
// the original. Input must already have passed JSON.parse.

export interface Span {
  readonly start: number;
  /** One past the last character. */
  readonly end: number;
}

export interface Member extends Span {
  readonly key: string;
  readonly value: Span;
}

const WS = new Set([' ', '\t', '\n', '\r']);

export function skipWs(text: string, i: number): number {
  while (i < text.length && WS.has(text[i]!)) i++;
  return i;
}

/** End (exclusive) of the JSON value starting at `i`. */
export function valueEnd(text: string, i: number): number {
  const c = text[i];
  if (c === '"') {
    for (let j = i + 1; j < text.length; j++) {
      if (text[j] === '\\') j++;
      else if (text[j] === '"') return j + 1;
    }
    throw new SyntaxError(`unterminated string at ${i}`);
  }
  if (c === '{' || c === '[') {
    let depth = 0;
    for (let j = i; j < text.length; j++) {
      const d = text[j];
      if (d === '"') j = valueEnd(text, j) - 1;
      else if (d === '{' || d === '[') depth++;
      else if (d === '}' || d === ']') {
        depth--;
        if (depth === 0) return j + 1;
      }
    }
    throw new SyntaxError(`unterminated ${c} at ${i}`);
  }
  let j = i;
  while (j < text.length && !WS.has(text[j]!) && text[j] !== ',' && text[j] !== '}' && text[j] !== ']') j++;
  return j;
}

/** Members of the object whose `{` is at `open`. */
export function objectMembers(text: string, open: number): Member[] {
  const members: Member[] = [];
  let i = skipWs(text, open + 1);
  if (text[i] === '}') return members;
  for (;;) {
    const keyEnd = valueEnd(text, i);
    const key = JSON.parse(text.slice(i, keyEnd)) as string;
    const colon = skipWs(text, keyEnd);
    const vStart = skipWs(text, colon + 1);
    const vEnd = valueEnd(text, vStart);
    members.push({ key, start: i, end: vEnd, value: { start: vStart, end: vEnd } });
    i = skipWs(text, vEnd);
    if (text[i] === ',') i = skipWs(text, i + 1);
    else return members;
  }
}

/** Elements of the array whose `[` is at `open`. */
export function arrayElements(text: string, open: number): Span[] {
  const elements: Span[] = [];
  let i = skipWs(text, open + 1);
  if (text[i] === ']') return elements;
  for (;;) {
    const end = valueEnd(text, i);
    elements.push({ start: i, end });
    i = skipWs(text, end);
    if (text[i] === ',') i = skipWs(text, i + 1);
    else return elements;
  }
}

/** The indentation (spaces/tabs) of the line `pos` is on. */
export function lineIndent(text: string, pos: number): string {
  const lineStart = text.lastIndexOf('\n', pos - 1) + 1;
  const m = /^[ \t]*/.exec(text.slice(lineStart, pos));
  return m ? m[0] : '';
}

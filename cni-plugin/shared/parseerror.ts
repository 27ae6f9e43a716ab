// A JSON or JSON5 parse error said without the text it came from. V8's messages quote the input
// (`Unexpected token 'e', "eyJhbGciOi"... is not valid JSON`) and json5's quote the character,
// and the file may hold a token: the agent's messages reach /readyz and its logs, the plugin's
// the CNI error the runtime shows in pod events. Only the kind of error and where it is are kept.

/** `unexpected character`, `expected ',' or '}' after property value at line 3 column 7`. */
export function parseErrorDetail(e: unknown, text: string): string {
  const message = e instanceof Error ? e.message : String(e);
  let kind = message.replace(/^JSON5: /, '').split(/,? "| in JSON| at position| at \d|\n/)[0] ?? '';
  const without = (_m: string, k: string) => (k === 'Unexpected token' ? 'unexpected character' : k);
  kind = kind.replace(/^(Unexpected token|invalid character) .*$/s, without).trim();
  // Anything that still quotes more than one character ('}' is fine) is not said at all.
  if (kind === '' || kind.length > 60 || /["`]|'/.test(kind.replace(/'[^']'/g, ''))) kind = 'syntax error';
  kind = kind.charAt(0).toLowerCase() + kind.slice(1);
  const pos = /at position (\d+)/.exec(message);
  const j5 = e as { lineNumber?: unknown; columnNumber?: unknown };
  let where = '';
  if (pos) {
    const before = text.slice(0, Number(pos[1]));
    where = ` at line ${before.split('\n').length} column ${before.length - before.lastIndexOf('\n')}`;
  } else if (typeof j5.lineNumber === 'number' && typeof j5.columnNumber === 'number') {
    where = ` at line ${j5.lineNumber} column ${j5.columnNumber}`;
  }
  return `${kind}${where}`;
}

/** `not valid JSON (unterminated string at line 1 column 41)`. */
export function describeParseError(e: unknown, text: string, dialect: 'JSON' | 'JSON5'): string {
  return `not valid ${dialect} (${parseErrorDetail(e, text)})`;
}

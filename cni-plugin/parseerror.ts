// A JSON parse error said without the text it came from. V8's messages quote the input
// (`Unexpected token 'e', "eyJhbGciOi"... is not valid JSON`), and the orchconfig holds a token:
// what the plugin says goes into the CNI error the runtime shows in pod events. Only the kind of
// error and, where V8 gives it, the line and column are kept. The agent has its own (src/install/
// safefile.ts describeParseError); the plugin imports nothing from src/.

/** `unexpected character`, `expected ',' or '}' after property value at line 3 column 7`. */
export function describeJsonError(e: unknown, text: string): string {
  const message = e instanceof Error ? e.message : String(e);
  let kind = /^Unexpected token/.test(message) ? 'unexpected character'
    : /^Unexpected end of JSON input/.test(message) ? 'unexpected end of input'
    : message.split(/ in JSON| at position|,? "|\n/)[0]?.trim() ?? '';
  // Anything that still quotes more than one structural character ('}') is not said at all.
  if (kind === '' || kind.length > 60 || /["`]|'/.test(kind.replace(/'[^']'/g, ''))) kind = 'syntax error';
  kind = kind.charAt(0).toLowerCase() + kind.slice(1);
  const pos = /at position (\d+)/.exec(message);
  let where = '';
  if (pos) {
    const before = text.slice(0, Number(pos[1]));
    where = ` at line ${before.split('\n').length} column ${before.length - before.lastIndexOf('\n')}`;
  }
  return `${kind}${where}`;
}

// An esbuild plugin for the agent bundle: the written bundle is ASCII throughout.
//
// V8 keeps a script's source in the heap for the process's life, one byte a character only when
// Node's UTF-8 decoding of the file gives a one-byte string: a non-ASCII character made it two
// bytes a character. esbuild escapes non-ASCII characters in strings and identifiers (charset:
// ascii) but keeps comments and regular expressions as they are, and a dependency's comment with
// curly quotes doubled the agent's ~1.5 MB of source to ~3 MiB of heap on every node. Every
// non-ASCII character left is written as a \uXXXX escape, which means the same in a string,
// template, regular expression or identifier and nothing in a comment (only a tagged template's
// raw text would differ; test/node/agent-bundle-source.test.ts checks the result).

import { readFileSync, writeFileSync } from 'node:fs';
import type { Plugin } from 'esbuild';

const WIDE = /[\u0080-\uffff]/g;

/** `text` with every non-ASCII UTF-16 unit written as a \uXXXX escape. */
export function asciiText(text: string): string {
  return text.replace(WIDE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

export function asciiSource(): Plugin {
  return {
    name: 'ascii-source',
    setup(build) {
      build.onEnd((result) => {
        const out = build.initialOptions.outfile;
        if (result.errors.length > 0 || build.initialOptions.write === false || !out) return;
        const text = readFileSync(out, 'utf8');
        if (/[\u0080-\uffff]/.test(text)) writeFileSync(out, asciiText(text));
      });
    },
  };
}

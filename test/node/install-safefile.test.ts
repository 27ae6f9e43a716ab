// safefile.ts against real files: what the agent agrees to read, and what a parse error may say.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import JSON5 from 'json5';
import { describeParseError } from '../../cni-plugin/shared/parseerror.ts';
import {
  MAX_FILE_BYTES,
  readRegularFile,
  readRegularFileIfExists,
  UnsafeFileError,
} from '../../src/install/safefile.ts';

const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-safefile-'));
after(() => fs.rm(dir, { recursive: true, force: true }));

const refused = (re: RegExp) => (e: unknown) => e instanceof UnsafeFileError && re.test(e.message);

describe('readRegularFile', () => {
  it('reads a regular file, and one of exactly the cap', async () => {
    await fs.writeFile(path.join(dir, 'small'), 'hello');
    assert.equal((await readRegularFile(path.join(dir, 'small'))).text, 'hello');
    await fs.writeFile(path.join(dir, 'cap'), 'x'.repeat(MAX_FILE_BYTES));
    assert.equal((await readRegularFile(path.join(dir, 'cap'))).text.length, MAX_FILE_BYTES);
    assert.equal(await readRegularFileIfExists(path.join(dir, 'missing')), null);
  });

  it('refuses one byte over the cap, saying the size', async () => {
    await fs.writeFile(path.join(dir, 'over'), 'x'.repeat(MAX_FILE_BYTES + 1));
    await assert.rejects(readRegularFile(path.join(dir, 'over')), refused(/over is 1\.0 MiB, over the 1 MiB limit/));
  });

  it('refuses a FIFO without blocking, a device and a directory', async () => {
    execFileSync('mkfifo', [path.join(dir, 'fifo')]);
    await assert.rejects(readRegularFile(path.join(dir, 'fifo')), refused(/fifo is a FIFO, not a regular file/));
    await assert.rejects(readRegularFile('/dev/zero'), refused(/\/dev\/zero is a character device/));
    await assert.rejects(readRegularFile(dir), refused(/is a directory/));
  });

  it('follows a link to a regular file, unless told not to', async () => {
    await fs.symlink('small', path.join(dir, 'link'));
    assert.equal((await readRegularFile(path.join(dir, 'link'))).text, 'hello');
    await assert.rejects(
      readRegularFile(path.join(dir, 'link'), { noFollow: true }),
      refused(/link is a symbolic link/),
    );
  });
});

describe('describeParseError', () => {
  const secret = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0';
  const json: [string, RegExp][] = [
    [secret, /^not valid JSON \(unexpected character\)$/],
    [`{"a": ${secret}}`, /^not valid JSON \(unexpected character\)$/],
    [`{"token": "${secret}`, /^not valid JSON \(unterminated string at line 1 column 41\)$/],
    [`{\n  "a": 1,\n}`, /^not valid JSON \(expected double-quoted property name at line 3 column 1\)$/],
    ['', /^not valid JSON \(unexpected end of JSON input\)$/],
    ['{} x', /^not valid JSON \(unexpected non-whitespace character after JSON at line 1 column 4\)$/],
  ];
  for (const [text, re] of json) {
    it(`JSON ${JSON.stringify(text.slice(0, 20))}`, () => {
      let said = '';
      try {
        JSON.parse(text);
      } catch (e) {
        said = describeParseError(e, text, 'JSON');
      }
      assert.match(said, re);
      assert.ok(!said.includes('eyJ') && !said.includes('c2V'), said);
    });
  }
  it('JSON5 says where, not the character', () => {
    let said = '';
    try {
      JSON5.parse(`{a: ${secret}}`);
    } catch (e) {
      said = describeParseError(e, `{a: ${secret}}`, 'JSON5');
    }
    assert.equal(said, 'not valid JSON5 (invalid character at line 1 column 5)');
  });
});

// V8 keeps a script's source in the heap for the process's life, one byte a character when the
// file is ASCII and two when it is not: a curly quote in a dependency's comment doubled the agent
// bundle's ~1.5 MB of source to ~3 MiB of heap on every node.

import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import * as esbuild from 'esbuild';
import { bundleOptions } from '../../scripts/bundle-options.ts';
import { ROOT } from '../helpers/cli.ts';

describe('the agent bundle source', () => {
  it('is ASCII throughout, so V8 holds it one byte a character', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-bundle-src-'));
    try {
      const outfile = path.join(dir, 'agent.mjs');
      const options = bundleOptions('esm', { version: 't', gitCommit: 't', buildTime: new Date(0).toISOString() });
      await esbuild.build({
        ...options,
        entryPoints: [path.join(ROOT, 'src/cmd/install-cni-main.ts')],
        outfile,
        absWorkingDir: ROOT,
        logLevel: 'error',
      });
      const text = await readFile(outfile, 'utf8');
      const wide = text
        .split('\n')
        .flatMap((line, i) => (/[\u0080-\uffff]/.test(line) ? [`${i + 1}: ${line.trim()}`] : []));
      assert.deepEqual(wide, [], 'lines with non-ASCII characters');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

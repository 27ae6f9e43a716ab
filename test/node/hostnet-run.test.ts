// runOnHost (src/hostnet/run.ts): a program run in the agent's own netns through the agent's one
// runner (src/podnetns/program.ts), with the same time limit, output cap and lookup as runInNetns.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { runOnHost } from '../../src/hostnet/run.ts';

describe('runOnHost', () => {
  it('gives the exit status, stdout and stderr, and writes the input to stdin', async () => {
    const r = await runOnHost(['sh', '-c', 'cat; echo err >&2; exit 3'], { input: 'in\n' });
    assert.deepEqual(r, { code: 3, stdout: 'in\n', stderr: 'err\n', error: null });
  });

  it('kills a program past its time limit and says so', async () => {
    const r = await runOnHost(['sleep', '30'], { timeoutMs: 200 });
    assert.deepEqual(r, { code: null, stdout: '', stderr: '', error: 'sleep did not finish within 200 ms; killed' });
  });

  it('says which program could not start', async () => {
    const r = await runOnHost(['mcni-no-such-program']);
    assert.equal(r.code, null);
    assert.match(r.error ?? '', /^cannot run mcni-no-such-program: .*ENOENT/);
  });

  it("finds programs in the sbin dirs when the agent's PATH lacks them", async (t) => {
    const before = process.env.PATH;
    t.after(() => {
      process.env.PATH = before;
    });
    process.env.PATH = '/usr/bin';
    const r = await runOnHost(['ipset', '--version']);
    assert.equal(r.error, null);
    assert.equal(r.code, 0, r.stderr);
  });
});

// The plugin spawns its helpers (nsenter, iptables-restore, ip) and talks to the agent's unix
// sockets through the runtime's own API: node:child_process / node:net under Node, Bun.spawn /
// Bun.connect under Bun (docs/design.md "Start-up time": Bun's node: modules cost milliseconds on
// every call). The same cases run here on both runtimes, from the sources, and must give the
// same results: exit codes,
// output, the time limit (also with the child's own child holding the pipes), a missing binary, a child a signal ended, a socket that answers, closes
// without an answer, is not there, or splits a UTF-8 character across two writes; and askUnix, the
// one request/answer exchange both the pod lookup and the ambient ADD use, through each ending.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { bunBinary } from '../../scripts/plugin-runtime.ts';
import { ROOT } from '../helpers/cli.ts';
import { tempDir } from '../helpers/plugin.ts';

const CASES = `
import { exec, execNow } from ${JSON.stringify(path.join(ROOT, 'cni-plugin/netns/exec.ts'))};
import { askUnix, connectUnix } from ${JSON.stringify(path.join(ROOT, 'cni-plugin/unixsocket.ts'))};
const dir = process.argv[2];
const out = {};
const sh = (script, o) => ['sh', ['-c', script], o];
const runs = {
  output: sh('cat; echo err >&2; exit 3', { input: 'in\\u00e9\\n' }),
  noStdout: sh('echo out; echo err >&2', { stdout: false }),
  timeLimit: sh('exec sleep 5', { timeoutMs: 300 }),
  // The child killed at the limit leaves a process of its own holding our pipes: the limit still
  // ends the call (not when the pipes close, here with "late" read from them, or never).
  timeLimitHeldPipes: sh('(sleep 2; echo late; echo late >&2) & exec sleep 5', { timeoutMs: 300 }),
  signalled: sh('kill -9 $$', {}),
  // More than exec and execNow keep (1 MiB, Node's spawnSync default): ended and failed on both runtimes.
  tooMuchOutput: sh('yes | head -c 1100000 >&2; exit 0', { stdout: false }),
  missing: ['mesh-no-such-binary', [], {}],
};
for (const [name, [file, args, o]] of Object.entries(runs)) {
  for (const [how, f] of [['exec', exec], ['execNow', execNow]]) {
    const r = await f(file, args, o);
    // A missing binary: each runtime words the cause its own way after our prefix.
    // A long output by its length (the whole of it would not be flushed before process.exit).
    const text = (t) => (t.length > 4096 ? 'length ' + t.length : t);
    const error = r.error === null ? null : r.error.replace(/^(cannot run \\S+):.*/, '$1: ...');
    out[how + ':' + name] = { ...r, stdout: text(r.stdout), stderr: text(r.stderr), error };
  }
}
const talk = (name, send, { end = false } = {}) => new Promise((resolve) => {
  const events = [];
  let text = '';
  const s = connectUnix(dir + '/' + name + '.sock', {
    open: () => { events.push('open'); if (send) s.write(send); if (end) s.end(() => { events.push('ended'); resolve({ events: [...events], text }); }); },
    data: (d) => { text += d; },
    error: (m) => { events.push('error: ' + m.replace(dir, '<dir>')); resolve({ events: [...events], text }); },
    close: () => { events.push('close'); resolve({ events: [...events], text }); },
  });
  // Written before the connection is open: queued, not lost.
  if (!send && !end) s.write('early\\n');
});
out.answers = await talk('answer', 'ask\\n');
out.closes = await talk('silent', 'ask\\n');
out.missing = await talk('nothing-here', 'ask\\n');
out.split = await talk('split', 'ask\\n');
out.early = await talk('echo', null);
out.endAfterWrite = await talk('sink', 'x'.repeat(200000) + '\\n', { end: true });
// One exchange (askUnix): an answer is what read() makes of the text, once it is complete.
const line = (text, closed) => (text.includes('\\n') ? 'line ' + text : closed ? (text === '' ? null : 'partial ' + text) : null);
const ask = (name, o = {}) => askUnix(dir + '/' + name + '.sock', 'ask\\n', { timeoutMs: 2000, maxAnswerBytes: 1000, read: line, ...o })
  .then((r) => JSON.parse(JSON.stringify(r).replace(dir, '<dir>')));
out.askAnswers = await ask('answer');
out.askSplit = await ask('split');
out.askCloses = await ask('silent');
out.askHalfLine = await ask('halfline');
out.askMissing = await ask('nothing-here');
out.askMute = await ask('mute', { timeoutMs: 200 });
out.askTooLong = await ask('flood');
console.log(JSON.stringify(out));
process.exit(0);
`;

describe("the plugin's spawns and unix sockets give the same results under Node and Bun", () => {
  const tmp = tempDir();
  const servers: net.Server[] = [];
  let sunk = 0;
  before(async () => {
    const serve = (name: string, onConn: (c: net.Socket) => void) =>
      new Promise<void>((resolve) => {
        const srv = net.createServer(onConn);
        servers.push(srv);
        srv.listen(path.join(tmp.dir, `${name}.sock`), resolve);
      });
    await serve('answer', (c) => c.once('data', () => c.end('{"pod":"é"}\n')));
    await serve('silent', (c) => c.once('data', () => c.end()));
    await serve('split', (c) =>
      c.once('data', () => {
        const b = Buffer.from('{"x":"é"}\n');
        c.write(b.subarray(0, 7));
        setTimeout(() => c.end(b.subarray(7)), 50);
      }),
    );
    await serve('echo', (c) => c.once('data', (d) => c.end(d)));
    await serve('halfline', (c) => c.once('data', () => c.end('{"half":')));
    await serve('mute', () => {});
    // Never a newline, never a close: only the cap ends it (the peer's write fails once we go).
    await serve('flood', (c) => {
      c.on('error', () => {});
      c.once('data', () => c.write('x'.repeat(5000)));
    });
    await serve('sink', (c) => {
      c.on('data', (d: Buffer) => (sunk += d.length));
      c.on('end', () => c.end());
    });
    writeFileSync(path.join(tmp.dir, 'cases.ts'), CASES);
  });
  after(() => {
    for (const s of servers) s.close();
    tmp.remove();
  });

  /** The cases run by a runtime in a child process, while this process serves the sockets. */
  async function runCases(argv: string[]): Promise<Record<string, unknown>> {
    const { spawn } = await import('node:child_process');
    const child = spawn(argv[0]!, [...argv.slice(1), path.join(tmp.dir, 'cases.ts'), tmp.dir], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH ?? '' },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    assert.equal(code, 0, `${argv[0]}: ${stderr}`);
    return JSON.parse(stdout) as Record<string, unknown>;
  }

  it('each case, Node and Bun alike', async () => {
    sunk = 0;
    const onNode = await runCases([process.execPath]);
    assert.equal(sunk, 200001, 'Node: end() sent everything written before it');
    sunk = 0;
    const onBun = await runCases([bunBinary(ROOT)]);
    assert.equal(sunk, 200001, 'Bun: end() sent everything written before it (a write the kernel took in part)');
    // What they must say, checked on Node; then Bun must say the same.
    assert.deepEqual(onNode['exec:output'], { code: 3, stdout: 'iné\n', stderr: 'err\n', error: null });
    assert.deepEqual(onNode['execNow:noStdout'], { code: 0, stdout: '', stderr: 'err\n', error: null });
    assert.deepEqual(onNode['exec:timeLimit'], {
      code: null,
      stdout: '',
      stderr: '',
      error: 'sh did not finish within 300 ms',
    });
    for (const how of ['exec', 'execNow']) {
      const want = { code: null, stdout: '', stderr: '', error: 'sh did not finish within 300 ms' };
      assert.deepEqual(onNode[`${how}:timeLimitHeldPipes`], want, how);
    }
    const tooMuch = { code: null, stdout: '', stderr: '', error: 'sh wrote more than 1048576 bytes of output; killed' };
    for (const how of ['exec', 'execNow']) assert.deepEqual(onNode[`${how}:tooMuchOutput`], tooMuch, how);
    assert.deepEqual(onNode['execNow:signalled'], { code: null, stdout: '', stderr: '', error: null });
    assert.deepEqual((onNode['exec:missing'] as { error: string }).error, 'cannot run mesh-no-such-binary: ...');
    assert.deepEqual(onNode.answers, { events: ['open', 'close'], text: '{"pod":"é"}\n' });
    assert.deepEqual(onNode.missing, { events: ['error: connect ENOENT <dir>/nothing-here.sock'], text: '' });
    assert.deepEqual(onNode.split, { events: ['open', 'close'], text: '{"x":"é"}\n' });
    assert.deepEqual(onNode.early, { events: ['open', 'close'], text: 'early\n' });
    assert.deepEqual(onNode.endAfterWrite, { events: ['open', 'ended'], text: '' });
    assert.deepEqual(onNode.askAnswers, { answer: 'line {"pod":"é"}\n' });
    assert.deepEqual(onNode.askSplit, { answer: 'line {"x":"é"}\n' });
    assert.deepEqual(onNode.askCloses, { closed: true });
    assert.deepEqual(onNode.askHalfLine, { answer: 'partial {"half":' });
    assert.deepEqual(onNode.askMissing, { error: 'connect ENOENT <dir>/nothing-here.sock' });
    assert.deepEqual(onNode.askMute, { timeout: true, sent: true });
    assert.deepEqual(onNode.askTooLong, { tooLong: 1000 });
    assert.deepEqual(onBun, onNode);
  });
});

it('the Bun of node_modules runs (the cases above need it)', () => {
  assert.equal(spawnSync(bunBinary(ROOT), ['--version'], { encoding: 'utf8' }).status, 0);
});

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { lstatSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, beforeEach, describe, it } from 'node:test';
import { UdsLog } from '../../cni-plugin/log/udslog.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging, setScopeLevel } from '../../src/monitoring/logging.ts';
import { startPluginLogServer, DEFAULT_LIMITS, type LogServerLimits } from '../../src/monitoring/logserver.ts';
import { LineSplitter } from '../../src/monitoring/lines.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { parsePluginLine } from '../../src/monitoring/pluginrecord.ts';
import { captureSink, promtoolProblems } from '../helpers/observability.ts';
import { metricValue } from '../helpers/metrics.ts';
import { waitFor } from '../helpers/poll.ts';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'mcni-obs-uds-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

/** Connects, writes `data` (all at once), half-closes, and waits for the server to close. */
function send(address: string, data: string | Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: address }, () => s.end(data));
    s.on('close', () => resolve());
    s.on('error', reject);
    s.setTimeout(10_000, () => s.destroy(new Error('server did not close the connection')));
    s.resume();
  });
}

let n = 0;
function setup(limits: Partial<LogServerLimits> = {}) {
  const address = path.join(tmp, `run${++n}`, 'mesh-cni', 'log.sock');
  const settings = buildSettings({ 'log-uds-address': address }, {});
  return {
    address,
    start: () => startPluginLogServer(settings.install.logUdsAddress, { ...DEFAULT_LIMITS, ...limits }),
  };
}

describe('plugin log server', () => {
  let sink: ReturnType<typeof captureSink>;
  let running: Component[] = [];
  beforeEach(() => {
    sink = captureSink();
    configureLogging(buildSettings({ log_output_level: 'cni:info,monitoring:warn' }, {}).logging, sink);
  });
  afterEach(async () => {
    for (const c of running) await c.stop('SIGTERM');
    running = [];
  });
  const start = async (limits: Partial<LogServerLimits> = {}) => {
    const s = setup(limits);
    const c = await s.start();
    running.push(c);
    return { ...s, c };
  };
  const cniLines = () => sink.lines.filter((l) => l.split('\t')[2] === 'cni');

  it('creates the directory 0750 and the socket 0600, and removes the socket on stop', async () => {
    const { address, c } = await start();
    assert.equal(statSync(path.dirname(address)).mode & 0o777, 0o750);
    const st = lstatSync(address);
    assert.ok(st.isSocket());
    assert.equal(st.mode & 0o777, 0o600);
    await c.stop('SIGTERM');
    running = [];
    assert.equal(existsSync(address), false);
  });

  it("prints the real plugin client's records in scope cni with pod, container and the plugin's time", async () => {
    const { address } = await start();
    const client = new UdsLog(
      address,
      'debug',
      { command: 'ADD', containerID: 'c0ffee', pod: { namespace: 'shop', name: 'cart-1' } },
      'none',
    );
    client.info('redirect applied', { rules: 12 });
    client.debug('not printed: cni is at info');
    client.error('API server refused', { reason: 'Forbidden' });
    await client.flush(2000);
    const lines = await waitFor('two cni lines', () => (cniLines().length >= 2 ? cniLines() : undefined));
    assert.match(
      lines[0]!,
      /^\d{4}-\d\d-\d\dT[\d:.]+Z\tinfo\tcni\tredirect applied\tpod=shop\/cart-1 containerID=c0ffee command=ADD rules=12\n$/,
    );
    assert.match(
      lines[1]!,
      /\terror\tcni\tAPI server refused\tpod=shop\/cart-1 containerID=c0ffee command=ADD reason=Forbidden\n$/,
    );
    assert.equal(cniLines().length, 2);
  });

  it('follows the cni scope level at run time and reads snake_case pod fields too', async () => {
    const { address } = await start();
    const rec = {
      level: 'debug',
      msg: 'detail',
      time: '2026-03-04T05:06:07.089Z',
      pod_namespace: 'ns',
      pod_name: 'p',
      container_id: 'abc',
      extra: 'x y',
    };
    await send(address, JSON.stringify(rec) + '\n');
    setScopeLevel('cni', 'debug');
    await send(address, JSON.stringify(rec) + '\n');
    const lines = await waitFor('a debug line', () => (cniLines().length > 0 ? cniLines() : undefined));
    assert.deepEqual(lines, ['2026-03-04T05:06:07.089Z\tdebug\tcni\tdetail\tpod=ns/p containerID=abc extra="x y"\n']);
  });

  it('drops junk with a counter per reason and keeps reading the same connection', async () => {
    const { address } = await start();
    const before = {
      lines: await metricValue('mesh_cni_plugin_log_lines_received_total'),
      json: await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'invalid_json' }),
      rec: await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'invalid_record' }),
      big: await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'oversized' }),
    };
    const huge = JSON.stringify({ level: 'error', msg: 'x'.repeat(100 * 1024) });
    await send(
      address,
      Buffer.concat([
        Buffer.from('{not json\n[1,2]\n{"level":"info"}\n\n\x00\xff\n'),
        Buffer.from(huge + '\n'),
        Buffer.from('{"level":"warn","msg":"still here","pod":{"namespace":"a","name":"b"}}\r\n'),
        Buffer.from('{"level":"info","msg":"last line, no newline"}'),
      ]),
    );
    const lines = await waitFor('the two good lines', () => (cniLines().length >= 2 ? cniLines() : undefined));
    assert.match(lines[0]!, /\twarn\tcni\tstill here\tpod=a\/b\n$/);
    assert.match(lines[1]!, /\tinfo\tcni\tlast line, no newline\n$/);
    assert.equal(
      (await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'invalid_json' })) - before.json,
      2,
    );
    assert.equal(
      (await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'invalid_record' })) - before.rec,
      2,
    );
    assert.equal(
      (await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'oversized' })) - before.big,
      1,
    );
    assert.equal((await metricValue('mesh_cni_plugin_log_lines_received_total')) - before.lines, 7);
    assert.equal(await promtoolProblems(await registry.metrics()), '');
  });

  it('survives 8 MiB without a newline: one oversized drop, then the next line prints', async () => {
    const { address } = await start();
    const before = await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'oversized' });
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection({ path: address });
      s.on('error', reject);
      s.on('close', () => resolve());
      s.resume();
      const chunk = Buffer.alloc(1024 * 1024, 'a');
      let left = 8;
      const pump = () => {
        while (left > 0) {
          left--;
          if (!s.write(chunk)) return void s.once('drain', pump);
        }
        s.end('\n{"level":"info","msg":"after the flood"}\n');
      };
      s.once('connect', pump);
    });
    await waitFor('the line after the flood', () => cniLines().find((l) => l.includes('after the flood')));
    assert.equal((await metricValue('mesh_cni_plugin_log_lines_dropped_total', { reason: 'oversized' })) - before, 1);
  });

  it('closes a connection that stays silent past the idle timeout', async () => {
    const { address } = await start({ idleTimeoutMs: 200 });
    const before = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'idle' });
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection({ path: address }, () => s.write('{"level":"info","msg":"half a li'));
      s.on('error', reject);
      s.on('close', () => resolve());
      s.resume();
      setTimeout(() => s.destroy(new Error('the server kept an idle connection open')), 10_000).unref();
    });
    assert.equal((await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'idle' })) - before, 1);
    assert.equal(cniLines().length, 0, 'a partial line is not printed when the server gives up');
  });

  it('cuts a sender that trickles a line a byte at a time, though it is never idle', async () => {
    const { address } = await start({ idleTimeoutMs: 5_000, lineTimeoutMs: 300 });
    const before = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'line_timeout' });
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection({ path: address });
      const drip = setInterval(() => s.write('x'), 50);
      // The server's close shows to a sender as EPIPE (on its next write) or ECONNRESET (bytes it
      // sent were still unread when the server closed): both are the cut this test waits for.
      s.on('error', (e: NodeJS.ErrnoException) =>
        e.code === 'EPIPE' || e.code === 'ECONNRESET' ? undefined : reject(e),
      );
      s.on('close', () => {
        clearInterval(drip);
        resolve();
      });
      s.resume();
      setTimeout(() => s.destroy(new Error('the server kept a trickling sender')), 4_000).unref();
    });
    assert.equal(
      (await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'line_timeout' })) - before,
      1,
    );
  });

  it('cuts a connection at its lifetime, however it behaves', async () => {
    const { address } = await start({ maxConnectionMs: 300 });
    const before = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'lifetime' });
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection({ path: address });
      const chat = setInterval(() => s.write('{"level":"debug","msg":"keep-alive"}\n'), 50);
      // The server's close shows to a sender as EPIPE (on its next write) or ECONNRESET (bytes it
      // sent were still unread when the server closed): both are the cut this test waits for.
      s.on('error', (e: NodeJS.ErrnoException) =>
        e.code === 'EPIPE' || e.code === 'ECONNRESET' ? undefined : reject(e),
      );
      s.on('close', () => {
        clearInterval(chat);
        resolve();
      });
      s.resume();
      setTimeout(() => s.destroy(new Error('the server kept a connection past its lifetime')), 4_000).unref();
    });
    assert.equal(
      (await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'lifetime' })) - before,
      1,
    );
  });

  it('serves a plugin run while slow connections hold every slot: the oldest one goes', async () => {
    const { address } = await start({ maxConnections: 8 });
    const evictedBefore = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'evicted' });
    const held: net.Socket[] = [];
    const chat = setInterval(() => {
      for (const s of held) if (!s.destroyed) s.write('\n');
    }, 50);
    try {
      for (let i = 0; i < 8; i++) {
        // Whole (empty) lines now and then: never idle, never inside a line.
        const s = net.createConnection({ path: address });
        s.on('error', () => {});
        held.push(s);
        await new Promise((r) => s.once('connect', r));
      }
      await waitFor('8 open connections', async () =>
        (await metricValue('mesh_cni_plugin_log_connections_open')) === 8 ? true : undefined,
      );
      const client = new UdsLog(
        address,
        'info',
        { command: 'ADD', containerID: 'c1', pod: { namespace: 'shop', name: 'cart-9' } },
        'none',
      );
      client.info('served despite the slow ones');
      await client.flush(2000);
      await waitFor('the plugin record', () => cniLines().find((l) => l.includes('served despite the slow ones')));
      assert.equal(
        (await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'evicted' })) - evictedBefore,
        1,
      );
      await waitFor('the oldest connection closed', () => held[0]!.closed);
      assert.equal(
        held.slice(1).some((s) => s.closed),
        false,
        'only the oldest was closed',
      );
    } finally {
      clearInterval(chat);
      for (const s of held) s.destroy();
    }
  });

  it('never closes a plugin run that waits for its first read to make room: a newcomer goes instead', async () => {
    // A tiny rate: every read puts the server in debt, so new connections wait for their turn.
    const { address } = await start({ maxConnections: 4, maxBytesPerSecond: 8 * 1024 });
    const before = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'rejected' });
    const socks: net.Socket[] = [];
    const connect = async () => {
      const s = net.createConnection({ path: address });
      s.on('error', () => {});
      socks.push(s);
      await new Promise((r) => s.once('connect', r));
      return s;
    };
    try {
      for (let i = 0; i < 4; i++) (await connect()).write('{"level":"info","msg":"flood"}\n'.repeat(2000));
      await waitFor('reading paced', async () =>
        (await metricValue('mesh_cni_plugin_log_read_pauses_total')) > 0 ? true : undefined,
      );
      const client = new UdsLog(
        address,
        'info',
        { command: 'ADD', containerID: 'c7', pod: { namespace: 'shop', name: 'cart-7' } },
        'none',
      );
      client.info('waited for its turn');
      await client.flush(2000);
      // Connections that keep coming while the run waits: they take the flooders' slots, then are refused.
      for (let i = 0; i < 6; i++) await connect();
      await waitFor('the waiting run printed', () => cniLines().find((l) => l.includes('waited for its turn')));
      assert.ok(
        (await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'rejected' })) - before >= 1,
      );
    } finally {
      for (const s of socks) s.destroy();
    }
  });

  it('does not close as idle a plugin run that only waits for its turn to be read', async () => {
    const { address } = await start({ maxBytesPerSecond: 8 * 1024, idleTimeoutMs: 300 });
    const socks: net.Socket[] = [];
    const connect = async (data: string) => {
      const s = net.createConnection({ path: address });
      s.on('error', () => {});
      socks.push(s);
      await new Promise((r) => s.once('connect', r));
      s.write(data);
    };
    try {
      await connect('{"level":"debug","msg":"x"}\n'.repeat(2000)); // puts the server in debt
      await waitFor('reading paced', async () =>
        (await metricValue('mesh_cni_plugin_log_read_pauses_total')) > 0 ? true : undefined,
      );
      // Three new connections ahead of the run: it waits for their turns first, well past 300 ms.
      for (let i = 0; i < 3; i++) await connect('{"level":"debug","msg":"ahead"}\n'.repeat(500));
      await connect('{"level":"info","msg":"waited, never idle"}\n');
      await waitFor('the run printed', () => cniLines().find((l) => l.includes('waited, never idle')));
    } finally {
      for (const s of socks) s.destroy();
    }
  });

  it('holds at most a line per connection, however the bytes come', async () => {
    const { address, c } = await start({ maxLineBytes: 4096 });
    const s = net.createConnection({ path: address });
    s.on('error', () => {});
    try {
      await new Promise((r) => s.once('connect', r));
      for (let i = 0; i < 3000; i++) s.write('a'); // a byte a write: 3000 partial-line bytes
      const held = await waitFor('3000 bytes held', async () => {
        const b = await metricValue('mesh_cni_plugin_log_buffered_bytes');
        return b >= 3000 ? b : undefined;
      });
      assert.ok(held <= 4096, `held ${held} bytes for one connection, over its 4096-byte line cap`);
      assert.ok((c.status() as { bufferedBytes: number }).bufferedBytes <= 4096);
      s.write('b'.repeat(2000)); // over the cap: the line is dropped, nothing kept
      await waitFor('nothing held', async () =>
        (await metricValue('mesh_cni_plugin_log_buffered_bytes')) === 0 ? true : undefined,
      );
    } finally {
      s.destroy();
    }
  });

  it('holds at most the total budget across connections: the one that would go over is closed', async () => {
    const { address } = await start({ maxLineBytes: 4096, maxBufferedBytes: 10_000 });
    const before = await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'over_budget' });
    const socks: net.Socket[] = [];
    try {
      for (let i = 0; i < 6; i++) {
        const s = net.createConnection({ path: address });
        s.on('error', () => {});
        socks.push(s);
        await new Promise((r) => s.once('connect', r));
        s.write('p'.repeat(3000));
        await new Promise((r) => setTimeout(r, 30));
      }
      await waitFor('3 closed over the budget', async () =>
        (await metricValue('mesh_cni_plugin_log_connections_closed_total', { reason: 'over_budget' })) - before >= 3
          ? true
          : undefined,
      );
      assert.ok((await metricValue('mesh_cni_plugin_log_buffered_bytes')) <= 10_000);
      await send(address, '{"level":"info","msg":"whole lines need no budget"}\n');
      await waitFor('a whole line printed', () => cniLines().find((l) => l.includes('whole lines need no budget')));
    } finally {
      for (const s of socks) s.destroy();
    }
    await waitFor('nothing held', async () =>
      (await metricValue('mesh_cni_plugin_log_buffered_bytes')) === 0 ? true : undefined,
    );
  });

  it('reads no faster than its rate limit, pausing every connection, and loses no line', async () => {
    const { address } = await start({ maxBytesPerSecond: 256 * 1024 });
    const before = await metricValue('mesh_cni_plugin_log_read_pauses_total');
    const line = JSON.stringify({ level: 'info', msg: 'paced', pad: 'z'.repeat(4000) }) + '\n';
    const t0 = Date.now();
    await send(address, line.repeat(200)); // ~790 KiB: about three seconds at 256 KiB/s
    await waitFor('200 paced lines', () =>
      cniLines().filter((l) => l.includes('\tpaced\t')).length === 200 ? true : undefined,
    );
    assert.ok((await metricValue('mesh_cni_plugin_log_read_pauses_total')) - before >= 2);
    // A lower bound only (a busy machine makes it longer): the rate held, whatever the chunk size
    // (the 64 KiB reads are paid for after they are read, so the last one's pause comes after).
    assert.ok(Date.now() - t0 >= 2_000, `790 KiB read in ${Date.now() - t0} ms at 256 KiB/s`);
  });

  it('serves a plugin run while flooding connections use up the read rate', async () => {
    const { address, c } = await start();
    const linesBefore = await metricValue('mesh_cni_plugin_log_lines_received_total');
    // The flood comes from another process, as it would: in this one it would share our event loop.
    const flooder = spawn(
      process.execPath,
      [
        '-e',
        `
      const net = require('node:net');
      const junk = Buffer.from('{not json}\\n'.repeat(20000));
      for (let i = 0; i < 24; i++) {
        const s = net.createConnection(${JSON.stringify(address)});
        s.on('error', () => {});
        const pump = () => { while (!s.destroyed) if (!s.write(junk)) return void s.once('drain', pump); };
        s.once('connect', pump);
      }`,
      ],
      { stdio: 'ignore' },
    );
    try {
      // The flood under way, and every flooding connection read from once (none is new any more).
      await waitFor(
        'the flood under way',
        async () => {
          const waiting = (c.status() as { waitingToRead?: { new: number } }).waitingToRead;
          return (await metricValue('mesh_cni_plugin_log_lines_received_total')) - linesBefore >= 100_000 &&
            (waiting?.new ?? 0) === 0
            ? true
            : undefined;
        },
        30_000,
      );
      for (let run = 0; run < 3; run++) {
        const client = new UdsLog(
          address,
          'info',
          { command: 'ADD', containerID: `c${run}`, pod: { namespace: 'shop', name: `cart-${run}` } },
          'none',
        );
        client.info(`plugin run ${run} in the flood`);
        await client.flush(2000);
        await waitFor(
          `plugin run ${run}'s record`,
          () => cniLines().find((l) => l.includes(`plugin run ${run} in the flood`)),
          5_000,
        );
      }
    } finally {
      flooder.kill('SIGKILL');
      await new Promise((r) =>
        flooder.exitCode !== null || flooder.signalCode !== null ? r(undefined) : flooder.once('exit', r),
      );
    }
  });

  it('replaces a stale socket left by a killed agent', async () => {
    const { address, start: startIt } = setup();
    // Python binds and exits without unlinking: exactly what a SIGKILLed agent leaves behind.
    const py = spawnSync('/usr/bin/python3', [
      '-c',
      `import os,socket;os.makedirs(os.path.dirname(${JSON.stringify(address)}),exist_ok=True);socket.socket(socket.AF_UNIX).bind(${JSON.stringify(address)})`,
    ]);
    assert.equal(py.status, 0, String(py.stderr));
    assert.ok(lstatSync(address).isSocket());
    running.push(await startIt());
    await send(address, '{"level":"info","msg":"after restart"}\n');
    await waitFor('a line on the new socket', () => cniLines().find((l) => l.includes('after restart')));
  });

  it('refuses to remove something that is not a socket', async () => {
    const { address, start: startIt } = setup();
    spawnSync('mkdir', ['-p', path.dirname(address)]);
    writeFileSync(address, 'precious');
    await assert.rejects(
      startIt(),
      /cannot serve plugin logs on .*log\.sock: it exists and is not a socket; remove it or choose another --log-uds-address/,
    );
    assert.equal(readFileSync(address, 'utf8'), 'precious');
  });

  it('is off when --log-uds-address is empty', async () => {
    const c = await startPluginLogServer(buildSettings({ 'log-uds-address': '' }, {}).install.logUdsAddress);
    assert.deepEqual(c.status(), { enabled: false });
  });
});

describe('line splitter', () => {
  const split = (max: number, chunks: string[]) => {
    const out: string[] = [];
    const s = new LineSplitter(
      max,
      (l) => out.push(l.toString()),
      () => out.push('<oversized>'),
    );
    for (const c of chunks) s.push(Buffer.from(c));
    s.end();
    return out;
  };
  const cases: [string, number, string[], string[]][] = [
    ['lines across chunks', 10, ['ab', 'c\nde', 'f\n'], ['abc', 'def']],
    ['a line of exactly the limit', 3, ['abc\n'], ['abc']],
    ['one over the limit, in one chunk', 3, ['abcd\nok\n'], ['<oversized>', 'ok']],
    ['over the limit across chunks, reported once', 3, ['ab', 'cd', 'efgh', 'ij\nok'], ['<oversized>', 'ok']],
    ['a last line without newline', 10, ['a\nb'], ['a', 'b']],
    ['empty lines', 10, ['\n\n'], ['', '']],
  ];
  for (const [name, max, chunks, want] of cases) it(name, () => assert.deepEqual(split(max, chunks), want));
});

describe('plugin record parsing', () => {
  it('maps levels, times and pods, and keeps the rest of the fields', () => {
    const r = parsePluginLine(
      '{"level":"WARNING","message":"m","time":1767322800000,"pod":"ns/p","scope":"evil","__proto__":{"x":1},"a":[1]}',
    );
    assert.deepEqual(r, {
      ok: true,
      entry: { level: 'warn', msg: 'm', time: '2026-01-02T03:00:00.000Z', fields: { pod: 'ns/p', a: [1] } },
    });
    const odd = parsePluginLine('{"level":"loud","msg":"m","time":"yesterday"}');
    assert.deepEqual(odd, {
      ok: true,
      entry: { level: 'info', msg: 'm', time: undefined, fields: { plugin_level: 'loud' } },
    });
    assert.deepEqual(parsePluginLine('{"msg":5}'), { ok: false, reason: 'invalid_record' });
    assert.deepEqual(parsePluginLine('null'), { ok: false, reason: 'invalid_record' });
    assert.deepEqual(parsePluginLine('{'), { ok: false, reason: 'invalid_json' });
  });
});

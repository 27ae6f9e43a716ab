// The plugin's log when the agent is down: the real plugin (from source under Node, and the shipped
// executable) appends its records to plugin-log.jsonl beside the unreachable log socket, 0600,
// rotated once past 1 MiB by one of many concurrent runs with no torn line; a real agent log
// server started on that run dir prints them as replayed and removes the files. A link, another
// user's file or a FIFO planted at the file's path is refused by both sides without blocking, and
// a log socket the plugin refuses gets no file either.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  closeSync,
  openSync,
  renameSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import path from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import { rotate } from '../../cni-plugin/log/fallbackfile.ts';
import {
  PLUGIN_LOG_FILE_MAX_BYTES,
  PLUGIN_LOG_FILE_ROTATE_BYTES,
  pluginLogFiles,
  type PluginLogFiles,
} from '../../cni-plugin/shared/pluginlogfile.ts';
import type { Component } from '../../src/component.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { startPluginLogServer } from '../../src/monitoring/logserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns, type Run } from '../helpers/netns.ts';
import { captureSink } from '../helpers/observability.ts';
import { metricValue } from '../helpers/metrics.ts';
import { MESH_CNI_SOURCE, meshCni, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { waitFor } from '../helpers/poll.ts';

const NOBODY = 65534;
const SHIPPED = [path.join(ROOT, 'dist/bin/mesh-cni')];

interface Rec {
  readonly time: string;
  readonly level: string;
  readonly msg: string;
  readonly containerID: string;
}

/** Every line of `file` as a record: a torn or glued line fails here. */
function records(file: string): Rec[] {
  const text = readFileSync(file, 'utf8');
  assert.ok(text.endsWith('\n'), `${file} ends with a whole line`);
  return text
    .slice(0, -1)
    .split('\n')
    .map((l, i) => {
      try {
        return JSON.parse(l) as Rec;
      } catch {
        assert.fail(`${file} line ${i + 1} is not one JSON record: ${l.slice(0, 200)}`);
      }
    });
}

/** A record line as the plugin writes it, padded with `pad` characters. */
function recordLine(containerID: string, msg: string, pad = 0): string {
  return (
    JSON.stringify({
      time: '2026-01-02T03:04:05.678Z',
      level: 'info',
      msg,
      scope: 'cni',
      command: 'ADD',
      containerID,
      pod: { namespace: 'kube-system', name: 'filler' },
      ...(pad > 0 ? { pad: 'p'.repeat(pad) } : {}),
    }) + '\n'
  );
}

describe("the plugin's log file when the agent is down", () => {
  const tmp = tempDir();
  const defer = cleanupAfterEach();
  let ns: Netns;
  let n = 0;
  let sink: ReturnType<typeof captureSink>;
  before(() => {
    ns = new Netns('plog');
  });
  after(() => {
    ns.remove();
    tmp.remove();
  });
  beforeEach(() => {
    sink = captureSink();
    configureLogging(buildSettings({ log_output_level: 'cni:debug,monitoring:info' }, {}).logging, sink);
  });

  /** A run dir of the agent's kind (root's, 0750) with no agent: its socket and files. */
  function runDir(): { sock: string; files: PluginLogFiles } {
    const dir = path.join(tmp.dir, `run${++n}`, 'mesh-cni');
    mkdirSync(dir, { recursive: true, mode: 0o750 });
    const sock = path.join(dir, 'log.sock');
    return { sock, files: pluginLogFiles(sock)! };
  }

  /** A socket left by a killed agent: connecting is refused (ECONNREFUSED). */
  function staleSocket(sock: string): void {
    const r = spawnSync(process.execPath, [
      '-e',
      `require('node:net').createServer().listen(${JSON.stringify(sock)}, () => process.kill(process.pid, 'SIGKILL'))`,
    ]);
    assert.equal(r.signal, 'SIGKILL', r.stderr.toString());
    assert.ok(lstatSync(sock).isSocket());
  }

  /** An ADD of a pod in an excluded namespace: two records (info, debug), no rules. */
  async function add(sock: string, id: string, argv: readonly string[] = MESH_CNI_SOURCE): Promise<Run> {
    const r = await meshCni(
      'ADD',
      {
        containerId: id,
        netns: ns.path,
        ifname: 'eth0',
        args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns-${id};K8S_POD_UID=u-${id}`,
      },
      pluginConfig(
        { cniVersion: '1.0.0', orchconfig: path.join(tmp.dir, 'no-orchconfig'), logUds: sock },
        { cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '198.18.9.2/24', interface: 0 }] },
      ),
      argv,
    );
    assert.equal(r.code, 0, `ADD ${id} failed: ${r.stdout}${r.stderr}`);
    return r;
  }

  async function startAgent(sock: string): Promise<Component> {
    const c = await startPluginLogServer(buildSettings({ 'log-uds-address': sock }, {}).install.logUdsAddress);
    defer(() => c.stop('SIGTERM'));
    return c;
  }

  const replayDone = (c: Component) =>
    waitFor('the log files replayed', () => (c.status().replay as { done?: boolean } | undefined)?.done === true);

  for (const [from, argv] of [
    ['source', MESH_CNI_SOURCE],
    ['shipped', SHIPPED],
  ] as const) {
    it(`appends its records to plugin-log.jsonl beside the socket, 0600 root's, with no socket or a stale one (${from})`, async () => {
      const a = runDir();
      await add(a.sock, 'nosock', argv);
      const b = runDir();
      staleSocket(b.sock);
      await add(b.sock, 'stale', argv);
      for (const [files, id] of [
        [a.files, 'nosock'],
        [b.files, 'stale'],
      ] as const) {
        const st = lstatSync(files.current);
        assert.ok(st.isFile());
        assert.equal(st.mode & 0o7777, 0o600);
        assert.equal(st.uid, 0);
        const recs = records(files.current);
        assert.deepEqual(
          recs.map((r) => [r.level, r.containerID]),
          [
            ['info', id],
            ['debug', id],
          ],
        );
        assert.match(recs[0]!.msg, /excluded/);
        assert.equal(existsSync(files.rotated), false);
      }
    });
  }

  for (const [from, argv, runs] of [
    ['source', MESH_CNI_SOURCE, 24],
    ['shipped', SHIPPED, 64],
  ] as const) {
    it(`${runs} concurrent runs: rotated once past 1 MiB into .1, no line torn, no record lost (${from})`, async () => {
      const { sock, files } = runDir();
      // Just under the rotation size: the runs' own records take it over.
      const line = recordLine('filler', 'filler', 300);
      const fill = Math.floor((PLUGIN_LOG_FILE_ROTATE_BYTES - 2048) / line.length);
      writeFileSync(files.current, line.repeat(fill), { mode: 0o600 });
      const ids = Array.from({ length: runs }, (_, i) => `conc${i}`);
      await Promise.all(ids.map((id) => add(sock, id, argv)));
      assert.ok(existsSync(files.rotated), 'rotated into .1');
      const all = [...records(files.rotated), ...records(files.current)];
      assert.equal(all.filter((r) => r.containerID === 'filler').length, fill);
      for (const id of ids) assert.equal(all.filter((r) => r.containerID === id).length, 2, `both records of ${id}`);
      assert.equal(all.length, fill + 2 * ids.length);
      assert.ok(statSync(files.current).size < PLUGIN_LOG_FILE_ROTATE_BYTES);
      assert.equal(lstatSync(files.rotated).mode & 0o7777, 0o600);
      assert.equal(existsSync(files.claim), false, 'the rotation claim is released');
    });
  }

  it('a run still holding a file another run has rotated does not rotate the next one over .1', () => {
    const { files } = runDir();
    const line = recordLine('filler', 'filler', 300);
    writeFileSync(files.current, line.repeat(Math.ceil(PLUGIN_LOG_FILE_ROTATE_BYTES / line.length)), { mode: 0o600 });
    const fd = openSync(files.current, 'a');
    try {
      // Between this run's write and its rotation: another run rotates, and the next one writes.
      renameSync(files.current, files.rotated);
      writeFileSync(files.current, recordLine('next', 'the next run'), { mode: 0o600 });
      assert.equal(rotate(files, fd), null);
    } finally {
      closeSync(fd);
    }
    assert.ok(statSync(files.rotated).size >= PLUGIN_LOG_FILE_ROTATE_BYTES, 'the .1 just made is kept');
    assert.deepEqual(
      records(files.current).map((r) => r.containerID),
      ['next'],
    );
    assert.equal(existsSync(files.claim), false);
  });

  it('writes nothing past the hard cap while a rotation cannot happen (a claim left by a killed run)', async () => {
    const { sock, files } = runDir();
    const line = recordLine('filler', 'filler', 300);
    writeFileSync(files.current, line.repeat(Math.ceil(PLUGIN_LOG_FILE_MAX_BYTES / line.length)), { mode: 0o600 });
    writeFileSync(files.claim, '', { mode: 0o600 });
    const size = statSync(files.current).size;
    const r = await add(sock, 'full');
    assert.equal(statSync(files.current).size, size);
    assert.equal(existsSync(files.rotated), false);
    assert.match(r.stderr, /plugin-log\.jsonl.*full/);
  });

  it('the agent prints both files at start in scope cni, replayed with their time, counts them and removes the files', async () => {
    const { sock, files } = runDir();
    await add(sock, 'r1');
    await add(sock, 'r2');
    writeFileSync(
      files.rotated,
      recordLine('old1', 'older than the rest') +
        '{not json\n' +
        '{"level":"info"}\n' +
        JSON.stringify({ level: 'error', msg: 'x'.repeat(100 * 1024) }) +
        '\n' +
        JSON.stringify({
          level: 'warn',
          msg: 'says it is replayed',
          replayed: 'forged',
          time: '2026-01-02T03:04:06.000Z',
        }) +
        '\n',
      { mode: 0o600 },
    );
    const before = {
      replayed: await metricValue('mesh_cni_plugin_log_file_records_total', { result: 'replayed' }),
      json: await metricValue('mesh_cni_plugin_log_file_records_total', { result: 'invalid_json' }),
      rec: await metricValue('mesh_cni_plugin_log_file_records_total', { result: 'invalid_record' }),
      big: await metricValue('mesh_cni_plugin_log_file_records_total', { result: 'oversized' }),
      socket: await metricValue('mesh_cni_plugin_log_lines_received_total'),
    };
    const fromPlugin = records(files.current);
    const c = await startAgent(sock);
    await replayDone(c);
    assert.equal(existsSync(files.current), false);
    assert.equal(existsSync(files.rotated), false);
    const cni = sink.lines.filter((l) => l.split('\t')[2] === 'cni');
    assert.equal(cni.length, 6, sink.text());
    assert.equal(
      cni[0],
      '2026-01-02T03:04:05.678Z\tinfo\tcni\tolder than the rest\tpod=kube-system/filler containerID=old1 command=ADD replayed=true\n',
    );
    assert.match(cni[1]!, /^2026-01-02T03:04:06.000Z\twarn\tcni\tsays it is replayed\treplayed=true\n$/);
    for (const [i, rec] of fromPlugin.entries()) {
      const [time, level, , msg, fields] = cni[2 + i]!.split('\t');
      assert.deepEqual([time, level, msg], [rec.time, rec.level, rec.msg]);
      assert.match(
        fields!,
        new RegExp(`^pod=kube-system/dns-${rec.containerID} containerID=${rec.containerID} .*replayed=true\\n$`),
      );
    }
    const d = async (result: string, was: number) =>
      (await metricValue('mesh_cni_plugin_log_file_records_total', { result })) - was;
    assert.equal(await d('replayed', before.replayed), 6);
    assert.equal(await d('invalid_json', before.json), 1);
    assert.equal(await d('invalid_record', before.rec), 1);
    assert.equal(await d('oversized', before.big), 1);
    assert.equal(
      await metricValue('mesh_cni_plugin_log_lines_received_total'),
      before.socket,
      'not counted as socket lines',
    );
  });

  const plants = [
    [
      'a link to a root file',
      (f: string) => {
        const victim = path.join(path.dirname(path.dirname(f)), `victim-${n}`);
        writeFileSync(victim, 'precious\n', { mode: 0o600 });
        symlinkSync(victim, f);
        return () => {
          assert.ok(lstatSync(f).isSymbolicLink());
          assert.equal(readFileSync(victim, 'utf8'), 'precious\n');
        };
      },
    ],
    [
      "another user's file",
      (f: string) => {
        writeFileSync(f, recordLine('planted', 'planted by nobody'), { mode: 0o600 });
        chownSync(f, NOBODY, NOBODY);
        return () => {
          assert.equal(lstatSync(f).uid, NOBODY);
          assert.equal(readFileSync(f, 'utf8'), recordLine('planted', 'planted by nobody'));
        };
      },
    ],
    [
      'a FIFO',
      (f: string) => {
        const r = spawnSync('mkfifo', ['-m', '0600', f]);
        assert.equal(r.status, 0, r.stderr.toString());
        return () => assert.ok(lstatSync(f).isFIFO());
      },
    ],
  ] as const;

  for (const [what, plant] of plants) {
    it(`the plugin refuses ${what} at the file's path and its ADD still succeeds, unblocked`, async () => {
      const { sock, files } = runDir();
      const check = plant(files.current);
      const r = await add(sock, 'planted');
      check();
      assert.match(r.stderr, /plugin-log\.jsonl/);
    });

    it(`the agent refuses ${what} at the file's path: left in place, not printed, start not blocked`, async () => {
      const { sock, files } = runDir();
      const check = plant(files.current);
      const c = await startAgent(sock);
      await replayDone(c);
      check();
      assert.equal(sink.lines.filter((l) => l.split('\t')[2] === 'cni').length, 0, sink.text());
      assert.match(sink.text(), /\twarn\tmonitoring\t.*plugin-log\.jsonl/);
    });
  }

  it('a log socket the plugin refuses gets no file either', async () => {
    // A run dir another user can write: the socket may be theirs, and so may the file.
    const open = runDir();
    chmodSync(open.files.dir, 0o777);
    const r1 = await add(open.sock, 'opendir');
    assert.match(r1.stderr, /not sending logs/);
    assert.equal(existsSync(open.files.current), false);
    // A socket that is not root's in a dir of root's.
    const theirs = runDir();
    staleSocket(theirs.sock);
    chownSync(theirs.sock, NOBODY, NOBODY);
    const r2 = await add(theirs.sock, 'theirs');
    assert.match(r2.stderr, /not sending logs/);
    assert.equal(existsSync(theirs.files.current), false);
  });
});

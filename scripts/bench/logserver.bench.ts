// Plugin log socket throughput: records per second the agent's log server takes in (parsing each
// record and printing it in scope cni, output to /dev/null), the CPU it uses for that and its
// RSS meanwhile, against a baseline in the same run: a bare unix-socket server that only counts
// newlines. The server under test is pinned to one CPU (taskset), the load generator to another,
// so "records per second within one core" is what the table shows. The throughput rows lift
// the read rate limit (they measure parsing and printing); everything else runs at the defaults.
//
// Then floods (docs/design.md "Benchmark"), each against the same bare server: junk lines, endless
// oversized lines, and many slow connections each holding a partial line, on the log socket; a
// request followed by a flood of more requests and junk on every connection of the pod lookup
// socket. The table shows the server's peak RSS against the DaemonSet's 256 MiB memory limit, and
// whether a plugin run (one record on a fresh connection every 100 ms; one lookup for the lookup
// socket) was still served during the flood.
//
//   npm run bench -- logserver      (LOGSERVER_BENCH_SECONDS=n to change the 4 s per row)

import { fork, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { printTable } from './lib/table.ts';

interface Stats {
  readonly records: number;
  /** Plugin-run markers printed (agent) / lookups answered (lookup); the bare server cannot tell. */
  readonly served: number;
  readonly bytes: number;
  readonly cpuUs: number;
  readonly rss: number;
}

type Role = 'baseline' | 'agent-info' | 'agent-warn' | 'agent-flood' | 'lookup';
const MARKER = 'plugin run during the flood';
const LIMIT_MIB = 256;

// ---- server side (a child process) ----------------------------------------------------------

async function serve(role: Role, address: string): Promise<void> {
  let records: () => Promise<number>;
  let served: () => Promise<number> = async () => 0;
  let bytes: () => Promise<number>;
  if (role === 'baseline') {
    let n = 0;
    let b = 0;
    const server = net.createServer((s) => {
      s.on('data', (chunk: Buffer) => {
        b += chunk.length;
        for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      });
      s.on('error', () => {});
    });
    await new Promise<void>((resolve) => server.listen(address, resolve));
    records = async () => n;
    bytes = async () => b;
  } else if (role === 'lookup') {
    const { buildSettings } = await import('../../src/config/settings.ts');
    const { configureLogging } = await import('../../src/monitoring/logging.ts');
    const { startPodLookup } = await import('../../src/install/podlookup.ts');
    const { podLookupArgs } = await import('../../src/partargs.ts');
    const { registry } = await import('../../src/monitoring/metrics.ts');
    const { startTestApiServer } = await import('../../test/helpers/apiserver.ts');
    const { meshPod } = await import('../../test/helpers/plugin.ts');
    const api = await startTestApiServer();
    const pod = meshPod('shop', 'cart-1');
    const uid = api.upsertPod({ ...pod, spec: { ...pod.spec!, nodeName: 'node-1' } }).metadata?.uid;
    const orchconfig = api.writeOrchconfig(path.join(path.dirname(address), 'orchconfig'));
    const settings = buildSettings({ 'pod-lookup-uds-address': address, orchconfig }, { NODE_NAME: 'node-1' });
    configureLogging(settings.logging);
    const lookup = await startPodLookup(podLookupArgs(settings));
    while ((lookup.status() as { state?: string }).state !== 'watching') await new Promise((r) => setTimeout(r, 20));
    const metric = registry.getSingleMetric('mesh_cni_pod_lookups_total');
    records = async () => ((await metric?.get())?.values ?? []).reduce((sum, v) => sum + v.value, 0);
    served = async () => ((await metric?.get())?.values ?? []).find((v) => v.labels.result === 'hit')?.value ?? 0;
    bytes = async () => 0;
    process.send?.({ uid });
  } else {
    const { buildSettings } = await import('../../src/config/settings.ts');
    const { configureLogging } = await import('../../src/monitoring/logging.ts');
    const { startPluginLogServer, DEFAULT_LIMITS } = await import('../../src/monitoring/logserver.ts');
    const { registry } = await import('../../src/monitoring/metrics.ts');
    const settings = buildSettings(
      {
        'log-uds-address': address,
        log_output_level: role === 'agent-warn' ? 'default:info,cni:warn' : 'default:info,cni:info',
      },
      {},
    );
    configureLogging(settings.logging);
    // Throughput rows measure parsing and printing: no read rate limit. Floods run the defaults.
    await startPluginLogServer(
      settings.install.logUdsAddress,
      role === 'agent-flood' ? DEFAULT_LIMITS : { ...DEFAULT_LIMITS, maxBytesPerSecond: Number.MAX_SAFE_INTEGER },
    );
    const metric = registry.getSingleMetric('mesh_cni_plugin_log_lines_received_total');
    const read = registry.getSingleMetric('mesh_cni_plugin_log_received_bytes_total');
    records = async () => (await metric?.get())?.values[0]?.value ?? 0;
    bytes = async () => (await read?.get())?.values[0]?.value ?? 0;
    if (role === 'agent-flood') {
      // The marker records are counted as the agent prints them: wrap its stdout.
      let markers = 0;
      const write = process.stdout.write.bind(process.stdout) as (chunk: string) => boolean;
      process.stdout.write = ((chunk: string) => {
        if (typeof chunk === 'string' && chunk.includes(MARKER)) markers++;
        return write(chunk);
      }) as typeof process.stdout.write;
      served = async () => markers;
    }
  }
  process.on('message', async (m: string) => {
    if (m === 'stats') {
      const cpu = process.cpuUsage();
      process.send?.({
        records: await records(),
        served: await served(),
        bytes: await bytes(),
        cpuUs: cpu.user + cpu.system,
        rss: process.memoryUsage.rss(),
      } satisfies Stats);
    }
    if (m === 'exit') process.exit(0);
  });
  process.send?.('ready');
}

// ---- load side (this process) ---------------------------------------------------------------

function record(i: number): string {
  return (
    JSON.stringify({
      time: new Date().toISOString(),
      level: 'info',
      msg: 'applied redirect rules',
      scope: 'cni',
      command: 'ADD',
      containerID: 'f3c9d0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d',
      pod: { namespace: 'shop', name: `cart-${i % 1000}` },
      rules: 12,
      elapsedMs: 3,
    }) + '\n'
  );
}

function startServer(role: Role, address: string, cpu: number): Promise<{ child: ChildProcess; uid: string }> {
  const devnull = openSync('/dev/null', 'w');
  const self = fileURLToPath(import.meta.url);
  const child = fork(self, ['--serve', role, address], {
    stdio: ['ignore', devnull, 'inherit', 'ipc'],
    execArgv: [],
  });
  spawnSync('taskset', ['-p', '-c', String(cpu), String(child.pid)], { stdio: 'ignore' });
  let uid = '';
  return new Promise((resolve, reject) => {
    const onMessage = (m: unknown) => {
      if (m && typeof m === 'object' && 'uid' in m) uid = String((m as { uid: string }).uid);
      if (m !== 'ready') return;
      child.off('message', onMessage);
      resolve({ child, uid });
    };
    child.on('message', onMessage);
    child.once('exit', (code) => reject(new Error(`${role} server exited ${code}`)));
  });
}

function stats(child: ChildProcess): Promise<Stats> {
  return new Promise((resolve) => {
    child.once('message', (m) => resolve(m as Stats));
    child.send('stats');
  });
}

/** Long-lived connections writing batches as fast as the server reads them. */
async function floodLong(address: string, until: number, conns: number): Promise<number> {
  const batch = Buffer.from(Array.from({ length: 500 }, (_, i) => record(i)).join(''));
  let sent = 0;
  await Promise.all(
    Array.from(
      { length: conns },
      () =>
        new Promise<void>((resolve) => {
          const s = net.createConnection({ path: address });
          const pump = () => {
            while (Date.now() < until) {
              sent += 500;
              if (!s.write(batch)) return void s.once('drain', pump);
            }
            s.end();
            resolve();
          };
          s.on('connect', pump);
          s.on('error', () => resolve());
        }),
    ),
  );
  return sent;
}

/** One connection per plugin run, five records each, as the runtime does per pod. */
async function floodShort(address: string, until: number, parallel: number): Promise<number> {
  const run = Buffer.from(Array.from({ length: 5 }, (_, i) => record(i)).join(''));
  let sent = 0;
  const worker = async () => {
    while (Date.now() < until) {
      await new Promise<void>((resolve) => {
        const s = net.createConnection({ path: address }, () => s.end(run));
        s.on('close', () => resolve());
        s.on('error', () => resolve());
        s.resume();
      });
      sent += 5;
    }
  };
  await Promise.all(Array.from({ length: parallel }, worker));
  return sent;
}

// ---- floods -----------------------------------------------------------------------------------

type Flood = 'junk' | 'oversized' | 'slow' | 'lookup-junk';

const FLOODS: Record<Flood, { readonly what: string; readonly conns: number }> = {
  junk: { what: 'junk lines (not JSON, not records, 8 KiB noise)', conns: 64 },
  oversized: { what: '1 MiB writes, never a newline', conns: 256 },
  slow: { what: '60 KiB partial line, then a byte a second', conns: 1024 },
  'lookup-junk': { what: 'a request, then 1 MiB of requests and junk', conns: 64 },
};

function junkBatch(): Buffer {
  const noise = 'x'.repeat(8 * 1024);
  const lines = Array.from(
    { length: 200 },
    (_, i) =>
      [`{not json ${i}`, `[${i},${i}]`, `{"level":"info","nomsg":${i}}`, `\u0000\u00ff garbage ${i}`, noise][i % 5],
  );
  return Buffer.from(lines.join('\n') + '\n');
}

/** Keeps `conns` connections doing `work` until `until`, reconnecting whenever the server closes one. */
async function keep(
  address: string,
  until: number,
  conns: number,
  work: (s: net.Socket, done: () => void) => void,
): Promise<number> {
  let sent = 0;
  const one = () =>
    new Promise<void>((resolve) => {
      const s = net.createConnection({ path: address });
      let over = false;
      const done = () => {
        if (over) return;
        over = true;
        sent += s.bytesWritten;
        s.destroy();
        resolve();
      };
      s.on('error', done);
      s.on('close', done);
      s.resume();
      s.on('connect', () => work(s, done));
    });
  await Promise.all(
    Array.from({ length: conns }, async () => {
      while (Date.now() < until) await one();
    }),
  );
  return sent;
}

function flood(kind: Flood, address: string, until: number, conns: number): Promise<number> {
  const stopAt = (s: net.Socket, done: () => void) => setTimeout(done, Math.max(0, until - Date.now())).unref();
  if (kind === 'junk' || kind === 'oversized') {
    const batch = kind === 'junk' ? junkBatch() : Buffer.alloc(1024 * 1024, 'a');
    return keep(address, until, conns, (s, done) => {
      stopAt(s, done);
      const pump = () => {
        while (!s.destroyed && Date.now() < until) if (!s.write(batch)) return void s.once('drain', pump);
      };
      pump();
    });
  }
  if (kind === 'slow') {
    const partial = Buffer.alloc(60 * 1024, 'p');
    return keep(address, until, conns, (s, done) => {
      stopAt(s, done);
      s.write(partial);
      const drip = setInterval(() => (s.destroyed ? clearInterval(drip) : s.write('p')), 1000);
      s.once('close', () => clearInterval(drip));
    });
  }
  // Its first request names a pod the node does not have (so 'served' counts only the plugin's).
  const first = JSON.stringify({ namespace: 'shop', name: 'flood', uid: 'flood-uid' }) + '\n';
  const junk = Buffer.concat([Buffer.from(first), ...Array.from({ length: 16 }, () => junkBatch())]);
  const more = Buffer.from(
    Array.from({ length: 2000 }, (_, i) => JSON.stringify({ namespace: 'shop', name: `no-${i}`, uid: `u${i}` })).join(
      '\n',
    ) + '\n',
  );
  return keep(address, until, conns, (s, done) => {
    stopAt(s, done);
    const pump = () => {
      for (let i = 0; !s.destroyed && i < 16; i++)
        if (!s.write(i === 0 ? junk : more)) return void s.once('drain', pump);
    };
    pump();
  });
}

/** What the plugin does meanwhile: one run every 100 ms on a fresh connection. */
function pluginRuns(kind: Flood, address: string, until: number, lookupRequest: string): Promise<number> {
  let runs = 0;
  return new Promise((resolve) => {
    const tick = setInterval(() => {
      if (Date.now() >= until) {
        clearInterval(tick);
        return resolve(runs);
      }
      runs++;
      const s = net.createConnection({ path: address }, () => {
        if (kind === 'lookup-junk') s.write(lookupRequest);
        else
          s.end(
            JSON.stringify({
              time: new Date().toISOString(),
              level: 'info',
              msg: MARKER,
              command: 'ADD',
              containerID: 'c',
              pod: { namespace: 'shop', name: `run-${runs}` },
            }) + '\n',
          );
      });
      s.on('error', () => {});
      s.resume();
      s.setTimeout(2000, () => s.destroy());
    }, 100);
  });
}

interface Row {
  server: string;
  workload: string;
  perSec: number;
  cpuPct: number;
  perCpuSec: number;
  rssMiB: number;
}

interface FloodRow {
  server: string;
  flood: string;
  sentMiBs: number;
  readMiBs: number;
  cpuPct: number;
  rssMiB: number;
  served: string;
}

async function sample<T>(
  child: ChildProcess,
  run: () => Promise<T>,
): Promise<{ result: T; s0: Stats; s1: Stats; maxRss: number; elapsed: number }> {
  const s0 = await stats(child);
  const t0 = process.hrtime.bigint();
  let maxRss = s0.rss;
  const sampler = setInterval(() => void stats(child).then((s) => (maxRss = Math.max(maxRss, s.rss))), 100);
  const result = await run();
  clearInterval(sampler);
  await new Promise((r) => setTimeout(r, 300));
  const s1 = await stats(child);
  return { result, s0, s1, maxRss: Math.max(maxRss, s1.rss), elapsed: Number(process.hrtime.bigint() - t0) / 1e9 };
}

async function withServer<T>(
  role: Role,
  address: string,
  serverCpu: number,
  loadCpu: number,
  body: (child: ChildProcess, uid: string) => Promise<T>,
): Promise<T> {
  const { child, uid } = await startServer(role, address, serverCpu);
  child.setMaxListeners(0);
  spawnSync('taskset', ['-p', '-c', String(loadCpu), String(process.pid)], { stdio: 'ignore' });
  try {
    return await body(child, uid);
  } finally {
    child.send('exit');
    await new Promise((r) => child.once('exit', r));
  }
}

async function measure(
  role: Role,
  workload: 'long' | 'short',
  seconds: number,
  dir: string,
  serverCpu: number,
  loadCpu: number,
): Promise<Row> {
  const address = path.join(dir, `${role}-${workload}.sock`);
  return withServer(role, address, serverCpu, loadCpu, async (child) => {
    const until = Date.now() + seconds * 1000;
    const { s0, s1, maxRss, elapsed } = await sample(child, () =>
      workload === 'long' ? floodLong(address, until, 4) : floodShort(address, until, 16),
    );
    const records = s1.records - s0.records;
    const cpuSec = (s1.cpuUs - s0.cpuUs) / 1e6;
    return {
      server:
        role === 'baseline'
          ? 'bare net server (count newlines)'
          : `agent log server, cni:${role === 'agent-info' ? 'info (printed)' : 'warn (parsed, filtered)'}`,
      workload: workload === 'long' ? '4 long connections' : '16 x connection per 5 records',
      perSec: records / elapsed,
      cpuPct: (cpuSec / elapsed) * 100,
      perCpuSec: records / cpuSec,
      rssMiB: maxRss / 1048576,
    };
  });
}

async function measureFlood(
  role: Role,
  kind: Flood,
  seconds: number,
  dir: string,
  serverCpu: number,
  loadCpu: number,
): Promise<FloodRow> {
  const address = path.join(dir, `${role}-${kind}`, 'flood.sock');
  mkdirSync(path.dirname(address), { recursive: true });
  return withServer(role, address, serverCpu, loadCpu, async (child, uid) => {
    const until = Date.now() + seconds * 1000;
    const lookupRequest = JSON.stringify({ namespace: 'shop', name: 'cart-1', uid }) + '\n';
    const { conns, what } = FLOODS[kind];
    const { result, s0, s1, maxRss, elapsed } = await sample(child, () =>
      Promise.all([flood(kind, address, until, conns), pluginRuns(kind, address, until, lookupRequest)]),
    );
    const [sent, runs] = result;
    const cpuSec = (s1.cpuUs - s0.cpuUs) / 1e6;
    const served = s1.served - s0.served;
    return {
      server:
        role === 'baseline'
          ? 'bare net server (count newlines)'
          : role === 'lookup'
            ? 'agent pod lookup socket'
            : 'agent log server, defaults',
      flood: `${conns} x ${what}`,
      sentMiBs: sent / 1048576 / elapsed,
      readMiBs: role === 'lookup' ? Number.NaN : (s1.bytes - s0.bytes) / 1048576 / elapsed,
      cpuPct: (cpuSec / elapsed) * 100,
      rssMiB: maxRss / 1048576,
      served: role === 'baseline' ? 'n/a' : `${served}/${runs}`,
    };
  });
}

async function main(): Promise<void> {
  const seconds = Number(process.env.LOGSERVER_BENCH_SECONDS ?? 4);
  const cpus = os.availableParallelism();
  const serverCpu = 0;
  const loadCpu = cpus > 1 ? 1 : 0;
  const hasTaskset = spawnSync('taskset', ['-V'], { stdio: 'ignore' }).status === 0;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-obs-bench-'));
  const rows: Row[] = [];
  const floods: FloodRow[] = [];
  try {
    for (const workload of ['long', 'short'] as const) {
      for (const role of ['baseline', 'agent-info', 'agent-warn'] as const)
        rows.push(await measure(role, workload, seconds, dir, serverCpu, loadCpu));
    }
    for (const kind of ['junk', 'oversized', 'slow'] as const) {
      for (const role of ['baseline', 'agent-flood'] as const)
        floods.push(await measureFlood(role, kind, seconds, dir, serverCpu, loadCpu));
    }
    for (const role of ['baseline', 'lookup'] as const)
      floods.push(await measureFlood(role, 'lookup-junk', seconds, dir, serverCpu, loadCpu));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(
    `plugin log records (${Buffer.byteLength(record(0))} B each), ${seconds} s a row; server pinned to CPU ${serverCpu}, load to CPU ${loadCpu}${hasTaskset ? '' : ' (taskset missing: not pinned)'}; ${cpus} CPUs, Node ${process.version}`,
  );
  printTable(
    ['server', 'workload', 'records/s', 'server CPU %', 'records per CPU-s', 'server RSS MiB', 'vs baseline'],
    rows.map((r) => {
      const base = rows.find((b) => b.workload === r.workload && b.server.startsWith('bare'));
      return [
        r.server,
        r.workload,
        r.perSec.toFixed(0),
        r.cpuPct.toFixed(0),
        r.perCpuSec.toFixed(0),
        r.rssMiB.toFixed(1),
        base ? `${((r.perSec / base.perSec) * 100).toFixed(0)} %` : '',
      ];
    }),
    2,
  );
  console.log(
    `\nfloods, ${seconds} s a row, with a plugin run every 100 ms on a fresh connection (served: its record printed, or its lookup answered from the watch); DaemonSet memory limit ${LIMIT_MIB} MiB`,
  );
  printTable(
    [
      'server',
      'flood',
      'sent MiB/s',
      'read MiB/s',
      'server CPU %',
      'peak RSS MiB',
      `under ${LIMIT_MIB} MiB`,
      'plugin runs served',
    ],
    floods.map((r) => [
      r.server,
      r.flood,
      r.sentMiBs.toFixed(0),
      Number.isNaN(r.readMiBs) ? '' : r.readMiBs.toFixed(1),
      r.cpuPct.toFixed(0),
      r.rssMiB.toFixed(1),
      r.rssMiB < LIMIT_MIB ? 'yes' : 'NO',
      r.served,
    ]),
    2,
  );
}

if (process.argv[2] === '--serve') await serve(process.argv[3] as Role, process.argv[4] as string);
else await main();

// Plugin log socket throughput: records per second the agent's log server takes in (parsing each
// record and printing it in scope cni, output to /dev/null), the CPU it uses for that and its
// RSS meanwhile, against a baseline in the same run: a bare unix-socket server that only counts
// newlines. The server under test is pinned to one CPU (taskset), the load generator to another,
// so "records per second within one core" is what the table shows.
//
//   npm run bench -- logserver      (LOGSERVER_BENCH_SECONDS=n to change the 4 s per row)

import { fork, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

interface Stats {
  readonly records: number;
  readonly cpuUs: number;
  readonly rss: number;
}

type Role = 'baseline' | 'agent-info' | 'agent-warn';

// ---- server side (a child process) ----------------------------------------------------------

async function serve(role: Role, address: string): Promise<void> {
  let records: () => Promise<number>;
  if (role === 'baseline') {
    let n = 0;
    const server = net.createServer((s) => {
      s.on('data', (chunk: Buffer) => {
        for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) n++;
      });
      s.on('error', () => {});
    });
    await new Promise<void>((resolve) => server.listen(address, resolve));
    records = async () => n;
  } else {
    const { buildSettings } = await import('../../src/config/settings.ts');
    const { configureLogging } = await import('../../src/monitoring/logging.ts');
    const { startPluginLogServer } = await import('../../src/monitoring/logserver.ts');
    const { registry } = await import('../../src/monitoring/metrics.ts');
    const settings = buildSettings({ 'log-uds-address': address, log_output_level: role === 'agent-info' ? 'default:info,cni:info' : 'default:info,cni:warn' }, {});
    configureLogging(settings.logging);
    await startPluginLogServer(settings);
    const metric = registry.getSingleMetric('mesh_cni_plugin_log_lines_received_total');
    records = async () => (await metric?.get())?.values[0]?.value ?? 0;
  }
  process.on('message', async (m: string) => {
    if (m === 'stats') {
      const n = await records();
      const cpu = process.cpuUsage();
      process.send?.({ records: n, cpuUs: cpu.user + cpu.system, rss: process.memoryUsage.rss() } satisfies Stats);
    }
    if (m === 'exit') process.exit(0);
  });
  process.send?.('ready');
}

// ---- load side (this process) ---------------------------------------------------------------

function record(i: number): string {
  return JSON.stringify({
    time: new Date().toISOString(), level: 'info', msg: 'applied redirect rules', scope: 'cni', command: 'ADD',
    containerID: 'f3c9d0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d', pod: { namespace: 'shop', name: `cart-${i % 1000}` },
    rules: 12, elapsedMs: 3,
  }) + '\n';
}

function startServer(role: Role, address: string, cpu: number): Promise<ChildProcess> {
  const devnull = openSync('/dev/null', 'w');
  const self = fileURLToPath(import.meta.url);
  const child = fork(self, ['--serve', role, address], {
    stdio: ['ignore', devnull, 'inherit', 'ipc'],
    execArgv: [],
  });
  spawnSync('taskset', ['-p', '-c', String(cpu), String(child.pid)], { stdio: 'ignore' });
  return new Promise((resolve, reject) => {
    child.once('message', (m) => (m === 'ready' ? resolve(child) : reject(new Error(`unexpected ${String(m)}`))));
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
  await Promise.all(Array.from({ length: conns }, () => new Promise<void>((resolve) => {
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
  })));
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

interface Row {
  server: string;
  workload: string;
  perSec: number;
  cpuPct: number;
  perCpuSec: number;
  rssMiB: number;
}

async function measure(role: Role, workload: 'long' | 'short', seconds: number, dir: string, serverCpu: number, loadCpu: number): Promise<Row> {
  const address = path.join(dir, `${role}-${workload}.sock`);
  const child = await startServer(role, address, serverCpu);
  spawnSync('taskset', ['-p', '-c', String(loadCpu), String(process.pid)], { stdio: 'ignore' });
  try {
    const s0 = await stats(child);
    const t0 = process.hrtime.bigint();
    let maxRss = s0.rss;
    const sampler = setInterval(() => void stats(child).then((s) => (maxRss = Math.max(maxRss, s.rss))), 250);
    const until = Date.now() + seconds * 1000;
    if (workload === 'long') await floodLong(address, until, 4);
    else await floodShort(address, until, 16);
    clearInterval(sampler);
    await new Promise((r) => setTimeout(r, 300));
    const s1 = await stats(child);
    const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
    const records = s1.records - s0.records;
    const cpuSec = (s1.cpuUs - s0.cpuUs) / 1e6;
    return {
      server: role === 'baseline' ? 'bare net server (count newlines)' : `agent log server, cni:${role === 'agent-info' ? 'info (printed)' : 'warn (parsed, filtered)'}`,
      workload: workload === 'long' ? '4 long connections' : '16 x connection per 5 records',
      perSec: records / elapsed,
      cpuPct: (cpuSec / elapsed) * 100,
      perCpuSec: records / cpuSec,
      rssMiB: Math.max(maxRss, s1.rss) / 1048576,
    };
  } finally {
    child.send('exit');
    await new Promise((r) => child.once('exit', r));
  }
}

async function main(): Promise<void> {
  const seconds = Number(process.env.LOGSERVER_BENCH_SECONDS ?? 4);
  const cpus = os.availableParallelism();
  const serverCpu = 0;
  const loadCpu = cpus > 1 ? 1 : 0;
  const hasTaskset = spawnSync('taskset', ['-V'], { stdio: 'ignore' }).status === 0;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-obs-bench-'));
  const rows: Row[] = [];
  try {
    for (const workload of ['long', 'short'] as const) {
      for (const role of ['baseline', 'agent-info', 'agent-warn'] as const) rows.push(await measure(role, workload, seconds, dir, serverCpu, loadCpu));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(`plugin log records (${Buffer.byteLength(record(0))} B each), ${seconds} s a row; server pinned to CPU ${serverCpu}, load to CPU ${loadCpu}${hasTaskset ? '' : ' (taskset missing: not pinned)'}; ${cpus} CPUs, Node ${process.version}`);
  const header = ['server', 'workload', 'records/s', 'server CPU %', 'records per CPU-s', 'server RSS MiB', 'vs baseline'];
  const table = rows.map((r) => {
    const base = rows.find((b) => b.workload === r.workload && b.server.startsWith('bare'));
    return [r.server, r.workload, r.perSec.toFixed(0), r.cpuPct.toFixed(0), r.perCpuSec.toFixed(0), r.rssMiB.toFixed(1), base ? `${((r.perSec / base.perSec) * 100).toFixed(0)} %` : ''];
  });
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i]!.length)));
  const fmt = (cells: string[]) => cells.map((c, i) => (i < 2 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ');
  console.log(fmt(header));
  console.log(widths.map((w) => '-'.repeat(w)).join('-|-'));
  for (const row of table) console.log(fmt(row));
}

if (process.argv[2] === '--serve') await serve(process.argv[3] as Role, process.argv[4] as string);
else await main();

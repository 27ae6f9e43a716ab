// Repair benchmark: the real install-cni agent (repair in label mode, default --repair-qps/burst/
// concurrency) against the test API server, and in the same run a naive baseline that lists every
// second and labels everything at once. Measures:
//   burst    PODS broken pods appear on the node at once: time until all are labelled, requests
//            sent, label patches (exactly once = PODS), peak RSS of the agent process
//   reaction REACTIONS times, one pod's status turns broken: time until its label patch arrives
//   idle     RSS with WATCHED pods watched
//   in-place INPLACE_PODS broken pods that run (netns + a process in a kubelet-shaped cgroup,
//            test/helpers/kubepods.ts): time until the agent repaired them all in place
//            (--repair-repair-pods) and its CPU time (/proc/<pid>/stat, its own and its
//            children's: nsenter, iptables, the proof), against the same agent deleting the same
//            pods (--repair-delete-pods); the floor is one pod's iptables-save + iptables-restore +
//            mesh-validation in its netns, run alone, and our cost beyond it is printed too
//
//   npm run bench -- repair            (PODS=1000 REACTIONS=200 WATCHED=250 INPLACE_PODS=100)
//   PARTS=inplace npm run bench -- repair   only the in-place table (PARTS=label: only the first)
//
// Both contenders run as esbuild bundles made with the options of dist/install-cni.js (the shipped
// form, scripts/bundle-options.ts): running the TypeScript sources through Node's type stripping would add ~50 MB of RSS
// that no node ever sees.

import * as esbuild from 'esbuild';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import os, { availableParallelism } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startTestApiServer, type TestApiServer } from '../../test/helpers/apiserver.ts';
import { bundleOptions } from '../bundle-options.ts';
import { brokenPod, testPod } from '../../test/helpers/pods.ts';
import { waitFor } from '../../test/helpers/poll.ts';
import { scratchAgentFlags } from '../../test/helpers/agent.ts';
import { createServer } from 'node:net';
import { detectFlavour } from '../../cni-plugin/netns/iptables.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../cni-plugin/redirect/spec.ts';
import { makeNetnsPods, type NetnsPods } from '../../test/helpers/kubepods.ts';
import { RusageDriver } from './lib/rusage.ts';
import { printTable } from './lib/table.ts';

const PODS = Number(process.env.PODS ?? 1000);
const REACTIONS = Number(process.env.REACTIONS ?? 200);
const WATCHED = Number(process.env.WATCHED ?? 250);
const INPLACE_PODS = Number(process.env.INPLACE_PODS ?? 100);
const PARTS = (process.env.PARTS ?? 'label,inplace').split(',');
const LABEL = 'cni.mesh.io/uninitialized';
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');

interface Contender {
  readonly name: string;
  start(server: TestApiServer, dir: string): ChildProcess;
}

const bundleDir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-bundle-'));
process.once('exit', () => rmSync(bundleDir, { recursive: true, force: true }));
async function bundle(entry: string, name: string): Promise<string> {
  const outfile = path.join(bundleDir, `${name}.mjs`);
  await esbuild.build({
    ...bundleOptions('esm', { version: 'bench', gitCommit: 'bench', buildTime: new Date().toISOString() }),
    entryPoints: [entry],
    outfile,
  });
  return outfile;
}
const agentJs = await bundle(path.join(root, 'src/cmd/install-cni-main.ts'), 'install-cni');
const pollerJs = await bundle(path.join(here, 'lib', 'repair-poller.ts'), 'repair-poller');
// In-place repair proves each repair with mesh-validation.cjs, which the agent finds beside its
// bundle (as in the image); it is the built one (npm run build).
const validationCjs = path.join(root, 'dist', 'mesh-validation.cjs');
if (PARTS.includes('inplace')) {
  if (!existsSync(validationCjs)) throw new Error(`${validationCjs} is missing: run npm run build first`);
  copyFileSync(validationCjs, path.join(bundleDir, 'mesh-validation.cjs'));
}

const agent: Contender = {
  name: 'mesh-cni repair (watch, qps 200/burst 400/concurrency 16)',
  start(server, dir) {
    const kc = server.writeOrchconfig(path.join(dir, 'kc.json'));
    return spawn(
      process.execPath,
      [
        '--no-deprecation',
        agentJs,
        '--repair-enabled',
        '--repair-label-pods',
        '--repair-node-name',
        'node-a',
        ...scratchAgentFlags(dir, kc),
        '--log_output_level',
        'all:none',
      ],
      { stdio: ['ignore', 'ignore', 'inherit'], env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } },
    );
  },
};

const poller: Contender = {
  name: 'baseline: list every 1 s, label all at once',
  start(server, dir) {
    const kc = server.writeOrchconfig(path.join(dir, 'kc.json'));
    return spawn(process.execPath, ['--no-deprecation', pollerJs, kc, 'node-a'], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  },
};

function procKb(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const until = (what: string, pred: () => boolean, timeoutMs: number, everyMs = 5) =>
  waitFor(what, pred, { timeoutMs, everyMs });

/** Waits for the agent's first pod list, then 1.5 s for its start-up to settle before measuring. */
async function listedAndSettled(server: TestApiServer): Promise<void> {
  await until(
    'the first pod list',
    () => server.requests.some((r) => r.method === 'GET' && r.path === '/api/v1/pods' && r.status === 200),
    20_000,
  );
  await sleep(1500);
}

/** Starts a contender against a fresh server holding `pods`, waits until it has listed them. */
async function launch(c: Contender, pods: number) {
  const server = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  for (let i = 0; i < pods; i++) server.upsertPod(testPod(`idle-${i}`, { initExitCode: 0 }));
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-bench-'));
  for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(dir, d));
  const child = c.start(server, dir);
  await listedAndSettled(server);
  return {
    server,
    child,
    async close() {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('close', r));
      await server.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function burst(c: Contender) {
  const run = await launch(c, 0);
  const before = run.server.requests.length;
  const t0 = performance.now();
  for (let i = 0; i < PODS; i++) run.server.upsertPod(brokenPod(`burst-${i}`));
  // Counted from the request log, not by reading the store: cloning 1000 pods every few ms would
  // starve the API server, which shares this process.
  let seen = before;
  const labelled = new Set<string>();
  const done = () => {
    const reqs = run.server.requests;
    for (; seen < reqs.length; seen++)
      if (reqs[seen]!.method === 'PATCH' && reqs[seen]!.status === 200) labelled.add(reqs[seen]!.path);
    return labelled.size >= PODS;
  };
  await until(`all ${PODS} labelled`, done, 60_000, 10);
  const ms = performance.now() - t0;
  await sleep(1500);
  const reqs = run.server.requests.slice(before);
  const patches = reqs.filter((r) => r.method === 'PATCH').length;
  const unlabelled = run.server.listPods().filter((p) => p.metadata?.labels?.[LABEL] !== 'true').length;
  if (unlabelled > 0) throw new Error(`${unlabelled} pods are not labelled`);
  const hwm = procKb(run.child.pid!, 'VmHWM');
  await run.close();
  return { ms, requests: reqs.length, patches, peakRssMb: hwm / 1024 };
}

async function reaction(c: Contender, n: number) {
  const run = await launch(c, 0);
  const lat: number[] = [];
  for (let i = 0; i < n; i++) {
    const name = `react-${i}`;
    run.server.upsertPod(testPod(name));
    await sleep(5 + Math.random() * 20);
    const t0 = performance.now();
    run.server.upsertPod(brokenPod(name));
    // The agent labels through pods/status, the baseline patches the pod itself.
    await until(
      `${name} labelled`,
      () =>
        run.server.requests.some(
          (r) => r.method === 'PATCH' && (r.path.endsWith(`/${name}`) || r.path.endsWith(`/${name}/status`)),
        ),
      10_000,
      1,
    );
    lat.push(performance.now() - t0);
  }
  await run.close();
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]!;
  return { p50: q(0.5), p99: q(0.99), n };
}

async function idle(c: Contender) {
  const run = await launch(c, WATCHED);
  await sleep(3000);
  const rss = procKb(run.child.pid!, 'VmRSS') / 1024;
  await run.close();
  return { rssMb: rss };
}

if (PARTS.includes('label')) {
  const rows: string[][] = [];
  for (const c of [agent, poller]) {
    const b = await burst(c);
    // The baseline's reaction is its 1 s poll period; 30 samples show it without 200 s of waiting.
    const r = await reaction(c, c === agent ? REACTIONS : Math.min(REACTIONS, 30));
    const i = await idle(c);
    rows.push([
      c.name,
      `${(b.ms / 1000).toFixed(2)} s`,
      String(b.requests),
      `${b.patches}/${PODS}`,
      `${b.peakRssMb.toFixed(1)} MB`,
      `${r.p50.toFixed(1)} ms (n=${r.n})`,
      `${r.p99.toFixed(1)} ms`,
      `${i.rssMb.toFixed(1)} MB`,
    ]);
  }
  printTable(
    [
      'contender',
      `${PODS} broken: all handled`,
      'requests',
      'label patches',
      'peak RSS',
      'reaction p50',
      'reaction p99',
      `RSS, ${WATCHED} pods watched`,
    ],
    rows,
  );
  console.log(
    `targets: all ${PODS} handled exactly once in <= 5 s, reaction p99 <= 100 ms, RSS with ${WATCHED} pods <= 80 MB`,
  );
}

// --- in place ------------------------------------------------------------------------------

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** CPU ms of a process: its own (user+sys) and its waited-for children's (cutime+cstime). */
function cpuMs(pid: number): { self: number; children: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // f[0] is field 3 (state): utime 14, stime 15, cutime 16, cstime 17.
  const t = (i: number) => (Number(f[i - 3]) * 1000) / CLK_TCK;
  return { self: t(14) + t(15), children: t(16) + t(17) };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject).listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function metricsOf(port: number): Promise<string> {
  try {
    return await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  } catch {
    return '';
  }
}

const sampleOf = (body: string, re: RegExp) => Number(re.exec(body)?.[1] ?? 0);
const REPAIRED_IN_PLACE =
  /^mesh_cni_repair_pods_repaired_total\{[^}]*type="repair"[^}]*result="success"[^}]*\} (\S+)$/m;

type InPlaceMode = 'in place' | 'delete';

async function inPlaceRun(mode: InPlaceMode, fleet: NetnsPods) {
  const server = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-bench-'));
  for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(dir, d));
  const kc = server.writeOrchconfig(path.join(dir, 'kc.json'));
  const port = await freePort();
  const rmDir = () => rmSync(dir, { recursive: true, force: true });
  process.once('exit', rmDir);
  const child = spawn(
    process.execPath,
    [
      '--no-deprecation',
      agentJs,
      '--repair-enabled',
      ...(mode === 'in place'
        ? ['--repair-repair-pods', '--host-proc-dir', '/proc', '--host-netns-path', '/proc/self/ns/net']
        : ['--repair-delete-pods']),
      '--repair-node-name',
      'node-a',
      ...scratchAgentFlags(dir, kc).filter(
        (_, i, a) => a[i] !== '--monitoring-port' && a[i - 1] !== '--monitoring-port',
      ),
      '--monitoring-port',
      String(port),
      '--log_output_level',
      'all:none',
    ],
    { stdio: ['ignore', 'ignore', 'inherit'], env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } },
  );
  // Interrupted (the fleet's handlers re-raise the signal): the agent goes too.
  const killAgent = () => child.kill('SIGKILL');
  process.once('exit', killAgent);
  try {
    await listedAndSettled(server);
    const before = server.requests.length;
    const cpu0 = cpuMs(child.pid!);
    const t0 = performance.now();
    for (const p of fleet.pods) {
      const pod = brokenPod(p.name, { where: 'lastState' });
      server.upsertPod({
        ...pod,
        metadata: { ...pod.metadata, uid: p.uid },
        status: { ...pod.status, podIP: p.ip, podIPs: [{ ip: p.ip }] },
      });
    }
    const n = fleet.pods.length;
    if (mode === 'in place') {
      let last = '';
      await waitFor(
        `all ${n} repaired in place`,
        async () => {
          last = await metricsOf(port);
          return sampleOf(last, REPAIRED_IN_PLACE) >= n;
        },
        {
          timeoutMs: 180_000,
          everyMs: 100,
          context: () =>
            last
              .split('\n')
              .filter((l) => l.startsWith('mesh_cni_repair_'))
              .join('\n'),
        },
      );
    } else {
      let seen = before;
      const deleted = new Set<string>();
      await until(
        `all ${n} deleted`,
        () => {
          const reqs = server.requests;
          for (; seen < reqs.length; seen++)
            if (reqs[seen]!.method === 'DELETE' && reqs[seen]!.status === 200) deleted.add(reqs[seen]!.path);
          return deleted.size >= n;
        },
        60_000,
        10,
      );
    }
    const ms = performance.now() - t0;
    const cpu1 = cpuMs(child.pid!);
    await sleep(500);
    return {
      ms,
      selfMs: cpu1.self - cpu0.self,
      childrenMs: cpu1.children - cpu0.children,
      requests: server.requests.length - before,
    };
  } finally {
    process.off('exit', killAgent);
    process.off('exit', rmDir);
    child.kill('SIGTERM');
    if (child.exitCode === null) await new Promise((r) => child.once('close', r));
    await server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

function which(exe: string): string {
  const r = spawnSync('sh', ['-c', `command -v ${exe}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${exe} is not on the PATH`);
  return r.stdout.trim();
}

/** One pod's unavoidable work, alone: read its rules, write ours, prove them; in fresh netns. */
async function inPlaceFloor(rounds: number) {
  const fleet = makeNetnsPods(`mcni-rbf-${process.pid}`, rounds, '198.18.65');
  const driver = new RusageDriver();
  try {
    const { flavour } = await detectFlavour();
    const env = { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' };
    const per: { wallMs: number; cpuMs: number }[] = [];
    for (const p of fleet.pods) {
      const pod = brokenPod(p.name);
      const doc = buildFamilyRules(specForPod(pod), 4).restore;
      // The driver spawns without a PATH search: absolute paths (nsenter itself searches the PATH).
      const enter = [which('nsenter'), `--net=${p.netnsPath}`, '--'];
      const steps = [
        { argv: [...enter, `iptables-${flavour}-save`], env },
        { argv: [...enter, `iptables-${flavour}-restore`, '--noflush', '-w', '5'], env, input: doc },
        { argv: [...enter, process.execPath, validationCjs], env },
      ];
      let wallMs = 0;
      let cpu = 0;
      for (const s of steps) {
        const r = await driver.run({ argv: s.argv.map(String), env: s.env, ...(s.input ? { input: s.input } : {}) });
        if (r.code !== 0) throw new Error(`floor step ${s.argv.join(' ')} failed (${r.code}): ${r.stderr}`);
        wallMs += r.wallMs;
        cpu += r.userMs + r.sysMs;
      }
      per.push({ wallMs, cpuMs: cpu });
    }
    const mean = (k: 'wallMs' | 'cpuMs') => per.reduce((a, x) => a + x[k], 0) / per.length;
    return { wallMs: mean('wallMs'), cpuMs: mean('cpuMs'), flavour, rounds };
  } finally {
    driver.close();
    fleet.remove();
  }
}

if (PARTS.includes('inplace')) {
  const floor = await inPlaceFloor(10);
  const results: { mode: InPlaceMode; r: Awaited<ReturnType<typeof inPlaceRun>> }[] = [];
  for (const mode of ['in place', 'delete'] as const) {
    // A fresh fleet for each: in-place leaves its rules in the netns it repaired.
    const fleet = makeNetnsPods(`mcni-rb-${process.pid}`, INPLACE_PODS, '198.18.64');
    try {
      results.push({ mode, r: await inPlaceRun(mode, fleet) });
    } finally {
      fleet.remove();
    }
  }
  const n = INPLACE_PODS;
  // The floor's wall time for n pods, 16 at once: at least ceil(n / 16) pods one after the other,
  // and at least their CPU spread over this machine's CPUs (16 at once do not fit on 2 CPUs).
  const cpus = availableParallelism();
  const floorWallS = Math.max(Math.ceil(n / 16) * floor.wallMs, (n * floor.cpuMs) / cpus) / 1000;
  const rows = results.map(({ mode, r }) => [
    mode === 'in place'
      ? 'mesh-cni repair in place (--repair-repair-pods, concurrency 16)'
      : 'mesh-cni repair delete (--repair-delete-pods), same pods',
    `${(r.ms / 1000).toFixed(2)} s`,
    `${r.selfMs.toFixed(0)} ms`,
    `${r.childrenMs.toFixed(0)} ms`,
    `${((r.selfMs + r.childrenMs) / n).toFixed(1)} ms`,
    String(r.requests),
  ]);
  rows.push([
    `floor: ${floor.flavour} save + restore + mesh-validation per pod, alone (mean of ${floor.rounds})`,
    `>= ${floorWallS.toFixed(2)} s (${floor.wallMs.toFixed(0)} ms a pod; 16 at once, ${cpus} CPUs)`,
    '-',
    `${(floor.cpuMs * n).toFixed(0)} ms`,
    `${floor.cpuMs.toFixed(1)} ms`,
    '0',
  ]);
  printTable(
    ['contender', `${n} broken: all handled`, 'agent CPU', 'its children CPU', 'CPU per pod', 'API requests'],
    rows,
  );
  const ip = results.find((x) => x.mode === 'in place')!.r;
  const beyond = (ip.selfMs + ip.childrenMs) / n - floor.cpuMs;
  console.log(
    `in place beyond the floor: ${beyond.toFixed(1)} ms CPU per pod ` +
      `(${((beyond / floor.cpuMs) * 100).toFixed(0)}% of the floor); ` +
      `wall ${(ip.ms / 1000).toFixed(2)} s against the floor's ${floorWallS.toFixed(2)} s`,
  );
}
await rm(bundleDir, { recursive: true, force: true });

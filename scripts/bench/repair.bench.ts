// Repair benchmark: the real install-cni agent (repair in label mode, default --repair-qps/burst/
// concurrency) against the test API server, and in the same run a naive baseline that lists every
// second and labels everything at once. Measures:
//   burst    PODS broken pods appear on the node at once: time until all are labelled, requests
//            sent, label patches (exactly once = PODS), peak RSS of the agent process
//   reaction REACTIONS times, one pod's status turns broken: time until its label patch arrives
//   idle     RSS with WATCHED pods watched
//
//   npm run bench -- repair            (PODS=1000 REACTIONS=200 WATCHED=250 by default)
//
// Both contenders run as esbuild bundles made with the options of dist/install-cni.js (the shipped
// form, scripts/bundle-options.ts): running the TypeScript sources through Node's type stripping would add ~50 MB of RSS
// that no node ever sees.

import * as esbuild from 'esbuild';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startTestApiServer, type TestApiServer } from '../../test/helpers/apiserver.ts';
import { bundleOptions } from '../bundle-options.ts';
import { brokenPod, testPod } from '../../test/helpers/pods.ts';
import { waitFor } from '../../test/helpers/poll.ts';
import { scratchAgentFlags } from '../../test/helpers/agent.ts';

const PODS = Number(process.env.PODS ?? 1000);
const REACTIONS = Number(process.env.REACTIONS ?? 200);
const WATCHED = Number(process.env.WATCHED ?? 250);
const LABEL = 'cni.mesh.io/uninitialized';
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');

interface Contender {
  readonly name: string;
  start(server: TestApiServer, dir: string): ChildProcess;
}

const bundleDir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-bundle-'));
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

/** Starts a contender against a fresh server holding `pods`, waits until it has listed them. */
async function launch(c: Contender, pods: number) {
  const server = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  for (let i = 0; i < pods; i++) server.upsertPod(testPod(`idle-${i}`, { initExitCode: 0 }));
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-repair-bench-'));
  for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(dir, d));
  const child = c.start(server, dir);
  await until(
    'the first pod list',
    () => server.requests.some((r) => r.method === 'GET' && r.path === '/api/v1/pods' && r.status === 200),
    20_000,
  );
  await sleep(1500);
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
const head = [
  'contender',
  `${PODS} broken: all handled`,
  'requests',
  'label patches',
  'peak RSS',
  'reaction p50',
  'reaction p99',
  `RSS, ${WATCHED} pods watched`,
];
const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i]!)).join(' | ');
console.log(line(head));
console.log(widths.map((w) => '-'.repeat(w)).join('-|-'));
for (const r of rows) console.log(line(r));
await rm(bundleDir, { recursive: true, force: true });
console.log(
  `targets: all ${PODS} handled exactly once in <= 5 s, reaction p99 <= 100 ms, RSS with ${WATCHED} pods <= 80 MB`,
);

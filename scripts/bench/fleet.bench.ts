// Fleet benchmark (docs/design.md "Fleet scale"): what the agents of a 5,000-node cluster cost the
// API server.
//
// The cluster: the test API server (HTTPS, this process) holds NODES x PODS_PER_NODE pods
// (5,000 x 30 = 150,000) and counts, per request, the objects the real server would read
// (test/helpers/apiserver.ts RequestRecord.objectsRead): a consistent list = every pod of the
// cluster (etcd has no index by node), a resourceVersion=0 list or a watch-list = the node's pods
// (the watch cache's spec.nodeName index), a GET = one.
//
// The agents: AGENTS real agents (the pod source, the repair controller and the pod lookup on one
// node watch, wired as src/agent.ts does, each with its own settings, orchconfig, rate limiter
// and lookup socket) in a child process, for AGENTS nodes picked at random among the 5,000. Every
// figure is per agent, or a fleet rate scaled by NODES / AGENTS: each agent's timing is drawn
// independently (jitter, spread), so the sample's histogram is the fleet's, thinned.
//
// Old against new in the same run: old = --orch-list-mode=consistent (today's paginated
// consistent list, limit=500, no resourceVersion), no client-side rate limit and no re-watch
// spread or start jitter (today's re-watch: about 1 s); new = the defaults. Scenarios, each on a
// fresh fleet of the same nodes:
//   start       every agent starts at once (a rollout's worst case, a mass restart)
//   steady      IDLE_S seconds with nothing changing; a watch renewal costs what a re-watch after
//               a cut costs; renewals an hour = 3600 / the mean timeoutSeconds the agents asked;
//               the plugin token's refresh at 50-80 % of its 1 h lifetime (tokenrequest.ts) adds
//               3600 / (0.65 h) = 1.54 (the bench's agents mint none: they run no installer)
//   restart     the API server stops and starts again (every connection, every watch cut):
//               requests/s across the fleet in the first 30 s, the peak second, the spread
//   compaction  every watch gets 410 Gone
//   rss         one real agent process (bundled as shipped) with 30 and with 250 pods on its node,
//               this tree against a baseline tree (BASE, git archive)
//
//   npm run bench -- fleet        (AGENTS=500 NODES=5000 PODS_PER_NODE=30 IDLE_S=20 by default)

import * as esbuild from 'esbuild';
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1Pod } from '@kubernetes/client-node';
import { startTestApiServer, type RequestRecord, type TestApiServer } from '../../test/helpers/apiserver.ts';
import { waitFor } from '../../test/helpers/poll.ts';
import { scratchAgentFlags } from '../../test/helpers/agent.ts';
import { bundleOptions } from '../bundle-options.ts';

const AGENTS = Number(process.env.AGENTS ?? 500);
const NODES = Number(process.env.NODES ?? 5000);
const PODS_PER_NODE = Number(process.env.PODS_PER_NODE ?? 30);
const IDLE_S = Number(process.env.IDLE_S ?? 20);
const QPS = 1;
const BURST = 10;
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Mode = 'old' | 'new';

// ---------------------------------------------------------------- the fleet (child process)

interface FleetArgs {
  readonly url: string;
  readonly caPem: string;
  readonly token: string;
  readonly nodes: readonly string[];
  readonly mode: Mode;
  readonly dir: string;
}

async function runFleet(a: FleetArgs): Promise<void> {
  const { buildSettings } = await import('../../src/config/settings.ts');
  const { configureLogging } = await import('../../src/monitoring/logging.ts');
  const { clientNodeApi } = await import('../../src/orch/api.ts');
  const { orchKubeConfig } = await import('../../src/orch/client.ts');
  const { nodePodSource } = await import('../../src/orch/podsource.ts');
  const { orchContext } = await import('../../src/orch/ratelimit.ts');
  const { startRepair } = await import('../../src/repair/index.ts');
  const { orchClientArgs, podLookupArgs, repairArgs } = await import('../../src/partargs.ts');
  const { DEFAULT_POD_LOOKUP, startPodLookup } = await import('../../src/install/podlookup.ts');
  configureLogging(buildSettings({ log_output_level: 'all:none' }, {}).logging);
  const caData = Buffer.from(a.caPem).toString('base64');
  const kubeconfig = (file: string) => {
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        'current-context': 'c',
        clusters: [{ name: 'c', cluster: { server: a.url, 'certificate-authority-data': caData } }],
        users: [{ name: 'u', user: { token: a.token } }],
        contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
      }),
      { mode: 0o600 },
    );
    return file;
  };
  const agents = a.nodes.map((node, i) => {
    const flags = {
      orchconfig: kubeconfig(path.join(a.dir, `kc-${i}.json`)),
      'repair-enabled': true,
      'repair-label-pods': true,
      'pod-lookup-uds-address': path.join(a.dir, `l${i}.sock`),
      ...(a.mode === 'old'
        ? { 'orch-list-mode': 'consistent', 'orch-qps': '10000', 'orch-burst': '100000' }
        : { 'orch-qps': String(QPS), 'orch-burst': String(BURST) }),
    };
    const built = buildSettings(flags, { NODE_NAME: node });
    // Today's re-watch timing for the old fleet (no spread, no start jitter); the settings object
    // is frozen, so a copy with that one part replaced.
    const today = { ...built.orch, reconnectSpreadMs: 0, startJitterMs: 0 };
    const settings = a.mode === 'old' ? { ...built, orch: today } : built;
    return { node, settings };
  });
  const running: { stop(): Promise<void> }[] = [];
  const t0 = Date.now();
  const synced: number[] = [];
  const watches = await Promise.all(
    agents.map(async ({ settings }) => {
      // As src/agent.ts: the node's watch once, repair and the lookup reading it.
      const kc = orchKubeConfig(orchClientArgs(settings));
      const api = clientNodeApi(kc, orchContext(settings.orch));
      const watch = nodePodSource(api, settings.env.nodeName, 'repair');
      watch.start();
      const repair = startRepair(repairArgs(settings), watch, api);
      const lookup = await startPodLookup(podLookupArgs(settings), DEFAULT_POD_LOOKUP, watch);
      running.push({ stop: () => lookup.stop('SIGTERM') });
      running.push({ stop: () => repair.stop('SIGTERM') }, { stop: () => watch.stop() });
      void watch.synced.then(() => synced.push(Date.now() - t0));
      return { watch, limiter: orchContext(settings.orch).limiter };
    }),
  );
  process.on('message', (m: { cmd: string }) => {
    if (m.cmd === 'status') {
      process.send!({
        synced: [...synced],
        agents: watches.map(({ watch, limiter }) => ({ ...watch.status(), delayed: limiter?.stats.delayed ?? 0 })),
      });
    } else if (m.cmd === 'stop') {
      void Promise.all(running.map((r) => r.stop())).then(() => process.exit(0));
    }
  });
  process.send!({ ready: true });
}

// ---------------------------------------------------------------- the bench (this process)

interface FleetStatus {
  readonly synced: number[];
  readonly agents: { state: string; lists: number; listMode: string; delayed: number }[];
}

class Fleet {
  readonly #child: ChildProcess;
  constructor(child: ChildProcess) {
    this.#child = child;
  }
  static async start(server: TestApiServer, nodes: readonly string[], mode: Mode, dir: string): Promise<Fleet> {
    const args: FleetArgs = { url: server.url, caPem: server.caPem, token: server.token, nodes, mode, dir };
    const env = { ...process.env, FLEET_ARGS: JSON.stringify(args) };
    const stdio = ['ignore', 'inherit', 'inherit', 'ipc'] as const;
    const child = fork(fileURLToPath(import.meta.url), ['--fleet'], { env, stdio: [...stdio] });
    await new Promise<void>((resolve, reject) => {
      child.once('message', () => resolve());
      child.once('exit', (code) => reject(new Error(`fleet exited with ${code}`)));
    });
    return new Fleet(child);
  }
  status(): Promise<FleetStatus> {
    return new Promise((resolve) => {
      this.#child.once('message', (m) => resolve(m as FleetStatus));
      this.#child.send({ cmd: 'status' });
    });
  }
  async stop(): Promise<void> {
    const exited = new Promise((r) => this.#child.once('exit', r));
    this.#child.send({ cmd: 'stop' });
    await Promise.race([exited, sleep(10_000)]);
    this.#child.kill('SIGKILL');
  }
}

const q = (r: RequestRecord) => new URLSearchParams(r.query);
const isPods = (r: RequestRecord) => r.method === 'GET' && r.path === '/api/v1/pods';
const isWatch = (r: RequestRecord) => q(r).get('watch') === 'true';
const isConsistentList = (r: RequestRecord) => isPods(r) && !isWatch(r) && (q(r).get('resourceVersion') ?? '') === '';
const nodeOf = (r: RequestRecord) => /spec\.nodeName=([^,&]+)/.exec(decodeURIComponent(r.query))?.[1] ?? '';

interface Window {
  readonly requests: number;
  readonly objects: number;
  readonly consistent: number;
  /** Requests per second across the fleet (scaled), 1 s buckets from the window's start. */
  readonly perSecond: number[];
  /** Seconds from the window's start to each agent's first request in it. */
  readonly firstBy: number[];
  /** Agents whose requests exceeded their token bucket (burst + qps * t) anywhere. */
  readonly overLimit: number;
}

function window(server: TestApiServer, from: number, to: number): Window {
  const reqs = server.requests.filter((r) => r.time >= from && r.time < to && isPods(r));
  const scale = NODES / AGENTS;
  const perSecond: number[] = [];
  for (const r of reqs) {
    const s = Math.floor((r.time - from) / 1000);
    perSecond[s] = (perSecond[s] ?? 0) + scale;
  }
  for (let i = 0; i < perSecond.length; i++) perSecond[i] ??= 0;
  const byNode = new Map<string, number[]>();
  for (const r of reqs) byNode.set(nodeOf(r), [...(byNode.get(nodeOf(r)) ?? []), r.time]);
  let overLimit = 0;
  for (const times of byNode.values()) {
    times.sort((x, y) => x - y);
    let over = false;
    for (let i = 0; i < times.length && !over; i++) {
      // +1: the request that takes the last token is allowed, and the server's clock is ms.
      for (let j = i; j < times.length; j++) {
        if (j - i + 1 > BURST + QPS * ((times[j]! - times[i]!) / 1000) + 1) over = true;
      }
    }
    if (over) overLimit++;
  }
  return {
    requests: reqs.length,
    objects: reqs.reduce((n, r) => n + (r.objectsRead ?? 0), 0),
    consistent: reqs.filter(isConsistentList).length,
    perSecond,
    firstBy: [...byNode.values()].map((t) => (t[0]! - from) / 1000).sort((x, y) => x - y),
    overLimit,
  };
}

const pctl = (xs: readonly number[], p: number) =>
  xs.length === 0 ? NaN : xs[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;

interface Result {
  readonly start: Window & { readySeconds: { p50: number; max: number } };
  readonly steady: { idleRequests: number; meanTimeoutS: number; perRenewal: number; perNodeHour: number };
  readonly restart: Window;
  readonly compaction: Window;
}

async function scenario(server: TestApiServer, nodes: readonly string[], mode: Mode, dir: string): Promise<Result> {
  const waitSynced = async (fleet: Fleet, since: (s: FleetStatus) => boolean, what: string) => {
    let last: FleetStatus | undefined;
    await waitFor(what, async () => since((last = await fleet.status())), { timeoutMs: 300_000, everyMs: 500 });
    return last!;
  };
  // start
  const t0 = Date.now();
  const fleet = await Fleet.start(server, nodes, mode, dir);
  const watching = (s: FleetStatus) => s.agents.every((a) => a.state === 'watching');
  const st = await waitSynced(fleet, (s) => s.synced.length === nodes.length && watching(s), 'every agent synced');
  await sleep(2000);
  const ready = [...st.synced].sort((x, y) => x - y);
  const readySeconds = { p50: pctl(ready, 0.5) / 1000, max: ready.at(-1)! / 1000 };
  const start = { ...window(server, t0, Date.now()), readySeconds };
  // steady: nothing changes for IDLE_S seconds
  const i0 = Date.now();
  await sleep(IDLE_S * 1000);
  const idle = window(server, i0, Date.now());
  // restart: every connection and watch cut
  const r0 = Date.now();
  await server.stop();
  await server.start();
  await sleep(35_000);
  await waitSynced(fleet, watching, 'every agent watching again');
  const restart = window(server, r0, r0 + 30_000);
  // compaction: every watch gets 410
  const c0 = Date.now();
  const listsBefore = (await fleet.status()).agents.reduce((n, a) => n + a.lists, 0);
  server.expireResourceVersions();
  const lists = (s: FleetStatus) => s.agents.reduce((n, a) => n + a.lists, 0);
  const reread = (s: FleetStatus) => lists(s) >= listsBefore + nodes.length && watching(s);
  await waitSynced(fleet, reread, 'every agent read the state again');
  await sleep(Math.max(0, 30_000 - (Date.now() - c0)));
  const compaction = window(server, c0, c0 + 30_000);
  await fleet.stop();
  const asked = server.requests
    .filter((r) => r.time >= t0 && isPods(r) && isWatch(r))
    .map((r) => Number(q(r).get('timeoutSeconds') ?? 0))
    .filter((n) => n > 0);
  const meanTimeoutS = asked.reduce((x, y) => x + y, 0) / asked.length;
  const perRenewal = restart.requests / nodes.length;
  // At rest: what the idle window sent, a renewal per mean timeout, the token refresh at 0.65 h.
  const perNodeHour = (idle.requests / nodes.length) * (3600 / IDLE_S) + (3600 / meanTimeoutS) * perRenewal + 1 / 0.65;
  return { start, steady: { idleRequests: idle.requests, meanTimeoutS, perRenewal, perNodeHour }, restart, compaction };
}

// ---------------------------------------------------------------- RSS of one agent process

function procKb(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

/** The agent bundle of the tree at `rev` ('' = this working tree), made as dist/install-cni.js is. */
async function agentBundle(rev: string, out: string): Promise<string> {
  let src = root;
  if (rev) {
    src = path.join(out, `tree-${rev.slice(0, 8)}`);
    mkdirSync(src, { recursive: true });
    execFileSync('sh', ['-c', `git -C '${root}' archive '${rev}' | tar -x -C '${src}'`]);
    symlinkSync(path.join(root, 'node_modules'), path.join(src, 'node_modules'));
  }
  const outfile = path.join(out, `agent-${rev ? rev.slice(0, 8) : 'now'}.mjs`);
  const options = bundleOptions('esm', { version: 'bench', gitCommit: 'bench', buildTime: new Date().toISOString() });
  const entryPoints = [path.join(src, 'src/cmd/install-cni-main.ts')];
  await esbuild.build({ ...options, entryPoints, outfile, absWorkingDir: src, logLevel: 'error' });
  return outfile;
}

async function agentRss(bundle: string, pods: number): Promise<number> {
  const server = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  for (let i = 0; i < pods; i++) server.upsertPod(benchPod(`rss-${i}`, 'node-a'));
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-fleet-rss-'));
  for (const d of ['net.d', 'bin', 'src']) await mkdir(path.join(dir, d));
  const kc = server.writeOrchconfig(path.join(dir, 'kc.json'));
  const child = spawn(
    process.execPath,
    [
      '--no-deprecation',
      bundle,
      '--repair-enabled',
      '--repair-label-pods',
      ...scratchAgentFlags(dir, kc),
      '--log_output_level',
      'all:none',
    ],
    {
      stdio: ['ignore', 'ignore', 'inherit'],
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', NODE_NAME: 'node-a', POD_NAMESPACE: 'mesh-system' },
    },
  );
  try {
    const watchingNow = () => server.requests.some((r) => isPods(r) && isWatch(r) && r.status === 200);
    await waitFor('the agent watching', watchingNow, { timeoutMs: 30_000, everyMs: 20 });
    await sleep(4000);
    return procKb(child.pid!, 'VmRSS') / 1024;
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('close', r));
    await server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

function benchPod(name: string, node: string): V1Pod {
  return {
    metadata: {
      name,
      namespace: `ns-${name.length % 7}`,
      labels: { app: name.replace(/-\d+$/, '') },
      annotations: { 'sidecar.mesh.io/status': '{}' },
    },
    spec: { nodeName: node, containers: [{ name: 'app', image: 'registry.example/app:1' }] },
    status: { phase: 'Running' },
  };
}

/** Today's agent for the RSS baseline: the commit before our own watch stream (apiWatch) came in. */
function baseRev(): string {
  const env = process.env.BASE;
  if (env) return env;
  const log = ['-C', root, 'log', '--format=%H', '--reverse', '-S', 'export async function apiWatch'];
  log.push('--', 'src/orch/request.ts');
  const first = execFileSync('git', log, { encoding: 'utf8' }).split('\n')[0];
  return execFileSync('git', ['-C', root, 'rev-parse', first ? `${first}^` : 'HEAD'], { encoding: 'utf8' }).trim();
}

async function main(): Promise<void> {
  console.log(
    `fleet: ${NODES} nodes x ${PODS_PER_NODE} pods = ${NODES * PODS_PER_NODE} pods; ` +
      `${AGENTS} real agents on ${AGENTS} of the nodes; fleet rates x ${NODES / AGENTS}`,
  );
  const server = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  const t = Date.now();
  for (let n = 0; n < NODES; n++) {
    for (let p = 0; p < PODS_PER_NODE; p++) server.upsertPod(benchPod(`p${n}-${p}`, `node-${n}`));
  }
  console.log(`  ${NODES * PODS_PER_NODE} pods stored in ${((Date.now() - t) / 1000).toFixed(1)} s`);
  const picked = [...Array(NODES).keys()]
    .sort(() => Math.random() - 0.5)
    .slice(0, AGENTS)
    .map((n) => `node-${n}`);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-fleet-'));
  const results: Partial<Record<Mode, Result>> = {};
  try {
    for (const mode of ['old', 'new'] as const) {
      console.log(`  running the ${mode} fleet ...`);
      results[mode] = await scenario(server, picked, mode, dir);
    }
  } finally {
    await server.close();
  }
  const rssDir = await mkdtemp(path.join(os.tmpdir(), 'mcni-fleet-bundle-'));
  const rss: Record<Mode, number[]> = { old: [], new: [] };
  try {
    const bundles = { old: await agentBundle(baseRev(), rssDir), new: await agentBundle('', rssDir) };
    // The median of 3 runs each, interleaved: one process's RSS varies by a few MiB from run to run.
    for (const pods of [30, 250]) {
      const runs: Record<Mode, number[]> = { old: [], new: [] };
      for (let i = 0; i < 3; i++) {
        for (const mode of ['old', 'new'] as const) runs[mode].push(await agentRss(bundles[mode], pods));
      }
      for (const mode of ['old', 'new'] as const) rss[mode].push(runs[mode].sort((x, y) => x - y)[1]!);
    }
  } finally {
    await rm(rssDir, { recursive: true, force: true });
    await rm(dir, { recursive: true, force: true });
  }
  const scale = NODES / AGENTS;
  const per = (w: Window) => (w.requests / AGENTS).toFixed(2);
  const obj = (w: Window) => Math.round(w.objects / AGENTS).toLocaleString('en');
  const peak = (w: Window) => Math.round(Math.max(...w.perSecond)).toLocaleString('en');
  const avg30 = (w: Window) => Math.round((w.requests * scale) / 30).toLocaleString('en');
  const at = (w: Window) => {
    const [p5, p95, max] = [pctl(w.firstBy, 0.05), pctl(w.firstBy, 0.95), w.firstBy.at(-1) ?? NaN];
    return `${p5.toFixed(1)}-${p95.toFixed(1)} s (max ${max.toFixed(1)})`;
  };
  const secs = (x: number) => x.toFixed(1);
  const fleetObjects = (w: Window) => Math.round(w.objects * scale).toLocaleString('en');
  const rssOf = (m: Mode) => `${rss[m][0]!.toFixed(1)} / ${rss[m][1]!.toFixed(1)} MiB`;
  type Figure = (r: Result, m: Mode) => string;
  const figures: [string, Figure, string][] = [
    ['start: requests / objects read per agent', (r) => `${per(r.start)} / ${obj(r.start)}`, `<= ${2 * PODS_PER_NODE}`],
    ['start: consistent lists (fleet of the sample)', (r) => `${r.start.consistent}`, '0'],
    [
      'start: synced after, p50 / max',
      (r) => `${secs(r.start.readySeconds.p50)} / ${secs(r.start.readySeconds.max)} s`,
      '',
    ],
    ['steady: requests per node per hour', (r) => r.steady.perNodeHour.toFixed(1), '<= 12'],
    ['  of which sent in the idle window', (r) => `${r.steady.idleRequests}`, ''],
    [
      '  watch renewal: requests, mean timeout',
      (r) => `${r.steady.perRenewal.toFixed(2)}, ${Math.round(r.steady.meanTimeoutS)} s`,
      '',
    ],
    ['restart: fleet req/s, first 30 s avg / peak', (r) => `${avg30(r.restart)} / ${peak(r.restart)}`, ''],
    ['restart: reconnects at (p5-p95 after the cut)', (r) => at(r.restart), 'over >= 10 s'],
    ['restart: objects read per agent, consistent lists', (r) => `${obj(r.restart)}, ${r.restart.consistent}`, '0'],
    ['restart: agents over their rate limit', (r, m) => (m === 'old' ? 'no limit' : `${r.restart.overLimit}`), '0'],
    ['compaction: fleet req/s, first 30 s avg / peak', (r) => `${avg30(r.compaction)} / ${peak(r.compaction)}`, ''],
    ['compaction: re-reads at (p5-p95 after the 410)', (r) => at(r.compaction), ''],
    [
      'compaction: objects read per agent, consistent lists',
      (r) => `${obj(r.compaction)}, ${r.compaction.consistent}`,
      '0 consistent lists',
    ],
    ['compaction: fleet objects read (x NODES/AGENTS)', (r) => fleetObjects(r.compaction), ''],
    ['agent RSS, 30 / 250 pods on its node', (_r, m) => rssOf(m), 'unchanged'],
  ];
  const rows = figures.map(([label, f, target]) => [label, f(results.old!, 'old'), f(results.new!, 'new'), target]);
  const w = [0, 1, 2].map((c) => Math.max(3, ...rows.map((r) => r[c]!.length)));
  const line = (r: readonly string[]) =>
    `| ${r
      .slice(0, 3)
      .map((x, c) => x.padEnd(w[c]!))
      .join(' | ')} | ${r[3]} |`;
  console.log(`\n${line(['figure', 'old', 'new', 'target'])}`);
  console.log(`|${w.map((x) => '-'.repeat(x + 2)).join('|')}|--------|`);
  for (const r of rows) console.log(line(r));
  const bySecond = (m: Mode) =>
    results[m]!.restart.perSecond.slice(0, 30)
      .map((x) => Math.round(x))
      .join(' ');
  console.log(`\nrestart, new, fleet req/s by second: ${bySecond('new')}`);
  console.log(`restart, old, fleet req/s by second: ${bySecond('old')}`);
  console.log(`RSS baseline: ${baseRev().slice(0, 12)} (baseline tree)`);
}

if (process.argv.includes('--fleet')) await runFleet(JSON.parse(process.env.FLEET_ARGS!) as FleetArgs);
else await main();

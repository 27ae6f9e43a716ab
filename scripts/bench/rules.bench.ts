// What programming a pod's redirection costs per backend (lib/rule-backends.ts: iptables legacy,
// the iptables nft shim, native nft) and per mode (sidecar REDIRECT, sidecar TPROXY, ambient's
// in-pod rules), on the plugin tests' pods (test/helpers/plugin.ts meshPod), each against the
// backend's floor measured in the same run. Rows:
//   programming   our code (cni-plugin/redirect for the sidecar modes, nftrender.ts + nft.ts for
//                 native nft's, src/ambient/podbackend.ts's backends for ambient) putting the pod's
//                 rules into a fresh netns: wall time in this process around the call, CPU = every program it
//                 ran (nsenter + iptables/ip/nft, exact, wait4 in lib/rusage-driver.py) + this
//                 process's own.
//   floor         the backend's loader alone through the same runner, on exactly what ours fed it:
//                 iptables-restore --noflush of each document (one per family), `nft -f` of the
//                 transaction (one for every family). Native nft has a check row besides: `nft -f`
//                 of a hand-written IPv4 REDIRECT ruleset (lib/nft-floor.ts).
//   ADD           the plugin's whole ADD, executed as a runtime does (CNI env, prevResult from
//                 Debian's bridge plugin, the pod from the API server: the plugin's own lookup, so
//                 no agent is needed), spawn to exit and its CPU with its children (wait4), in a
//                 fresh netns per call. Ambient's ADD is the agent's work: `npm run bench --
//                 ambient` measures it.
// One run, interleaved: per pod, every row runs once in an order that rotates from pod to pod, so
// load from other work on the machine falls on every row alike; ratios to the same-run floor are
// the figures to compare across runs.
//   npm run bench -- rules     (PODS=n, default 30; QUICK=1: 2 pods, no warm-up round;
//                               FAMILIES=4,6: dual-stack pods, the bridge hands out both families)
// PLUGIN=source runs the plugin from its sources (no build); PLUGIN=<executable> runs that one;
// unset, scripts/build.ts builds dist/bin/mesh-cni first.
// Interrupted (SIGINT/SIGTERM) or failing, it removes every netns it made, its bridge network and
// its temp dir; the floor's nft table lives only in those netns.

import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import type { V1Pod } from '@kubernetes/client-node';
import { startTestApiServer } from '../../test/helpers/apiserver.ts';
import { ROOT } from '../../test/helpers/cli.ts';
import { BridgeNetwork, cniEnv, Netns, type ChainEnv } from '../../test/helpers/netns.ts';
import { k8sArgs, pluginConfig } from '../../test/helpers/plugin.ts';
import {
  BACKENDS,
  MODES,
  podFor,
  SIDECAR_MODES,
  type Backend,
  type Exec,
  type Fed,
  type Mode,
  type Step,
} from './lib/rule-backends.ts';
import type { Family } from '../../cni-plugin/redirect/model.ts';
import { RusageDriver } from './lib/rusage.ts';
import { pct } from './lib/stats.ts';
import { printTable } from './lib/table.ts';
import { prepareCacheDir } from '../../cni-plugin/shared/cachedir.ts';

const QUICK = process.env.QUICK === '1';
const PODS = Number(process.env.PODS ?? (QUICK ? 2 : 30));
const PLUGIN = process.env.PLUGIN ?? '';
const FAMILIES: readonly Family[] = (() => {
  const f = process.env.FAMILIES ?? '4';
  if (f === '4') return [4];
  if (f === '4,6') return [4, 6];
  console.error(`FAMILIES=${f}: expected 4 or 4,6`);
  process.exit(2);
})();
const DUAL = FAMILIES.length === 2;
const PATH_ENV = '/usr/sbin:/usr/bin:/sbin:/bin';

if (PLUGIN === '') {
  const build = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], { cwd: ROOT, stdio: 'inherit' });
  if (build.status !== 0) process.exit(1);
}
const pluginArgv: readonly string[] =
  PLUGIN === 'source'
    ? [process.execPath, path.join(ROOT, 'bin/mesh-cni.js')]
    : [path.resolve(PLUGIN || path.join(ROOT, 'dist/bin/mesh-cni'))];

// Everything made here, removed by one synchronous cleanup that also runs from the exit handler
// (a failure, or SIGINT/SIGTERM through process.exit below).
const tmp = mkdtempSync(path.join(os.tmpdir(), 'mcni-rules-bench-'));
const live = new Set<Netns>();
let network: BridgeNetwork | undefined;
function cleanup(): void {
  for (const ns of live) ns.remove();
  live.clear();
  network?.cleanup();
  network = undefined;
  rmSync(tmp, { recursive: true, force: true });
}
process.once('exit', cleanup);
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(128 + os.constants.signals[sig]));

function freshNetns(tag: string): Netns {
  const ns = new Netns(tag);
  live.add(ns);
  return ns;
}
function dropNetns(ns: Netns): void {
  ns.remove();
  live.delete(ns);
}

interface Sample {
  readonly wallMs: number;
  readonly cpuMs: number;
}
const samples = new Map<string, Sample[]>();
const record = (k: string, s: Sample) => (samples.get(k) ?? samples.set(k, []).get(k)!).push(s);
const key = (part: 'program' | 'floor' | 'check' | 'ADD', mode: Mode, backend: Backend) =>
  `${part}|${mode}|${backend.name}`;

const driver = new RusageDriver();

/** Runs argv in `ns` through the driver; `seen` gets each call's argv, input and CPU. */
function execIn(ns: Netns, seen: (argv: readonly string[], input: string, cpuMs: number) => void): Exec {
  return async (argv, input) => {
    const m = await driver.run({
      argv: ['/usr/bin/nsenter', `--net=${ns.path}`, '--', ...argv],
      env: { PATH: PATH_ENV },
      input,
    });
    seen(argv, input ?? '', m.userMs + m.sysMs);
    return { code: m.code, stdout: m.stdout, stderr: m.stderr, error: null };
  };
}

/** One step in a fresh netns: wall time here, CPU of every program it ran plus this process's. */
async function measureStep(k: string, step: Step, pod: V1Pod, fed: readonly Fed[]): Promise<void> {
  const ns = freshNetns('r');
  try {
    let childCpu = 0;
    const exec = execIn(ns, (_argv, _input, cpuMs) => (childCpu += cpuMs));
    const own = process.cpuUsage();
    const t0 = performance.now();
    await step(exec, pod, fed, FAMILIES);
    const wallMs = performance.now() - t0;
    const o = process.cpuUsage(own);
    record(k, { wallMs, cpuMs: childCpu + (o.user + o.system) / 1000 });
  } finally {
    dropNetns(ns);
  }
}

/** What `b`'s program feeds its loader for a pod of `mode` (every such call), in a scratch netns. */
async function fedBy(b: Backend, mode: Mode): Promise<Fed[]> {
  const program = b.program[mode];
  if (!program) return [];
  const ns = freshNetns('f');
  try {
    const fed: Fed[] = [];
    await program(
      execIn(ns, (argv, input) => {
        if (b.loader(argv)) fed.push({ argv: [...argv], input });
      }),
      podFor(mode, 'recorded'),
      [],
      FAMILIES,
    );
    if (fed.length === 0) throw new Error(`${b.name}, ${mode}: its program never ran its loader`);
    return fed;
  } finally {
    dropNetns(ns);
  }
}

/** The bridge plugin handing out an address of each family (host-local's ranges). */
class DualStackBridge extends BridgeNetwork {
  readonly subnet6: string;
  constructor(subnet4: string, subnet6: string) {
    super(subnet4);
    this.subnet6 = subnet6;
  }
  override get bridgeConfig(): Record<string, unknown> {
    const conf = super.bridgeConfig;
    const ipam = conf.ipam as Record<string, unknown>;
    return {
      ...conf,
      ipam: {
        type: ipam.type,
        dataDir: ipam.dataDir,
        ranges: [[{ subnet: this.subnet }], [{ subnet: this.subnet6 }]],
        routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0' }],
      },
    };
  }
}

mkdirSync(path.join(tmp, 'run'));
const logUds = path.join(tmp, 'run/log.sock');
prepareCacheDir(logUds);
const api = await startTestApiServer();
const orchconfig = api.writeOrchconfig(path.join(tmp, 'orchconfig'));
network = DUAL ? new DualStackBridge('198.18.6.0/24', '2001:db8:6::/64') : new BridgeNetwork('198.18.6.0/24');
const bridge = network;
const pods = new Map<Mode, V1Pod[]>();
for (const mode of MODES) {
  const list: V1Pod[] = [];
  for (let i = 0; i <= PODS; i++) {
    const p = podFor(mode, `${mode.replace(/\W+/g, '-').toLowerCase()}-${i}`);
    list.push(SIDECAR_MODES.includes(mode) ? api.upsertPod({ ...p, spec: { ...p.spec!, nodeName: 'node-1' } }) : p);
  }
  pods.set(mode, list);
}
/** The plugin's ADD in a fresh pod netns after the bridge ADD, as a runtime runs the chain. */
async function measureAdd(k: string, backend: Backend, pod: V1Pod, id: string): Promise<void> {
  const ns = freshNetns('a');
  try {
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
    const br = await bridge.bridgeCmd('ADD', chain);
    if (br.code !== 0) throw new Error(`bridge ADD: ${br.stdout} ${br.stderr}`);
    const prev = JSON.parse(br.stdout) as { ips?: { address?: string }[] };
    // A dual-stack row is measured only on a dual-stack pod: the plugin's families are its prevResult's.
    if (DUAL && !(prev.ips ?? []).some((ip) => ip.address?.includes(':'))) {
      throw new Error(`bridge ADD gave no IPv6 address: ${br.stdout}`);
    }
    const conf = pluginConfig(
      {
        cniVersion: '1.0.0',
        orchconfig,
        extra: {
          log_level: 'warn',
          log_uds_address: logUds,
          ...backend.pluginConf,
        },
      },
      prev,
    );
    const m = await driver.run({
      argv: pluginArgv,
      env: cniEnv('ADD', chain, { PATH: PATH_ENV }),
      input: JSON.stringify(conf),
    });
    if (m.code !== 0) throw new Error(`${k}: plugin ADD exit ${m.code}: ${m.stdout} ${m.stderr}`);
    record(k, { wallMs: m.wallMs, cpuMs: m.userMs + m.sysMs });
    // Releases the address: host-local's /24 would run out over a run.
    await bridge.bridgeCmd('DEL', chain, prev);
  } finally {
    dropNetns(ns);
  }
}

type Task = () => Promise<void>;
const fed = new Map<string, Fed[]>();
function tasksFor(i: number): Task[] {
  const tasks: Task[] = [];
  for (const mode of MODES) {
    const pod = pods.get(mode)![i]!;
    for (const b of BACKENDS) {
      const program = b.program[mode];
      const floor = b.floor[mode];
      if (program) tasks.push(() => measureStep(key('program', mode, b), program, pod, []));
      if (floor) tasks.push(() => measureStep(key('floor', mode, b), floor, pod, fed.get(key('floor', mode, b))!));
      if (b.check?.mode === mode) tasks.push(() => measureStep(key('check', mode, b), b.check!.step, pod, []));
      if (b.pluginConf && SIDECAR_MODES.includes(mode)) {
        const id = `rules${process.pid}x${i}${tasks.length}`;
        tasks.push(() => measureAdd(key('ADD', mode, b), b, pod, id));
      }
    }
  }
  return tasks;
}

const started = performance.now();
try {
  for (const mode of MODES) for (const b of BACKENDS) fed.set(key('floor', mode, b), await fedBy(b, mode));
  if (!QUICK) {
    // Warm-up: page cache, the kernel modules of each backend, the API server's TLS.
    for (const t of tasksFor(PODS)) await t();
    samples.clear();
  }
  console.log(`measuring ${PODS} pods, ${tasksFor(0).length} rows each`);
  for (let i = 0; i < PODS; i++) {
    const tasks = tasksFor(i);
    for (let k = 0; k < tasks.length; k++) await tasks[(i * 7 + k) % tasks.length]!();
  }
} finally {
  driver.close();
  await api.close();
  cleanup();
}

interface Stats {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly cpu: number;
}
function stats(k: string): Stats | undefined {
  const xs = samples.get(k);
  if (!xs || xs.length === 0) return undefined;
  const wall = xs.map((s) => s.wallMs);
  return { n: xs.length, p50: pct(wall, 50), p99: pct(wall, 99), cpu: xs.reduce((a, s) => a + s.cpuMs, 0) / xs.length };
}
const num = (v: number | undefined, digits = 1) => (v === undefined || !Number.isFinite(v) ? '-' : v.toFixed(digits));
const ratio = (a?: number, f?: number) => (a !== undefined && f !== undefined ? a / f : undefined);
const load = os
  .loadavg()
  .map((l) => l.toFixed(2))
  .join(' ');

console.log(
  `\nrule programming, a fresh netns per pod, ${DUAL ? 'dual-stack (IPv4 and IPv6)' : 'IPv4'}; ${PODS} pods, rows interleaved (${os.cpus().length} CPUs, load ${load} at the end, ${((performance.now() - started) / 1000).toFixed(0)} s)`,
);
printTable(
  ['mode', 'backend', 'n', 'ours p50 ms', 'p99', 'CPU ms', 'floor p50 ms', 'p99', 'CPU ms', 'p50/floor', 'CPU/floor'],
  MODES.flatMap((mode) =>
    BACKENDS.map((b) => {
      const ours = stats(key('program', mode, b));
      const floor = stats(key('floor', mode, b));
      return [
        mode,
        b.name,
        String(ours?.n ?? floor?.n ?? 0),
        num(ours?.p50),
        num(ours?.p99),
        num(ours?.cpu),
        num(floor?.p50),
        num(floor?.p99),
        num(floor?.cpu),
        num(ratio(ours?.p50, floor?.p50), 2),
        num(ratio(ours?.cpu, floor?.cpu), 2),
      ];
    }),
  ),
  2,
);
for (const b of BACKENDS) console.log(`  ${b.name}: ${b.legend}`);
/** Across backends: each backend's `part` against iptables legacy's, the same pods in the same run. */
function againstLegacy(part: 'floor' | 'ADD', modes: readonly Mode[]): void {
  const legacy = BACKENDS[0]!;
  for (const mode of modes) {
    const base = stats(key(part, mode, legacy));
    const others = BACKENDS.slice(1).flatMap((b) => {
      const s = stats(key(part, mode, b));
      return s && base ? [`${b.name} ${num(s.p50 / base.p50, 2)} x (CPU ${num(s.cpu / base.cpu, 2)} x)`] : [];
    });
    if (others.length > 0) console.log(`  ${mode}, ${part} p50 against ${legacy.name}'s: ${others.join(', ')}`);
  }
}
// The floors: the same pod's rules loaded the cheapest way each backend can.
againstLegacy('floor', MODES);
// The check rows: a floor written another way, against the recorded one.
for (const b of BACKENDS) {
  if (!b.check) continue;
  const c = stats(key('check', b.check.mode, b));
  const f = stats(key('floor', b.check.mode, b));
  console.log(
    `  check, ${b.name} ${b.check.mode}: ${b.check.label}: p50 ${num(c?.p50)} ms, CPU ${num(c?.cpu)} ms; recorded floor / this: p50 ${num(ratio(f?.p50, c?.p50), 2)}, CPU ${num(ratio(f?.cpu, c?.cpu), 2)}`,
  );
}

console.log(
  `\nthe plugin's whole ADD (${PLUGIN === 'source' ? 'from its sources, under Node' : pluginArgv[0]}), spawn to exit, CPU with its children, pod from the API server; ambient's ADD is the agent's work (npm run bench -- ambient)`,
);
printTable(
  ['mode', 'backend', 'n', 'ADD p50 ms', 'p99', 'CPU ms/ADD', 'ADD/floor p50', 'ADD - floor p50', 'CPU - floor'],
  SIDECAR_MODES.flatMap((mode) =>
    BACKENDS.map((b) => {
      const add = stats(key('ADD', mode, b));
      const floor = stats(key('floor', mode, b));
      const minus = (a?: number, f?: number) => (a !== undefined && f !== undefined ? a - f : undefined);
      return [
        mode,
        b.name,
        String(add?.n ?? 0),
        num(add?.p50),
        num(add?.p99),
        num(add?.cpu),
        num(ratio(add?.p50, floor?.p50)),
        num(minus(add?.p50, floor?.p50)),
        num(minus(add?.cpu, floor?.cpu)),
      ];
    }),
  ),
  2,
);
againstLegacy('ADD', SIDECAR_MODES);

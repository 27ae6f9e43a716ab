// Ambient mode's costs (docs/ambient.md), each against its baseline measured in the same run:
//   ADD        the plugin's ADD of an ambient pod (lookup, POST /cmdadd; the agent: netns, in-pod
//              rules, ztunnel Add acked by a fake ztunnel, probe ipset, the annotation) from spawn
//              to exit and its CPU (wait4, lib/rusage-driver.py), interleaved with the ADD of a
//              sidecar pod (the plugin's own rules) by the same executable against the same agent,
//              and the executable's VERSION (the runtime's start: the floor of any call).
//   snapshot   the agent's start with PODS (250) running ambient pods (netns + a sleep in a
//              kubelet-shaped cgroup, test/helpers/kubepods.ts makeNetnsPods) annotated enabled:
//              from its spawn, and from ztunnel's connection, until SnapshotSent reaches the fake
//              ztunnel; against the same start with no ambient pod (the floor: the agent's own
//              start, the watches, an empty snapshot).
//   memory     the agent's resident memory with the PODS pods enrolled (read SETTLE_MS after
//              the snapshot of every ambient start above), against sidecar mode (ambient off)
//              with the same pods in its watch and Node's own floor, medians of ROUNDS, broken
//              down as the memory bench does (lib/memory.ts).
// The agent runs from dist/install-cni.js (what the image runs) inside a netns made here that
// stands for the node's host network (its host probe rule and ipset go there, never into the
// machine's own), reaching the test API server on its loopback (forwarded). The fake ztunnel
// (test/helpers/fake-ztunnel.ts, one-in-flight check off) runs in this process.
// Every agent runs with the DaemonSet's NODE_OPTIONS, as it ships.
//   npm run bench -- ambient      (PODS=n, ADDS=n, ROUNDS=n, SETTLE_MS=n)
// Interrupted (SIGINT/SIGTERM) or not, everything made here goes: the pods' netns, sleeps and
// cgroup dirs (makeNetnsPods's handlers), every process in the node netns (agent, forwarder),
// the netns of the ADDs, the node netns and the scratch dir.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { scratchAgentFlags } from '../../test/helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../../test/helpers/apiserver.ts';
import { ROOT } from '../../test/helpers/cli.ts';
import { FakeZtunnel } from '../../test/helpers/fake-ztunnel.ts';
import { makeNetnsPods, type NetnsPods } from '../../test/helpers/kubepods.ts';
import { cniEnv, Netns } from '../../test/helpers/netns.ts';
import { k8sArgs, meshPod, pluginConfig } from '../../test/helpers/plugin.ts';
import { forwardLoopback } from '../../test/helpers/podman.ts';
import { waitFor } from '../../test/helpers/poll.ts';
import { pct } from './lib/stats.ts';
import { RusageDriver, type Measured } from './lib/rusage.ts';
import { printTable } from './lib/table.ts';
import {
  floorMemory,
  medianMemory,
  printMemory,
  readMemory,
  shippedNodeOptions,
  writePreload,
  type Memory,
} from './lib/memory.ts';

const PODS = Number(process.env.PODS ?? 250);
const ADDS = Number(process.env.ADDS ?? 20);
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const SETTLE_MS = Number(process.env.SETTLE_MS ?? 4000);
const NODE = 'node-1';
const NS = 'demo';
const PATH_ENV = '/usr/sbin:/usr/bin:/sbin:/bin';
const TAG = `mcni-ambb-${process.pid}`;
const nodeNetns = `${TAG}-node`;
const nodeNetnsPath = `/run/netns/${nodeNetns}`;

const build = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], { cwd: ROOT, stdio: 'inherit' });
if (build.status !== 0) process.exit(1);
const agentJs = path.join(ROOT, 'dist/install-cni.js');
const pluginExe = path.join(ROOT, 'dist/bin/mesh-cni');

const tmp = mkdtempSync(path.join(os.tmpdir(), 'mcni-amb-bench-'));
// What the helpers make in the temp dir (the loopback forwarders' socket dirs) goes in ours, so an
// interrupted run leaves none of it.
process.env.TMPDIR = tmp;
const addNetns: Netns[] = [];
/** Synchronous, so it runs from the exit handler too (makeNetnsPods's signal handlers exit through it). */
function cleanup(): void {
  const pids = spawnSync('ip', ['netns', 'pids', nodeNetns], { encoding: 'utf8' }).stdout.split('\n');
  for (const pid of pids.filter((p) => /^\d+$/.test(p))) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      // gone already
    }
  }
  spawnSync('ip', ['netns', 'del', nodeNetns]);
  for (const ns of addNetns.splice(0)) ns.remove();
  rmSync(tmp, { recursive: true, force: true });
}
process.once('exit', cleanup);
// Exits as the signal would, through process.exit so that the exit handlers (this cleanup, the
// fleet's) run; kept for the whole run (the fleet's own handlers go when it is removed).
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(128 + os.constants.signals[sig]));

const sh = (args: string[]) => {
  const r = spawnSync(args[0]!, args.slice(1), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${args.join(' ')} failed (${r.status}): ${r.stderr}`);
};
const preload = writePreload(tmp);
const NODE_OPTIONS = shippedNodeOptions(ROOT);
sh(['ip', 'netns', 'add', nodeNetns]);
sh(['ip', '-n', nodeNetns, 'link', 'set', 'lo', 'up']);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;
/** The process's CPU with its reaped children's (nsenter, iptables, ipset), in ms. */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields 14-17 (utime stime cutime cstime) are 12-15 after the comm
  return ((Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 1000) / CLK_TCK;
}

/** An API server holding namespace demo (ambient) and `pods`, reachable in the node netns too. */
async function apiWith(pods: readonly V1Pod[]): Promise<{ api: TestApiServer; kc: string; close(): Promise<void> }> {
  const api = await startTestApiServer({ bookmarkIntervalMs: 60_000 });
  api.upsertNamespace({ metadata: { name: NS, labels: { 'mesh.io/dataplane-mode': 'ambient' } } });
  api.upsertNamespace({ metadata: { name: 'default' } });
  for (const p of pods) api.upsertPod(p);
  const forward = await forwardLoopback(nodeNetnsPath, api.port);
  const kc = api.writeOrchconfig(path.join(tmp, `kc-${api.port}.json`));
  return {
    api,
    kc,
    async close() {
      await forward.close();
      await api.close();
    },
  };
}

interface Agent {
  readonly child: ChildProcess;
  readonly dir: string;
  readonly zds: string;
  readonly events: string;
  /** Where it writes its memory report (lib/memory.ts readMemory). */
  readonly memOut: string;
  stop(): Promise<void>;
}

let agents = 0;
/** The agent (ambient on or off) in the node netns, in a scratch dir of its own. */
function startAgent(kc: string, ambient: boolean): Agent {
  const dir = path.join(tmp, `agent-${++agents}`);
  for (const d of ['net.d', 'bin', 'src', 'run', 'ztunnel']) mkdirSync(path.join(dir, d), { recursive: true });
  const zds = path.join(dir, 'ztunnel/ztunnel.sock');
  const events = path.join(dir, 'run/pluginevent.sock');
  const memOut = path.join(dir, 'mem.json');
  const child = spawn(
    'nsenter',
    [
      `--net=${nodeNetnsPath}`,
      '--',
      process.execPath,
      '--no-deprecation',
      ...['--import', preload],
      agentJs,
      ...scratchAgentFlags(dir, kc),
      ...['--repair-enabled=false', '--log_output_level', 'all:none'],
      ...(ambient
        ? [
            '--ambient-enabled',
            ...['--ztunnel-uds-address', zds, '--pluginevent-uds-address', events],
            ...['--host-proc-dir', '/proc', '--host-netns-path', '/proc/self/ns/net', '--host-root', '/'],
          ]
        : []),
    ],
    {
      stdio: ['ignore', 'ignore', 'inherit'],
      env: { PATH: process.env.PATH ?? PATH_ENV, NODE_NAME: NODE, NODE_OPTIONS, MEM_OUT: memOut },
    },
  );
  return {
    child,
    dir,
    zds,
    events,
    memOut,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await gone;
      }
    },
  };
}

/** A running pod of the fleet as the API server has it: demo, on this node, annotated enabled. */
function fleetPod(p: NetnsPods['pods'][number]): V1Pod {
  return {
    metadata: {
      name: p.name,
      namespace: NS,
      uid: p.uid,
      annotations: { 'ambient.mesh.io/redirection': 'enabled' },
    },
    spec: { nodeName: NODE, serviceAccountName: 'bench', containers: [{ name: 'app', image: 'bench' }] },
    status: { phase: 'Running', podIP: p.ip, podIPs: [{ ip: p.ip }] },
  };
}

interface SnapshotRun {
  readonly spawnToSentMs: number;
  readonly connectedToSentMs: number;
  readonly adds: number;
  /** Its memory SETTLE_MS after the snapshot, when asked for. */
  readonly memory?: Memory;
}

/**
 * One agent start with `kc`'s pods: a fake ztunnel waiting for the socket, then the agent.
 * `measure`: its memory is read SETTLE_MS after the snapshot (the fake ztunnel still connected).
 */
async function snapshotRun(
  kc: string,
  expectAdds: number,
  keep = false,
  measure = false,
): Promise<SnapshotRun & { agent: Agent }> {
  const agent = startAgent(kc, true);
  const fake = new FakeZtunnel({ path: agent.zds, maxBackoffMs: 2, checkOneInFlight: false });
  const t0 = performance.now();
  try {
    const connected = fake.waitFor((r) => r.kind === 'connected').then(() => performance.now());
    await Promise.race([
      fake.waitForNth('snapshot_sent', 1),
      new Promise((_, reject) => {
        agent.child.once('exit', (c) => reject(new Error(`the agent exited (${c}) before its snapshot`)));
        setTimeout(() => reject(new Error('no snapshot in 120 s')), 120_000).unref();
      }),
    ]);
    const t1 = performance.now();
    const adds = fake.of('add').length;
    if (adds !== expectAdds) throw new Error(`the snapshot had ${adds} Adds, ${expectAdds} expected`);
    const connectedToSentMs = t1 - (await connected);
    let memory: Memory | undefined;
    if (measure) {
      await sleep(SETTLE_MS);
      memory = await readMemory(agent.child.pid!, agent.memOut);
    }
    return { spawnToSentMs: t1 - t0, connectedToSentMs, adds, agent, memory };
  } finally {
    if (!keep) {
      await fake.stop();
      await agent.stop();
    } else {
      keepFake = fake;
    }
  }
}
let keepFake: FakeZtunnel | null = null;

const ms = (x: number) => `${x.toFixed(1)} ms`;
const median = (xs: readonly number[]) => pct(xs, 50);

// --- snapshot and RSS --------------------------------------------------------------------------
const fleet = makeNetnsPods(TAG, PODS, '198.18.66');
const full = await apiWith(fleet.pods.map(fleetPod));
const empty = await apiWith([]);
const snapRows: { what: string; runs: SnapshotRun[] }[] = [
  { what: 'agent start, no ambient pod (floor)', runs: [] },
  { what: `agent start, ${PODS} running ambient pods`, runs: [] },
];
/** Sidecar mode (ambient off) with `kc`'s pods in its watch: its memory SETTLE_MS after it listed them. */
async function sidecarMemory(kc: string, api: TestApiServer): Promise<Memory> {
  const agent = startAgent(kc, false);
  try {
    const listed = api.requests.length;
    await waitFor(
      'the sidecar-mode agent to list the pods',
      () => api.requests.slice(listed).some((q) => q.method === 'GET' && q.path === '/api/v1/pods' && q.status === 200),
      { timeoutMs: 60_000 },
    );
    await sleep(SETTLE_MS);
    return await readMemory(agent.child.pid!, agent.memOut);
  } finally {
    await agent.stop();
  }
}

// Memory rows, interleaved with the snapshot runs so load falls on every row alike.
const floors: Memory[] = [];
const sidecars: Memory[] = [];
for (let r = 0; r < ROUNDS; r++) {
  snapRows[0]!.runs.push(await snapshotRun(empty.kc, 0));
  snapRows[1]!.runs.push(await snapshotRun(full.kc, PODS, false, true));
  floors.push(await floorMemory(tmp, preload, SETTLE_MS));
  sidecars.push(await sidecarMemory(full.kc, full.api));
}
const ambients = snapRows[1]!.runs.map((r) => r.memory!);
// Ambient with the pods enrolled, kept for the ADDs.
const last = await snapshotRun(full.kc, PODS, true);
const ambientAgent = last.agent;

// --- ADD: ambient vs sidecar, interleaved --------------------------------------------------------
const driver = new RusageDriver();
const samples = new Map<string, Measured[]>();
const record = (k: string, m: Measured) => (samples.get(k) ?? samples.set(k, []).get(k)!).push(m);
const logUds = path.join(ambientAgent.dir, 'run/log.sock');
const lookupUds = path.join(ambientAgent.dir, 'run/pods.sock');

function stdin(prev: unknown): string {
  return JSON.stringify(
    pluginConfig(
      {
        cniVersion: '1.0.0',
        orchconfig: full.kc,
        extra: {
          log_level: 'warn',
          log_uds_address: logUds,
          pod_lookup_uds_address: lookupUds,
          iptables_flavour: 'nft',
          ambient_enabled: true,
          pluginevent_uds_address: ambientAgent.events,
        },
      },
      prev,
    ),
  );
}

const addPods: { kind: 'ambient' | 'sidecar'; pod: V1Pod; ip: string }[] = [];
for (let i = 0; i < ADDS; i++) {
  const uid = randomUUID();
  const ambient: V1Pod = {
    metadata: { name: `${TAG}-add-${i}`, namespace: NS, uid },
    spec: { nodeName: NODE, serviceAccountName: 'bench', containers: [{ name: 'app', image: 'bench' }] },
    status: { phase: 'Pending' },
  };
  const side = meshPod('default', `${TAG}-side-${i}`);
  side.metadata = { ...side.metadata, uid: randomUUID() };
  side.spec = { ...side.spec!, nodeName: NODE };
  full.api.upsertPod(ambient);
  full.api.upsertPod(side);
  addPods.push({ kind: 'ambient', pod: ambient, ip: `198.18.67.${i + 2}` });
  addPods.push({ kind: 'sidecar', pod: side, ip: `198.18.68.${i + 2}` });
}
await sleep(1000); // the agent's watch has them (the /cmdadd server reads the pod from it)

const agentCpuAmbient: number[] = [];
const agentCpuSidecar: number[] = [];
for (let i = 0; i < ADDS; i++) {
  const pair = [addPods[2 * i]!, addPods[2 * i + 1]!];
  if (i % 2 === 1) pair.reverse();
  const version = await driver.run({
    argv: [pluginExe],
    env: { CNI_COMMAND: 'VERSION' },
    input: '{"cniVersion":"1.0.0"}',
  });
  record('mesh-cni VERSION (floor: the runtime starts)', version);
  for (const { kind, pod, ip } of pair) {
    const ns = new Netns(kind[0]);
    addNetns.push(ns);
    const id = `${TAG}-${kind}-${i}`;
    const chain = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
    const prev = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: ns.path }],
      ips: [{ address: `${ip}/24`, interface: 0 }],
    };
    const cpu0 = cpuMs(ambientAgent.child.pid!);
    const m = await driver.run({
      argv: [pluginExe],
      env: cniEnv('ADD', chain, { PATH: PATH_ENV }),
      input: stdin(prev),
    });
    (kind === 'ambient' ? agentCpuAmbient : agentCpuSidecar).push(cpuMs(ambientAgent.child.pid!) - cpu0);
    if (m.code !== 0) throw new Error(`${kind} ADD failed (${m.code}): ${m.stdout} ${m.stderr}`);
    record(
      kind === 'ambient' ? 'ADD, ambient pod (/cmdadd, ztunnel Add)' : 'ADD, sidecar pod (rules by the plugin)',
      m,
    );
  }
}
const ambientAdds = keepFake!.of('add').filter((r) => r.conn === 1).length - PODS;
driver.close();
await keepFake!.stop();
await ambientAgent.stop();
await full.close();
await empty.close();
fleet.remove();

console.log(`\nADD, spawn to exit (${ADDS} each, interleaved; plugin ${path.relative(ROOT, pluginExe)}, nft)`);
printTable(
  ['call', 'p50 wall', 'p99 wall', 'p50 CPU (user+sys, children incl.)'],
  [...samples].map(([k, xs]) => [
    k,
    ms(median(xs.map((m) => m.wallMs))),
    ms(
      pct(
        xs.map((m) => m.wallMs),
        99,
      ),
    ),
    ms(median(xs.map((m) => m.userMs + m.sysMs))),
  ]),
);
console.log(`(the fake ztunnel got ${ambientAdds} Adds from the ${ADDS} ambient ADDs)`);
console.log(
  `the agent's CPU while the ADD ran (its children incl., ${CLK_TCK} Hz ticks), p50: ambient ` +
    `${ms(median(agentCpuAmbient))}, sidecar ${ms(median(agentCpuSidecar))} (the plugin's CPU above excludes it)`,
);

console.log(
  `\nStart-up snapshot, median of ${ROUNDS} runs ` +
    '(fake ztunnel waiting for the socket; later runs find the rules in place)',
);
printTable(
  ['start', 'first run (rules applied)', 'spawn -> SnapshotSent', 'ztunnel connected -> SnapshotSent', 'Adds'],
  snapRows.map(({ what, runs }) => [
    what,
    ms(runs[0]?.spawnToSentMs ?? NaN),
    ms(median(runs.map((r) => r.spawnToSentMs))),
    ms(median(runs.map((r) => r.connectedToSentMs))),
    String(runs[0]?.adds ?? 0),
  ]),
);

console.log(
  `\nAgent memory, ${PODS} pods on the node, median of ${ROUNDS} interleaved runs, read ${SETTLE_MS} ms ` +
    `after settling (agent NODE_OPTIONS ${JSON.stringify(NODE_OPTIONS)}, load ${os.loadavg()[0]!.toFixed(2)} at the end)`,
);
const ambientMem = medianMemory(ambients);
printMemory([
  { name: 'node floor (setInterval)', m: medianMemory(floors) },
  { name: `sidecar mode (ambient off), ${PODS} pods in the watch`, m: medianMemory(sidecars) },
  { name: `ambient, ${PODS} pods enrolled (netns fds held)`, m: ambientMem },
]);
// 85 MB = 81.1 MiB.
const MiB = 1024 * 1024;
console.log(
  `target: ambient with ${PODS} pods enrolled ${ambientMem.rss.toFixed(1)} MiB = ${((ambientMem.rss * MiB) / 1e6).toFixed(1)} MB ` +
    `(<= 85 MB: ${ambientMem.rss * MiB <= 85e6 ? 'met' : 'MISSED'})`,
);
process.exit(0);

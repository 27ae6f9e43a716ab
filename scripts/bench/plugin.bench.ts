// The plugin's cost as the runtime sees it, per runtime of the shipped executable (docs/design.md
// "Start-up time"): spawn to exit and the process's own user+sys CPU (its nsenter/iptables children
// included), a cold process every time, measured by wait4 (lib/rusage-driver.py). One run,
// interleaved: per pod, every row below runs once, in an order that rotates from pod to pod, so
// load from other work on the machine falls on every row alike. Rows:
//   floor             `node -e 0`, and each runtime's executable of an empty script
//   minimal IO        Bun only: an executable built with the plugin's flags that reads stdin and
//                     writes it to stdout with Bun's own IO, what a plugin call cannot go below
//   bridge VERSION    Debian's Go reference plugin: what the targets compare with
//   VERSION           per runtime
//   DEL, netns gone   per runtime (a runtime's second DEL, a node after reboot)
//   ADD excluded ns   per runtime: a kube-system pod, answered from the request alone
//   ADD               per runtime x pod lookup (agent's watch over its socket | API server,
//                     HTTPS + token, the fallback) x iptables flavour (nft | legacy), each in a
//                     fresh pod netns after Debian's bridge + host-local ADD
//   DEL, netns there  per runtime x flavour: our rules removed after that ADD
//   restored alone    the same IPv4 rules by nsenter + iptables-{nft,legacy}-restore, fresh netns
// Then the node-reboot case: 100 (BURST=n) ADDs started at once per runtime, pods from the
// agent, flavour auto (remembered in the plugin cache): total CPU and the time to the last exit.
// Then the pod start under a real CRI runtime (lib/cri-bench.ts): sandboxes started through
// containerd's CRI as kubelet does, bridge + portmap with and without mesh-cni (per runtime), the
// agent's lookup up; the start difference and ADD/DEL as containerd runs them.
// The start-up targets (docs/design.md "Start-up time") are printed at the end, each met or not.
//   npm run bench -- plugin        (PODS=n, BURST=n, BURSTS=n, CRI_PODS=n; PARTS=calls,burst,cri picks parts)
// RUNTIMES=bun (or node-sea) measures only those; BASELINE=<a mesh-cni.cjs> adds every row of a Bun
// executable of that bundle too, as `bun-baseline` (a change's before and after, in one run);
// BASELINE=<an executable> measures that one (a change of the build itself).

import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startTestApiServer } from '../../test/helpers/apiserver.ts';
import { ROOT } from '../../test/helpers/cli.ts';
import { BridgeNetwork, cniEnv, Netns, type ChainEnv } from '../../test/helpers/netns.ts';
import { k8sArgs, meshPod, pluginConfig } from '../../test/helpers/plugin.ts';
import { pct } from './lib/stats.ts';
import { RusageDriver, type Job, type Measured } from './lib/rusage.ts';
import { benchCri } from './lib/cri-bench.ts';
import {
  buildExecutable,
  DEFAULT_PLUGIN_RUNTIME,
  PLUGIN_RUNTIMES,
  pluginRuntimeFrom,
  type PluginRuntime,
} from '../plugin-runtime.ts';
import type { V1Pod } from '@kubernetes/client-node';
import { prepareCacheDir } from '../../cni-plugin/shared/cachedir.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod } from '../../cni-plugin/redirect/spec.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { podLookupArgs } from '../../src/partargs.ts';

configureLogging({
  asJson: false,
  outputLevels: buildSettings({ log_output_level: 'all:warn' }, {}).logging.outputLevels,
});

const PODS = Number(process.env.PODS ?? 100);
const BURST = Number(process.env.BURST ?? 100);
const BURSTS = Number(process.env.BURSTS ?? 2);
const CRI_PODS = Number(process.env.CRI_PODS ?? 30);
/** Which parts to run (comma-separated): calls, burst, cri. */
const PARTS = new Set((process.env.PARTS ?? 'calls,burst,cri').split(','));
const RUNTIMES: PluginRuntime[] = process.env.RUNTIMES
  ? process.env.RUNTIMES.split(',').map((r) => pluginRuntimeFrom(r, 'RUNTIMES'))
  : [...PLUGIN_RUNTIMES];
const BASELINE = process.env.BASELINE ?? '';
/** The executables measured: one per runtime, and the baseline's. */
const LABELS: string[] = [...RUNTIMES, ...(BASELINE ? ['bun-baseline'] : [])];
let criOverhead = new Map<string, number>();
const PATH_ENV = '/usr/sbin:/usr/bin:/sbin:/bin';
const tmp = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-bench-'));

const build = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.ts')], {
  cwd: ROOT,
  env: { ...process.env, MESH_SEA: '0' },
  stdio: 'inherit',
});
if (build.status !== 0) process.exit(1);
const bundle = path.join(ROOT, 'dist/mesh-cni.cjs');
const emptyScript = path.join(tmp, 'empty.cjs');
writeFileSync(emptyScript, 'process.exit(0);\n');
// The least a Bun plugin does: read the request, write a result, with Bun's own IO (no node:
// modules loaded); VERSION and DEL with the netns gone are compared with it.
const ioScript = path.join(tmp, 'io.cjs');
writeFileSync(ioScript, 'Bun.stdin.text().then((s) => Bun.write(Bun.stdout, s));\n');
const exe = new Map<string, string>();
const emptyExe = new Map<string, string>();
const ioExe = new Map<string, string>();
if (BASELINE) {
  if (BASELINE.endsWith('.cjs')) {
    exe.set('bun-baseline', path.join(tmp, 'mesh-cni-baseline'));
    buildExecutable({
      root: ROOT,
      main: path.resolve(BASELINE),
      out: exe.get('bun-baseline')!,
      runtime: 'bun',
      seaMode: 'codecache',
    });
  } else {
    exe.set('bun-baseline', path.resolve(BASELINE));
  }
}
for (const runtime of RUNTIMES) {
  // The same bundle, each runtime's executable built as scripts/build.ts builds it.
  exe.set(runtime, path.join(tmp, `mesh-cni-${runtime}`));
  buildExecutable({ root: ROOT, main: bundle, out: exe.get(runtime)!, runtime, seaMode: 'codecache' });
  emptyExe.set(runtime, path.join(tmp, `empty-${runtime}`));
  buildExecutable({ root: ROOT, main: emptyScript, out: emptyExe.get(runtime)!, runtime, seaMode: 'codecache' });
  if (runtime === 'bun') {
    ioExe.set(runtime, path.join(tmp, `io-${runtime}`));
    buildExecutable({ root: ROOT, main: ioScript, out: ioExe.get(runtime)!, runtime, seaMode: 'codecache' });
  }
}

// As on a node: a log socket dir, where the plugin also remembers the host's iptables flavour.
mkdirSync(path.join(tmp, 'run'));
const logUds = path.join(tmp, 'run/log.sock');
prepareCacheDir(logUds);
const api = await startTestApiServer();
const orchconfig = api.writeOrchconfig(path.join(tmp, 'orchconfig'));
const network = new BridgeNetwork('198.18.3.0/24');
const burstNetwork = new BridgeNetwork('198.18.4.0/24');
// The agent's pod lookup (in this process: it answers from its watch while the plugin runs).
const podLookupSocket = path.join(tmp, 'run/pods.sock');
const lookup = await startPodLookup(
  podLookupArgs(buildSettings({ 'pod-lookup-uds-address': podLookupSocket, orchconfig }, { NODE_NAME: 'node-1' })),
);
const driver = new RusageDriver();
const excludedNetns = new Netns('x');

const samples = new Map<string, Measured[]>();
const record = (k: string, m: Measured) => (samples.get(k) ?? samples.set(k, []).get(k)!).push(m);

async function measured(name: string, job: Job, check = true): Promise<Measured> {
  const m = await driver.run(job);
  if (check && m.code !== 0) throw new Error(`${name}: exit ${m.code}: ${m.stdout} ${m.stderr}`);
  record(name, m);
  return m;
}

function pluginStdin(extra: Record<string, unknown>, prev: unknown): string {
  return JSON.stringify(
    pluginConfig(
      { cniVersion: '1.0.0', orchconfig, extra: { log_level: 'warn', log_uds_address: logUds, ...extra } },
      prev,
    ),
  );
}

/** A fresh pod netns with Debian's bridge ADD done in it, as the runtime leaves it for us. */
async function podNetns(
  net: BridgeNetwork,
  pod: V1Pod,
  id: string,
): Promise<{ ns: Netns; chain: ChainEnv; prev: unknown }> {
  const ns = new Netns('b');
  try {
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args: k8sArgs(pod, id) };
    const br = await net.bridgeCmd('ADD', chain);
    if (br.code !== 0) throw new Error(`bridge ADD: ${br.stdout} ${br.stderr}`);
    return { ns, chain, prev: JSON.parse(br.stdout) as unknown };
  } catch (e) {
    ns.remove();
    throw e;
  }
}

type Task = () => Promise<void>;

function tasksFor(pod: V1Pod, i: number): Task[] {
  const tasks: Task[] = [
    async () => {
      await measured('floor: node -e 0', { argv: [process.execPath, '-e', '0'], env: {} });
    },
    async () => {
      await measured('bridge VERSION (Debian, Go)', {
        argv: ['/usr/lib/cni/bridge'],
        env: { CNI_COMMAND: 'VERSION' },
        input: '{"cniVersion":"1.0.0"}',
      });
    },
  ];
  for (const flavour of ['nft', 'legacy'] as const) {
    tasks.push(async () => {
      const ns = new Netns('r');
      try {
        await measured(`${flavour}: the same rules restored alone`, {
          argv: [
            '/usr/bin/nsenter',
            `--net=${ns.path}`,
            '--',
            `/usr/sbin/iptables-${flavour}-restore`,
            '--noflush',
            '-w',
            '5',
          ],
          env: { PATH: PATH_ENV },
          input: buildFamilyRules(specForPod(pod), 4).restore,
        });
      } finally {
        ns.remove();
      }
    });
  }
  for (const runtime of LABELS) {
    const argv = [exe.get(runtime)!];
    const empty = emptyExe.get(runtime);
    if (empty)
      tasks.push(async () => {
        await measured(`${runtime}: floor (empty script)`, { argv: [empty], env: {} });
      });
    const io = ioExe.get(runtime);
    if (io)
      tasks.push(async () => {
        await measured(`${runtime}: minimal IO (stdin to stdout)`, {
          argv: [io],
          env: {},
          input: '{"cniVersion":"1.0.0"}',
        });
      });
    tasks.push(async () => {
      await measured(`${runtime}: VERSION`, { argv, env: { CNI_COMMAND: 'VERSION' }, input: '{"cniVersion":"1.0.0"}' });
    });
    tasks.push(async () => {
      const chain = {
        containerId: `gone${i}`,
        netns: `/run/netns/mcni-plg-${process.pid}-gone`,
        ifname: 'eth0',
        args: k8sArgs(pod, `gone${i}`),
      };
      await measured(`${runtime}: DEL, netns gone`, {
        argv,
        env: cniEnv('DEL', chain, { PATH: PATH_ENV }),
        input: pluginStdin({ iptables_flavour: 'nft' }, undefined),
      });
    });
    tasks.push(async () => {
      const chain = {
        containerId: `x${i}`,
        netns: excludedNetns.path,
        ifname: 'eth0',
        args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns-${i};K8S_POD_UID=x${i}`,
      };
      const prev = {
        cniVersion: '1.0.0',
        interfaces: [{ name: 'eth0', sandbox: excludedNetns.path }],
        ips: [{ address: '198.18.5.2/24', interface: 0 }],
      };
      await measured(`${runtime}: ADD, excluded namespace`, {
        argv,
        env: cniEnv('ADD', chain, { PATH: PATH_ENV }),
        input: pluginStdin({ iptables_flavour: 'nft' }, prev),
      });
    });
    for (const by of ['agent', 'api'] as const) {
      for (const flavour of ['nft', 'legacy'] as const) {
        tasks.push(async () => {
          const { ns, chain, prev } = await podNetns(network, pod, `bench${process.pid}x${i}${runtime}${by}${flavour}`);
          try {
            const lookupVia = by === 'api' ? {} : { pod_lookup_uds_address: podLookupSocket };
            const stdin = pluginStdin({ iptables_flavour: flavour, ...lookupVia }, prev);
            await measured(`${runtime}: ADD, pod from the ${by === 'agent' ? 'agent' : 'API server'}, ${flavour}`, {
              argv,
              env: cniEnv('ADD', chain, { PATH: PATH_ENV }),
              input: stdin,
            });
            if (by === 'agent')
              await measured(`${runtime}: DEL, netns there, ${flavour}`, {
                argv,
                env: cniEnv('DEL', chain, { PATH: PATH_ENV }),
                input: stdin,
              });
            await network.bridgeCmd('DEL', chain, prev);
          } finally {
            ns.remove();
          }
        });
      }
    }
  }
  return tasks;
}

interface BurstRow {
  runtime: string;
  wallMs: number;
  cpuMs: number;
  p50: number;
  p99: number;
  failed: number;
}
const bursts: BurstRow[] = [];

async function burst(runtime: string, pods: V1Pod[], round: number): Promise<void> {
  const made: { ns: Netns; chain: ChainEnv; prev: unknown }[] = [];
  try {
    for (let j = 0; j < pods.length; j++)
      made.push(await podNetns(burstNetwork, pods[j]!, `burst${process.pid}r${round}${runtime}${j}`));
    const jobs = made.map(({ chain, prev }) => ({
      argv: [exe.get(runtime)!],
      env: cniEnv('ADD', chain, { PATH: PATH_ENV }),
      input: pluginStdin({ iptables_flavour: 'auto', pod_lookup_uds_address: podLookupSocket }, prev),
    }));
    const r = await driver.runAll(jobs);
    const walls = r.results.map((m) => m.wallMs);
    bursts.push({
      runtime,
      wallMs: r.wallMs,
      cpuMs: r.results.reduce((a, m) => a + m.userMs + m.sysMs, 0),
      p50: pct(walls, 50),
      p99: pct(walls, 99),
      failed: r.results.filter((m) => m.code !== 0).length,
    });
    const bad = r.results.find((m) => m.code !== 0);
    if (bad) console.error(`burst ${runtime}: an ADD failed: ${bad.stdout} ${bad.stderr}`);
  } finally {
    for (const { ns, chain, prev } of made) {
      await burstNetwork.bridgeCmd('DEL', chain, prev);
      ns.remove();
    }
  }
}

try {
  const pods: V1Pod[] = [];
  for (let i = 0; i < Math.max(PODS, BURST); i++) {
    const template = meshPod('bench', `pod-${i}`);
    pods.push(api.upsertPod({ ...template, spec: { ...template.spec!, nodeName: 'node-1' } }));
  }
  if (PARTS.has('calls')) {
    // Warm-up: page cache, the flavour cache, the agent's watch.
    for (const t of tasksFor(pods[0]!, 0)) await t();
    samples.clear();
    for (let i = 0; i < PODS; i++) {
      const tasks = tasksFor(pods[i]!, i);
      for (let k = 0; k < tasks.length; k++) await tasks[(i * 7 + k) % tasks.length]!();
    }
  }
  if (PARTS.has('burst')) {
    for (let round = 0; round < BURSTS; round++) {
      const order = round % 2 === 0 ? [...LABELS] : [...LABELS].reverse();
      for (const runtime of order) await burst(runtime, pods.slice(0, BURST), round);
    }
  }
  if (PARTS.has('cri')) {
    criOverhead = await benchCri({
      meshCni: new Map(RUNTIMES.map((r) => [r, exe.get(r)!])),
      api,
      orchconfig,
      podLookupSocket,
      logUds,
      pods: CRI_PODS,
      tmp,
      nodeName: 'node-1',
    });
  }
} finally {
  driver.close();
  excludedNetns.remove();
  network.cleanup();
  burstNetwork.cleanup();
  await lookup.stop('SIGTERM');
  await api.close();
  rmSync(tmp, { recursive: true, force: true });
}

const rows = [...samples.entries()]
  .map(([name, xs]) => {
    const wall = xs.map((m) => m.wallMs);
    const cpu = xs.map((m) => m.userMs + m.sysMs);
    return {
      name,
      n: xs.length,
      p50: pct(wall, 50),
      p99: pct(wall, 99),
      cpu: cpu.reduce((a, b) => a + b, 0) / cpu.length,
    };
  })
  .sort((a, b) => a.name.localeCompare(b.name));
const w = Math.max(...rows.map((r) => r.name.length));
const f = (v: number, n = 8) => v.toFixed(1).padStart(n);
if (PARTS.has('calls')) {
  console.log(
    `\nplugin, spawn to exit, cold process, ${PODS} pods, every row once per pod in a rotating order (${os.cpus().length} CPUs, load ${os.loadavg()[0]!.toFixed(2)} at the end)`,
  );
  console.log(
    `${'row'.padEnd(w)}  ${'n'.padStart(4)}  ${'p50 ms'.padStart(8)}  ${'p99 ms'.padStart(8)}  ${'CPU ms/call'.padStart(11)}`,
  );
  for (const r of rows)
    console.log(`${r.name.padEnd(w)}  ${String(r.n).padStart(4)}  ${f(r.p50)}  ${f(r.p99)}  ${f(r.cpu, 11)}`);
}

if (PARTS.has('burst')) {
  console.log(
    `\n${BURST} ADDs started at once (a node reboot), pods from the agent, flavour auto; ${BURSTS} round(s), runtimes alternating first`,
  );
  console.log(
    `${'runtime'.padEnd(12)}  ${'to last exit ms'.padStart(15)}  ${'total CPU ms'.padStart(12)}  ${'CPU ms/ADD'.padStart(10)}  ${'p50 ms'.padStart(8)}  ${'p99 ms'.padStart(8)}  failed`,
  );
  for (const b of bursts)
    console.log(
      `${b.runtime.padEnd(12)}  ${f(b.wallMs, 15)}  ${f(b.cpuMs, 12)}  ${f(b.cpuMs / BURST, 10)}  ${f(b.p50)}  ${f(b.p99)}  ${b.failed}`,
    );
}

const verdict = (ok: boolean) => (ok ? 'met' : 'MISSED');
if (PARTS.has('calls')) {
  const row = (name: string) => rows.find((r) => r.name === name)!;
  const bridgeVersion = row('bridge VERSION (Debian, Go)').p50;
  console.log(
    `\nstart-up targets, default runtime today: ${DEFAULT_PLUGIN_RUNTIME}; bridge VERSION p50 ${bridgeVersion.toFixed(1)} ms`,
  );
  for (const runtime of LABELS) {
    for (const flavour of ['nft', 'legacy'] as const) {
      const restore = row(`${flavour}: the same rules restored alone`);
      const alone = restore.p50;
      for (const by of ['agent', 'API server']) {
        const add = row(`${runtime}: ADD, pod from the ${by}, ${flavour}`);
        console.log(
          `  ${runtime}, ${flavour}, pod from the ${by}: ADD p50 ${add.p50.toFixed(1)} - restore alone ${alone.toFixed(1)} = ${(add.p50 - alone).toFixed(1)} ms (<= 15: ${verdict(add.p50 - alone <= 15)}); CPU ${add.cpu.toFixed(1)} - restore alone ${restore.cpu.toFixed(1)} = ${(add.cpu - restore.cpu).toFixed(1)} ms/ADD (<= 15: ${verdict(add.cpu - restore.cpu <= 15)})`,
        );
      }
    }
    const v = row(`${runtime}: VERSION`).p50;
    const d = row(`${runtime}: DEL, netns gone`).p50;
    console.log(
      `  ${runtime}: VERSION p50 ${v.toFixed(1)} ms = ${(v / bridgeVersion).toFixed(2)} x bridge (<= 2: ${verdict(v <= 2 * bridgeVersion)}); DEL, netns gone p50 ${d.toFixed(1)} ms = ${(d / bridgeVersion).toFixed(2)} x bridge (<= 2: ${verdict(d <= 2 * bridgeVersion)})`,
    );
    // What the runtime's own start costs before any code of ours: when it alone is near or over a
    // target, that target is the runtime's, not the plugin's (docs/design.md, "Benchmark").
    const floor = rows.find((r) => r.name === `${runtime}: floor (empty script)`);
    if (floor) {
      console.log(
        `  ${runtime}: its floor, an empty script, p50 ${floor.p50.toFixed(1)} ms = ${(floor.p50 / bridgeVersion).toFixed(2)} x bridge; ` +
          `VERSION - floor ${(v - floor.p50).toFixed(1)} ms, DEL netns gone - floor ${(d - floor.p50).toFixed(1)} ms`,
      );
    }
    const io = rows.find((r) => r.name === `${runtime}: minimal IO (stdin to stdout)`);
    if (io) {
      const over = (x: number) => `${(x - io.p50).toFixed(1)} ms (<= 3: ${verdict(x - io.p50 <= 3)})`;
      console.log(
        `  ${runtime}: minimal IO program p50 ${io.p50.toFixed(1)} ms; VERSION - it ${over(v)}, DEL netns gone - it ${over(d)}`,
      );
    }
  }
}
if (criOverhead.size > 0) console.log("\nstart-up targets, under containerd's CRI");
for (const [network, d] of criOverhead) {
  console.log(
    `  ${network}: pod start overhead p50 ${d >= 0 ? '+' : ''}${d.toFixed(1)} ms (<= +40: ${verdict(d <= 40)})`,
  );
}

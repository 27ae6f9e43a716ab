// The plugin bench's CRI part (docs/design.md "Start-up time"): the pod start as kubelet sees it,
// through a real containerd's CRI (test/helpers/cri-containerd.ts, driven over gRPC by
// test/helpers/cri.ts), on the same network with and without mesh-cni, the agent's pod lookup
// socket up.
//
// One containerd per network, all running at once, each with its own CNI conflist:
//   bridge + portmap                      Debian's plugins (the baseline)
//   bridge + portmap + mesh-cni (<rt>)    the same, then mesh-cni as shipped, per runtime
// Per pod, each network starts one sandbox in an order that rotates from pod to pod, so load from
// other work falls on every network alike: RunPodSandbox, then PodSandboxStatus until it reports
// SANDBOX_READY with an IP (what kubelet waits for before it starts the pod's containers), then
// StopPodSandbox and RemovePodSandbox. Every pod is in the test API server first (so the agent's
// watch has it), with the uid the sandbox is started with.
// Each plugin executable runs through a timing shim (test/helpers/cri/cnitime.c) in the bench's
// own CNI bin dir: ADD and DEL wall time as containerd runs them, per plugin. The shim costs
// every plugin call one fork + exec of a small static program, on every network alike.

import { spawnSync } from 'node:child_process';
import type { TestApiServer } from '../../../test/helpers/apiserver.ts';
import {
  bridgePortmap,
  compileStatic,
  Containerd,
  DEBIAN_PLUGINS,
  type CniCall,
} from '../../../test/helpers/cri-containerd.ts';
import { meshPod } from '../../../test/helpers/plugin.ts';
import { pct } from './stats.ts';

export interface CriBenchOptions {
  /** mesh-cni executables to measure, by a short label (e.g. the runtime that built it). */
  readonly meshCni: ReadonlyMap<string, string>;
  readonly api: TestApiServer;
  readonly orchconfig: string;
  readonly podLookupSocket: string;
  readonly logUds: string;
  /** Pods started per network. */
  readonly pods: number;
  /** A temp dir of the caller's for the compiled shim and pause binaries. */
  readonly tmp: string;
  /** The agent's node. */
  readonly nodeName: string;
}

interface Network {
  readonly label: string;
  readonly mesh: boolean;
  readonly ctrd: Containerd;
  readonly startMs: number[];
  readonly stopMs: number[];
  readonly removeMs: number[];
  readonly ids: string[];
  /** RunPodSandbox sent, PodSandboxStatus ready: CLOCK_MONOTONIC ns, as the timing shim logs. */
  readonly spans: { readonly t0: bigint; readonly t1: bigint }[];
}

const ms = (a: bigint, b: bigint) => Number(b - a) / 1e6;

/** Our plugin entry as install-cni writes it by default (src/install/template.ts). */
function meshEntry(o: CriBenchOptions): Record<string, unknown> {
  return {
    type: 'mesh-cni',
    log_level: 'warn',
    log_uds_address: o.logUds,
    pod_lookup_uds_address: o.podLookupSocket,
    orch: {
      orchconfig: o.orchconfig,
      cni_bin_dir: '/opt/cni/bin',
      exclude_namespaces: ['mesh-system', 'kube-system'],
      node_name: o.nodeName,
    },
  };
}

async function startPod(net: Network, name: string, uid: string, record: boolean): Promise<void> {
  const { cri } = net.ctrd;
  const t0 = process.hrtime.bigint();
  const id = await cri.runPodSandbox({
    name,
    namespace: 'bench-cri',
    uid,
    labels: { 'mesh-bench': 'cri' },
    cgroupParent: `${net.ctrd.cgroupParent}/pod${uid}`,
  });
  for (let i = 0; ; i++) {
    const st = await cri.podSandboxStatus(id);
    if (st.ready && st.ip) break;
    if (!st.ready || i > 100) throw new Error(`${net.label}: sandbox ${name} not ready with an IP after RunPodSandbox`);
  }
  const t1 = process.hrtime.bigint();
  if (!record) checkRedirection(net, await cri.podSandboxNetns(id));
  await cri.stopPodSandbox(id);
  const t2 = process.hrtime.bigint();
  await cri.removePodSandbox(id);
  const t3 = process.hrtime.bigint();
  if (!record) return;
  net.startMs.push(ms(t0, t1));
  net.stopMs.push(ms(t1, t2));
  net.removeMs.push(ms(t2, t3));
  net.ids.push(id);
  net.spans.push({ t0, t1 });
}

/** The warm-up pod proves the measured chain does its job: our chains in the pod's netns or none. */
function checkRedirection(net: Network, netns: string): void {
  const chains = ['nft', 'legacy'].map((flavour) => {
    const argv = [`--net=${netns}`, '--', `/usr/sbin/iptables-${flavour}-save`];
    const r = spawnSync('/usr/bin/nsenter', argv, { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`${net.label}: iptables-${flavour}-save in ${netns}: ${r.stderr}`);
    return r.stdout.includes(':MESH_');
  });
  if (chains.includes(true) !== net.mesh) {
    const what = net.mesh ? 'no MESH_ chains' : 'MESH_ chains';
    throw new Error(`${net.label}: the sandbox's netns ${netns} has ${what} after RunPodSandbox`);
  }
}

const f = (v: number, n = 8) => v.toFixed(1).padStart(n);
const cols = (...cells: string[]) => cells.join('  ');

/** Runs the part and prints its tables; returns the pod start overhead p50 per mesh network. */
export async function benchCri(o: CriBenchOptions): Promise<Map<string, number>> {
  const shim = compileStatic('cnitime', `${o.tmp}/cnitime`);
  const pause = compileStatic('pause', `${o.tmp}/pause`);
  const variants: { label: string; mesh?: string }[] = [{ label: 'bridge + portmap' }];
  for (const [label, exe] of o.meshCni) variants.push({ label: `bridge + portmap + mesh-cni (${label})`, mesh: exe });
  const networks: Network[] = [];
  try {
    for (const [k, v] of variants.entries()) {
      const plugins = bridgePortmap(`mcnicri${k + 1}`, `198.18.${160 + k}.0/24`);
      if (v.mesh) plugins.push(meshEntry(o));
      const ctrd = await Containerd.start({
        tag: `b${k}`,
        plugins,
        pauseBinary: pause,
        timingShim: shim,
        binaries: { ...DEBIAN_PLUGINS, ...(v.mesh ? { 'mesh-cni': v.mesh } : {}) },
      });
      const mesh = v.mesh !== undefined;
      networks.push({ label: v.label, mesh, ctrd, startMs: [], stopMs: [], removeMs: [], ids: [], spans: [] });
    }
    // Every pod in the API server (so in the agent's watch) before any sandbox starts.
    const pods = networks.map((_, k) =>
      Array.from({ length: o.pods + 1 }, (_, i) => {
        const t = meshPod('bench-cri', `cri-${k}-${i}`);
        return o.api.upsertPod({ ...t, spec: { ...t.spec!, nodeName: o.nodeName } });
      }),
    );
    // Warm-up (not recorded): page cache, each containerd's first sandbox, the flavour cache.
    for (const [k, net] of networks.entries()) {
      await startPod(net, pods[k]![0]!.metadata!.name!, pods[k]![0]!.metadata!.uid!, false);
    }
    for (let i = 1; i <= o.pods; i++) {
      for (let j = 0; j < networks.length; j++) {
        const k = (i + j) % networks.length;
        const p = pods[k]![i]!;
        await startPod(networks[k]!, p.metadata!.name!, p.metadata!.uid!, true);
      }
    }
    const v = await networks[0]!.ctrd.cri.version();
    return report(networks, o.pods, `${v.runtimeName} ${v.runtimeVersion}, CRI ${v.runtimeApiVersion}`);
  } catch (e) {
    for (const net of networks) console.error(`--- ${net.label}: containerd log tail\n${net.ctrd.logTail(15)}`);
    throw e;
  } finally {
    for (const net of networks) {
      await net.ctrd.stop().catch((e: unknown) => console.error(`${net.label}: ${String(e)}`));
    }
  }
}

function report(networks: readonly Network[], pods: number, runtime: string): Map<string, number> {
  const base = networks[0]!;
  const w = Math.max(...networks.map((n) => n.label.length));
  console.log(
    `\npod start under a CRI runtime (${runtime}, runc, cgroupfs), ` +
      'RunPodSandbox until PodSandboxStatus is ready with an IP, as kubelet sees it; ' +
      `${pods} pods per network, interleaved; ms`,
  );
  console.log(
    '(+paired: p50 of the difference to the baseline pod of the same round; ' +
      'then p50s of its parts: RunPodSandbox sent to the first CNI ADD, the CNI ADDs (first start to last end), ' +
      'the last ADD to ready; and of StopPodSandbox and RemovePodSandbox)',
  );
  const heads = ['p50', 'p90', '+p50', '+p90', '+paired', 'to CNI', 'CNI ADDs', 'to ready', 'stop', 'remove'];
  console.log(cols('network'.padEnd(w), ...heads.map((h) => h.padStart(8))));
  const overhead = new Map<string, number>();
  const p = (xs: number[], q: number) => pct(xs, q);
  for (const n of networks) {
    const d50 = p(n.startMs, 50) - p(base.startMs, 50);
    const d90 = p(n.startMs, 90) - p(base.startMs, 90);
    if (n.mesh) overhead.set(n.label, d50);
    const plus = (v: number) => (n === base ? '-'.padStart(8) : `${v >= 0 ? '+' : ''}${v.toFixed(1)}`.padStart(8));
    const parts = phases(n);
    const paired = p(
      n.startMs.map((x, i) => x - base.startMs[i]!),
      50,
    );
    console.log(
      cols(
        n.label.padEnd(w),
        f(p(n.startMs, 50)),
        f(p(n.startMs, 90)),
        plus(d50),
        plus(d90),
        plus(paired),
        f(p(parts.toCni, 50)),
        f(p(parts.cni, 50)),
        f(p(parts.toReady, 50)),
        f(p(n.stopMs, 50)),
        f(p(n.removeMs, 50)),
      ),
    );
  }

  console.log(
    '\nCNI calls as containerd ran them (timing shim around each plugin), wall ms; ' +
      'DEL 1st = on StopPodSandbox (netns there), DEL 2nd = on RemovePodSandbox (netns gone)',
  );
  console.log(
    cols(
      'network'.padEnd(w),
      'plugin'.padEnd(9),
      'call'.padEnd(7),
      'n'.padStart(4),
      'p50'.padStart(8),
      'p90'.padStart(8),
      'failed',
    ),
  );
  for (const n of networks) {
    const ours = new Set(n.ids);
    const calls = n.ctrd.cniCalls().filter((c) => ours.has(c.containerId));
    for (const plugin of ['bridge', 'portmap', 'mesh-cni']) {
      const mine = calls.filter((c) => c.plugin === plugin);
      if (mine.length === 0) continue;
      const rows: [string, CniCall[]][] = [['ADD', mine.filter((c) => c.command === 'ADD')], ...delRounds(mine)];
      for (const [call, xs] of rows) {
        if (xs.length === 0) continue;
        const walls = xs.map((c) => ms(c.startNs, c.endNs));
        const failed = xs.filter((c) => c.code !== 0).length;
        console.log(
          cols(
            n.label.padEnd(w),
            plugin.padEnd(9),
            call.padEnd(7),
            String(xs.length).padStart(4),
            f(pct(walls, 50)),
            f(pct(walls, 90)),
            String(failed),
          ),
        );
      }
    }
  }
  return overhead;
}

/** Where each pod start went: before containerd ran the first CNI ADD, the ADDs, after them. */
function phases(n: Network): { toCni: number[]; cni: number[]; toReady: number[] } {
  const adds = new Map<string, CniCall[]>();
  for (const c of n.ctrd.cniCalls()) {
    if (c.command === 'ADD') (adds.get(c.containerId) ?? adds.set(c.containerId, []).get(c.containerId)!).push(c);
  }
  const out = { toCni: [] as number[], cni: [] as number[], toReady: [] as number[] };
  n.ids.forEach((id, i) => {
    const xs = adds.get(id) ?? [];
    if (xs.length === 0) return;
    const first = xs.reduce((a, c) => (c.startNs < a ? c.startNs : a), xs[0]!.startNs);
    const last = xs.reduce((a, c) => (c.endNs > a ? c.endNs : a), xs[0]!.endNs);
    out.toCni.push(ms(n.spans[i]!.t0, first));
    out.cni.push(ms(first, last));
    out.toReady.push(ms(last, n.spans[i]!.t1));
  });
  return out;
}

/** A sandbox's DEL calls in order: the first (on stop), the second (on remove), any more. */
function delRounds(calls: readonly CniCall[]): [string, CniCall[]][] {
  const byId = new Map<string, CniCall[]>();
  for (const c of calls.filter((k) => k.command === 'DEL').sort((a, b) => (a.startNs < b.startNs ? -1 : 1))) {
    (byId.get(c.containerId) ?? byId.set(c.containerId, []).get(c.containerId)!).push(c);
  }
  const names = ['DEL 1st', 'DEL 2nd', 'DEL 3rd+'];
  const out: [string, CniCall[]][] = names.map((name) => [name, []]);
  for (const xs of byId.values()) xs.forEach((c, i) => out[Math.min(i, 2)]![1].push(c));
  return out;
}

// Kubelet-shaped cgroups for tests and benchmarks of in-place repair: the agent finds a running
// pod's processes by the pod UID in their cgroup path (/kubepods/besteffort/pod<uid>/...), as a
// kubelet with the cgroupfs driver lays them out. Two ways to get there here, without a kubelet:
//   - podman with --cgroup-parent=/kubepods/besteffort/pod<uid> (cgroupfs manager): the container
//     lands in /kubepods/besteffort/pod<uid>/libpod-<id> in every hierarchy;
//   - a plain process (a `sleep` in an `ip netns add` netns: makeNetnsPods, for the benchmark's
//     100 pods and for a pod whose netns outlives its process) written into
//     .../pod<uid>/<container> in every hierarchy by placeInPodCgroup.
// Neither podman nor the kernel removes the pod<uid>, besteffort and kubepods dirs when the last
// process goes: removePodCgroups does, deepest first; a dir that still holds a process or another
// test's pod stays (rmdir refuses), so concurrent users never lose theirs.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { constants } from 'node:os';
import path from 'node:path';
import type { Podman } from './podman.ts';

export const KUBEPODS_QOS_PATH = '/kubepods/besteffort';

/** The cgroup parent of a pod's containers, as podman's --cgroup-parent takes it. */
export const podCgroupParent = (uid: string): string => `${KUBEPODS_QOS_PATH}/pod${uid}`;

/** Every mounted cgroup hierarchy (v1 controllers, named v1 like systemd, the v2 unified one). */
export function cgroupMounts(): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    // <id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype> <source> <super options>
    const [pre, post] = line.split(' - ');
    const fstype = post?.split(' ')[0];
    if (fstype !== 'cgroup' && fstype !== 'cgroup2') continue;
    const mountPoint = pre?.split(' ')[4];
    if (mountPoint && !out.includes(mountPoint)) out.push(mountPoint);
  }
  return out;
}

/** Which hierarchies a v1 process must be written into (all), or the unified one on pure v2. */
function writableHierarchies(): string[] {
  const mounts = cgroupMounts();
  const v1 = mounts.filter((m) => path.basename(m) !== 'unified' && !isV2Root(m));
  return v1.length > 0 ? v1 : mounts;
}

function isV2Root(m: string): boolean {
  try {
    readFileSync(path.join(m, 'cgroup.controllers'));
    return true;
  } catch {
    return false;
  }
}

/**
 * Moves `pid` into <hierarchy>/kubepods/besteffort/pod<uid>/<container> of every hierarchy, as a
 * kubelet's runtime would have put a container's process. Returns the dirs written.
 */
export function placeInPodCgroup(uid: string, pid: number, container = 'bench-sandbox'): string[] {
  const dirs: string[] = [];
  for (const h of writableHierarchies()) {
    const dir = path.join(h, podCgroupParent(uid), container);
    mkdirSync(dir, { recursive: true });
    // cpuset children start with no CPUs or memory nodes: a process cannot join them until set.
    for (const f of ['cpuset.cpus', 'cpuset.mems']) inheritCpuset(h, dir, f);
    writeFileSync(path.join(dir, 'cgroup.procs'), String(pid));
    dirs.push(dir);
  }
  return dirs;
}

function inheritCpuset(hierarchy: string, dir: string, file: string): void {
  let parent: string;
  try {
    parent = readFileSync(path.join(hierarchy, file), 'utf8').trim();
  } catch {
    return; // not the cpuset hierarchy
  }
  const rel = path.relative(hierarchy, dir).split(path.sep);
  for (let i = 1; i <= rel.length; i++) {
    const d = path.join(hierarchy, ...rel.slice(0, i));
    if (readFileSync(path.join(d, file), 'utf8').trim() === '') writeFileSync(path.join(d, file), parent);
  }
}

/** The pod dirs left in any hierarchy (for asserting a clean-up). */
export function podCgroupDirs(uid: string): string[] {
  return cgroupMounts()
    .map((h) => path.join(h, podCgroupParent(uid)))
    .filter((d) => {
      try {
        readdirSync(d);
        return true;
      } catch {
        return false;
      }
    });
}

/** rmdir of `dir` and everything below it, deepest first; false when something refused. */
function rmdirTree(dir: string): boolean {
  let entries: string[];
  try {
    entries = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name);
  } catch {
    return true; // gone already
  }
  let ok = true;
  for (const e of entries) ok = rmdirTree(path.join(dir, e)) && ok;
  try {
    rmdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') ok = false;
  }
  return ok;
}

/**
 * Removes the pod's cgroup dirs in every hierarchy, then besteffort and kubepods where empty. A
 * process that is still exiting keeps its dir busy for a moment: retried for up to `waitMs`.
 * Returns the pod dirs that could not be removed (empty: all clean).
 */
export async function removePodCgroups(uid: string, waitMs = 5000): Promise<string[]> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const left = cgroupMounts()
      .map((h) => path.join(h, podCgroupParent(uid)))
      .filter((d) => !rmdirTree(d));
    if (left.length === 0 || Date.now() > deadline) {
      for (const h of cgroupMounts())
        for (const d of [KUBEPODS_QOS_PATH, path.dirname(KUBEPODS_QOS_PATH)]) {
          try {
            rmdirSync(path.join(h, d));
          } catch {
            // not empty (another pod, another test) or never made here
          }
        }
      return left;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface KubepodsContainer {
  readonly name: string;
  readonly id: string;
  /** The container's init process as the host sees it. */
  readonly pid: number;
  /** podman's bind mount of the container's netns (/run/netns/cni-...). */
  readonly netnsPath: string;
  /** The address the CNI chain gave it on `network`. */
  readonly ip: string;
}

/**
 * `podman run --detach` of `argv` in `image` as a container of pod `uid` (kubelet-shaped cgroup),
 * on `network`; what the test needs to know of it. The caller removes it (podman rm) and then the
 * pod's cgroup dirs (removePodCgroups).
 */
export async function runPodContainer(
  podman: Podman,
  o: { name: string; uid: string; network: string; image: string; argv: readonly string[] },
): Promise<KubepodsContainer> {
  await podman.ok([
    'run',
    '--detach',
    '--name',
    o.name,
    '--cgroup-parent',
    podCgroupParent(o.uid),
    '--network',
    o.network,
    o.image,
    ...o.argv,
  ]);
  const fmt = [
    '{{.Id}}',
    '{{.State.Pid}}',
    '{{.NetworkSettings.SandboxKey}}',
    `{{(index .NetworkSettings.Networks "${o.network}").IPAddress}}`,
  ].join(' ');
  const [id, pid, netnsPath, ip] = (await podman.ok(['inspect', '--format', fmt, o.name])).trim().split(' ');
  if (!id || !pid || !netnsPath?.startsWith('/run/netns/') || !ip)
    throw new Error(`podman inspect of ${o.name} gave no id/pid/netns/ip: ${id} ${pid} ${netnsPath} ${ip}`);
  return { name: o.name, id, pid: Number(pid), netnsPath, ip };
}

// --- pods without a runtime -------------------------------------------------------------------
// Each is a netns made with `ip netns add`, with an address in 198.18.0.0/15 on a veth (both ends
// inside) and a default route (mesh-validation's probe needs a route to its documentation
// address), and a `sleep` in it placed in a kubelet-shaped cgroup, so the agent's /proc scan finds
// it by the pod UID as it finds a real pod's sandbox. The netns is pinned by its bind mount, so it
// outlives the sleep (as a pod's netns outlives an app container). remove() is synchronous so that
// it can run from an exit or signal handler too: an interrupted run leaves no netns, process or
// cgroup dir.

export interface NetnsPod {
  readonly name: string;
  readonly uid: string;
  readonly netns: string;
  readonly netnsPath: string;
  readonly ip: string;
  readonly sleeper: ChildProcess;
}

export interface NetnsPods {
  readonly pods: readonly NetnsPod[];
  /** Kills the sleeps, deletes the netns, removes the cgroup dirs; idempotent, synchronous. */
  remove(): void;
}

function ip(args: readonly string[], input?: string): void {
  const r = spawnSync('ip', args, { encoding: 'utf8', ...(input === undefined ? {} : { input }) });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed (${r.status}): ${r.stderr.trim()}`);
}

function rmdirDeepSync(dir: string): void {
  let subdirs: string[];
  try {
    subdirs = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name);
  } catch {
    return;
  }
  for (const s of subdirs) rmdirDeepSync(path.join(dir, s));
  try {
    rmdirSync(dir);
  } catch {
    // busy (a process still exiting) or not ours to remove: reported by the caller's check
  }
}

/**
 * `count` pods named `<prefix>-<i>`, with addresses `<net>.<i + 2>` (net: three octets in
 * 198.18.0.0/15). Removal is registered on exit and on SIGINT/SIGTERM.
 */
export function makeNetnsPods(prefix: string, count: number, net: string): NetnsPods {
  if (count > 250) throw new Error('makeNetnsPods: at most 250 pods per /24');
  const pods: NetnsPod[] = [];
  const made: string[] = [];
  let removed = false;
  const remove = () => {
    if (removed) return;
    removed = true;
    process.off('exit', remove);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    for (const p of pods) if (p.sleeper.exitCode === null) p.sleeper.kill('SIGKILL');
    for (const n of made) spawnSync('ip', ['netns', 'del', n]);
    // A killed process leaves its cgroup as it exits (before it is reaped).
    for (let i = 0; i < 50; i++) {
      for (const p of pods) for (const h of cgroupMounts()) rmdirDeepSync(path.join(h, podCgroupParent(p.uid)));
      const left = pods.filter((p) => cgroupMounts().some((h) => dirExists(path.join(h, podCgroupParent(p.uid)))));
      if (left.length === 0) break;
      spawnSync('sleep', ['0.05']);
    }
    for (const h of cgroupMounts())
      for (const d of [KUBEPODS_QOS_PATH, path.dirname(KUBEPODS_QOS_PATH)]) {
        try {
          rmdirSync(path.join(h, d));
        } catch {
          // not empty: someone else's pods
        }
      }
  };
  // Exits as the signal would (128 + its number), through process.exit so that the caller's own
  // exit handlers (its child processes, its temp dirs) run too.
  const onSignal = (sig: NodeJS.Signals) => {
    remove();
    process.exit(128 + (constants.signals[sig] ?? 0));
  };
  process.once('exit', remove);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    for (let i = 0; i < count; i++) {
      const name = `${prefix}-${i}`;
      const netnsPath = `/run/netns/${name}`;
      const addr = `${net}.${i + 2}`;
      ip(['netns', 'add', name]);
      made.push(name);
      ip(
        ['-n', name, '-batch', '-'],
        [
          'link set lo up',
          // No dummy module on every kernel: a veth pair with both ends in the netns does as well.
          'link add eth0 type veth peer name peer0',
          `addr add ${addr}/24 dev eth0`,
          'link set peer0 up',
          'link set eth0 up',
          'route add default dev eth0',
          '',
        ].join('\n'),
      );
      const uid = randomUUID();
      const sleeper = spawn('nsenter', [`--net=${netnsPath}`, '--', 'sleep', '100000'], { stdio: 'ignore' });
      pods.push({ name, uid, netns: name, netnsPath, ip: addr, sleeper });
      placeInPodCgroup(uid, sleeper.pid!, `sandbox-${i}`);
    }
  } catch (e) {
    remove();
    throw e;
  }
  return { pods, remove };
}

function dirExists(d: string): boolean {
  try {
    readdirSync(d);
    return true;
  } catch {
    return false;
  }
}

// Kubelet-shaped cgroups for tests and benchmarks of in-place repair: the agent finds a running
// pod's processes by the pod UID in their cgroup path (/kubepods/besteffort/pod<uid>/...), as a
// kubelet with the cgroupfs driver lays them out. Two ways to get there here, without a kubelet:
//   - podman with --cgroup-parent=/kubepods/besteffort/pod<uid> (cgroupfs manager): the container
//     lands in /kubepods/besteffort/pod<uid>/libpod-<id> in every hierarchy;
//   - a plain process (the benchmark's `sleep` in an `ip netns add` netns) written into
//     .../pod<uid>/<container> in every hierarchy by placeInPodCgroup.
// Neither podman nor the kernel removes the pod<uid>, besteffort and kubepods dirs when the last
// process goes: removePodCgroups does, deepest first; a dir that still holds a process or another
// test's pod stays (rmdir refuses), so concurrent users never lose theirs.

import { mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
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
  const fmt = `{{.Id}} {{.State.Pid}} {{.NetworkSettings.SandboxKey}} {{(index .NetworkSettings.Networks "${o.network}").IPAddress}}`;
  const [id, pid, netnsPath, ip] = (await podman.ok(['inspect', '--format', fmt, o.name])).trim().split(' ');
  if (!id || !pid || !netnsPath?.startsWith('/run/netns/') || !ip)
    throw new Error(`podman inspect of ${o.name} gave no id/pid/netns/ip: ${id} ${pid} ${netnsPath} ${ip}`);
  return { name: o.name, id, pid: Number(pid), netnsPath, ip };
}

// Pods for the in-place repair benchmark without a container runtime (podman for 100 pods is too
// slow): each is a netns made with `ip netns add`, with an address in 198.18.0.0/15 on a veth
// (both ends inside) and a default route (mesh-validation's probe needs a route to its
// documentation address), and a `sleep` in it, placed in a kubelet-shaped cgroup (/kubepods/besteffort/pod<uid>/...) so
// the agent's /proc scan finds it by the pod UID, as it finds a real pod's sandbox.
//
// Everything is removed by remove(), which is synchronous so that it can run from an exit or
// signal handler too (an interrupted benchmark leaves no netns, process or cgroup dir).

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readdirSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import { cgroupMounts, KUBEPODS_QOS_PATH, placeInPodCgroup, podCgroupParent } from '../../../test/helpers/kubepods.ts';

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

function rmdirDeep(dir: string): void {
  let subdirs: string[];
  try {
    subdirs = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name);
  } catch {
    return;
  }
  for (const s of subdirs) rmdirDeep(path.join(dir, s));
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
    for (const p of pods) if (p.sleeper.exitCode === null) p.sleeper.kill('SIGKILL');
    for (const n of made) spawnSync('ip', ['netns', 'del', n]);
    // A killed process leaves its cgroup as it exits (before it is reaped).
    for (let i = 0; i < 50; i++) {
      for (const p of pods) for (const h of cgroupMounts()) rmdirDeep(path.join(h, podCgroupParent(p.uid)));
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
  const onSignal = (sig: NodeJS.Signals) => {
    remove();
    process.kill(process.pid, sig);
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

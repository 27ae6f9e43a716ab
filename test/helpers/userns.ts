// A pod netns as the runtime makes one for a `hostUsers: false` pod: owned by a user namespace of
// its own that maps uids 0..65535 inside to a high range on the host (as kubelet's user namespaces
// do), bound at /run/netns/<name>, its "pause" process (sleep) holding the user namespace a
// process can enter. Removed by `defer`, also after a failure.

import { spawn, spawnSync } from 'node:child_process';
import { readlinkSync, writeFileSync } from 'node:fs';
import type { Defer } from './cleanup.ts';
import { Netns, uniqueName } from './netns.ts';
import { waitFor } from './poll.ts';
import { sh, shStatus } from './sh.ts';

/** Where uid/gid 0 inside lands on the host; the proxy's 1337 inside is HOST_BASE + 1337. */
export const HOST_BASE = 200_000;

export interface UsernsNetns {
  readonly name: string;
  /** /run/netns/<name>: CNI_NETNS. */
  readonly path: string;
  /** /proc/<pause>/ns/user. */
  readonly userns: string;
  /** argv prefix that runs a program in the pod's netns as `uid` (and gid) inside its user namespace. */
  as(uid: number): string[];
}

export async function usernsNetns(tag: string, defer: Defer): Promise<UsernsNetns> {
  const name = uniqueName(tag);
  const pause = spawn('unshare', ['--user', '--net', '--', 'sleep', 'infinity'], { stdio: 'ignore' });
  defer(async () => {
    pause.kill('SIGKILL');
  });
  const ours = readlinkSync('/proc/self/ns/user');
  const userns = `/proc/${pause.pid}/ns/user`;
  // unshare has made both namespaces once its user namespace differs from ours.
  await waitFor(`unshare (pid ${pause.pid}) to make its user namespace`, () => {
    try {
      return readlinkSync(userns) !== ours;
    } catch {
      return false;
    }
  });
  for (const f of ['uid_map', 'gid_map']) writeFileSync(`/proc/${pause.pid}/${f}`, `0 ${HOST_BASE} 65536\n`);
  sh(['ip', 'netns', 'attach', name, String(pause.pid)]);
  defer(async () => {
    spawnSync('ip', ['netns', 'del', name]);
  });
  const path = `/run/netns/${name}`;
  return {
    name,
    path,
    userns,
    as: (uid) => ['nsenter', `--user=${userns}`, `--net=${path}`, `--setuid=${uid}`, `--setgid=${uid}`, '--'],
  };
}

/** A server in `netns` that answers every connection with `tag` and closes it. */
export async function tagServer(netns: string, port: number, tag: string, defer: Defer): Promise<void> {
  const script = `require('node:net').createServer((s) => s.end(${JSON.stringify(tag)})).listen(${port}, '0.0.0.0', () => console.log('ready'));`;
  const child = spawn('nsenter', [`--net=${netns}`, '--', process.execPath, '-e', script], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  defer(async () => {
    child.kill('SIGKILL');
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`tag server ${tag} exited (${code})`)));
  });
}

/** What a connection from the pod to dst:8080, made as `uid` inside the pod's user namespace, reaches. */
export function reachedAs(pod: UsernsNetns, uid: number, dst: string): string {
  const r = spawnSync(
    pod.as(uid)[0]!,
    [...pod.as(uid).slice(1), 'bash', '-c', `exec 3<>/dev/tcp/${dst}/8080 && head -c 16 <&3`],
    { encoding: 'utf8', timeout: 10_000 },
  );
  return r.status === 0 ? r.stdout : `failed (${r.status ?? r.signal}): ${r.stderr}`;
}

/**
 * A userns-owned pod netns at `subnet`.2 on eth0 (its default route), a veth to a plain netns at `subnet`.9 where a
 * server answers "dest" on :8080, and the proxy's port 15001 in the pod answering "proxy".
 */
export async function podWithTraffic(subnet: string, defer: Defer): Promise<{ pod: UsernsNetns; dst: string }> {
  const pod = await usernsNetns('uns', defer);
  const far = new Netns('dst');
  defer(async () => far.remove());
  sh(['ip', '-n', far.name, 'link', 'add', 'vd', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.name]);
  sh(['ip', '-n', far.name, 'addr', 'add', `${subnet}.9/24`, 'dev', 'vd']);
  sh(['ip', '-n', far.name, 'link', 'set', 'vd', 'up']);
  for (const a of [
    ['link', 'set', 'lo', 'up'],
    ['addr', 'add', `${subnet}.2/24`, 'dev', 'eth0'],
    ['link', 'set', 'eth0', 'up'],
    // As a pod has one: the validation check's probe address is routed nowhere else.
    ['route', 'add', 'default', 'dev', 'eth0'],
  ])
    sh(['ip', '-n', pod.name, ...a]);
  await tagServer(far.path, 8080, 'dest', defer);
  await tagServer(pod.path, 15001, 'proxy', defer);
  return { pod, dst: `${subnet}.9` };
}

/**
 * A user of the node (uid 65534) holding a flock on `file` until the test ends: anyone on the
 * node can open a netns file (0444 under /run/netns) and flock it. Returns once it is held.
 */
export async function flockedByNodeUser(file: string, defer: Defer): Promise<void> {
  const holder = spawn(
    'setpriv',
    ['--reuid=65534', '--regid=65534', '--clear-groups', 'flock', file, 'sleep', 'infinity'],
    {
      stdio: 'ignore',
      detached: true,
    },
  );
  defer(async () => process.kill(-holder.pid!, 'SIGKILL'));
  await waitFor(`uid 65534 to hold a flock on ${file}`, () => shStatus(['flock', '-n', file, 'true']).code === 1);
}

// A pod netns as the runtime makes one for a `hostUsers: false` pod: owned by a user namespace of
// its own that maps uids 0..65535 inside to a high range on the host (as kubelet's user namespaces
// do), bound at /run/netns/<name>, its "pause" process (sleep) holding the user namespace a
// process can enter. Removed by `defer`, also after a failure.

import { spawn, spawnSync } from 'node:child_process';
import { readlinkSync, writeFileSync } from 'node:fs';
import type { Defer } from './cleanup.ts';
import { uniqueName } from './netns.ts';
import { waitFor } from './poll.ts';
import { sh } from './sh.ts';

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

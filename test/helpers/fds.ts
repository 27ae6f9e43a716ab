// This process's open fds, for leak tests. A leak is an fd opened in the measured span and still
// open at its end, so fds are compared by number and by what each is, never counted: a count
// also moves when an fd of an earlier test closes in the span (a socket whose close finishes
// late), which failed a leak test in CI with two fewer fds than before and no leak.

import { readdirSync, readlinkSync } from 'node:fs';

/** The open fds: number -> what /proc says each is. */
export type FdSnapshot = ReadonlyMap<string, string>;

export function fdSnapshot(): FdSnapshot {
  const fds = new Map<string, string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      fds.set(fd, readlinkSync(`/proc/self/fd/${fd}`));
    } catch {
      // the fd readdir itself used, closed by now
    }
  }
  return fds;
}

/** The fds open now that were not open (as the same thing) in `before`, as "fd -> what", so a leak names itself. */
export function fdsOpenedSince(before: FdSnapshot): string[] {
  return [...fdSnapshot()].filter(([fd, what]) => before.get(fd) !== what).map(([fd, what]) => `${fd} -> ${what}`);
}

// A fake host /proc for tests of the pod-netns scan (src/podnetns/): numeric dirs holding the three
// files the scan reads, `cgroup`, `stat` and `ns/net`, the last a symbolic link to a real netns
// file (`ip netns add`'s /run/netns/<name>, or /proc/self/ns/net for "the host's"), so the scan
// opens and enters real namespaces while every process in the tree is made up.
// A cgroup dir of any shape under one hierarchy for a real process: TestCgroup. Kubelet-shaped
// dirs in every v1 hierarchy at once (what podman with --cgroup-parent makes): test/helpers/kubepods.ts.

import { existsSync, mkdirSync, mkdtempSync, rmdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export interface FakeProcess {
  readonly pid: number;
  /** The whole /proc/<pid>/cgroup text (see cgroupV2/cgroupV1). */
  readonly cgroup: string;
  /** /proc/<pid>/stat field 22. */
  readonly starttime: number;
  /** What `ns/net` links to; null: no link (a process that exited mid-scan). */
  readonly netns: string | null;
  /** Field 2 without its parentheses (may hold spaces and parentheses, as a real comm may). */
  readonly comm?: string;
}

/** A /proc/<pid>/stat line with `starttime` in field 22 and made-up values elsewhere. */
export function statLine(pid: number, comm: string, starttime: number): string {
  // fields 3..21: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice num_threads itrealvalue; then 22 starttime, 23 vsize, 24 rss.
  const middle = ['S', '1', String(pid), String(pid), '0', '-1', '4194560', '97', '0', '0', '0', '1', '2', '0', '0'];
  return `${pid} (${comm}) ${[...middle, '20', '0', '1', '0', String(starttime), '1056768', '251'].join(' ')}\n`;
}

export const cgroupV2 = (p: string): string => `0::${p}\n`;
/** A cgroup v1 file with the pod path in every hierarchy, as on this machine. */
export const cgroupV1 = (p: string): string =>
  ['12:name=systemd', '9:pids', '6:memory', '3:cpu,cpuacct'].map((h) => `${h}:${p}`).join('\n') + '\n0::/\n';

/** A kubepods (cgroupfs driver) path for a container of pod `uid`. */
export const kubepodsPath = (uid: string, container: string): string => `/kubepods/besteffort/pod${uid}/${container}`;

export class FakeProc {
  readonly dir: string;
  constructor() {
    this.dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-fakeproc-'));
    // What a real /proc also holds and the scan must pass over.
    mkdirSync(path.join(this.dir, 'self'));
    mkdirSync(path.join(this.dir, 'sys'));
    writeFileSync(path.join(this.dir, 'uptime'), '1.00 1.00\n');
  }

  add(p: FakeProcess): this {
    const d = path.join(this.dir, String(p.pid));
    mkdirSync(path.join(d, 'ns'), { recursive: true });
    writeFileSync(path.join(d, 'cgroup'), p.cgroup);
    writeFileSync(path.join(d, 'stat'), statLine(p.pid, p.comm ?? 'pause', p.starttime));
    if (p.netns !== null) symlinkSync(p.netns, path.join(d, 'ns', 'net'));
    return this;
  }

  /** Writes `text` as a file of process `pid` (a cgroup file too long, a stat without field 22). */
  write(pid: number, file: string, text: string): this {
    writeFileSync(path.join(this.dir, String(pid), file), text);
    return this;
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A cgroup dir made for a test under one hierarchy's mount (`/sys/fs/cgroup/unified` for the v2
 * line of a hybrid machine, `/sys/fs/cgroup/systemd` for systemd's v1 one...), at `rel` below it:
 * any shape (a systemd slice path, kubepods), made with every missing parent. remove() takes the
 * dirs it made away, deepest first, once the processes moved in are gone (rmdir refuses a busy one:
 * retried for up to `waitMs`); a parent someone else made stays.
 */
export class TestCgroup {
  readonly dir: string;
  /** The path /proc/<pid>/cgroup shows for a process in it (relative to the hierarchy's root). */
  readonly cgroupPath: string;
  readonly #made: string[] = [];
  constructor(mount: string, rel: string) {
    this.dir = path.join(mount, rel);
    this.cgroupPath = '/' + path.relative(mount, this.dir);
    let d = this.dir;
    const missing: string[] = [];
    while (d !== mount && !existsSync(d)) {
      missing.unshift(d);
      d = path.dirname(d);
    }
    for (const m of missing) {
      mkdirSync(m);
      this.#made.push(m);
    }
  }

  /** Moves `pid` (all its threads) in. */
  addPid(pid: number): void {
    writeFileSync(path.join(this.dir, 'cgroup.procs'), String(pid));
  }

  async remove(waitMs = 5000): Promise<void> {
    const deadline = Date.now() + waitMs;
    for (const d of [...this.#made].reverse()) {
      for (;;) {
        try {
          rmdirSync(d);
          break;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === 'ENOENT') break;
          if (Date.now() > deadline)
            throw new Error(`cannot remove cgroup dir ${d}: ${(e as Error).message}`, { cause: e });
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    }
  }
}

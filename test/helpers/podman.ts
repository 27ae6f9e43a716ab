// A private podman for tests: its own storage (--root/--runroot, vfs), its own containers.conf
// (CONTAINERS_CONF: CNI network backend, runc + cgroupfs, no default ulimits, file events,
// private tmp/volume dirs) and storage.conf, its own CNI network config dir. The machine's
// podman configuration and storage are never read or written. podman 4.3 needs this:
// it reads only the state these point it at (docs/install.md "Tests of the manifests and the
// image").
//
// With `hostNetns`, every podman command runs inside that network namespace (nsenter --net,
// mount namespace unchanged so podman's /run/netns bind mounts stay visible): the CNI plugins
// podman runs (bridge, host-local, mesh-cni) then treat it as "the host", so bridges, addresses
// and routes go there and never into the machine's own network namespace.

import { spawn, spawnSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { run, type Run } from './netns.ts';

export interface PodmanOptions {
  /** Dirs podman searches for CNI plugin binaries, in order. */
  readonly cniPluginDirs?: readonly string[];
  /** Network config dir; default: a private dir. */
  readonly networkConfigDir?: string;
  /** Path of a netns (`/run/netns/<name>`) podman and its CNI plugins run in. */
  readonly hostNetns?: string;
}

export interface Podman {
  readonly dir: string;
  readonly networkConfigDir: string;
  /** Runs `podman <args>`; never throws for a non-zero exit. */
  run(args: readonly string[], opts?: { timeoutMs?: number; input?: string }): Promise<Run>;
  /** Runs `podman <args>` and returns stdout; throws with stderr on a non-zero exit. */
  ok(args: readonly string[], opts?: { timeoutMs?: number; input?: string }): Promise<string>;
  /** Removes every container and image of this podman, then its dirs. */
  remove(): Promise<void>;
}

const toml = (s: string) => JSON.stringify(s);

export function makePodman(o: PodmanOptions = {}): Podman {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-podman-'));
  const networkConfigDir = o.networkConfigDir ?? path.join(dir, 'net.d');
  for (const d of ['root', 'run', 'libpod', 'volumes', 'tmp']) mkdirSync(path.join(dir, d), { recursive: true });
  mkdirSync(networkConfigDir, { recursive: true });
  const conf = path.join(dir, 'containers.conf');
  writeFileSync(
    conf,
    [
      '[containers]',
      // podman 4.3 sets RLIMIT_NOFILE etc. from the host by default, which runc refuses here.
      'default_ulimits = []',
      '[network]',
      'network_backend = "cni"',
      `cni_plugin_dirs = [${(o.cniPluginDirs ?? ['/usr/lib/cni']).map(toml).join(', ')}]`,
      `network_config_dir = ${toml(networkConfigDir)}`,
      '[engine]',
      'cgroup_manager = "cgroupfs"',
      'runtime = "runc"',
      'events_logger = "file"',
      `events_logfile_path = ${toml(path.join(dir, 'events.log'))}`,
      `tmp_dir = ${toml(path.join(dir, 'libpod'))}`,
      `volume_path = ${toml(path.join(dir, 'volumes'))}`,
      '',
    ].join('\n'),
  );
  const storage = path.join(dir, 'storage.conf');
  writeFileSync(
    storage,
    `[storage]\ndriver = "vfs"\nrunroot = ${toml(path.join(dir, 'run'))}\ngraphroot = ${toml(path.join(dir, 'root'))}\n`,
  );
  const env = {
    PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    CONTAINERS_CONF: conf,
    CONTAINERS_STORAGE_CONF: storage,
    // registries.conf is only read for pulls, which these tests never do.
    CONTAINERS_REGISTRIES_CONF: path.join(dir, 'registries.conf'),
    TMPDIR: path.join(dir, 'tmp'),
    HOME: dir,
  };
  writeFileSync(env.CONTAINERS_REGISTRIES_CONF, 'unqualified-search-registries = []\n');
  const global = [
    '--root',
    path.join(dir, 'root'),
    '--runroot',
    path.join(dir, 'run'),
    '--storage-driver',
    'vfs',
    '--runtime',
    'runc',
    '--cgroup-manager',
    'cgroupfs',
    '--network-config-dir',
    networkConfigDir,
    '--tmpdir',
    path.join(dir, 'libpod'),
    '--events-backend',
    'file',
  ];
  const argv = (args: readonly string[]) =>
    o.hostNetns
      ? { file: 'nsenter', args: [`--net=${o.hostNetns}`, '--', 'podman', ...global, ...args] }
      : { file: 'podman', args: [...global, ...args] };

  const runPodman: Podman['run'] = (args, opts = {}) => {
    const a = argv(args);
    return run(a.file, a.args, {
      env,
      timeoutMs: opts.timeoutMs ?? 120_000,
      ...(opts.input === undefined ? {} : { input: opts.input }),
    });
  };
  return {
    dir,
    networkConfigDir,
    run: runPodman,
    async ok(args, opts) {
      const r = await runPodman(args, opts);
      if (r.code !== 0) throw new Error(`podman ${args.join(' ')} failed (${r.code}): ${r.stderr.trim()}`);
      return r.stdout;
    },
    async remove() {
      await runPodman(['rm', '--all', '--force', '--time', '0'], { timeoutMs: 60_000 }).catch(() => undefined);
      await runPodman(['rmi', '--all', '--force'], { timeoutMs: 60_000 }).catch(() => undefined);
      // Whatever podman left mounted below our dirs (a container's shm, a netns) goes first.
      const mounts = readFileSync('/proc/self/mounts', 'utf8')
        .split('\n')
        .map((l) => l.split(' ')[1] ?? '')
        .filter((m) => m.startsWith(dir + '/'))
        .sort()
        .reverse();
      for (const m of mounts) spawnSync('umount', ['-l', m]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface LoopbackForward {
  close(): Promise<void>;
}

/**
 * Makes 127.0.0.1:`port` inside the netns at `netnsPath` reach 127.0.0.1:`port` of this
 * process's netns (where the test API server listens), through a unix socket: a small node
 * process in the netns accepts TCP and dials the socket; this process accepts on the socket and
 * dials the port. Bytes pass through untouched (TLS stays end to end).
 */
export async function forwardLoopback(netnsPath: string, port: number): Promise<LoopbackForward> {
  const sockDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-podman-fwd-'));
  const sock = path.join(sockDir, 'fwd.sock');
  const conns = new Set<Socket>();
  const track = (s: Socket) => {
    conns.add(s);
    s.on('close', () => conns.delete(s));
    s.on('error', () => s.destroy());
    return s;
  };
  const server = createServer((u) => {
    const t = track(connect(port, '127.0.0.1'));
    track(u).pipe(t).pipe(u);
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(sock, resolve));
  const script = `const net=require('net');net.createServer(c=>{c.on('error',()=>{});const u=net.connect(${JSON.stringify(sock)});u.on('error',()=>c.destroy());c.pipe(u).pipe(c)}).listen(${port},'127.0.0.1',()=>console.log('listening'))`;
  const child = spawn('nsenter', [`--net=${netnsPath}`, '--', process.execPath, '-e', script], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`loopback forwarder in ${netnsPath} did not start in 10s: ${err}`)),
      10_000,
    );
    child.stdout!.once('data', () => {
      clearTimeout(timer);
      resolve();
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`loopback forwarder in ${netnsPath} exited (${code}): ${err}`));
    });
  });
  return {
    async close() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        await exited;
      }
      for (const c of conns) c.destroy();
      await new Promise((r) => server.close(r));
      rmSync(sockDir, { recursive: true, force: true });
    },
  };
}

/** A podman image made offline from Debian's busybox-static: /bin/busybox and its applets. */
export async function importBusybox(podman: Podman, name: string): Promise<void> {
  const root = mkdtempSync(path.join(os.tmpdir(), 'mcni-podman-bb-'));
  try {
    const bin = path.join(root, 'rootfs/bin');
    mkdirSync(bin, { recursive: true });
    copyFileSync('/bin/busybox', path.join(bin, 'busybox'));
    chmodSync(path.join(bin, 'busybox'), 0o755);
    for (const applet of ['sh', 'sleep', 'ip', 'cat', 'ls', 'wget', 'nc'])
      symlinkSync('busybox', path.join(bin, applet));
    for (const d of ['proc', 'sys', 'dev', 'etc', 'tmp']) mkdirSync(path.join(root, 'rootfs', d));
    const tar = path.join(root, 'rootfs.tar');
    const t = await run('tar', ['-C', path.join(root, 'rootfs'), '-cf', tar, '.']);
    if (t.code !== 0) throw new Error(`tar of the busybox rootfs failed: ${t.stderr}`);
    await podman.ok(['import', '--quiet', '--change', 'CMD ["/bin/sh"]', tar, name]);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

/** What one plugin answered to a DEL the test ran for the runtime. */
export interface PluginDel {
  readonly type: string;
  readonly code: number | null;
  readonly output: string;
}

/**
 * Runs DEL for a container the way a runtime that tears down with the config it cached at ADD
 * does (CRI-O; podman 4.3 re-reads its config dir instead): from libcni's own cache entry
 * (`<cacheDir>/results/<network>-<container id>-<ifname>`, written by podman at ADD), every
 * plugin of the cached conflist in reverse order, each given the list's name and cniVersion and
 * the cached result as prevResult, stopping at the first failure as libcni does. Runs in
 * `hostNetns`, where podman ran the plugins.
 */
export async function delFromCachedConfig(o: {
  cacheFile: string;
  netns: string;
  pluginDirs: readonly string[];
  hostNetns: string;
}): Promise<PluginDel[]> {
  const cache = JSON.parse(readFileSync(o.cacheFile, 'utf8')) as {
    containerId: string;
    ifName: string;
    config: string;
    cniArgs?: [string, string][];
    result?: unknown;
  };
  const list = JSON.parse(Buffer.from(cache.config, 'base64').toString('utf8')) as {
    name: string;
    cniVersion: string;
    plugins: { type: string }[];
  };
  const done: PluginDel[] = [];
  for (const plugin of [...list.plugins].reverse()) {
    const exe = o.pluginDirs
      .map((d) => path.join(d, plugin.type))
      .find((f) => spawnSync('test', ['-x', f]).status === 0);
    if (!exe) {
      done.push({
        type: plugin.type,
        code: null,
        output: `failed to find plugin "${plugin.type}" in path ${o.pluginDirs.join(':')}`,
      });
      return done;
    }
    const conf = {
      ...plugin,
      name: list.name,
      cniVersion: list.cniVersion,
      ...(cache.result ? { prevResult: cache.result } : {}),
    };
    const r = await run('nsenter', [`--net=${o.hostNetns}`, '--', exe], {
      input: JSON.stringify(conf),
      env: {
        PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
        CNI_COMMAND: 'DEL',
        CNI_CONTAINERID: cache.containerId,
        CNI_NETNS: o.netns,
        CNI_IFNAME: cache.ifName,
        CNI_ARGS: (cache.cniArgs ?? []).map(([k, v]) => `${k}=${v}`).join(';'),
        CNI_PATH: o.pluginDirs.join(':'),
      },
      timeoutMs: 30_000,
    });
    done.push({ type: plugin.type, code: r.code, output: `${r.stdout}${r.stderr}` });
    if (r.code !== 0) return done;
  }
  return done;
}

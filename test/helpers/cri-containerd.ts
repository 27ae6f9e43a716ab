// A containerd of the test's or benchmark's own, driven over its CRI socket (cri.ts) as kubelet
// drives it: Debian's containerd (scripts/setup-host.sh installs it) with its own config, root,
// state, sockets, runc root, CNI conf and bin dirs, all in one temp dir. It runs inside a fake
// "host" netns the harness makes (nsenter --net), so the bridge plugin's bridge and routes, and
// CRI's stream server, never touch the machine's own network; pod netns are made by containerd
// itself (bind mounts under its state dir). The sandbox image is built here from our own files:
// cri/pause.c compiled with gcc -static, packed as a docker-archive tarball and imported with
// `ctr images import`, so no registry is needed.
//
// stop() removes everything, also after a failure half-way: the sandboxes (over CRI), containerd
// and the shims it left (and their sockets in /run/containerd/s), runc state, mounts under the
// temp dir, the cgroup dirs below our own cgroup parent, the CNI result cache files of our network
// name and of CRI's loopback network for our sandboxes, the fake host netns, the dir.
//
// containerd 1.6 (Debian 12), config version 2. On these machines it needs
// restrict_oom_score_adj = true (the process may not lower its OOM score) and runc with cgroupfs.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CriClient } from './cri.ts';
import { sh as shared } from './sh.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const PAUSE_IMAGE = 'localhost/mesh-cri-pause:1';
const CNI_RESULTS = '/var/lib/cni/results';

const sh = (argv: readonly string[]): string => shared(argv, { timeoutMs: 60_000 });

/** Compiles one of cri/*.c into a static executable at `out`. */
export function compileStatic(source: 'pause' | 'cnitime', out: string): string {
  sh(['cc', '-static', '-Os', '-s', '-Wall', '-o', out, path.join(HERE, 'cri', `${source}.c`)]);
  return out;
}

// ---- a docker-archive tarball of one static binary, written here (ustar, no dependencies) ----

interface TarEntry {
  readonly name: string;
  readonly data?: Buffer;
  readonly mode: number;
  readonly dir?: boolean;
}

function tar(entries: readonly TarEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const data = e.data ?? Buffer.alloc(0);
    const h = Buffer.alloc(512);
    const put = (s: string, off: number, len: number) => h.write(s, off, len, 'ascii');
    const oct = (n: number, off: number, len: number) => put(n.toString(8).padStart(len - 1, '0') + '\0', off, len);
    put(e.name, 0, 100);
    oct(e.mode, 100, 8);
    oct(0, 108, 8);
    oct(0, 116, 8);
    oct(data.length, 124, 12);
    oct(0, 136, 12);
    put('        ', 148, 8);
    put(e.dir ? '5' : '0', 156, 1);
    put('ustar\0', 257, 6);
    put('00', 263, 2);
    let sum = 0;
    for (const b of h) sum += b;
    put(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** The pause image as a docker-archive (what `docker save` writes; containerd imports it as is). */
export function pauseImageArchive(pauseBinary: string, name = PAUSE_IMAGE): Buffer {
  const layer = tar([
    ...['dev/', 'etc/', 'proc/', 'sys/'].map((d) => ({ name: d, mode: 0o755, dir: true })),
    { name: 'pause', data: readFileSync(pauseBinary), mode: 0o755 },
  ]);
  const layerId = sha256(layer);
  const config = Buffer.from(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: { Entrypoint: ['/pause'], WorkingDir: '/' },
      rootfs: { type: 'layers', diff_ids: [`sha256:${layerId}`] },
    }),
  );
  const configName = `${sha256(config)}.json`;
  const manifest = Buffer.from(
    JSON.stringify([{ Config: configName, RepoTags: [name], Layers: [`${layerId}/layer.tar`] }]),
  );
  return tar([
    { name: `${layerId}/`, mode: 0o755, dir: true },
    { name: `${layerId}/layer.tar`, data: layer, mode: 0o644 },
    { name: configName, data: config, mode: 0o644 },
    { name: 'manifest.json', data: manifest, mode: 0o644 },
  ]);
}

// ---- the containerd ----

export interface ContainerdOptions {
  /** Short tag for names: netns, cgroup parent, CNI network name. */
  readonly tag: string;
  /** The plugins list of the CNI conflist (its name and cniVersion are filled in here). */
  readonly plugins: readonly Record<string, unknown>[];
  /** Plugin type -> real executable. With `timingShim`, each is run through it (cri/cnitime.c). */
  readonly binaries: Record<string, string>;
  /** A compiled cri/cnitime.c: calls are logged to cniCallsLog. */
  readonly timingShim?: string;
  /** The compiled pause binary (compiled here when absent). */
  readonly pauseBinary?: string;
}

export interface CniCall {
  readonly plugin: string;
  readonly command: string;
  readonly containerId: string;
  readonly startNs: bigint;
  readonly endNs: bigint;
  readonly code: number;
}

/** Where runc (cgroupfs) puts a cgroup: each v1 hierarchy here, or the v2 root itself. */
const cgroupRoots = (): string[] => {
  try {
    return ['/sys/fs/cgroup', ...readdirSync('/sys/fs/cgroup').map((c) => path.join('/sys/fs/cgroup', c))];
  } catch {
    return [];
  }
};

/**
 * Containerds started and not yet stopped. A Ctrl-C (SIGINT to the whole job: ours stops too, its
 * shims, started in their own process group, do not) or a SIGTERM would end the process before
 * any finally block runs, leaving all of it: the first such signal stops them, then ends the
 * process by that signal as it would have (a second one ends it at once).
 */
const live = new Set<Containerd>();
function stopAllOn(sig: NodeJS.Signals): void {
  const onSignal = () => {
    void Promise.all(
      [...live].map((c) => c.stop().catch((e: unknown) => console.error(`${c.dir}: ${String(e)}`))),
    ).then(() => {
      if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
    });
  };
  process.once(sig, onSignal);
}
let stopsOnSignals = false;

export class Containerd {
  readonly dir: string;
  readonly socket: string;
  readonly netnsName: string;
  readonly networkName: string;
  /** cgroupfs parent for the sandboxes (SandboxSpec.cgroupParent, with /pod<uid> below it). */
  readonly cgroupParent: string;
  readonly cniCallsLog: string;
  #proc: ChildProcess | undefined;
  #exited: Promise<void> = Promise.resolve();
  #clientCache: CriClient | undefined;

  private constructor(tag: string) {
    this.dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-cri-'));
    this.socket = path.join(this.dir, 'containerd.sock');
    this.netnsName = `mcni-cri-${process.pid}-${tag}`;
    this.networkName = `mcni-cri-${process.pid}-${tag}`;
    this.cgroupParent = `/mcni-cri-${process.pid}-${tag}`;
    this.cniCallsLog = path.join(this.dir, 'cni', 'cni-calls.log');
    live.add(this);
    if (!stopsOnSignals) {
      stopsOnSignals = true;
      stopAllOn('SIGINT');
      stopAllOn('SIGTERM');
    }
  }

  /** For tests of the cleanup: containerd dies (SIGKILL) as in a crash, leaving its shims running. */
  async crash(): Promise<void> {
    this.#proc?.kill('SIGKILL');
    await this.#exited;
  }

  get cri(): CriClient {
    return (this.#clientCache ??= new CriClient(this.socket));
  }

  /** Starts it with its network and the pause image in place; on failure removes what it made. */
  static async start(o: ContainerdOptions): Promise<Containerd> {
    const c = new Containerd(o.tag);
    try {
      await c.#setUp(o);
      return c;
    } catch (e) {
      await c.stop();
      throw e;
    }
  }

  async #setUp(o: ContainerdOptions): Promise<void> {
    const d = (...p: string[]) => path.join(this.dir, ...p);
    for (const sub of ['root', 'state', 'opt', 'runc', 'cni/bin/real', 'cni/net.d', 'cni/ipam', 'logs']) {
      mkdirSync(d(sub), { recursive: true });
    }
    sh(['ip', 'netns', 'add', this.netnsName]);
    sh(['ip', '-n', this.netnsName, 'link', 'set', 'lo', 'up']);

    for (const [type, real] of Object.entries(o.binaries)) {
      if (o.timingShim) {
        symlinkSync(real, d('cni/bin/real', type));
        copyFileSync(o.timingShim, d('cni/bin', type));
      } else symlinkSync(real, d('cni/bin', type));
    }
    const plugins = o.plugins.map((p) => fillIpamDataDir(p, d('cni/ipam')));
    const conflist = { cniVersion: '1.0.0', name: this.networkName, plugins };
    writeFileSync(d('cni/net.d/10-mcni-cri.conflist'), JSON.stringify(conflist, null, 2));

    const q = JSON.stringify;
    const cri = '[plugins."io.containerd.grpc.v1.cri"';
    writeFileSync(
      d('config.toml'),
      [
        'version = 2',
        `root = ${q(d('root'))}`,
        `state = ${q(d('state'))}`,
        // Only what a pod sandbox needs: no other snapshotters, no tracing, no NRI.
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", ' +
          '"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", ' +
          '"io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]',
        '[grpc]',
        `  address = ${q(this.socket)}`,
        '[ttrpc]',
        `  address = ${q(`${this.socket}.ttrpc`)}`,
        '[debug]',
        '  level = "info"',
        '[plugins."io.containerd.internal.v1.opt"]',
        `  path = ${q(d('opt'))}`,
        `${cri}]`,
        `  sandbox_image = ${q(PAUSE_IMAGE)}`,
        '  restrict_oom_score_adj = true',
        '  netns_mounts_under_state_dir = true',
        '  disable_apparmor = true',
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        `${cri}.containerd]`,
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        `${cri}.containerd.runtimes.runc]`,
        '  runtime_type = "io.containerd.runc.v2"',
        `${cri}.containerd.runtimes.runc.options]`,
        '  SystemdCgroup = false',
        '  BinaryName = "/usr/sbin/runc"',
        `  Root = ${q(d('runc'))}`,
        `${cri}.cni]`,
        `  bin_dir = ${q(d('cni/bin'))}`,
        `  conf_dir = ${q(d('cni/net.d'))}`,
        '  max_conf_num = 1',
        '',
      ].join('\n'),
    );

    const log = openSync(d('logs/containerd.log'), 'a');
    try {
      const argv = [`--net=/run/netns/${this.netnsName}`, '--', '/usr/bin/containerd', '--config', d('config.toml')];
      this.#proc = spawn('/usr/bin/nsenter', argv, {
        stdio: ['ignore', log, log],
        env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      });
    } finally {
      closeSync(log);
    }
    const proc = this.#proc;
    this.#exited = new Promise((resolve) => proc.once('exit', () => resolve()));
    let lastError: unknown;
    for (let i = 0; i < 300; i++) {
      if (proc.exitCode !== null || proc.signalCode !== null) {
        const how = proc.exitCode ?? proc.signalCode;
        throw new Error(`containerd exited during start (${how}); its log:\n${this.logTail()}`);
      }
      if (existsSync(this.socket)) {
        try {
          await this.cri.version();
          lastError = undefined;
          break;
        } catch (e) {
          lastError = e;
        }
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    if (lastError !== undefined || !existsSync(this.socket)) {
      throw new Error(`containerd's CRI did not answer within 15 s: ${String(lastError)}\n${this.logTail()}`);
    }

    const pause = o.pauseBinary ?? compileStatic('pause', d('pause'));
    writeFileSync(d('pause-image.tar'), pauseImageArchive(pause));
    const ctr = ['/usr/bin/ctr', '--address', this.socket, '-n', 'k8s.io'];
    sh([...ctr, 'images', 'import', '--snapshotter', 'overlayfs', d('pause-image.tar')]);
    // CRI learns of the import from containerd's event stream: wait until it has it, or the first
    // sandbox would try to pull it.
    for (let i = 0; !(await this.cri.hasImage(PAUSE_IMAGE)); i++) {
      if (i > 100) throw new Error(`CRI does not see ${PAUSE_IMAGE} after importing it\n${this.logTail()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** The CNI plugin calls the timing shim logged so far. */
  cniCalls(): CniCall[] {
    if (!existsSync(this.cniCallsLog)) return [];
    return readFileSync(this.cniCallsLog, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => {
        const [plugin, command, containerId, start, end, code] = l.split(' ');
        return {
          plugin: plugin!,
          command: command!,
          containerId: containerId!,
          startNs: BigInt(start!),
          endNs: BigInt(end!),
          code: Number(code),
        };
      });
  }

  logTail(lines = 30): string {
    try {
      return readFileSync(path.join(this.dir, 'logs/containerd.log'), 'utf8').split('\n').slice(-lines).join('\n');
    } catch {
      return '(no containerd log)';
    }
  }

  /** Removes every sandbox, containerd, and everything it made. Safe to call twice. */
  async stop(): Promise<void> {
    live.delete(this);
    const problems: string[] = [];
    const proc = this.#proc;
    if (proc && proc.exitCode === null && proc.signalCode === null) {
      try {
        for (const s of await this.cri.listPodSandbox()) {
          await this.cri.stopPodSandbox(s.id).catch((e: unknown) => problems.push(`stop ${s.id}: ${String(e)}`));
          await this.cri.removePodSandbox(s.id).catch((e: unknown) => problems.push(`remove ${s.id}: ${String(e)}`));
        }
      } catch (e) {
        problems.push(`listing sandboxes: ${String(e)}`);
      }
    }
    this.#clientCache?.close();
    this.#clientCache = undefined;
    if (proc && proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      await this.#exited;
      clearTimeout(timer);
    }
    this.#proc = undefined;
    // What containerd keeps outside our dir by design, read before its records go: each task's
    // shim socket (/run/containerd/s/<hash>, the host's own containerd's dir, whatever our config
    // says), which a killed shim leaves, and CRI's loopback network's libcni result per sandbox.
    const outside = this.#outsideOurDir();
    // Shims outlive containerd by design; ours are the ones started with our socket address.
    for (const pid of this.#shimPids()) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    // The shim gives runc a root per containerd namespace (runc/k8s.io/<container id>).
    const runcRoot = path.join(this.dir, 'runc');
    for (const ns of existsSync(runcRoot) ? readdirSync(runcRoot) : []) {
      for (const id of readdirSync(path.join(runcRoot, ns))) {
        spawnSync('/usr/sbin/runc', ['--root', path.join(runcRoot, ns), 'delete', '--force', id], { stdio: 'ignore' });
      }
    }
    this.#unmountUnder(this.dir);
    this.#removeCgroups();
    for (const socket of outside.shimSockets) rmSync(socket, { force: true });
    try {
      const ours = [`${this.networkName}-`, ...outside.sandboxes.map((id) => `cni-loopback-${id}-`)];
      for (const f of readdirSync(CNI_RESULTS)) {
        if (ours.some((prefix) => f.startsWith(prefix))) rmSync(path.join(CNI_RESULTS, f), { force: true });
      }
    } catch {
      // no result cache dir
    }
    spawnSync('ip', ['netns', 'del', this.netnsName], { stdio: 'ignore' });
    rmSync(this.dir, { recursive: true, force: true });
    if (problems.length > 0) throw new Error(`containerd cleanup: ${problems.join('; ')}`);
  }

  /** Our sandboxes' ids and our tasks' shim sockets, from containerd's records in our dir. */
  #outsideOurDir(): { sandboxes: string[]; shimSockets: string[] } {
    const ls = (dir: string) => (existsSync(dir) ? readdirSync(dir) : []);
    const sandboxes = ls(path.join(this.dir, 'root/io.containerd.grpc.v1.cri/sandboxes'));
    const shimSockets: string[] = [];
    const tasks = path.join(this.dir, 'state/io.containerd.runtime.v2.task');
    for (const ns of ls(tasks)) {
      for (const id of ls(path.join(tasks, ns))) {
        sandboxes.push(id);
        try {
          const socket = readFileSync(path.join(tasks, ns, id, 'address'), 'utf8')
            .trim()
            .replace(/^unix:\/\//, '');
          if (socket.startsWith('/run/containerd/s/')) shimSockets.push(socket);
        } catch {
          // no shim started for it
        }
      }
    }
    return { sandboxes: [...new Set(sandboxes)].filter((id) => /^[0-9a-f]{64}$/.test(id)), shimSockets };
  }

  #shimPids(): number[] {
    const pids: number[] = [];
    for (const p of readdirSync('/proc')) {
      if (!/^\d+$/.test(p)) continue;
      try {
        const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
        if (argv[0]?.includes('containerd-shim') && argv.includes(this.socket)) pids.push(Number(p));
      } catch {
        // exited meanwhile
      }
    }
    return pids;
  }

  #unmountUnder(dir: string): void {
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4]?.replace(/\\040/g, ' '))
      .filter((m): m is string => m !== undefined && (m === dir || m.startsWith(`${dir}/`)));
    for (const m of mounts.reverse()) spawnSync('umount', ['-l', m], { stdio: 'ignore' });
  }

  #removeCgroups(): void {
    const rmTree = (p: string) => {
      let kids: string[];
      try {
        kids = readdirSync(p, { withFileTypes: true })
          .filter((e) => e.isDirectory())
          .map((e) => path.join(p, e.name));
      } catch {
        return;
      }
      for (const k of kids) rmTree(k);
      try {
        rmdirSync(p);
      } catch {
        // still has tasks (should not), or not ours to remove
      }
    };
    for (const controller of cgroupRoots()) rmTree(path.join(controller, this.cgroupParent));
  }
}

/** host-local keeps its leases in /var/lib/cni/networks by default: keep them in our dir. */
function fillIpamDataDir(plugin: Record<string, unknown>, dataDir: string): Record<string, unknown> {
  const ipam = plugin.ipam as Record<string, unknown> | undefined;
  if (ipam?.type !== 'host-local') return plugin;
  return { ...plugin, ipam: { dataDir, ...ipam } };
}

/** Debian's bridge + portmap, the network without mesh-cni: a conflist's plugins for `subnet`. */
export function bridgePortmap(bridge: string, subnet: string): Record<string, unknown>[] {
  return [
    {
      type: 'bridge',
      bridge,
      isGateway: true,
      ipMasq: false,
      ipam: { type: 'host-local', ranges: [[{ subnet }]], routes: [{ dst: '0.0.0.0/0' }] },
    },
    { type: 'portmap', capabilities: { portMappings: true } },
  ];
}

export const DEBIAN_PLUGINS = {
  loopback: '/usr/lib/cni/loopback',
  bridge: '/usr/lib/cni/bridge',
  'host-local': '/usr/lib/cni/host-local',
  portmap: '/usr/lib/cni/portmap',
} as const;

// Network namespaces for plugin tests, and a CNI chain run exactly as a runtime runs it.
//
// The Debian `bridge` plugin changes its "host" netns (bridge, gateway address, ip_forward), so
// it runs inside a fake host netns the test creates (`ip netns exec`); the real host netns is
// never touched. Pod netns are separate `ip netns add` namespaces. Every name starts with
// `mcni-plg-<pid>-` and everything is removed by `cleanup()`, also after failures.

import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Defer } from './cleanup.ts';
import { sh } from './sh.ts';

export const CNI_BIN = '/usr/lib/cni';
let counter = 0;

export interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

export function run(
  file: string,
  args: readonly string[],
  opts: { env?: Record<string, string>; input?: string; timeoutMs?: number } = {},
): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, {
      env: opts.env ?? { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 30_000);
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(opts.input ?? '');
  });
}

export function uniqueName(tag: string): string {
  return `mcni-plg-${process.pid}-${tag}${++counter}`;
}

export class Netns {
  readonly name: string;
  readonly path: string;
  constructor(tag = 'ns') {
    this.name = uniqueName(tag);
    this.path = `/run/netns/${this.name}`;
    sh(['ip', 'netns', 'add', this.name]);
    sh(['ip', '-n', this.name, 'link', 'set', 'lo', 'up']);
  }

  /** Runs argv inside this netns. */
  exec(argv: readonly string[], input?: string): string {
    return sh(['ip', 'netns', 'exec', this.name, ...argv], { input });
  }

  remove(): void {
    spawnSync('ip', ['netns', 'del', this.name]);
  }
}

/**
 * A pod's netns, removed by `defer`: `ip`/24 on eth0, a veth whose peer (peer0) stays inside, and
 * a default route through it, so the pod's traffic has somewhere to go without leaving the netns.
 */
export function podNetnsWithVeth(tag: string, ip: string, defer: Defer): Netns {
  const n = new Netns(tag);
  defer(async () => n.remove());
  for (const a of [
    ['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0'],
    ['addr', 'add', `${ip}/24`, 'dev', 'eth0'],
    ['link', 'set', 'peer0', 'up'],
    ['link', 'set', 'eth0', 'up'],
    ['route', 'add', 'default', 'dev', 'eth0'],
  ])
    sh(['ip', '-n', n.name, ...a]);
  return n;
}

/**
 * Every iptables table in a netns as both backends see it (whichever the plugin used), without
 * their '# Generated ... on <time>' lines; a backend that cannot read it adds nothing.
 */
export function rulesIn(netnsPath: string): string {
  return ['iptables-nft-save', 'iptables-legacy-save']
    .map((bin) => {
      const r = spawnSync('nsenter', [`--net=${netnsPath}`, '--', bin], { encoding: 'utf8' });
      return r.status === 0 ? r.stdout : '';
    })
    .join('\n')
    .replace(/^#.*\n/gm, '');
}

export interface ChainEnv {
  readonly containerId: string;
  readonly netns: string;
  readonly ifname: string;
  readonly args: string;
}

export function cniEnv(command: string, c: ChainEnv, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    CNI_COMMAND: command,
    CNI_CONTAINERID: c.containerId,
    CNI_NETNS: c.netns,
    CNI_IFNAME: c.ifname,
    CNI_ARGS: c.args,
    CNI_PATH: CNI_BIN,
    ...extra,
  };
}

/** A fake host netns with a bridge network (Debian bridge + host-local) pods can be added to. */
export class BridgeNetwork {
  readonly host: Netns;
  readonly bridge: string;
  readonly subnet: string;
  readonly dataDir: string;
  readonly cniVersion: string;
  constructor(subnet: string, cniVersion = '1.0.0') {
    this.host = new Netns('host');
    this.bridge = `mcnib${process.pid % 100000}${counter}`.slice(0, 15);
    this.subnet = subnet;
    this.cniVersion = cniVersion;
    this.dataDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-ipam-'));
  }

  get bridgeConfig(): Record<string, unknown> {
    return {
      cniVersion: this.cniVersion,
      name: 'mcni-plg-net',
      type: 'bridge',
      bridge: this.bridge,
      isGateway: true,
      ipMasq: false,
      ipam: { type: 'host-local', subnet: this.subnet, dataDir: this.dataDir, routes: [{ dst: '0.0.0.0/0' }] },
    };
  }

  /** Runs the bridge plugin in the fake host netns; returns its result (the next plugin's prevResult). */
  async bridgeCmd(command: 'ADD' | 'DEL' | 'CHECK', c: ChainEnv, prevResult?: unknown): Promise<Run> {
    const conf = { ...this.bridgeConfig, ...(prevResult ? { prevResult } : {}) };
    return run('ip', ['netns', 'exec', this.host.name, `${CNI_BIN}/bridge`], {
      env: cniEnv(command, c),
      input: JSON.stringify(conf),
    });
  }

  async addPod(c: ChainEnv): Promise<Record<string, unknown>> {
    const r = await this.bridgeCmd('ADD', c);
    if (r.code !== 0) throw new Error(`bridge ADD failed: ${r.stdout} ${r.stderr}`);
    return JSON.parse(r.stdout) as Record<string, unknown>;
  }

  cleanup(): void {
    this.host.remove();
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

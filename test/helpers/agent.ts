// Runs the real install-cni as a child process against a host tree, reading its JSON logs, so
// tests can send it real signals and talk to its monitoring port.

import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { ROOT } from './cli.ts';
import { type HostTree } from './hosttree.ts';
import { run } from './netns.ts';
import { eventually } from './poll.ts';

export interface AgentProcess {
  readonly child: ChildProcess;
  /** Parsed JSON log records so far. */
  readonly logs: Record<string, unknown>[];
  readonly stderr: () => string;
  /** The monitoring port it listens on (it was started with --monitoring-port 0). */
  monitoringPort(): Promise<number>;
  get(pathname: string): Promise<{ status: number; body: string }>;
  waitForLog(
    pred: (r: Record<string, unknown>) => boolean,
    what: string,
    ms?: number,
  ): Promise<Record<string, unknown>>;
  /** Sends the signal and resolves with the exit code (or signal name). */
  stop(signal: NodeJS.Signals, ms?: number): Promise<number | string>;
}

/**
 * The flags that run an agent in a scratch dir of its own against a test API server: the
 * orchconfig `kc`, the net, bin and source dirs `net.d`, `bin`, `src` under `dir` (made by the
 * caller), both sockets there, ports chosen by the kernel, nothing removed on exit. Benchmarks
 * and tests add what they measure (repair flags, log levels).
 */
export function scratchAgentFlags(dir: string, kc: string): string[] {
  return [
    ...['--orchconfig', kc],
    ...['--mounted-cni-net-dir', path.join(dir, 'net.d')],
    ...['--mounted-cni-bin-dir', path.join(dir, 'bin')],
    ...['--cni-binaries-dir', path.join(dir, 'src')],
    ...['--monitoring-port', '0', '--ctrlz_port', '0'],
    ...['--log-uds-address', path.join(dir, 'log.sock')],
    ...['--pod-lookup-uds-address', path.join(dir, 'pods.sock')],
    ...['--cleanup-on-exit', 'never'],
  ];
}

/** source: the TypeScript through Node's type stripping; bundle: dist/install-cni.js, what the image runs. */
export type AgentEntry = 'source' | 'bundle';
const ENTRY: Record<AgentEntry, string> = { source: 'bin/install-cni.js', bundle: 'dist/install-cni.js' };

/**
 * `netnsPath`: the agent runs inside that netns (nsenter --net, which execs: the pid is the
 * agent's), as on a node whose host network a netns of the test stands for; get() then asks from
 * there too (curl in that netns), since its monitoring port is on that netns's loopback.
 */
export interface SpawnAgentOptions {
  readonly netnsPath?: string;
}

export function spawnAgent(
  tree: HostTree,
  flags: Record<string, string> = {},
  env: Record<string, string> = {},
  entry: AgentEntry = 'source',
  opts: SpawnAgentOptions = {},
): AgentProcess {
  const args = Object.entries({
    'monitoring-port': '0',
    ctrlz_port: '0',
    log_as_json: 'true',
    log_output_level: 'default:info,install:debug',
    'cleanup-on-exit': 'always',
    ...tree.flags,
    ...flags,
  }).map(([k, v]) => `--${k}=${v}`);
  const argv = [
    ...(opts.netnsPath ? ['nsenter', `--net=${opts.netnsPath}`, '--'] : []),
    process.execPath,
    path.join(ROOT, ENTRY[entry]),
    ...args,
  ];
  const child = spawn(argv[0]!, argv.slice(1), {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...tree.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: Record<string, unknown>[] = [];
  let stderr = '';
  let partial = '';
  child.stdout!.on('data', (d: Buffer) => {
    partial += d.toString();
    const lines = partial.split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) {
      try {
        logs.push(JSON.parse(l) as Record<string, unknown>);
      } catch {
        logs.push({ raw: l });
      }
    }
  });
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | string>((resolve) =>
    child.on('exit', (code, sig) => resolve(code ?? sig ?? 'unknown')),
  );

  const waitForLog = async (pred: (r: Record<string, unknown>) => boolean, what: string, ms = 10_000) => {
    await eventually(() => logs.some(pred) || child.exitCode !== null, what, ms);
    const rec = logs.find(pred);
    if (!rec)
      throw new Error(
        `install-cni exited (${child.exitCode}) before ${what}; stderr: ${stderr}; logs: ${JSON.stringify(logs.slice(-5))}`,
      );
    return rec;
  };
  let port: number | undefined;
  const monitoringPort = async () => {
    port ??= (await waitForLog((r) => r.msg === 'monitoring server listening', 'the monitoring server')).port as number;
    return port;
  };
  return {
    child,
    logs,
    stderr: () => stderr,
    monitoringPort,
    async get(pathname) {
      if (opts.netnsPath) {
        const url = `http://127.0.0.1:${await monitoringPort()}${pathname}`;
        const r = await run('nsenter', [`--net=${opts.netnsPath}`, '--', 'curl', '-sS', '-w', '\n%{http_code}', url]);
        if (r.code !== 0) throw new Error(`GET ${pathname} in ${opts.netnsPath} failed (${r.code}): ${r.stderr}`);
        const at = r.stdout.lastIndexOf('\n');
        return { status: Number(r.stdout.slice(at + 1)), body: r.stdout.slice(0, at) };
      }
      const res = await fetch(`http://127.0.0.1:${await monitoringPort()}${pathname}`);
      return { status: res.status, body: await res.text() };
    },
    waitForLog,
    async stop(signal, ms = 15_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), ms);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
      }
    },
  };
}

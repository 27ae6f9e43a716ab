// Stand-ins for ztunnel's proxies and for a pod's app: python3 listeners inside a netns, which
// answer each connection with "<listening port> <source address> <SO_ORIGINAL_DST>" and report
// the same line on their stdout (so the harness records what reached them, the way ztunnel would
// see it). No ztunnel exists here (it is not ours to ship): these are what the in-pod rules must
// send traffic to.
//
// - listenIn(netns, ports): listeners in a netns given by path (`/run/netns/x`, `/proc/<pid>/ns/net`);
// - ZtunnelListeners: the fake ztunnel's workload hook (test/helpers/fake-ztunnel.ts `workloads`):
//   on each Add it enters the RECEIVED netns fd (nsenter --net=/proc/self/fd/3, the fd handed to
//   the child as its fd 3: the test process's own threads never change netns) and binds
//   15001/15006/15008 there, as ztunnel starts a proxy in the pod's netns; on Del it stops them;
// - connectFrom(netns, host, port, mark?): a client in a netns; its answer is the listener's line.
// Every child is killed by the pid we started (stop, del, stopAll), and the fd we were given is
// the caller's to close: spawn dups it into the child before it returns.

import { spawn, type ChildProcess } from 'node:child_process';
import { run } from './netns.ts';

export const PYTHON = '/usr/bin/python3';

/** Ztunnel's in-pod ports: outbound, inbound plaintext, inbound HBONE. */
export const ZTUNNEL_PORTS = [15001, 15006, 15008] as const;

/** Listens on every port given (IPv4 and IPv6), answers and reports each connection. */
export const LISTENER = `
import selectors, socket, struct, sys
sel = selectors.DefaultSelector()
for p in sys.argv[1:]:
    for fam, any in ((socket.AF_INET, '0.0.0.0'), (socket.AF_INET6, '::')):
        s = socket.socket(fam)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((any, int(p)))
        s.listen(16)
        sel.register(s, selectors.EVENT_READ)
print('ready', flush=True)
while True:
    for key, _ in sel.select():
        c, addr = key.fileobj.accept()
        try:
            if c.family == socket.AF_INET:
                od = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
                orig = '%s:%d' % (socket.inet_ntoa(od[4:8]), struct.unpack('!H', od[2:4])[0])
            else:
                od = c.getsockopt(socket.IPPROTO_IPV6, 80, 28)  # IP6T_SO_ORIGINAL_DST
                orig = '[%s]:%d' % (socket.inet_ntop(socket.AF_INET6, od[8:24]), struct.unpack('!H', od[2:4])[0])
        except OSError:
            orig = '-'
        line = '%d %s %s' % (key.fileobj.getsockname()[1], addr[0], orig)
        try:
            c.sendall((line + '\\n').encode())
        except OSError:
            pass
        c.close()
        print('conn ' + line, flush=True)
`;

/** Connects to argv[1]:argv[2] (with SO_MARK argv[3] when not 0), prints the first line it gets. */
export const CLIENT = `
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
if int(sys.argv[3]):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[3]))
s.settimeout(5)
s.connect((sys.argv[1], int(sys.argv[2])))
print(s.recv(200).decode().strip())
`;

/** One connection a listener accepted. */
export interface AcceptedConnection {
  /** The port it was accepted on. */
  readonly port: number;
  readonly source: string;
  /** SO_ORIGINAL_DST as `ip:port` (`[ip6]:port`), '-' when there was none. */
  readonly originalDst: string;
}

export interface Listening {
  readonly pid: number;
  /** What it accepted so far, in order. */
  readonly accepted: AcceptedConnection[];
  /** Kills it (by its pid) and waits for its exit; idempotent. */
  stop(): Promise<void>;
}

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

/** Starts `argv` with `fd` (when given) as the child's fd 3; resolves once it printed 'ready'. */
async function startListener(argv: readonly string[], what: string, fd?: number): Promise<Listening> {
  const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'pipe', 'pipe'];
  if (fd !== undefined) stdio.push(fd);
  const child = spawn(argv[0]!, argv.slice(1), { stdio });
  const accepted: AcceptedConnection[] = [];
  let err = '';
  let partial = '';
  const stop = async () => {
    if (exited(child)) return;
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await gone;
  };
  child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  const ready = new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      partial += b.toString();
      const lines = partial.split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) {
        if (l === 'ready') resolve();
        const m = /^conn (\d+) (\S+) (\S+)$/.exec(l);
        if (m) accepted.push({ port: Number(m[1]), source: m[2]!, originalDst: m[3]! });
      }
    });
    child.once('error', reject);
    child.once('exit', (code, sig) => reject(new Error(`listener ${what} exited (${code ?? sig}): ${err.trim()}`)));
  });
  const timer = setTimeout(() => void stop(), 10_000);
  try {
    await ready;
  } catch (e) {
    await stop();
    throw e;
  } finally {
    clearTimeout(timer);
  }
  return { pid: child.pid!, accepted, stop };
}

/** Listeners on `ports` in the netns at `netnsPath` (the app of a pod, a peer's server). */
export function listenIn(netnsPath: string, ports: readonly number[]): Promise<Listening> {
  return startListener(
    ['nsenter', `--net=${netnsPath}`, '--', PYTHON, '-c', LISTENER, ...ports.map(String)],
    `in ${netnsPath}`,
  );
}

/** Connects from the netns at `netnsPath`; the listener's answer: [port, source, original destination]. */
export async function connectFrom(netnsPath: string, host: string, port: number, mark = 0): Promise<string[]> {
  const r = await run('nsenter', [`--net=${netnsPath}`, '--', PYTHON, '-c', CLIENT, host, String(port), String(mark)], {
    timeoutMs: 15_000,
  });
  if (r.code !== 0) throw new Error(`connect from ${netnsPath} to ${host}:${port} failed (${r.code}): ${r.stderr}`);
  return r.stdout.trim().split(' ');
}

/** A connection ztunnel's proxy of a workload accepted. */
export interface WorkloadConnection extends AcceptedConnection {
  readonly uid: string;
}

/**
 * The fake ztunnel's proxies: per workload UID, listeners on `ports` inside the netns of the fd
 * ztunnel was given with the Add. Pass it as FakeZtunnel's `workloads` option.
 */
export class ZtunnelListeners {
  readonly #ports: readonly number[];
  readonly #byUid = new Map<string, Listening>();
  /** Every connection any workload's proxy accepted (kept after a Del). */
  readonly #done: WorkloadConnection[] = [];

  constructor(ports: readonly number[] = ZTUNNEL_PORTS) {
    this.#ports = ports;
  }

  /** The UIDs with proxies now. */
  get uids(): string[] {
    return [...this.#byUid.keys()];
  }

  /** Connections accepted so far, of one workload if given. */
  connections(uid?: string): WorkloadConnection[] {
    const live = [...this.#byUid].flatMap(([u, l]) => l.accepted.map((c) => ({ ...c, uid: u })));
    return [...this.#done, ...live].filter((c) => uid === undefined || c.uid === uid);
  }

  /** Ztunnel's Add: proxies in the netns of `netnsFd` (a new Add of the same UID replaces them). */
  async add(uid: string, netnsFd: number): Promise<void> {
    await this.del(uid);
    const l = await startListener(
      ['nsenter', '--net=/proc/self/fd/3', '--', PYTHON, '-c', LISTENER, ...this.#ports.map(String)],
      `of workload ${uid}`,
      netnsFd,
    );
    this.#byUid.set(uid, l);
  }

  /** Ztunnel's Del: the workload's proxies stop. */
  async del(uid: string): Promise<void> {
    const l = this.#byUid.get(uid);
    if (!l) return;
    this.#byUid.delete(uid);
    await l.stop();
    this.#done.push(...l.accepted.map((c) => ({ ...c, uid })));
  }

  /** Every proxy stops (a ztunnel that exits, the end of a test). */
  async stopAll(): Promise<void> {
    for (const uid of this.uids) await this.del(uid);
  }
}

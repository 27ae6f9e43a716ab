// The unix sockets between the agent and the root plugin (log, pod lookup, plugin events) are
// trusted only where no user but root can change what the path names (docs/security.md, "Security: the
// trust model"). Here an unprivileged user (uid 65534, a real child process) takes over a socket
// in a directory it can write, as an attacker on the node would: it moves the socket, or a
// directory above it, aside and answers in its place. The agent must refuse such a path at
// start; the plugin must refuse to talk to what it finds there and fail the ADD (CNI error 11),
// never take it as "the agent is not running". Then the path check itself, case by case.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, lchownSync, mkdirSync, symlinkSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startCmdAddServer, type CmdAddDeps } from '../../src/ambient/cmdadd.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { startPodLookup } from '../../src/install/podlookup.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { startPluginLogServer } from '../../src/monitoring/logserver.ts';
import { listenUnix } from '../../src/monitoring/unixsocket.ts';
import { socketRefusal, untrustedDirChain } from '../../cni-plugin/shared/trustedpath.ts';
import { bunBinary } from '../../scripts/plugin-runtime.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { BridgeNetwork, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { waitFor } from '../helpers/poll.ts';
import { podLookupArgs } from '../../src/partargs.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const NOBODY = 65534;

// The unprivileged user's program (plain JS, run with `node -e`): moves `aside` to `aside.moved`,
// makes the socket's dir again when that was it, and answers on `sock` as the agent would have,
// but with what it likes: a pod without its sidecar annotation, "enrolled", or a line naming it.
// Prints "ready" once listening and "asked" for each connection.
const IMPOSTOR = `
const fs = process.getBuiltinModule('node:fs');
const net = process.getBuiltinModule('node:net');
const path = process.getBuiltinModule('node:path');
const [sock, aside, kind] = process.argv.slice(1);
try {
  fs.renameSync(aside, aside + '.moved');
} catch (e) {
  if (e.code !== 'ENOENT') throw e; // nothing served there: the path is free to take
}
fs.mkdirSync(path.dirname(sock), { recursive: true });
const server = net.createServer((c) => {
  console.log('asked');
  c.on('error', () => {});
  if (kind === 'line') return c.end('impostor\\n');
  let text = '';
  c.on('data', (d) => {
    text += d;
    if (kind === 'lookup' && text.includes('\\n')) {
      const req = JSON.parse(text.slice(0, text.indexOf('\\n')));
      const pod = { metadata: { namespace: req.namespace, name: req.name, uid: req.uid },
        spec: { containers: [{ name: 'app', image: 'app:1' }, { name: 'mesh-proxy', image: 'proxy:1' }] } };
      c.end(JSON.stringify({ pod }) + '\\n');
    }
    if (kind === 'cmdadd' && text.includes('\\r\\n\\r\\n')) {
      const body = '{"ok":true}';
      c.end('HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: ' + body.length +
        '\\r\\nConnection: close\\r\\n\\r\\n' + body);
    }
  });
});
server.listen(sock, () => console.log('ready'));
`;

interface Impostor {
  asked(): number;
  stop(): void;
}

const impostors = new Set<ChildProcess>();

/** uid 65534 moves `aside` away and serves `sock` in its place (see IMPOSTOR). */
async function takeOver(sock: string, aside: string, kind: 'line' | 'lookup' | 'cmdadd'): Promise<Impostor> {
  const child = spawn(process.execPath, ['-e', IMPOSTOR, sock, aside, kind], {
    uid: NOBODY,
    gid: NOBODY,
    cwd: '/',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  impostors.add(child);
  let out = '';
  let err = '';
  let exited = false;
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  child.on('exit', () => (exited = true));
  await waitFor(`uid ${NOBODY} to take ${sock} over`, () => {
    if (exited) throw new Error(`uid ${NOBODY} could not take ${sock} over: ${err}`);
    return out.includes('ready');
  });
  return {
    asked: () => out.split('\n').filter((l) => l === 'asked').length,
    stop: () => {
      child.kill();
      impostors.delete(child);
    },
  };
}

/** What answers on `sock` (a plain client: no check of its own), up to its close. */
function whoAnswers(sock: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.createConnection(sock);
    let text = '';
    s.on('data', (d) => (text += d.toString()));
    s.on('error', (e) => resolve(`error ${e.message}`));
    s.on('close', () => resolve(text));
  });
}

describe('a socket another user can take over', () => {
  const tmp = tempDir();
  let n = 0;
  /** A dir of root's, mode 0777: where sockets could be served by and taken over by anyone. */
  const sharedDir = (name: string) => {
    chmodSync(tmp.dir, 0o755); // mkdtemp's 0700 would keep uid 65534 out of everything below
    const d = path.join(tmp.dir, `${name}-${++n}`);
    mkdirSync(d);
    chmodSync(d, 0o777);
    return d;
  };
  after(() => {
    for (const c of impostors) c.kill();
    tmp.remove();
  });

  describe('the agent refuses to serve there, at start', () => {
    let api: TestApiServer;
    before(async () => {
      api = await startTestApiServer();
    });
    after(async () => {
      await api?.close();
    });

    type Started = Error | { close(): Promise<void> };
    const settle = (p: Promise<{ close(): Promise<void> }>): Promise<Started> => p.catch((e: Error) => e);
    const servers: [string, (sock: string) => Promise<Started>][] = [
      [
        'the plugin log socket (--log-uds-address)',
        (sock) =>
          settle(
            startPluginLogServer(buildSettings({ 'log-uds-address': sock }, {}).install.logUdsAddress).then((c) => ({
              close: () => c.stop('SIGTERM'),
            })),
          ),
      ],
      [
        'the pod lookup socket (--pod-lookup-uds-address)',
        async (sock) => {
          const orchconfig = api.writeOrchconfig(path.join(tmp.dir, `orchconfig-${++n}`));
          const c = await startPodLookup(
            podLookupArgs(buildSettings({ 'pod-lookup-uds-address': sock, orchconfig }, { NODE_NAME: 'node-1' })),
          );
          // A lookup it cannot serve is logged and left off (the plugin asks the API server).
          const error = (c.status() as { error?: string }).error;
          return error !== undefined ? new Error(error) : { close: () => c.stop('SIGTERM') };
        },
      ],
      [
        'the plugin event socket (--pluginevent-uds-address)',
        (sock) => {
          const unused = () => {
            throw new Error('not asked here');
          };
          const deps: CmdAddDeps = {
            pods: { get: unused },
            dataplane: { addPodToMesh: unused },
            isAmbient: unused,
            toEnrollPod: unused,
          };
          return settle(startCmdAddServer(sock, deps));
        },
      ],
    ];
    const layouts: [string, (dir: string, name: string) => { sock: string; aside: string; refused: string }][] = [
      [
        'in a dir of mode 0777',
        (dir, name) => ({ sock: path.join(dir, name), aside: path.join(dir, name), refused: dir }),
      ],
      [
        'in a dir of its own below a dir of mode 0777',
        (dir, name) => ({ sock: path.join(dir, 'run', name), aside: path.join(dir, 'run'), refused: dir }),
      ],
    ];

    for (const [what, start] of servers) {
      for (const [where, layout] of layouts) {
        it(`${what} ${where}`, async () => {
          const { sock, aside, refused } = layout(sharedDir('agent'), 'agent.sock');
          const started = await start(sock);
          // Whatever the agent did: uid 65534 takes the path over, as it could any time later.
          const impostor = await takeOver(sock, aside, 'line');
          const answer = await whoAnswers(sock);
          impostor.stop();
          if (!(started instanceof Error)) await started.close();
          assert.ok(
            started instanceof Error,
            `the agent served ${sock}; uid ${NOBODY} then moved ${aside} aside and answered in its place: ${JSON.stringify(answer)}`,
          );
          assert.match(
            started.message,
            new RegExp(`${refused} is writable by a user other than root \\(mode 0777, owner uid 0\\)`),
          );
          assert.match(started.message, /root's and writable by root alone/);
        });
      }
    }
  });

  describe("the plugin refuses what answers there, and fails the pod's ADD", () => {
    let api: TestApiServer;
    let network: BridgeNetwork;
    let orchconfig: string;
    const netns: Netns[] = [];
    const standIns: net.Server[] = [];
    let id = 0;
    const runtimes: [string, readonly string[]][] = [
      ['node', MESH_CNI_SOURCE],
      ['bun', [bunBinary(ROOT), path.join(ROOT, 'cni-plugin/main.ts')]],
    ];

    before(async () => {
      api = await startTestApiServer();
      orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
      network = new BridgeNetwork('198.18.231.0/24');
      api.upsertNamespace({ metadata: { name: 'amb', labels: { 'mesh.io/dataplane-mode': 'ambient' } } });
    });
    after(async () => {
      for (const ns of netns) ns.remove();
      network?.cleanup();
      for (const s of standIns) s.close();
      await api?.close();
    });

    /** The agent's socket as root served it there (an agent of before this check, say). */
    async function agentSocket(sock: string, handler: (c: net.Socket) => void): Promise<void> {
      const server = net.createServer(handler);
      standIns.push(server);
      await new Promise<void>((resolve) => server.listen(sock, resolve));
    }

    async function add(pod: V1Pod, extra: Record<string, unknown>, argv: readonly string[]) {
      const stored = api.upsertPod(pod);
      const ns = new Netns('trust');
      netns.push(ns);
      const ctr = `ctr${process.pid}t${++id}`;
      const chain: ChainEnv = { containerId: ctr, netns: ns.path, ifname: 'eth0', args: k8sArgs(stored, ctr) };
      const prev = await network.addPod(chain);
      const run = await meshCni('ADD', chain, pluginConfig({ cniVersion: '1.0.0', orchconfig, extra }, prev), argv);
      return { run, rules: ns.exec(['iptables-nft-save', '-t', 'nat']) };
    }
    const errorOf = (stdout: string) => JSON.parse(stdout) as { code: number; msg: string; details?: string };

    for (const [runtime, argv] of runtimes) {
      it(`${runtime}: a sidecar pod whose pod lookup socket was taken over is not started (no pod without its rules)`, async () => {
        const dir = sharedDir('lookup');
        const sock = path.join(dir, 'pods.sock');
        await agentSocket(sock, (c) => c.end('{"miss":"the agent stand-in"}\n'));
        const impostor = await takeOver(sock, sock, 'lookup');
        const { run, rules } = await add(meshPod('shop', `lookup-${runtime}`), { pod_lookup_uds_address: sock }, argv);
        const asked = impostor.asked();
        impostor.stop();
        assert.notEqual(
          run.code,
          0,
          `ADD exited 0 after asking uid ${NOBODY}'s socket ${asked} time(s); rules: ${/MESH_/.test(rules) ? 'some' : 'none'}`,
        );
        const e = errorOf(run.stdout);
        assert.equal(e.code, 11, run.stdout);
        assert.match(e.msg, new RegExp(`pod lookup socket ${sock} .*${dir} is writable by a user other than root`));
        assert.match(e.details ?? '', /root's and writable by root alone.*--pod-lookup-uds-address/);
        assert.equal(asked, 0, 'the socket was not talked to');
        assert.doesNotMatch(rules, /MESH_/);
      });

      it(`${runtime}: an ambient pod whose plugin event socket was taken over is not started unredirected`, async () => {
        const dir = sharedDir('event');
        const sock = path.join(dir, 'pluginevent.sock');
        const server = http.createServer((_req, res) => res.end());
        await new Promise<void>((resolve) => server.listen(sock, resolve));
        standIns.push(server);
        const impostor = await takeOver(sock, sock, 'cmdadd');
        const pod: V1Pod = {
          apiVersion: 'v1',
          kind: 'Pod',
          metadata: { namespace: 'amb', name: `event-${runtime}` },
          spec: { containers: [{ name: 'app', image: 'app:1' }] },
        };
        const { run } = await add(pod, { ambient_enabled: true, pluginevent_uds_address: sock }, argv);
        const asked = impostor.asked();
        impostor.stop();
        assert.notEqual(
          run.code,
          0,
          `ADD exited 0 after uid ${NOBODY}'s socket said "enrolled" (asked ${asked} time(s))`,
        );
        const e = errorOf(run.stdout);
        assert.equal(e.code, 11, run.stdout);
        assert.match(e.msg, new RegExp(`plugin event socket ${sock}: ${dir} is writable by a user other than root`));
        assert.match(e.msg, /not starting it unredirected/);
        assert.match(e.details ?? '', /--pluginevent-uds-address/);
        assert.equal(asked, 0, 'the socket was not talked to');
      });
    }

    it('sends no log line to a log socket that was taken over, says so on stderr, and still redirects the pod', async () => {
      const dir = sharedDir('log');
      const sock = path.join(dir, 'log.sock');
      await agentSocket(sock, (c) => c.resume());
      const impostor = await takeOver(sock, sock, 'line');
      const { run, rules } = await add(meshPod('shop', 'logged'), { log_uds_address: sock }, MESH_CNI_SOURCE);
      const asked = impostor.asked();
      impostor.stop();
      assert.equal(run.code, 0, run.stdout + run.stderr);
      assert.match(rules, /-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports 15001/);
      assert.equal(asked, 0, `the plugin's log lines went to uid ${NOBODY}'s socket`);
      assert.match(run.stderr, new RegExp(`not sending logs to ${sock}: ${dir} is writable by a user other than root`));
    });
  });
});

describe('the path check (cni-plugin/shared/trustedpath.ts)', () => {
  const tmp = tempDir();
  after(() => tmp.remove());
  let n = 0;
  const dir = (mode: number, parent = tmp.dir, uid = 0) => {
    const d = path.join(parent, `d${++n}`);
    mkdirSync(d);
    chmodSync(d, mode);
    chownSync(d, uid, 0);
    return d;
  };
  const serve = async (sock: string) => {
    const s = net.createServer();
    await new Promise<void>((resolve) => s.listen(sock, resolve));
    return s;
  };

  it('takes a dir of its own below a sticky shared dir of root (as a mkdtemp dir below /tmp)', async () => {
    const own = dir(0o750, dir(0o1777));
    assert.equal(untrustedDirChain(own), null);
    const s = await serve(path.join(own, 'x.sock'));
    assert.equal(socketRefusal(path.join(own, 'x.sock')), null);
    s.close();
  });

  it("refuses a sticky shared dir as the socket's own dir, and one of another user", () => {
    assert.match(untrustedDirChain(dir(0o1777)) ?? '', /is a shared directory \(sticky/);
    assert.match(untrustedDirChain(dir(0o755, tmp.dir, NOBODY)) ?? '', /is not root's \(owner uid 65534/);
    assert.match(untrustedDirChain(dir(0o755, dir(0o1777, tmp.dir, NOBODY))) ?? '', /is not root's/);
    assert.match(untrustedDirChain(dir(0o770)) ?? '', /writable by a user other than root \(mode 0770/);
  });

  it('walks links where they point: a link of root to a good dir is taken, one into a shared dir or of another user is not', () => {
    const good = dir(0o755);
    const bad = dir(0o777);
    const toGood = path.join(tmp.dir, `link${++n}`);
    symlinkSync(good, toGood);
    assert.equal(untrustedDirChain(toGood), null);
    const toBad = path.join(dir(0o755), 'link');
    symlinkSync(path.relative(path.dirname(toBad), bad), toBad);
    assert.match(untrustedDirChain(path.join(toBad, '.')) ?? '', new RegExp(`${bad} is writable by a user other`));
    const theirs = path.join(tmp.dir, `link${++n}`);
    symlinkSync(good, theirs);
    lchownSync(theirs, NOBODY, NOBODY);
    assert.match(untrustedDirChain(theirs) ?? '', /is a link of uid 65534/);
    // `..` after a link is the parent of where it points, as the kernel walks it: here a sticky
    // shared dir, fine above the socket's dir but not as it (path.join would drop the `..`).
    const sticky = dir(0o1777);
    const intoSticky = path.join(dir(0o755), 'link');
    symlinkSync(dir(0o755, sticky), intoSticky);
    assert.equal(untrustedDirChain(intoSticky), null);
    assert.match(untrustedDirChain(`${intoSticky}/..`) ?? '', new RegExp(`${sticky} is a shared directory`));
  });

  it("refuses a socket of another user, or a link, even in a dir of root's; nothing there is no refusal", async () => {
    const d = dir(0o755);
    const sock = path.join(d, 'x.sock');
    const s = await serve(sock);
    chownSync(sock, NOBODY, NOBODY);
    assert.match(socketRefusal(sock) ?? '', /x\.sock is not root's \(owner uid 65534\)/);
    symlinkSync(sock, path.join(d, 'link.sock'));
    assert.match(socketRefusal(path.join(d, 'link.sock')) ?? '', /link\.sock is not a socket/);
    assert.equal(socketRefusal(path.join(d, 'absent.sock')), null);
    assert.equal(socketRefusal(path.join(d, 'no-dir', 'absent.sock')), null);
    s.close();
  });

  it('refuses a path whose missing dir any user could make in a sticky shared dir (before the connect)', async () => {
    const sticky = dir(0o1777);
    const sock = path.join(sticky, 'absent', 'x.sock');
    // "Not there" would let the connect go on: a user who makes the dir and a socket in it between
    // the check and the connect (a rename loop wins that race) would answer the root plugin.
    assert.match(socketRefusal(sock) ?? '', new RegExp(`${sticky}/absent does not exist.*any user could make it`));
    assert.match(
      untrustedDirChain(path.join(sticky, 'absent')) ?? '',
      new RegExp(`${sticky}/absent does not exist.*any user could make it`),
    );
    // Once made by root, the dir of its own is walked as any other.
    mkdirSync(path.join(sticky, 'absent'), { mode: 0o755 });
    assert.equal(socketRefusal(sock), null);
  });

  it('listenUnix serves in a dir of its own below a sticky shared dir, and not in the shared dir itself', async () => {
    const shared = dir(0o1777);
    const close = await listenUnix(net.createServer(), path.join(shared, 'own', 'x.sock'), 'test', '--x', {
      maxConnections: 2,
    });
    await close();
    const served = await listenUnix(net.createServer(), path.join(shared, 'x.sock'), 'test', '--x', {
      maxConnections: 2,
    }).catch((e: Error) => e);
    if (!(served instanceof Error)) await served();
    assert.ok(served instanceof Error, `served in ${shared}`);
    assert.match(served.message, /is a shared directory \(sticky/);
  });
});

// A /cmdadd whose netns path is not a netns (a FIFO, planted by whoever can reach the plugin
// event socket or write the runtime's netns dir) must be refused at once: a FIFO opened without
// O_NONBLOCK held a libuv worker until a writer came, five of them held the whole thread pool,
// and the next real ADD (whose netns open queued behind them) failed after the plugin's 5 s.
// The agent's real /cmdadd server and real dataplane here: the node is a test netns, the pods
// real netns with an address, real iptables in them, ztunnel the fake on a real seqpacket socket.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, rmSync, statSync } from 'node:fs';
import fsp from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { startCmdAddServer } from '../../src/ambient/cmdadd.ts';
import { createDataplane, type PodAnnotator } from '../../src/ambient/dataplane.ts';
import { ambientPodOf } from '../../src/ambient/enablement.ts';
import { buildSettings, type Settings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { openNetns, runInNetns } from '../../src/podnetns/index.ts';
import { podPathCalls, POD_PATH_CALL_LIMITS } from '../../src/podnetns/fscalls.ts';
import { CMDADD_TIMEOUT_MS } from '../../cni-plugin/shared/pluginevent.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';
import { HungMount } from '../helpers/hungfs.ts';
import { Netns, podNetnsWithVeth } from '../helpers/netns.ts';
import { waitFor } from '../helpers/poll.ts';

configureLogging(
  { asJson: true, outputLevels: buildSettings({ log_output_level: 'all:none' }, {}).logging.outputLevels },
  { write: () => {} },
);

const defer = cleanupAfterEach();

class RecordingAnnotator implements PodAnnotator {
  readonly calls: { uid: string; value: string | null }[] = [];
  async setRedirection(pod: { uid: string }, value: 'enabled' | 'pending' | null): Promise<void> {
    this.calls.push({ uid: pod.uid, value });
  }
}

interface Answer {
  readonly status: number;
  readonly json: { ok: boolean; reason?: string; message?: string } | null;
}

/** POST /cmdadd as the plugin does, giving up after the plugin's own limit. */
function postCmdAdd(socketPath: string, body: object): Promise<Answer | 'no answer'> {
  return new Promise((resolve) => {
    const req = http.request({ socketPath, path: '/cmdadd', method: 'POST', agent: false }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => {
        clearTimeout(timer);
        let json = null;
        try {
          json = JSON.parse(text) as Answer['json'];
        } catch {
          /* not JSON */
        }
        resolve({ status: res.statusCode ?? 0, json });
      });
    });
    const timer = setTimeout(() => {
      req.destroy();
      resolve('no answer');
    }, CMDADD_TIMEOUT_MS);
    req.on('error', () => {
      clearTimeout(timer);
      resolve('no answer');
    });
    req.end(JSON.stringify(body));
  });
}

/** Every /cmdadd the agent answered (whether the client was still there). */
async function answered(): Promise<number> {
  const m = await registry.getSingleMetric('mesh_cni_plugin_requests_total')!.get();
  return m.values.reduce((n, v) => n + v.value, 0);
}

/** The answer, or the test fails naming what got none within the plugin's limit. */
function answerOf(a: Answer | 'no answer', what: string): Answer {
  if (a === 'no answer') assert.fail(`${what} got no answer within the plugin's limit`);
  return a;
}

/** The ADD of pod shop/real, whose netns `ns` holds `ip`. */
async function realAdd(socketPath: string, ns: Netns, ip: string): Promise<Answer> {
  const body = {
    netns: ns.path,
    podName: 'real',
    podNamespace: 'shop',
    podUid: 'uid-real',
    ips: [{ address: `${ip}/24` }],
  };
  return answerOf(await postCmdAdd(socketPath, body), "the real pod's ADD");
}

/** One ADD per path, all at once, each for its own pod (shop/<basename>) with an IP in `net`.0/24. */
function addsNaming(socketPath: string, paths: readonly string[], net: string): Promise<(Answer | 'no answer')[]> {
  return Promise.all(
    paths.map((p, i) => {
      const name = path.basename(p);
      const ips = [{ address: `${net}.${10 + i}/24` }];
      return postCmdAdd(socketPath, { netns: p, podName: name, podNamespace: 'shop', podUid: `uid-${name}`, ips });
    }),
  );
}

const pod = (name: string): V1Pod => ({
  metadata: { namespace: 'shop', name, uid: `uid-${name}` },
  spec: { nodeName: 'node-1', serviceAccountName: 'cart', containers: [{ name: 'app', image: 'app' }] },
});

async function agentUnderTest() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-fifo-'));
  defer(async () => rmSync(dir, { recursive: true, force: true }));
  // The test's node: a netns the host runner runs in, by fd as the agent's runner does.
  const node = new Netns('fifo-node');
  defer(async () => node.remove());
  const nodeHeld = await openNetns(node.path, 0);
  defer(async () => nodeHeld.close());
  const base = buildSettings({}, {});
  const settings: Settings = {
    ...base,
    ambient: { ...base.ambient, ztunnelUdsAddress: path.join(dir, 'ztunnel.sock'), hostRoot: '/' },
    repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
  };
  const annotator = new RecordingAnnotator();
  const dp = createDataplane(ambientArgs(settings), {
    annotator,
    host: (argv, o) => runInNetns(nodeHeld, argv, { input: o?.input ?? null }),
    flavour: async () => 'nft',
    zdsTimings: { acceptsPerSecond: 1000, helloTimeoutMs: 2000, writeTimeoutMs: 2000, ackTimeoutMs: 2000 },
  });
  defer(() => dp.stop(false));
  await dp.start([]);
  const zt = new FakeZtunnel({ path: settings.ambient.ztunnelUdsAddress });
  defer(() => zt.stop());
  await zt.waitForNth('snapshot_sent', 1);
  const server = await startCmdAddServer(
    path.join(dir, 'run', 'pluginevent.sock'),
    {
      pods: { get: (_ns, name) => pod(name) },
      dataplane: dp,
      isAmbient: () => true,
      toEnrollPod: ambientPodOf,
    },
    { podReadAttempts: 1 },
  );
  defer(() => server.close());
  return { dir, dp, zt, server, annotator };
}

describe("the agent's /cmdadd with a netns path that is not a netns", () => {
  it(
    'FIFOs as the netns are refused at once by name and kind; a real ADD still succeeds; no fd is left open',
    { timeout: 60_000 },
    async () => {
      const { dir, dp, zt, server, annotator } = await agentUnderTest();
      // More FIFOs than libuv has workers (4 by default).
      const fifos = Array.from({ length: 6 }, (_, i) => path.join(dir, `fifo-${i}`));
      for (const f of fifos) execFileSync('mkfifo', [f]);
      const answeredBefore = await answered();
      // Whatever the outcome, no open stays blocked past the test: until the agent has answered
      // every ADD sent here, each blocked reader is let go by a writer's open (O_NONBLOCK: never
      // blocks, ENXIO while no reader waits). Sync, on the main thread: the pool may be what is stuck.
      defer(async () => {
        for (let i = 0; i < 1500 && (await answered()) < answeredBefore + fifos.length + 1; i++) {
          for (const f of fifos) {
            try {
              closeSync(openSync(f, constants.O_WRONLY | constants.O_NONBLOCK));
            } catch {
              /* no reader now */
            }
          }
          await new Promise((r) => setTimeout(r, 20));
        }
      });
      const before = fdSnapshot();
      const refused = addsNaming(server.address, fifos, '198.18.61');

      // A real pod's ADD, sent while the FIFO ones are in flight.
      const ns = podNetnsWithVeth('fifo-pod', '198.18.61.2', defer);
      const real = await realAdd(server.address, ns, '198.18.61.2');
      assert.equal(real.status, 200, JSON.stringify(real.json));
      const add = zt.of('add').find((r) => r.kind === 'add' && r.uid === 'uid-real');
      assert.equal(add?.kind === 'add' ? add.netnsIno : null, statSync(ns.path, { bigint: true }).ino);
      assert.equal(dp.isEnrolled('uid-real'), true);

      const answers = await refused;
      for (const [i, answer] of answers.entries()) {
        const a = answerOf(answer, `the ADD naming ${fifos[i]}`);
        assert.equal(a.status, 500);
        assert.equal(a.json?.reason, 'netns', a.json?.message);
        assert.match(a.json?.message ?? '', new RegExp(`${fifos[i]} is a FIFO, not a network namespace`));
      }
      assert.deepEqual(
        annotator.calls.map((c) => c.uid),
        ['uid-real'],
        'nothing but the real pod annotated',
      );
      // The real pod's netns is held while it is enrolled; once removed, nothing opened is left.
      await dp.removePodFromMesh(ambientPodOf(pod('real')), true);
      await waitFor('no fd left open', () => fdsOpenedSince(before).length === 0, {
        context: () => fdsOpenedSince(before).join('\n'),
      });
    },
  );

  it(
    'netns paths the kernel hangs on (FUSE, no daemon): each ADD answered in time naming the path, the pool kept, /readyz told',
    { timeout: 60_000 },
    async () => {
      const { server } = await agentUnderTest();
      const m = new HungMount();
      defer(async () => m.release());
      const hungPaths = Array.from({ length: 6 }, (_, i) => m.path(`netns-${i}`));
      const answers = await addsNaming(server.address, hungPaths, '198.18.62');
      for (const [i, answer] of answers.entries()) {
        const a = answerOf(answer, `the ADD naming ${hungPaths[i]}`);
        assert.equal(a.status, 500);
        assert.equal(a.json?.reason, 'netns', a.json?.message);
        assert.match(
          a.json?.message ?? '',
          new RegExp(`opening ${hungPaths[i]} as a netns( did not return|: not started)`),
        );
      }
      // Two of them hold their workers, named for /readyz; the rest never reached the pool.
      const reasons = podPathCalls.notReadyReasons();
      assert.equal(reasons.length, POD_PATH_CALL_LIMITS.slots, reasons.join('\n'));
      for (const r of reasons) assert.match(r, new RegExp(`opening ${m.dir}/netns-\\d as a netns has not returned`));
      // The pool's other workers serve the agent meanwhile.
      await fsp.stat(os.tmpdir());
      // Once the kernel lets go, the slots are free and a real pod is enrolled.
      m.release();
      await waitFor('the hung calls returned', () => podPathCalls.running === 0);
      assert.deepEqual(podPathCalls.notReadyReasons(), []);
      const ns = podNetnsWithVeth('fifo-pod', '198.18.62.2', defer);
      const real = await realAdd(server.address, ns, '198.18.62.2');
      assert.equal(real.status, 200, JSON.stringify(real.json));
    },
  );
});

// A stop of the agent during an in-place repair (docs/repair.md "Repair in place"): the program
// running in the pod's netns is killed when the repair queue's stop grace ends, not when its own
// time limit does, and the cut repair decides nothing: no label, no Event, no failure counted,
// the pod left broken for the next agent. The production controller and watch against the test
// HTTPS API server, the real repairer running real nsenter in a real netns; what hangs is a stub
// (the validation check, or iptables-nft-restore put first on PATH). Needs root and iptables-nft.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { before, describe, it } from 'node:test';
import { buildSettings } from '../../src/config/settings.ts';
import { configureLogging } from '../../src/monitoring/logging.ts';
import { registry } from '../../src/monitoring/metrics.ts';
import { orchApi } from '../../src/orch/client.ts';
import { orchClientArgs, repairArgs } from '../../src/partargs.ts';
import { openNetns, runInNetns, type HeldNetns } from '../../src/podnetns/index.ts';
import type { RepairTiming } from '../../src/repair/controller.ts';
import { repairPodSource, startRepair } from '../../src/repair/index.ts';
import { InPlaceRepairer } from '../../src/repair/inplace.ts';
import { startTestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { podNetnsWithVeth } from '../helpers/netns.ts';
import { brokenPod } from '../helpers/pods.ts';
import { waitFor } from '../helpers/poll.ts';

const defer = cleanupAfterEach();
const LABEL = 'cni.mesh.io/uninitialized';
const POD_IP = '198.18.5.2';

const TIMING: Partial<RepairTiming> = {
  watchBackoffBaseMs: 50,
  watchBackoffMaxMs: 400,
  actionBackoffBaseMs: 20,
  actionBackoffMaxMs: 50,
  requestTimeoutMs: 3000,
  resyncIntervalMs: 60_000,
  maxAttempts: 3,
  // Short, next to the programs' own time limit below: only the stop's abort can end them in time.
  stopGraceMs: 200,
};
/** Each program's own time limit: a stop that waited for it would count the run as failed. */
const RUN_TIMEOUT_MS = 20_000;

const logs: string[] = [];

async function failuresOfRepair(): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === 'mesh_cni_repair_failures_total');
  return (m?.values ?? []).filter((v) => v.labels.type === 'repair').reduce((n, v) => n + v.value, 0);
}

/** The pid a stub wrote once it is running (and about to hang). */
const pidIn = (file: string) =>
  waitFor(`the stub's pid in ${file}`, async () => {
    const text = existsSync(file) ? await readFile(file, 'utf8') : '';
    return /^\d+\n$/.test(text) ? Number(text) : false;
  });

const netnsPids = (name: string) => spawnSync('ip', ['netns', 'pids', name], { encoding: 'utf8' }).stdout.trim();

describe('in-place repair: a stop cuts a running repair short', () => {
  before(() => {
    configureLogging(
      {
        asJson: false,
        outputLevels: buildSettings({ log_output_level: 'all:warn,repair:debug' }, {}).logging.outputLevels,
      },
      { write: (l) => void logs.push(l) },
    );
  });

  for (const hangs of ['validation', 'iptables-nft-restore'] as const) {
    it(`${hangs} hangs: killed when the stop's grace ends; no label, Event or failure; no process left`, async () => {
      const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-inplace-stop-'));
      defer(() => rm(dir, { recursive: true, force: true }));
      const pidFile = path.join(dir, 'stub.pid');
      // The stub becomes the process nsenter started (exec), so killing that one leaves nothing.
      const hangJs = path.join(dir, 'hang.cjs');
      await writeFile(
        hangJs,
        `require('node:fs').writeFileSync(${JSON.stringify(pidFile)}, process.pid + '\\n');\n` +
          'setInterval(() => {}, 60_000);\n',
      );
      const validation = hangs === 'validation' ? hangJs : path.join(dir, 'passes.cjs');
      await writeFile(path.join(dir, 'passes.cjs'), "process.stdout.write('fake pass\\n');\n");
      if (hangs === 'iptables-nft-restore') {
        const stub = path.join(dir, 'bin', hangs);
        await mkdir(path.dirname(stub));
        await writeFile(stub, `#!/bin/sh\necho $$ > ${pidFile}.tmp && mv ${pidFile}.tmp ${pidFile}\nexec sleep 600\n`);
        await chmod(stub, 0o755);
        const saved = process.env.PATH;
        defer(async () => void (process.env.PATH = saved));
        process.env.PATH = `${path.dirname(stub)}:${saved}`;
      }

      const ns = podNetnsWithVeth('inpls', POD_IP, defer);
      const s = await startTestApiServer({ bookmarkIntervalMs: 200 });
      defer(() => s.close());
      const p = brokenPod('stop-0');
      s.upsertPod({ ...p, status: { ...p.status, podIP: POD_IP, podIPs: [{ ip: POD_IP }] } });
      const repairer = new InPlaceRepairer({
        netns: {
          findPodNetns: async () => ({ ok: true, netns: await openNetns(ns.path, 0) }),
          runInNetns: (n, argv, o) => runInNetns(n as HeldNetns, argv, o),
          stillThere: async () => true,
        },
        validationBundle: validation,
        hostFlavour: async () => 'nft',
        runTimeoutMs: RUN_TIMEOUT_MS,
      });
      const kc = s.writeOrchconfig(path.join(dir, 'kc.json'), {});
      const settings = buildSettings(
        { 'repair-enabled': true, 'repair-node-name': 'node-a', orchconfig: kc },
        { NODE_NAME: 'node-a', POD_NAME: 'mesh-cni-test', REPAIR_REPAIR_PODS: 'true', REPAIR_LABEL_PODS: 'true' },
      );
      const api = orchApi(orchClientArgs(settings));
      const pods = repairPodSource(repairArgs(settings), api, TIMING);
      pods.start();
      defer(() => pods.stop());
      const failedBefore = await failuresOfRepair();
      const mark = logs.length;
      const c = startRepair(repairArgs(settings), pods, api, TIMING, repairer);
      defer(() => c.stop('SIGTERM'));

      const pid = await pidIn(pidFile);
      assert.ok(existsSync(`/proc/${pid}`), 'the stub runs in the pod netns when the stop comes');
      await c.stop('SIGTERM');

      // Killed, not waited for: the stop ended before the program's own time limit could.
      const said = logs.slice(mark).join('');
      assert.match(said, /in-place repair cut short by the stop; left for the next agent/);
      assert.match(said, /was cut short \(work queue repair stopped\); killed/);
      assert.doesNotMatch(said, /did not finish within/);
      assert.doesNotMatch(said, /giving up|falling through|retrying/);
      await waitFor('the stub reaped', () => !existsSync(`/proc/${pid}`), 5000);
      await waitFor('no process left in the pod netns', () => netnsPids(ns.name) === '', 5000);
      assert.equal((await failuresOfRepair()) - failedBefore, 0, 'no failure counted against the pod');
      const now = s.getPod('default', 'stop-0')!;
      assert.equal(now.metadata?.labels?.[LABEL], undefined, 'not labelled on a half-run repair');
      assert.deepEqual(
        s.events().filter((e) => e.involvedObject.name === 'stop-0'),
        [],
        'no Event: neither repaired nor failed',
      );
      const st = c.status() as { counts: { failedAttempts: number; gaveUp: number; repairedInPlace: number } };
      assert.deepEqual(
        [st.counts.failedAttempts, st.counts.gaveUp, st.counts.repairedInPlace],
        [0, 0, 0],
        JSON.stringify(st.counts),
      );
    });
  }
});

// In-place repair end to end (docs/repair.md "Repair in place") with a real container runtime:
// podman starts a container in a kubelet-shaped cgroup (/kubepods/besteffort/pod<uid>/libpod-<id>)
// on a bridge network WITHOUT mesh-cni in the chain, so the container runs unredirected, as a pod
// that raced the plugin does. The test API server holds its pod: the sidecar annotation, the IP the
// container really got, and the validation init container's last run terminated with 126. The agent
// (install-cni from source, repair in place on, the host's /proc being this machine's) must find
// the container's netns through /proc, program the redirect rules there, prove them, and count the
// pod repaired: no delete, no label (with --native-nftables=true, as our nftables table). Then the
// faults: the netns gone, the IP not the container's, iptables failing, the process exiting
// mid-repair, each with its reason and the fall-through to the operator's label (or delete).
//
// The node: a netns made here stands in for the node's host network (podman and the CNI plugins
// it runs enter it), so the bridge and its routes never touch the machine's own network. The
// agent runs in the machine's netns and talks to the API server on loopback; its host-netns
// reference is /proc/self/ns/net (this VM's /proc/1/ns/net cannot be read), which is not the
// container's, as on a node.
//
// mesh-validation runs as the bundle dist/mesh-validation.cjs with this Node through `nsenter
// --net=<the container's netns>`: the check is about the netns, and the busybox-static container
// has no Node of its own.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { spawnAgent, type AgentEntry, type AgentProcess } from '../helpers/agent.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { ROOT } from '../helpers/cli.ts';
import { addHostNetns, podmanOn, runCleanups } from '../helpers/e2e-node.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { makeHostTree } from '../helpers/hosttree.ts';
import {
  makeNetnsPods,
  podCgroupDirs,
  removePodCgroups,
  runPodContainer,
  type KubepodsContainer,
} from '../helpers/kubepods.ts';
import { rulesIn, run, type Run } from '../helpers/netns.ts';
import type { Podman } from '../helpers/podman.ts';
import { brokenPod } from '../helpers/pods.ts';
import { waitFor } from '../helpers/poll.ts';
import { sh } from '../helpers/sh.ts';

const TAG = `mcni-rip-${process.pid}`;
const NODE = 'node-1';
const NETWORK = TAG;
const SUBNET = '198.19.7.0/24';
const GATEWAY = '198.19.7.1';
/** An address of the subnet no container gets (host-local hands them out from .2 up). */
const NOBODYS_IP = '198.19.7.250';
const LABEL = 'cni.mesh.io/uninitialized';
const OUR_CHAIN = /^:MESH_OUTPUT /m;

/** mesh-validation, the bundle with this Node, inside the netns: what the init container runs. */
function validate(netnsPath: string): Promise<Run> {
  return run(
    'nsenter',
    [
      `--net=${netnsPath}`,
      '--',
      process.execPath,
      path.join(ROOT, 'dist/mesh-validation.cjs'),
      '--termination-log',
      '/nonexistent/termination-log',
    ],
    { timeoutMs: 30_000 },
  );
}

function bridgeConflist(bridge: string, ipamDir: string): string {
  return JSON.stringify(
    {
      cniVersion: '1.0.0',
      name: NETWORK,
      plugins: [
        {
          type: 'bridge',
          bridge,
          isGateway: true,
          ipMasq: false,
          ipam: {
            type: 'host-local',
            routes: [{ dst: '0.0.0.0/0' }],
            ranges: [[{ subnet: SUBNET, gateway: GATEWAY }]],
            dataDir: ipamDir,
          },
        },
      ],
    },
    null,
    2,
  );
}

/** Parses one sample of the agent's /metrics text; 0 when absent. */
function sample(metrics: string, name: string, labels: Record<string, string>): number {
  for (const line of metrics.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const m = /^[^{]+\{([^}]*)\} (\S+)$/.exec(line);
    if (!m) continue;
    const have = Object.fromEntries([...m[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) return Number(m[2]);
  }
  return 0;
}

describe('e2e: in-place repair of a running podman container in a kubelet-shaped cgroup', { timeout: 900_000 }, () => {
  const hostNetns = `${TAG}-host`;
  const hostNetnsPath = `/run/netns/${hostNetns}`;
  const bridge = `mcnir${process.pid % 100000}`.slice(0, 15);
  const IMAGE = `localhost/${TAG}-busybox:latest`;
  let api: TestApiServer;
  let podman: Podman;
  let scratch: string;
  const suiteCleanups: (() => unknown)[] = [];
  const defer = cleanupAfterEach();

  before(async () => {
    for (const bin of ['dist/mesh-validation.cjs'])
      assert.ok(existsSync(path.join(ROOT, bin)), `${bin} is missing: run npm run build first`);
    addHostNetns(hostNetns, suiteCleanups);
    scratch = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-rip-'));
    suiteCleanups.push(() => fs.rm(scratch, { recursive: true, force: true }));
    const netDir = path.join(scratch, 'net.d');
    const ipamDir = path.join(scratch, 'ipam');
    await fs.mkdir(netDir);
    await fs.mkdir(ipamDir);
    // The primary CNI alone: containers started here are never redirected by the plugin.
    await fs.writeFile(path.join(netDir, '10-rip.conflist'), bridgeConflist(bridge, ipamDir));
    podman = await podmanOn(NETWORK, IMAGE, { networkConfigDir: netDir, hostNetns: hostNetnsPath }, suiteCleanups);
  });

  after(() => runCleanups(suiteCleanups, 'e2e-repair-inplace cleanup'));

  /** A container of a new pod, removed (with its cgroup dirs) after the test. */
  async function startPodContainer(name: string): Promise<KubepodsContainer & { uid: string }> {
    const uid = randomUUID();
    // Deferred before the run: a failed run may still have made the container and the dirs.
    defer(async () => {
      const left = await removePodCgroups(uid);
      if (left.length > 0) throw new Error(`cgroup dirs left: ${left.join(', ')}`);
    });
    defer(() => podman.run(['rm', '--force', '--time', '0', name]));
    const c = await runPodContainer(podman, { name, uid, network: NETWORK, image: IMAGE, argv: ['sleep', '600'] });
    return { ...c, uid };
  }

  /** The pod as the API server shows it once the kubelet saw the validation init container exit 126. */
  function brokenPodObject(name: string, uid: string, ip: string): V1Pod {
    const p = brokenPod(name, { node: NODE, where: 'lastState' });
    return {
      ...p,
      metadata: { ...p.metadata, uid },
      status: { ...p.status, podIP: ip, podIPs: [{ ip }], hostIP: GATEWAY },
    };
  }

  async function startAgent(
    flags: Record<string, string>,
    env: Record<string, string> = {},
    entry: AgentEntry = 'source',
  ): Promise<AgentProcess> {
    api = await startTestApiServer({ bookmarkIntervalMs: 1000 });
    defer(() => api.close());
    const tree = await makeHostTree({ token: api.token, ca: api.caPem });
    defer(() => tree.remove());
    const agent = spawnAgent(
      tree,
      {
        'cni-net-dir': tree.netDir,
        'cni-bin-dir': tree.binDir,
        'repair-enabled': 'true',
        'repair-repair-pods': 'true',
        'host-proc-dir': '/proc',
        'host-netns-path': '/proc/self/ns/net',
        log_output_level: 'default:info,repair:debug',
        ...flags,
      },
      {
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String(api.port),
        NODE_NAME: NODE,
        POD_NAME: 'mesh-cni-node-rip',
        POD_NAMESPACE: 'mesh-system',
        ...env,
      },
      entry,
    );
    defer(() => agent.stop('SIGKILL'));
    return agent;
  }

  const metrics = async (agent: AgentProcess) => (await agent.get('/metrics')).body;
  const repairLogs = (agent: AgentProcess) =>
    agent.logs
      .filter((r) => r.scope === 'repair')
      .slice(-15)
      .map((r) => JSON.stringify(r))
      .join('\n');
  const podRequests = (name: string, method: string) =>
    api.requests.filter((q) => q.method === method && new RegExp(`/pods/${name}(/status)?$`).test(q.path));

  // From source, and as the bundle the image runs (dist/install-cni.js, which finds
  // dist/mesh-validation.cjs beside it as the image has /opt/mesh-cni/mesh-validation.cjs).
  for (const entry of ['source', 'bundle'] as const)
    it(`repairs a running unredirected pod in place (${entry}): validation passes, no delete, no label, once`, () =>
      repairsInPlace(entry));

  it('with --native-nftables=true a pod is repaired in place with our nftables table, no iptables rules', async () => {
    const name = `${TAG}-nft`;
    const c = await startPodContainer(name);
    const agent = await startAgent({ 'repair-label-pods': 'true', 'native-nftables': 'true' });
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    await waitFor(
      'the in-place repair to succeed',
      async () =>
        sample(await metrics(agent), 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }) >= 1,
      { timeoutMs: 60_000, everyMs: 200, context: () => repairLogs(agent) },
    );
    const table = sh(['nsenter', `--net=${c.netnsPath}`, '--', 'nft', 'list', 'table', 'inet', 'mesh_pod']);
    assert.match(table, /chain nat4_MESH_OUTPUT \{/);
    assert.doesNotMatch(rulesIn(c.netnsPath), OUR_CHAIN, 'no iptables rules of ours');
    const after = await validate(c.netnsPath);
    assert.equal(after.code, 0, `validation inside the repaired container: ${after.stdout}${after.stderr}`);
    assert.deepEqual(podRequests(name, 'PATCH'), [], 'the pod was never labelled');
  });

  async function repairsInPlace(entry: AgentEntry): Promise<void> {
    const name = `${TAG}-ok-${entry}`;
    const c = await startPodContainer(name);
    assert.ok(podCgroupDirs(c.uid).length > 0, 'podman put the container under kubepods/besteffort/pod<uid>');
    assert.match(
      await fs.readFile(`/proc/${c.pid}/cgroup`, 'utf8'),
      new RegExp(`/kubepods/besteffort/pod${c.uid}/libpod-${c.id}`),
    );
    assert.doesNotMatch(rulesIn(c.netnsPath), OUR_CHAIN, 'no redirect rules: the plugin was not in the chain');
    // Another component's rule in the pod netns (in both flavours: whichever the agent writes to).
    for (const bin of ['iptables-nft', 'iptables-legacy'])
      sh([
        'nsenter',
        `--net=${c.netnsPath}`,
        '--',
        bin,
        ...['-t', 'filter', '-A', 'INPUT', '-p', 'tcp', '--dport', '9'],
        ...['-m', 'comment', '--comment', 'other-component', '-j', 'ACCEPT'],
      ]);
    const before = await validate(c.netnsPath);
    assert.equal(before.code, 126, `validation before the repair: ${before.stdout}${before.stderr}`);

    const agent = await startAgent({ 'repair-label-pods': 'true' }, {}, entry);
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    const m = await waitFor(
      'the in-place repair to succeed',
      async () => {
        const body = await metrics(agent);
        return sample(body, 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }) >= 1 && body;
      },
      { timeoutMs: 60_000, everyMs: 200, context: () => repairLogs(agent) },
    );
    assert.equal(sample(m, 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }), 1);
    assert.match(rulesIn(c.netnsPath), OUR_CHAIN, 'the redirect chains are in the container netns');
    const after = await validate(c.netnsPath);
    assert.equal(after.code, 0, `validation inside the repaired container: ${after.stdout}${after.stderr}`);
    // The container is the same one, still running: nothing restarted it.
    assert.equal((await podman.ok(['inspect', '--format', '{{.State.Pid}}', name])).trim(), String(c.pid));
    const ev = await waitFor(
      'the Event on the pod',
      () => api.events().find((e) => e.involvedObject.uid === c.uid),
      10_000,
    );
    assert.equal(ev.reason, 'MeshCniRepairedInPlace');
    assert.equal(ev.type, 'Normal');
    assert.match(
      rulesIn(c.netnsPath),
      /other-component/,
      "another component's rule in the pod netns survived the repair",
    );

    // The same broken state again (an unrelated update, then a relist after a closed watch): no
    // second repair.
    const cur = api.getPod('default', name)!;
    api.upsertPod({ ...cur, metadata: { ...cur.metadata, annotations: { ...cur.metadata?.annotations, x: '1' } } });
    const watches = api.requests.filter((q) => q.method === 'GET' && q.path === '/api/v1/pods').length;
    api.closeWatches();
    await waitFor(
      'the agent to watch again',
      () => api.requests.filter((q) => q.method === 'GET' && q.path === '/api/v1/pods').length > watches,
      15_000,
    );
    await new Promise((r) => setTimeout(r, 2000));
    const m2 = await metrics(agent);
    assert.equal(sample(m2, 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }), 1);
    assert.equal(
      agent.logs.filter(
        (r) => r.scope === 'repair' && r.uid === c.uid && /^repaired broken pod in place/.test(String(r.msg)),
      ).length,
      1,
      `one repair log record:\n${repairLogs(agent)}`,
    );
    assert.deepEqual(podRequests(name, 'DELETE'), [], 'the pod was never deleted');
    assert.deepEqual(podRequests(name, 'PATCH'), [], 'the pod was never labelled');
    assert.equal(api.getPod('default', name)?.metadata?.labels?.[LABEL], undefined);
    assert.equal(sample(m2, 'mesh_cni_repair_pods_repaired_total', { type: 'label' }), 0);

    // Broken again (a new failed run of its validation container): a repair that did not hold is
    // not tried in place again; the operator's fall-through (label) takes over and says why.
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    await waitFor(
      'the label after the second breakage',
      () => api.getPod('default', name)?.metadata?.labels?.[LABEL] === 'true',
      { timeoutMs: 30_000, everyMs: 100, context: () => repairLogs(agent) },
    );
    const m3 = await metrics(agent);
    assert.equal(failures(m3, 'repair_did_not_hold'), 1);
    assert.equal(sample(m3, 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }), 1);
    await waitFor(
      'the Event naming repair_did_not_hold',
      () =>
        api
          .events()
          .some(
            (e) =>
              e.involvedObject.uid === c.uid &&
              (e.message ?? '').includes('in-place repair failed (repair_did_not_hold'),
          ),
      10_000,
    );
    assert.deepEqual(podRequests(name, 'DELETE'), [], 'label only: never deleted');
  }

  /** Failures of in-place repair with `reason`, whatever the type label says. */
  const failures = (body: string, reason: string) =>
    body
      .split('\n')
      .filter((l) => l.startsWith('mesh_cni_repair_failures_total{') && l.includes(`reason="${reason}"`))
      .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);

  /** A PATH dir whose iptables-*restore run `body` (a shell script) instead of the real ones. */
  async function shimDir(body: string): Promise<string> {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-rip-shim-'));
    defer(() => fs.rm(dir, { recursive: true, force: true }));
    for (const fam of ['iptables', 'ip6tables'])
      for (const flavour of ['', '-legacy', '-nft']) {
        const exe = `${fam}${flavour}-restore`;
        await fs.writeFile(path.join(dir, exe), `#!/bin/sh\nREAL=/usr/sbin/${exe}\n${body}\n`, { mode: 0o755 });
      }
    return dir;
  }

  /** Shim body: the first call kills `pid` and waits until it is gone; every call runs the real one. */
  const killThenRestore = (flag: string, pid: number) =>
    [
      `if [ ! -e ${flag} ]; then`,
      `  : > ${flag}; kill -9 ${pid}`,
      `  while kill -0 ${pid} 2>/dev/null; do sleep 0.05; done`,
      'fi',
      'exec "$REAL" "$@"',
    ].join('\n');

  /**
   * Expects the in-place repair of `name` to fail with `reason` (metric, and the reason in a log
   * record or the Event), the container's netns to be left without our rules when it still
   * exists, and the fall-through: `fallThrough` done.
   */
  async function expectFailure(
    agent: AgentProcess,
    o: { name: string; uid: string; reason: string | RegExp; fallThrough: 'label' | 'delete'; netnsPath?: string },
  ): Promise<void> {
    const reasons = ['no_netns', 'ip_mismatch', 'rules_failed', 'proof_failed', 'repair_did_not_hold'];
    const matching = reasons.filter((r) => (typeof o.reason === 'string' ? r === o.reason : o.reason.test(r)));
    const body = await waitFor(
      `a failed in-place repair of ${o.name} (${String(o.reason)})`,
      async () => {
        const b = await metrics(agent);
        return matching.some((r) => failures(b, r) > 0) && b;
      },
      { timeoutMs: 60_000, everyMs: 200, context: () => repairLogs(agent) },
    );
    const reason = matching.find((r) => failures(body, r) > 0)!;
    if (o.fallThrough === 'label')
      await waitFor(
        `the fall-through label on ${o.name}`,
        () => api.getPod('default', o.name)?.metadata?.labels?.[LABEL] === 'true',
        { timeoutMs: 90_000, everyMs: 100, context: () => repairLogs(agent) },
      );
    else
      await waitFor('the fall-through delete of ' + o.name, () => api.getPod('default', o.name) === undefined, {
        timeoutMs: 90_000,
        everyMs: 100,
        context: () => repairLogs(agent),
      });
    const said = agent.logs.some(
      (r) => r.scope === 'repair' && r.uid === o.uid && r.reason === reason && typeof r.error === 'string',
    );
    assert.ok(said, `a log record of ${o.name} gives the reason ${reason} and the detail:\n${repairLogs(agent)}`);
    // The fall-through's Event says why in-place repair did not do, for whoever looks at the pod.
    const told = await waitFor(
      `the Event on ${o.name} naming ${reason}`,
      () =>
        api
          .events()
          .find(
            (e) => e.involvedObject.uid === o.uid && (e.message ?? '').includes(`in-place repair failed (${reason}`),
          ),
      10_000,
    );
    assert.equal(told.type, 'Warning');
    const m = await metrics(agent);
    assert.equal(sample(m, 'mesh_cni_repair_pods_repaired_total', { type: 'repair', result: 'success' }), 0);
    if (o.netnsPath && existsSync(o.netnsPath))
      assert.doesNotMatch(rulesIn(o.netnsPath), OUR_CHAIN, 'no half-programmed redirect left counted as done');
  }

  it('fault: the netns is gone (container removed before the agent acts): no_netns, then delete', async () => {
    const name = `${TAG}-gone`;
    const c = await startPodContainer(name);
    await podman.ok(['rm', '--force', '--time', '0', name]);
    const agent = await startAgent({ 'repair-delete-pods': 'true' });
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    await expectFailure(agent, { name, uid: c.uid, reason: 'no_netns', fallThrough: 'delete' });
    assert.equal(podRequests(name, 'DELETE').length, 1, 'deleted once');
  });

  it("fault: the IP changed (the API's pod IP is not the container's): ip_mismatch, then label", async () => {
    const name = `${TAG}-ip`;
    const c = await startPodContainer(name);
    const agent = await startAgent({ 'repair-label-pods': 'true' });
    api.upsertPod(brokenPodObject(name, c.uid, NOBODYS_IP));
    await expectFailure(agent, {
      name,
      uid: c.uid,
      reason: 'ip_mismatch',
      fallThrough: 'label',
      netnsPath: c.netnsPath,
    });
    assert.deepEqual(podRequests(name, 'DELETE'), [], 'label only: not deleted');
  });

  it('fault: iptables fails (failing iptables-*restore on the agent PATH): rules_failed, then label', async () => {
    const name = `${TAG}-ipt`;
    const c = await startPodContainer(name);
    const shims = await shimDir('echo "iptables-restore shim: refused by the e2e test" >&2\nexit 4');
    const agent = await startAgent({ 'repair-label-pods': 'true' }, { PATH: `${shims}:${process.env.PATH}` });
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    await expectFailure(agent, {
      name,
      uid: c.uid,
      reason: 'rules_failed',
      fallThrough: 'label',
      netnsPath: c.netnsPath,
    });
  });

  it('fault: the process exits mid-repair (killed by the first restore): not repaired, then label', async () => {
    const name = `${TAG}-exit`;
    const c = await startPodContainer(name);
    // The first restore the agent runs kills the container's only process, then does its job:
    // the netns is found and held, but its pod is gone by the time the rules land.
    const flag = path.join(scratch, `${name}.killed`);
    const shims = await shimDir(killThenRestore(flag, c.pid));
    defer(() => fs.rm(flag, { force: true }));
    const agent = await startAgent({ 'repair-label-pods': 'true' }, { PATH: `${shims}:${process.env.PATH}` });
    api.upsertPod(brokenPodObject(name, c.uid, c.ip));
    // The rules land in a netns held only by the agent's fd. Either podman's clean-up has taken
    // the container's interface out of it by then (the proof fails: proof_failed, retried) or not
    // (the proof passes, but the pod's process has left it); either way the next look finds no
    // process of the pod: not repaired (no_netns, final), and the fall-through labels the pod.
    await expectFailure(agent, { name, uid: c.uid, reason: 'no_netns', fallThrough: 'label' });
    assert.ok(existsSync(flag), 'the agent ran iptables-restore (the shim killed the container then)');
  });

  it('fault: the process exits mid-repair, its netns pinned: rules land and prove, yet not counted', async () => {
    // A pod without podman: a netns pinned by `ip netns add`, a sleep in it in the pod's cgroup.
    // Killing the sleep leaves the netns whole (address, route), so the proof passes in it: only
    // the check that the pod's process is still there refuses the claim (no_netns, final).
    const fleet = makeNetnsPods(`${TAG}-kept`, 1, '198.18.70');
    defer(async () => fleet.remove());
    const p = fleet.pods[0]!;
    const name = `${TAG}-kept`;
    const flag = path.join(scratch, `${name}.killed`);
    const pid = p.sleeper.pid!;
    const shims = await shimDir(killThenRestore(flag, pid));
    defer(() => fs.rm(flag, { force: true }));
    const agent = await startAgent({ 'repair-label-pods': 'true' }, { PATH: `${shims}:${process.env.PATH}` });
    api.upsertPod(brokenPodObject(name, p.uid, p.ip));
    await expectFailure(agent, { name, uid: p.uid, reason: 'no_netns', fallThrough: 'label' });
    assert.ok(existsSync(flag), 'the agent ran iptables-restore (the shim killed the pod process then)');
    assert.ok(
      agent.logs.some(
        (r) =>
          r.scope === 'repair' && r.uid === p.uid && r.reason === 'no_netns' && /left its netns/.test(String(r.error)),
      ),
      `the log says the pod's process left its netns during the repair:\n${repairLogs(agent)}`,
    );
    assert.match(rulesIn(p.netnsPath), OUR_CHAIN, 'the rules were programmed in the held netns');
    const proof = await validate(p.netnsPath);
    assert.equal(proof.code, 0, `validation passes in that netns: ${proof.stdout}${proof.stderr}`);
  });
});

// The agent in a `hostUsers: false` pod's netns, which the pod's own user namespace owns
// (docs/plugin.md "User-namespaced pods"): in-place repair writes the proxy's `-m owner
// --uid-owner 1337` rules, which the kernel takes there only from inside that user namespace, and
// ambient enrollment writes the in-pod rules. The netns is held by fd as the agent holds a pod's
// (src/podnetns), its owner found with NS_GET_USERNS through the agent's addon. Real traffic after
// the repair: uid 1337 inside the pod goes out, another uid is redirected to the proxy port; on
// legacy iptables and on the nft shim. Every netns, process and socket is removed after each test.
// Root, a built dist/ (mesh-validation.cjs, native/seqpacket.node).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { closeSync, fstatSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { createDataplane, type AmbientPod, type PodAnnotator } from '../../src/ambient/dataplane.ts';
import { ambientArgs } from '../../src/partargs.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { openNetns, runInNetns, type HeldNetns } from '../../src/podnetns/index.ts';
import { writesRules } from '../../src/podnetns/run.ts';
import { netnsOwner } from '../../src/podnetns/userns.ts';
import { InPlaceRepairer, type PodNetns } from '../../src/repair/inplace.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { ROOT } from '../helpers/cli.ts';
import { FakeZtunnel } from '../helpers/fake-ztunnel.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';
import { Netns, rulesIn } from '../helpers/netns.ts';
import { testPod } from '../helpers/pods.ts';
import { sh } from '../helpers/sh.ts';
import { flockedByNodeUser, podWithTraffic, reachedAs, usernsNetns } from '../helpers/userns.ts';

const defer = cleanupAfterEach();
const VALIDATION = path.join(ROOT, 'dist', 'mesh-validation.cjs');
const PROXY_UID = 1337;
const APP_UID = 1000;

async function held(netnsPath: string): Promise<HeldNetns> {
  const h = await openNetns(netnsPath, 0);
  defer(async () => h.close());
  return h;
}

/** The netns's nftables ruleset, read from the host's user namespace. */
const nftIn = (netnsPath: string): string => sh(['nsenter', `--net=${netnsPath}`, '--', 'nft', 'list', 'ruleset']);

describe("a held netns's owner: NS_GET_USERNS through the agent's addon", () => {
  it("is the pod's own user namespace for a hostUsers: false pod's netns, none for one the host's owns", async () => {
    const pod = await usernsNetns('unsown', defer);
    const plain = new Netns('unsown');
    defer(async () => plain.remove());
    const owner = netnsOwner((await held(pod.path)).fd, pod.path);
    assert.notEqual(owner, null);
    try {
      assert.equal(fstatSync(owner!, { bigint: true }).ino, statSync(pod.userns, { bigint: true }).ino);
    } finally {
      closeSync(owner!);
    }
    assert.equal(netnsOwner((await held(plain.path)).fd, plain.path), null);
  });

  it('a kernel that does not answer is an error naming the netns, never "the host\'s"', () => {
    // No fd has this number here: EBADF.
    assert.throws(() => netnsOwner(1 << 20, 'the netns of pid 42'), {
      name: 'Error',
      code: 'ERR_NETNS_USERNS',
      message: /ioctl NS_GET_USERNS on the netns of pid 42 failed \(errno 9\); not writing there/,
    });
  });

  it('only what writes rules enters: iptables but its saves, ip -batch', () => {
    for (const argv of [
      ['iptables-legacy-restore', '--noflush', '-w', '5'],
      ['ip6tables-nft-restore', '--noflush'],
      ['/usr/sbin/iptables-restore'],
      ['iptables', '-t', 'nat', '-A', 'OUTPUT'],
      ['ip', '-4', '-force', '-batch', '-'],
    ])
      assert.equal(writesRules(argv), true, argv.join(' '));
    for (const argv of [
      ['iptables-legacy-save'],
      ['ip6tables-nft-save'],
      ['ip', '-6', '-o', 'addr', 'show', 'dev', 'lo'],
      [process.execPath, VALIDATION, '--probe-timeout', '2s'],
      ['iptables-restore-translate'],
    ])
      assert.equal(writesRules(argv), false, argv.join(' '));
  });

  it("a writer runs in the pod's user namespace and leaves no fd open; a save reads it back", async () => {
    const pod = await usernsNetns('unsrun', defer);
    const h = await held(pod.path);
    const before = fdSnapshot();
    // The kernel takes an owner match there only from inside the pod's user namespace.
    const writer = await runInNetns(h, ['iptables', '-t', 'nat', '-A', 'OUTPUT', '-m', 'owner', '--uid-owner', '1337']);
    assert.equal(writer.error, null, writer.error ?? '');
    assert.equal(writer.code, 0, writer.stderr);
    assert.deepEqual(
      fdsOpenedSince(before).filter((fd) => !/\/mesh-cni-xtlock-/.test(fd)),
      [],
      'no fd left but the lock file',
    );
    assert.match(rulesIn(pod.path), /-A OUTPUT -m owner --uid-owner 1337/);
    const save = await runInNetns(h, ['iptables-save', '-t', 'nat']);
    assert.equal(save.code, 0, save.stderr);
    assert.match(save.stdout, /--uid-owner 1337/);
  });
});

describe("legacy iptables in a pod's user namespace locks a file of the agent's own", () => {
  it("a node user's lock on the netns file keeps no write waiting", async () => {
    const pod = await usernsNetns('unslock', defer);
    await flockedByNodeUser(pod.path, defer);
    const h = await held(pod.path);
    const before = fdSnapshot();
    const rule = ['-t', 'nat', '-A', 'OUTPUT', '-m', 'owner', '--uid-owner', '1337', '-j', 'RETURN'];
    const r = await runInNetns(h, ['iptables-legacy', '-w', '5', ...rule], { timeoutMs: 20_000 });
    assert.equal(r.error, null, r.error ?? '');
    assert.equal(r.code, 0, r.stderr);
    assert.match(rulesIn(pod.path), /-A OUTPUT -m owner --uid-owner 1337 -j RETURN/);
    const again = await runInNetns(h, ['iptables-legacy-restore', '--noflush', '-w', '5'], {
      input: '*nat\n-A OUTPUT -m owner --uid-owner 1338 -j RETURN\nCOMMIT\n',
      timeoutMs: 20_000,
    });
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual(
      fdsOpenedSince(before).filter((fd) => !/\/mesh-cni-xtlock-/.test(fd)),
      [],
      'no fd left but the lock file',
    );
  });
});

function brokenPod(name: string, ip: string): V1Pod {
  const p = testPod(name, { initExitCode: 126 });
  return {
    ...p,
    metadata: { ...p.metadata, uid: `uid-${name}` },
    status: { ...p.status, podIP: ip, podIPs: [{ ip }] },
  };
}

function repairer(netns: HeldNetns, flavour: 'legacy' | 'nft', nativeNftables = false): InPlaceRepairer {
  const pods: PodNetns = {
    findPodNetns: async () => ({ ok: true, netns }),
    runInNetns: (n, argv, o) => runInNetns(n as HeldNetns, argv, o),
    stillThere: async () => true,
  };
  return new InPlaceRepairer({
    netns: pods,
    validationBundle: VALIDATION,
    hostFlavour: async () => flavour,
    nativeNftables,
  });
}

describe('in-place repair of a hostUsers: false pod', () => {
  for (const [flavour, subnet] of [
    ['legacy', '198.18.61'],
    ['nft', '198.18.62'],
  ] as const) {
    it(`${flavour}: repaired and proven; uid ${PROXY_UID} inside goes out, another uid is redirected`, async () => {
      const { pod, dst } = await podWithTraffic(subnet, defer);
      assert.equal(reachedAs(pod, APP_UID, dst), 'dest', 'before the repair nothing is redirected');
      const r = await repairer(await held(pod.path), flavour).repair(brokenPod(`uns-${flavour}`, `${subnet}.2`));
      assert.ok(r.ok, JSON.stringify(r));
      assert.match(r.detail, /IPv4 created/);
      assert.match(r.detail, /validation passed/);
      assert.match(rulesIn(pod.path), /-A MESH_OUTPUT -m owner --uid-owner 1337 -j RETURN/);
      assert.equal(reachedAs(pod, PROXY_UID, dst), 'dest', 'the proxy (uid 1337 inside) is not redirected');
      assert.equal(reachedAs(pod, APP_UID, dst), 'proxy', 'the app is redirected to the proxy port');

      // Again: the rules read back from the host's user namespace are right, nothing is written.
      const again = await repairer(await held(pod.path), flavour).repair(brokenPod(`uns-${flavour}`, `${subnet}.2`));
      assert.ok(again.ok, JSON.stringify(again));
      assert.match(again.detail, /IPv4 unchanged/);
    });
  }

  it(`native nftables (from the host's user namespace): uid ${PROXY_UID} inside goes out, another uid is redirected`, async () => {
    const { pod, dst } = await podWithTraffic('198.18.60', defer);
    const r = await repairer(await held(pod.path), 'nft', true).repair(brokenPod('uns-native', '198.18.60.2'));
    assert.ok(r.ok, JSON.stringify(r));
    assert.match(r.detail, /validation passed/);
    assert.match(nftIn(pod.path), /table inet mesh_pod/);
    assert.equal(reachedAs(pod, PROXY_UID, dst), 'dest', 'the proxy (uid 1337 inside) is not redirected');
    assert.equal(reachedAs(pod, APP_UID, dst), 'proxy', 'the app is redirected to the proxy port');
  });
});

const annotator: PodAnnotator = { setRedirection: async () => {} };

describe('ambient enrollment of a hostUsers: false pod', () => {
  for (const [flavour, nativeNftables] of [
    ['legacy', false],
    ['nft', false],
    ['nft', true],
  ] as const) {
    const backend = nativeNftables ? 'native nftables' : `iptables-${flavour}`;
    it(`${backend}: its in-pod rules go in, ztunnel gets its netns, it is enrolled; removal takes ours out`, async () => {
      const node = new Netns('unsnode');
      defer(async () => node.remove());
      const nodeHeld = await held(node.path);
      const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-unsamb-'));
      defer(async () => rmSync(dir, { recursive: true, force: true }));
      const sock = path.join(dir, 'ztunnel.sock');
      const base = buildSettings({}, {});
      const settings = {
        ...base,
        ambient: { ...base.ambient, ztunnelUdsAddress: sock, hostRoot: '/' },
        repair: { ...base.repair, hostProcDir: '/proc', hostNetnsPath: '/proc/self/ns/net' },
      };
      const dp = createDataplane(ambientArgs(settings, nativeNftables), {
        annotator,
        host: (argv, o) => runInNetns(nodeHeld, argv, { input: o?.input ?? null }),
        flavour: async () => flavour,
      });
      defer(() => dp.stop(false));
      await dp.start([]);
      const zt = new FakeZtunnel({ path: sock });
      defer(() => zt.stop());
      await zt.waitForNth('snapshot_sent', 1);

      const pod = await usernsNetns('unsamb', defer);
      const ambient: AmbientPod = {
        uid: randomUUID(),
        namespace: 'shop',
        name: `userns-${flavour}`,
        serviceAccount: 'cart',
        ips: ['198.18.63.2'],
        annotations: {},
      };
      await dp.addPodToMesh(ambient, pod.path);
      assert.equal(dp.isEnrolled(ambient.uid), true);
      const ours = () => (nativeNftables ? nftIn(pod.path) : rulesIn(pod.path));
      assert.match(ours(), nativeNftables ? /table inet mesh_ambient_pod/ : /:MESH_PRERT/);
      const add = await zt.waitFor((r) => r.kind === 'add');
      assert.equal(add.kind === 'add' ? add.netnsIno : null, statSync(pod.path, { bigint: true }).ino);
      await dp.removePodFromMesh(ambient, false);
      assert.doesNotMatch(ours(), /MESH_|mesh_/);
    });
  }
});

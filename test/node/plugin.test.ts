// mesh-cni as a runtime runs it: Debian bridge + host-local in a netns, then mesh-cni with the
// bridge's result as prevResult, against the test API server (HTTPS, bearer token). Plus every
// bad input of the plugin (docs/plugin.md "mesh-cni: the CNI plugin"), and the CNI result
// conversions.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { CniError } from '../../cni-plugin/cni/errors.ts';
import { convertResult } from '../../cni-plugin/cni/result.ts';
import { parseCniArgs, podRefFromArgs } from '../../cni-plugin/cni/protocol.ts';
import { buildFamilyRules } from '../../cni-plugin/redirect/rules.ts';
import { specForPod, type PodLike } from '../../cni-plugin/redirect/spec.ts';
import { sidecarSkipReason as skipReason } from '../../cni-plugin/shared/sidecar.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { BridgeNetwork, cniEnv, Netns, type ChainEnv } from '../helpers/netns.ts';
import { k8sArgs, MESH_CNI_SOURCE, meshCni, meshPod, pluginConfig, tempDir } from '../helpers/plugin.ts';
import { diffRules, parseRules } from '../../cni-plugin/netns/iptables.ts';

const PREV_V4 = {
  cniVersion: '1.0.0',
  interfaces: [
    { name: 'mcnib0', mac: '0a:58:c6:12:00:01' },
    { name: 'eth0', mac: '0a:58:c6:12:00:05', sandbox: '/run/netns/x' },
  ],
  ips: [{ interface: 1, address: '198.18.0.5/24', gateway: '198.18.0.1' }],
  routes: [{ dst: '0.0.0.0/0' }],
  dns: {},
};

describe('CNI protocol pieces', () => {
  it('parses containerd and podman CNI_ARGS', () => {
    const c = parseCniArgs(
      'IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1',
    );
    assert.deepEqual(podRefFromArgs(c, ''), { namespace: 'shop', name: 'cart-1', uid: 'u-1', infraContainerId: 'abc' });
    // podman names the container but no namespace: not a Kubernetes pod, unless the config
    // says which namespace to assume (test set-ups).
    assert.equal(podRefFromArgs(parseCniArgs('IgnoreUnknown=1;K8S_POD_NAME=web'), ''), null);
    assert.deepEqual(podRefFromArgs(parseCniArgs('IgnoreUnknown=1;K8S_POD_NAME=web'), 'default'), {
      namespace: 'default',
      name: 'web',
      uid: '',
      infraContainerId: '',
    });
    assert.equal(podRefFromArgs(parseCniArgs('K8S_POD_NAMESPACE=shop'), 'default'), null);
    assert.equal(podRefFromArgs(parseCniArgs(''), ''), null);
    assert.throws(
      () => parseCniArgs('K8S_POD_NAME'),
      (e: CniError) => e.code === 4 && /not KEY=VALUE/.test(e.details),
    );
  });

  it('converts prevResult between 0.3.x/0.4.0 and 1.x shapes', () => {
    const v11 = {
      cniVersion: '1.1.0',
      interfaces: [{ name: 'eth0', mac: 'm', mtu: 1500, sandbox: '/n', socketPath: '/s' }],
      ips: [
        { address: 'fd00::5/64', interface: 0 },
        { address: '10.0.0.5/24', gateway: '10.0.0.1', interface: 0 },
      ],
      routes: [{ dst: '0.0.0.0/0', gw: '10.0.0.1', mtu: 1400, table: 5 }],
      dns: { nameservers: ['10.0.0.10'] },
    };
    assert.deepEqual(convertResult(v11, '0.4.0'), {
      cniVersion: '0.4.0',
      interfaces: [{ name: 'eth0', mac: 'm', sandbox: '/n' }],
      ips: [
        { version: '6', address: 'fd00::5/64', interface: 0 },
        { version: '4', address: '10.0.0.5/24', gateway: '10.0.0.1', interface: 0 },
      ],
      routes: [{ dst: '0.0.0.0/0', gw: '10.0.0.1' }],
      dns: { nameservers: ['10.0.0.10'] },
    });
    const v04 = convertResult(v11, '0.4.0');
    const back = convertResult(v04, '1.0.0');
    assert.deepEqual(back.ips, [
      { address: 'fd00::5/64', interface: 0 },
      { address: '10.0.0.5/24', gateway: '10.0.0.1', interface: 0 },
    ]);
    assert.deepEqual(convertResult(v11, '1.1.0'), v11);
  });
});

// Istio's plugin.go, in its order: its own init container, DISABLE_ENVOY on the proxy, no proxy
// container, a proxy of another type than sidecar, inject disabled (label over annotation, Go's
// ParseBool), no status annotation. Our status annotation and interceptionMode NONE checks too.
describe('which pods get rules', () => {
  const pod = (
    o: {
      annotations?: Record<string, string>;
      labels?: Record<string, string>;
      init?: object[];
      containers?: object[];
    } = {},
  ): PodLike => ({
    metadata: {
      annotations: { 'sidecar.mesh.io/status': '{}', ...o.annotations },
      ...(o.labels ? { labels: o.labels } : {}),
    },
    spec: {
      initContainers: (o.init ?? []) as never,
      containers: (o.containers ?? [{ name: 'app' }, { name: 'mesh-proxy' }]) as never,
    },
  });
  const redirected: [string, PodLike][] = [
    ['an injected pod', pod()],
    [
      'a native sidecar (mesh-proxy among the init containers)',
      pod({ init: [{ name: 'mesh-proxy' }], containers: [{ name: 'app' }] }),
    ],
    ['a proxy of type sidecar', pod({ containers: [{ name: 'mesh-proxy', args: ['proxy', 'sidecar'] }] })],
    ['a proxy with other args', pod({ containers: [{ name: 'mesh-proxy', args: ['--log', 'x'] }] })],
    [
      'inject label true over annotation false',
      pod({ labels: { 'sidecar.mesh.io/inject': 'true' }, annotations: { 'sidecar.mesh.io/inject': 'false' } }),
    ],
    ['inject annotation no boolean', pod({ annotations: { 'sidecar.mesh.io/inject': 'nope' } })],
    [
      'inject annotation " false" (ParseBool takes no blanks)',
      pod({ annotations: { 'sidecar.mesh.io/inject': ' false' } }),
    ],
    [
      'DISABLE_ENVOY not true',
      pod({ containers: [{ name: 'mesh-proxy', env: [{ name: 'DISABLE_ENVOY', value: 'no' }] }] }),
    ],
  ];
  const skipped: [string, PodLike, RegExp][] = [
    [
      'no status annotation',
      { metadata: { annotations: {} }, spec: { containers: [{ name: 'mesh-proxy' }] } },
      /no sidecar\.mesh\.io\/status/,
    ],
    ['its own mesh-init', pod({ init: [{ name: 'mesh-init' }] }), /own mesh-init/],
    [
      'DISABLE_ENVOY',
      pod({ containers: [{ name: 'mesh-proxy', env: [{ name: 'DISABLE_ENVOY', value: 'True' }] }] }),
      /DISABLE_ENVOY/,
    ],
    ['no mesh-proxy container', pod({ containers: [{ name: 'app' }] }), /no mesh-proxy container/],
    ['a gateway', pod({ containers: [{ name: 'mesh-proxy', args: ['proxy', 'router'] }] }), /proxy type router/],
    ['inject annotation false', pod({ annotations: { 'sidecar.mesh.io/inject': 'false' } }), /inject is disabled/],
    ['inject annotation 0', pod({ annotations: { 'sidecar.mesh.io/inject': '0' } }), /inject is disabled/],
    [
      'inject label F over annotation true',
      pod({ labels: { 'sidecar.mesh.io/inject': 'F' }, annotations: { 'sidecar.mesh.io/inject': 'true' } }),
      /label sidecar\.mesh\.io\/inject/,
    ],
    ['interceptionMode NONE', pod({ annotations: { 'sidecar.mesh.io/interceptionMode': 'NONE' } }), /NONE/],
  ];
  for (const [why, p] of redirected) it(`redirects ${why}`, () => assert.equal(skipReason(p), null));
  for (const [why, p, reason] of skipped)
    it(`skips ${why}`, () => assert.match(skipReason(p) ?? '(redirected)', reason));
});

describe('mesh-cni bad input (no API server needed)', () => {
  const chain: ChainEnv = {
    containerId: 'c0ffee',
    netns: '/run/netns/mcni-plg-none',
    ifname: 'eth0',
    args: 'K8S_POD_NAMESPACE=a;K8S_POD_NAME=b',
  };
  const conf = (over: Record<string, unknown> = {}) => ({
    ...pluginConfig({ cniVersion: '1.0.0', orchconfig: '/nonexistent/orchconfig' }, PREV_V4),
    ...over,
  });
  const errorOf = (stdout: string) =>
    JSON.parse(stdout) as { cniVersion: string; code: number; msg: string; details?: string };

  it('answers VERSION, also podman style with CNI_NETNS=dummy and an old version asked', async () => {
    for (const v of ['1.1.0', '0.4.0', '0.3.1']) {
      const r = await meshCni('VERSION', { ...chain, netns: 'dummy' }, { cniVersion: v });
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(JSON.parse(r.stdout), {
        cniVersion: v,
        supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'],
      });
    }
  });

  it('reads a config that arrives in two parts, late, on a non-blocking stdin', async () => {
    // A runtime whose stdin pipe is non-blocking: the first read gives part of the config, the
    // next one EAGAIN; the rest must still be read, after what was already read. Node's own
    // spawn makes a child's stdin blocking, so Debian's python3 sets O_NONBLOCK and execs the plugin.
    const setNonblock =
      'import fcntl, os, sys; fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK); os.execv(sys.argv[1], sys.argv[1:])';
    const config = JSON.stringify({ cniVersion: '0.3.1', name: 'late', padding: 'p'.repeat(20_000) });
    const child = spawn('/usr/bin/python3', ['-c', setNonblock, ...MESH_CNI_SOURCE], {
      env: cniEnv('VERSION', { ...chain, netns: 'dummy' }),
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stdin.write(config.slice(0, 10_000));
    const later = setTimeout(() => child.stdin.end(config.slice(10_000)), 500);
    const [code] = (await once(child, 'close')) as [number | null];
    clearTimeout(later);
    assert.equal(code, 0, stdout);
    assert.equal(
      JSON.parse(stdout).cniVersion,
      '0.3.1',
      'the whole config was read: the version asked for is answered',
    );
  });

  const cases: [string, () => Promise<{ code: number | null; stdout: string }>, number, RegExp][] = [
    [
      'garbage stdin',
      () => meshCni('ADD', chain, '{"cniVersion": "1.0.0", oops'),
      6,
      /cannot decode the network config/,
    ],
    ['stdin not an object', () => meshCni('ADD', chain, '[1,2]'), 6, /cannot decode/],
    [
      'unknown cniVersion',
      () => meshCni('ADD', chain, conf({ cniVersion: '0.2.0' })),
      1,
      /incompatible CNI version "0.2.0"/,
    ],
    ['future cniVersion', () => meshCni('ADD', chain, conf({ cniVersion: '9.9.9' })), 1, /incompatible CNI version/],
    ['missing prevResult', () => meshCni('ADD', chain, { ...conf(), prevResult: undefined }), 7, /missing prevResult/],
    [
      'prevResult of the wrong type',
      () => meshCni('ADD', chain, conf({ prevResult: 'x' })),
      7,
      /prevResult must be an object/,
    ],
    ['missing CNI_NETNS', () => meshCni('ADD', { ...chain, netns: '' }, conf()), 4, /missing CNI_NETNS/],
    ['missing CNI_COMMAND', () => meshCni('', chain, conf()), 4, /CNI_COMMAND is not set/],
    ['unknown CNI_COMMAND', () => meshCni('UPDATE', chain, conf()), 4, /unknown CNI_COMMAND "UPDATE"/],
    [
      'bad CNI_ARGS',
      () => meshCni('ADD', { ...chain, args: 'K8S_POD_NAMESPACE=a;garbage' }, conf()),
      4,
      /invalid CNI_ARGS/,
    ],
    [
      'bad CNI_CONTAINERID',
      () => meshCni('ADD', { ...chain, containerId: '-x y' }, conf()),
      4,
      /invalid CNI_CONTAINERID/,
    ],
    ['bad log_level', () => meshCni('ADD', chain, conf({ log_level: 'loud' })), 7, /log_level "loud"/],
    // The agent writes the backend it chose, a boolean: anything else is no choice to guess at.
    [
      'native_nftables that is no boolean',
      () => meshCni('ADD', chain, conf({ native_nftables: 'auto' })),
      7,
      /native_nftables must be true or false: got "auto"/,
    ],
    [
      'a namespace to assume that is no namespace name',
      () =>
        meshCni(
          'ADD',
          chain,
          conf({ orch: { ...(conf().orch as object), assume_namespace_when_missing: 'Not/A;Namespace' } }),
        ),
      7,
      /orch\.assume_namespace_when_missing "Not\/A;Namespace"/,
    ],
    [
      'netns that does not exist',
      () => meshCni('ADD', chain, conf()),
      4,
      /CNI_NETNS \/run\/netns\/mcni-plg-none does not exist/,
    ],
  ];
  for (const [name, go, code, msg] of cases) {
    it(`fails cleanly on ${name}`, async () => {
      const r = await go();
      assert.notEqual(r.code, 0);
      const e = errorOf(r.stdout);
      assert.equal(e.code, code, r.stdout);
      assert.match(`${e.msg}: ${e.details ?? ''}`, msg);
    });
  }

  it('DEL succeeds when the netns is gone, and without prevResult', async () => {
    const r = await meshCni('DEL', chain, { ...conf(), prevResult: undefined });
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
  });

  it('GC succeeds with no output; STATUS says not available without an orchconfig', async () => {
    const gc = await meshCni('GC', chain, { ...conf({ cniVersion: '1.1.0' }), 'cni.dev/valid-attachments': [] });
    assert.equal(gc.code, 0);
    assert.equal(gc.stdout, '');
    const st = await meshCni('STATUS', chain, conf({ cniVersion: '1.1.0' }));
    assert.notEqual(st.code, 0);
    assert.equal(errorOf(st.stdout).code, 50);
  });
});

describe('mesh-cni end to end (bridge + host-local + mesh-cni, test API server)', () => {
  let api: TestApiServer;
  let network: BridgeNetwork;
  const tmp = tempDir();
  const pods: Netns[] = [];
  let orchconfig: string;
  let n = 0;

  before(async () => {
    api = await startTestApiServer();
    orchconfig = api.writeOrchconfig(path.join(tmp.dir, 'ZZZ-mesh-cni-orchconfig'));
    network = new BridgeNetwork('198.18.1.0/24');
  });
  after(async () => {
    for (const p of pods) p.remove();
    network?.cleanup();
    await api?.close();
    tmp.remove();
  });

  /** A pod netns with the bridge already run: returns what the runtime would pass to mesh-cni. */
  async function podSandbox(
    args: (id: string) => string,
  ): Promise<{ ns: Netns; chain: ChainEnv; prev: Record<string, unknown> }> {
    const ns = new Netns('pod');
    pods.push(ns);
    const id = `ctr${process.pid}x${++n}`;
    const chain: ChainEnv = { containerId: id, netns: ns.path, ifname: 'eth0', args: args(id) };
    const prev = await network.addPod(chain);
    return { ns, chain, prev };
  }

  const conf =
    (extra: Record<string, unknown> = {}, over: Partial<Parameters<typeof pluginConfig>[0]> = {}) =>
    (prev: unknown) =>
      pluginConfig({ cniVersion: '1.0.0', orchconfig, ...over, extra }, prev);
  const natRules = (ns: Netns) => ns.exec(['iptables-nft-save', '-t', 'nat']);

  it('redirects an injected pod: rules in its netns, output == prevResult, ADD twice, CHECK, DEL', async () => {
    const pod = api.upsertPod(
      meshPod('shop', 'cart-1', { 'traffic.sidecar.mesh.io/excludeOutboundIPRanges': '10.0.0.0/8' }),
    );
    const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
    const stdin = conf()(prev);
    const add = await meshCni('ADD', chain, stdin);
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.deepEqual(JSON.parse(add.stdout), prev, 'ADD prints prevResult unchanged');
    const want = parseRules(buildFamilyRules(specForPod(pod), 4).restore);
    assert.deepEqual(diffRules(want, parseRules(ns.exec(['iptables-nft-save']))), []);
    assert.match(natRules(ns), /-A MESH_OUTPUT -d 10\.0\.0\.0\/8 -j RETURN/);

    const again = await meshCni('ADD', chain, stdin);
    assert.equal(again.code, 0, again.stdout);
    const saved = ns.exec(['iptables-nft-save']);
    assert.deepEqual(diffRules(want, parseRules(saved)), [], 'a second ADD leaves exactly one set');
    assert.equal(saved.split('\n').filter((l) => l === '-A OUTPUT -j MESH_OUTPUT').length, 1);

    const check = await meshCni('CHECK', chain, stdin);
    assert.equal(check.code, 0, check.stdout + check.stderr);
    ns.exec(['iptables-nft', '-t', 'nat', '-F', 'MESH_OUTPUT']);
    const badCheck = await meshCni('CHECK', chain, stdin);
    assert.notEqual(badCheck.code, 0);
    assert.equal(JSON.parse(badCheck.stdout).code, 102);
    assert.match(
      JSON.parse(badCheck.stdout).details,
      /IPv4 nat MESH_OUTPUT rule 1: expected -A MESH_OUTPUT -d 192\.0\.2\.6\/32/,
    );

    const del = await meshCni('DEL', chain, stdin);
    assert.equal(del.code, 0, del.stdout + del.stderr);
    assert.doesNotMatch(natRules(ns), /MESH_/);
    assert.equal((await network.bridgeCmd('DEL', chain, prev)).code, 0);
    ns.remove();
    const delGone = await meshCni('DEL', chain, stdin);
    assert.equal(delGone.code, 0, 'DEL succeeds when the netns is gone');
  });

  it("excludes the uid and gid the pod's mesh-proxy container runs as (OpenShift-style assigned ids)", async () => {
    const pod = api.upsertPod(
      meshPod(
        'shop',
        'assigned-uid',
        {},
        {
          containers: [
            { name: 'app', image: 'app:1' },
            {
              name: 'mesh-proxy',
              image: 'proxy:1',
              securityContext: { runAsUser: 1000670000, runAsGroup: 1000670001 },
            },
          ],
        },
      ),
    );
    const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
    const add = await meshCni('ADD', chain, conf()(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    const nat = natRules(ns);
    assert.match(nat, /-A MESH_OUTPUT -m owner --uid-owner 1000670000 -j RETURN/);
    assert.match(nat, /-A MESH_OUTPUT -m owner --gid-owner 1000670001 -j RETURN/);
    assert.doesNotMatch(nat, /-owner 1337/);
  });

  it("redirects a static pod: the runtime names the kubelet's UID, which the API server holds as the mirror pod's kubernetes.io/config.mirror", async () => {
    // The kubelet runs a static pod under the UID it hashed from the manifest; the API server's
    // mirror pod has a UID of its own and that hash in kubernetes.io/config.mirror.
    const staticUid = '6f1d4ad0c3b1e0a6c0b2b5e0f3d4c5b6';
    const mirror = api.upsertPod(
      meshPod('shop', 'static-web', {
        'kubernetes.io/config.mirror': staticUid,
        'kubernetes.io/config.hash': staticUid,
      }),
    );
    assert.notEqual(mirror.metadata!.uid, staticUid);
    const { ns, chain, prev } = await podSandbox((id) =>
      k8sArgs({ ...mirror, metadata: { ...mirror.metadata, uid: staticUid } }, id),
    );
    const add = await meshCni('ADD', chain, conf()(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(natRules(ns), /-A MESH_OUTPUT /);

    // A namesake that is no mirror of that static pod is still a stale namesake (fails closed).
    const other = api.upsertPod(meshPod('shop', 'static-db', { 'kubernetes.io/config.mirror': 'another-hash' }));
    const second = await podSandbox((id) => k8sArgs({ ...other, metadata: { ...other.metadata, uid: staticUid } }, id));
    const refused = await meshCni('ADD', second.chain, conf()(second.prev));
    assert.notEqual(refused.code, 0, refused.stdout);
    assert.equal(JSON.parse(refused.stdout).code, 11);
  });

  it('answers in the requested cniVersion (0.4.0 chain)', async () => {
    const pod = api.upsertPod(meshPod('shop', 'old-runtime'));
    const { chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
    const prev04 = convertResult(prev, '0.4.0');
    const add = await meshCni(
      'ADD',
      chain,
      pluginConfig(
        { cniVersion: '0.4.0', orchconfig, extra: { pod_lookup_timeout_ms: 3000, iptables_flavour: 'nft' } },
        prev04,
      ),
    );
    assert.equal(add.code, 0, add.stdout);
    assert.deepEqual(JSON.parse(add.stdout), prev04);
  });

  it('applies ip6tables rules when prevResult has an IPv6 address, with the host flavour detected', async () => {
    const pod = api.upsertPod(meshPod('shop', 'dual'));
    const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
    const dual = { ...prev, ips: [...(prev.ips as unknown[]), { interface: 1, address: '2001:db8:5::5/64' }] };
    const add = await meshCni('ADD', chain, { ...conf()(dual), iptables_flavour: 'auto' });
    assert.equal(add.code, 0, add.stdout + add.stderr);
    const want6 = parseRules(buildFamilyRules(specForPod(pod), 6).restore);
    assert.deepEqual(diffRules(want6, parseRules(ns.exec(['ip6tables-nft-save']))), []);
    assert.match(ns.exec(['ip', '-6', 'addr', 'show', 'dev', 'lo']), /inet6 ::6\/128/);
  });

  it('fails closed (101, no result) when iptables-restore fails, for one family and for two', async () => {
    // An iptables-restore that refuses, as one would on a kernel without a needed module: first
    // on the PATH the runtime passes, so nsenter runs it in the pod netns.
    const fake = path.join(tmp.dir, 'fake-sbin');
    mkdirSync(fake, { recursive: true });
    for (const bin of ['iptables-nft-restore', 'ip6tables-nft-restore']) {
      writeFileSync(
        path.join(fake, bin),
        `#!/bin/sh\ncat >/dev/null\necho "${bin}: line 9 failed: no such module" >&2\nexit 1\n`,
        { mode: 0o755 },
      );
    }
    const pod = api.upsertPod(meshPod('shop', 'no-rules'));
    for (const [name, ips] of [
      ['IPv4', []],
      ['IPv4 + IPv6', [{ interface: 1, address: '2001:db8:5::7/64' }]],
    ] as const) {
      const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const withIps = { ...prev, ips: [...(prev.ips as unknown[]), ...ips] };
      const add = await meshCni('ADD', chain, conf()(withIps), MESH_CNI_SOURCE, {
        PATH: `${fake}:${process.env.PATH ?? '/usr/sbin:/usr/bin'}`,
      });
      assert.notEqual(add.code, 0, `${name}: ADD must fail`);
      const e = JSON.parse(add.stdout) as { code: number; msg: string; details: string };
      assert.equal(e.code, 101, `${name}: ${add.stdout}`);
      assert.match(e.msg, /cannot apply the redirect rules/);
      assert.match(e.details, /line 9 failed: no such module/, 'the reason reaches the runtime');
      assert.doesNotMatch(natRules(ns), /MESH_/, `${name}: no rules half-applied`);
    }
  });

  it('skips pods that must not be redirected, without touching their netns', async () => {
    const skipped: [string, ReturnType<typeof meshPod>][] = [
      ['no sidecar', { ...meshPod('shop', 'plain'), metadata: { namespace: 'shop', name: 'plain', annotations: {} } }],
      ['inject false', meshPod('shop', 'optout', { 'sidecar.mesh.io/inject': 'false' })],
      ['own mesh-init', meshPod('shop', 'selfinit', {}, { initContainers: [{ name: 'mesh-init', image: 'proxy:1' }] })],
      ['no mesh-proxy container', meshPod('shop', 'proxyless', {}, { containers: [{ name: 'app', image: 'app:1' }] })],
      [
        'a gateway (proxy router)',
        meshPod(
          'shop',
          'gateway',
          {},
          { containers: [{ name: 'mesh-proxy', image: 'proxy:1', args: ['proxy', 'router'] }] },
        ),
      ],
    ];
    for (const [why, p] of skipped) {
      const pod = api.upsertPod(p);
      const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const add = await meshCni('ADD', chain, conf()(prev));
      assert.equal(add.code, 0, `${why}: ${add.stdout}`);
      assert.deepEqual(JSON.parse(add.stdout), prev);
      assert.doesNotMatch(natRules(ns), /MESH_/, why);
    }
  });

  it('skips excluded namespaces before any API call', async () => {
    const before = api.requests.length;
    const { ns, chain, prev } = await podSandbox(
      (id) => `IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1;K8S_POD_INFRA_CONTAINER_ID=${id}`,
    );
    const add = await meshCni('ADD', chain, conf()(prev));
    assert.equal(add.code, 0, add.stdout);
    assert.equal(api.requests.length, before, 'no API request');
    assert.doesNotMatch(natRules(ns), /MESH_/);
  });

  it('passes a call without K8S_POD_NAMESPACE through untouched (podman: not a Kubernetes pod), asking no one', async () => {
    // Nothing to ask: no orchconfig, no agent socket. Before, such a call was taken as namespace
    // default and failed with code 11 once the lookups gave up.
    const before = api.requests.length;
    const sock = path.join(tmp.dir, 'passthrough-log.sock');
    const lines: string[] = [];
    const server = net.createServer((c) =>
      c.on('data', (d) =>
        lines.push(
          ...d
            .toString()
            .split('\n')
            .filter((l) => l !== ''),
        ),
      ),
    );
    await new Promise<void>((r) => server.listen(sock, r));
    const { ns, chain, prev } = await podSandbox(() => 'IgnoreUnknown=1;K8S_POD_NAME=podman-only');
    const add = await meshCni(
      'ADD',
      chain,
      pluginConfig(
        {
          cniVersion: '1.0.0',
          orchconfig: path.join(tmp.dir, 'absent'),
          logUds: sock,
          extra: { pod_lookup_uds_address: path.join(tmp.dir, 'absent.sock') },
        },
        prev,
      ),
    );
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.deepEqual(JSON.parse(add.stdout), prev, 'prevResult passed through');
    const said = () =>
      lines.some(
        (l) =>
          (JSON.parse(l) as { msg: string }).msg ===
          'not redirecting: CNI_ARGS has no K8S_POD_NAMESPACE: not a Kubernetes pod',
      );
    for (const deadline = Date.now() + 5000; !said() && Date.now() < deadline;)
      await new Promise((r) => setTimeout(r, 20));
    server.close();
    assert.ok(said(), `the log line says why: ${lines.join('\n')}`);
    assert.doesNotMatch(natRules(ns), /MESH_/);
    assert.equal(api.requests.length, before, 'no API request');
    const check = await meshCni(
      'CHECK',
      chain,
      pluginConfig({ cniVersion: '1.0.0', orchconfig: path.join(tmp.dir, 'absent') }, prev),
    );
    assert.equal(check.code, 0, check.stdout + check.stderr);
  });

  it('with orch.assume_namespace_when_missing, a call without K8S_POD_NAMESPACE is a pod of that namespace', async () => {
    const pod = api.upsertPod(meshPod('default', 'podman-web'));
    const { ns, chain, prev } = await podSandbox(() => `IgnoreUnknown=1;K8S_POD_NAME=${pod.metadata!.name}`);
    const stdin = conf()(prev) as { orch: Record<string, unknown> };
    stdin.orch.assume_namespace_when_missing = 'default';
    const add = await meshCni('ADD', chain, stdin);
    assert.equal(add.code, 0, add.stdout + add.stderr);
    assert.match(natRules(ns), /-A OUTPUT -j MESH_OUTPUT/);
  });

  it('refuses bad annotations with a clear error and leaves the pod unconfigured', async () => {
    for (const [key, value, text] of [
      [
        'traffic.sidecar.mesh.io/includeOutboundIPRanges',
        '10.0.0.0/8,300.1.1.1/32',
        /"300\.1\.1\.1\/32" is not an IPv4 or IPv6 address/,
      ],
      ['traffic.sidecar.mesh.io/excludeInboundPorts', '22,99999', /"99999" is not a port/],
    ] as const) {
      const pod = api.upsertPod(meshPod('shop', `bad-${n}`, { [key]: value }));
      const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const add = await meshCni('ADD', chain, conf()(prev));
      assert.notEqual(add.code, 0);
      const e = JSON.parse(add.stdout) as { code: number; msg: string; details: string };
      assert.equal(e.code, 100);
      assert.match(e.msg, /has a bad annotation; no rules applied/);
      assert.match(e.details, text);
      assert.ok(e.details.includes(key));
      assert.doesNotMatch(natRules(ns), /MESH_/);
    }
  });

  describe('API server faults: fail closed with code 11', () => {
    const expect11 = async (stdin: (prev: unknown) => unknown, podName: string, detail: RegExp) => {
      const pod = api.getPod('shop', podName) ?? api.upsertPod(meshPod('shop', podName));
      const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const add = await meshCni('ADD', chain, stdin(prev));
      assert.notEqual(add.code, 0, add.stdout);
      const e = JSON.parse(add.stdout) as { code: number; msg: string; details: string };
      assert.equal(e.code, 11, add.stdout);
      assert.match(e.msg, /not starting it unredirected|orchconfig unusable/);
      assert.match(e.details, detail);
      assert.doesNotMatch(natRules(ns), /MESH_/);
    };

    it('401: wrong token', async () => {
      const bad = api.writeOrchconfig(path.join(tmp.dir, 'wrong-token'), { token: 'not-the-token' });
      await expect11((prev) => pluginConfig({ cniVersion: '1.0.0', orchconfig: bad }, prev), 'auth', /401/);
    });

    it('404: the pod never shows up', async () => {
      const { ns, chain, prev } = await podSandbox(
        (id) => `IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=ghost;K8S_POD_INFRA_CONTAINER_ID=${id}`,
      );
      const add = await meshCni('ADD', chain, conf()(prev));
      const e = JSON.parse(add.stdout) as { code: number; details: string };
      assert.equal(e.code, 11);
      assert.match(e.details, /pod shop\/ghost not found/);
      assert.doesNotMatch(natRules(ns), /MESH_/);
    });

    it('500 for longer than the lookup timeout', async () => {
      api.faults.status = { code: 500, paths: /\/pods\/down$/ };
      try {
        await expect11(conf({ pod_lookup_timeout_ms: 1500 }), 'down', /500/);
      } finally {
        delete api.faults.status;
      }
    });

    it('no answer (timeout)', async () => {
      api.faults.delayMs = 1500;
      try {
        await expect11(
          conf({ pod_lookup_timeout_ms: 1200, pod_lookup_attempt_timeout_ms: 400 }),
          'slow',
          /within 1200 ms/,
        );
      } finally {
        delete api.faults.delayMs;
      }
    });

    it('orchconfig missing', async () => {
      await expect11(
        (prev) => pluginConfig({ cniVersion: '1.0.0', orchconfig: path.join(tmp.dir, 'absent') }, prev),
        'nocfg',
        /cannot read orchconfig/,
      );
    });

    it('recovers from a 503 and a 404 just after creation', async () => {
      const pod = api.upsertPod(meshPod('shop', 'flaky'));
      api.faults.status = { code: 503, retryAfterSeconds: 0, paths: /\/pods\/flaky$/, count: 2 };
      const { ns, chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const add = await meshCni('ADD', chain, conf()(prev));
      assert.equal(add.code, 0, add.stdout + add.stderr);
      assert.match(natRules(ns), /MESH_OUTPUT/);
      api.deletePodFromStore('shop', 'flaky');
      const late = meshPod('shop', 'late');
      const sandbox = await podSandbox(() => 'IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=late');
      const pending = meshCni('ADD', sandbox.chain, conf()(sandbox.prev));
      setTimeout(() => api.upsertPod(late), 150);
      const r = await pending;
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.match(natRules(sandbox.ns), /MESH_OUTPUT/);
    });
  });

  it('sends JSON log lines to the UDS, and works with no socket there', async () => {
    const sock = path.join(tmp.dir, 'log.sock');
    const lines: string[] = [];
    const server = net.createServer((c) => {
      let buf = '';
      c.on('data', (d) => {
        buf += d.toString();
        const parts = buf.split('\n');
        buf = parts.pop()!;
        lines.push(...parts);
      });
    });
    await new Promise<void>((r) => server.listen(sock, r));
    try {
      const pod = api.upsertPod(meshPod('shop', 'logged'));
      const { chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
      const add = await meshCni('ADD', chain, conf({}, { logUds: sock })(prev));
      assert.equal(add.code, 0, add.stdout);
      const deadline = Date.now() + 5000;
      while (!lines.some((l) => l.includes('redirect rules applied')) && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20));
      const rec = lines
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((r) => r.msg === 'redirect rules applied');
      assert.ok(rec, `got ${lines.join('\n')}`);
      assert.equal(rec.scope, 'cni');
      assert.equal(rec.level, 'info');
      assert.equal(rec.command, 'ADD');
      assert.equal(rec.containerID, chain.containerId);
      assert.deepEqual(rec.pod, { namespace: 'shop', name: 'logged' });
      assert.match(String(rec.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    } finally {
      server.close();
    }
    const pod = api.upsertPod(meshPod('shop', 'unlogged'));
    const { chain, prev } = await podSandbox((id) => k8sArgs(pod, id));
    const add = await meshCni('ADD', chain, conf({}, { logUds: path.join(tmp.dir, 'absent.sock') })(prev));
    assert.equal(add.code, 0, add.stdout + add.stderr);
  });
});

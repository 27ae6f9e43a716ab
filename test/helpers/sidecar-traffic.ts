// The traffic matrix of a sidecar pod a real runtime started, by real connections: listeners
// (test/helpers/ztunnel-listeners.ts) in the pod's netns stand in for the proxy (15001 outbound,
// 15006 inbound) and the app (9090, and 9091 whose inbound is excluded), and in the node's netns
// for what the pod talks to (8080, and 8081 whose outbound is excluded); each answers with the
// port it accepted on, the source and SO_ORIGINAL_DST, so an answer says where a connection went
// and where it was headed. The same matrix holds under either redirect backend (iptables or
// native nftables): it is what the e2e suites check for both.

import assert from 'node:assert/strict';
import { rulesIn, run } from './netns.ts';
import { CLIENT, listenIn, PYTHON } from './ztunnel-listeners.ts';

/** The redirect backends the plugin writes a pod's rules with (--native-nftables false / true). */
export const BACKENDS = ['iptables', 'nftables'] as const;
export type Backend = (typeof BACKENDS)[number];

/** The proxy's uid: its own connections are never redirected. */
const PROXY_UID = 1337;
/** An app's uid. */
const APP_UID = 1000;

export interface SidecarTrafficPod {
  /** The pod's netns (`/run/netns/<name>`, `/proc/<pid>/ns/net`). */
  readonly netns: string;
  readonly ip: string;
  /** The node's netns the pod's bridge is in, and its address on that bridge (the pod's gateway). */
  readonly nodeNetns: string;
  readonly nodeIp: string;
  /** Another address of the node's netns, reachable from the pod: the excluded outbound range. */
  readonly excludedIp: string;
}

/** The pod annotations the matrix needs: one excluded outbound port and range, one excluded inbound port. */
export function trafficAnnotations(excludedIp: string): Record<string, string> {
  return {
    'traffic.sidecar.mesh.io/excludeOutboundPorts': '8081',
    'traffic.sidecar.mesh.io/excludeOutboundIPRanges': `${excludedIp}/32`,
    'traffic.sidecar.mesh.io/excludeInboundPorts': '9091',
  };
}

/** Starts the listeners of the matrix; each is pushed to `cleanups` (stopped by its pid) as it starts. */
export async function trafficListeners(p: SidecarTrafficPod, cleanups: (() => unknown)[]): Promise<void> {
  for (const [netns, ports] of [
    [p.netns, [15001, 15006, 9090, 9091]],
    [p.nodeNetns, [8080, 8081]],
  ] as const) {
    const l = await listenIn(netns, ports);
    cleanups.push(() => l.stop());
  }
}

/** The listener's answer to a connection from `netns`, as `uid`, to host:port; what failed when it failed. */
async function reached(netns: string, uid: number, host: string, port: number): Promise<string[]> {
  const as = [`--setuid=${uid}`, `--setgid=${uid}`];
  const r = await run('nsenter', [`--net=${netns}`, ...as, '--', PYTHON, '-c', CLIENT, host, String(port), '0'], {
    timeoutMs: 15_000,
  });
  return r.code === 0 ? r.stdout.trim().split(' ') : [`failed (${r.code}): ${r.stderr.trim().split('\n').at(-1)}`];
}

/** The listener's port and the connection's source: where it went, from where. */
const portAndSource = (a: string[]) => a.slice(0, 2);

/** Asserts the matrix of a redirected pod (REDIRECT inbound): each connection goes where it should. */
export async function assertRedirectedTraffic(p: SidecarTrafficPod): Promise<void> {
  const out = (uid: number, host: string, port: number) => reached(p.netns, uid, host, port);
  const into = (port: number) => reached(p.nodeNetns, 0, p.ip, port);
  assert.deepEqual(await out(APP_UID, p.nodeIp, 8080), ['15001', p.ip, `${p.nodeIp}:8080`], 'outbound to 15001');
  assert.deepEqual(portAndSource(await out(PROXY_UID, p.nodeIp, 8080)), ['8080', p.ip], 'the proxy goes out directly');
  assert.deepEqual(portAndSource(await out(APP_UID, p.nodeIp, 8081)), ['8081', p.ip], 'excluded outbound port');
  assert.deepEqual(portAndSource(await out(APP_UID, p.excludedIp, 8080)), ['8080', p.ip], 'excluded outbound range');
  assert.deepEqual(await into(9090), ['15006', p.nodeIp, `${p.ip}:9090`], 'inbound to 15006');
  assert.deepEqual(portAndSource(await into(9091)), ['9091', p.nodeIp], 'excluded inbound port reaches the app');
}

/** Asserts a pod nothing redirects: every connection reaches the port it was made to. */
export async function assertUnredirectedTraffic(p: SidecarTrafficPod): Promise<void> {
  assert.deepEqual(portAndSource(await reached(p.netns, APP_UID, p.nodeIp, 8080)), ['8080', p.ip], 'outbound');
  assert.deepEqual(portAndSource(await reached(p.nodeNetns, 0, p.ip, 9090)), ['9090', p.nodeIp], 'inbound');
}

/** `nft list tables` in a netns ('' when nft fails there). */
async function nftTablesIn(netns: string): Promise<string> {
  const r = await run('nsenter', [`--net=${netns}`, '--', 'nft', 'list', 'tables']);
  return r.code === 0 ? r.stdout : '';
}

/**
 * Asserts ours in the netns is in `backend` alone: with nftables our table `inet <table>` and no
 * iptables chain of ours (either flavour); with iptables our chains and no table of ours.
 */
export async function assertWrittenWith(backend: Backend, netns: string, table = 'mesh_pod'): Promise<void> {
  const tables = await nftTablesIn(netns);
  const chains = (rulesIn(netns).match(/^:MESH_\S+/gm) ?? []).join(' ');
  const ours = new RegExp(`^table inet ${table}$`, 'm');
  if (backend === 'nftables') {
    assert.match(tables, ours, `our nftables table in ${netns}`);
    assert.equal(chains, '', `no iptables chain of ours in ${netns}`);
  } else {
    assert.notEqual(chains, '', `our iptables chains in ${netns}`);
    assert.doesNotMatch(tables, ours, `no nftables table of ours in ${netns}`);
  }
}

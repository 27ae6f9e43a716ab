// The pure parts of the pod-netns scan (src/podnetns/): which netns of a pod's processes is the
// pod's (planCandidates + chooseNetns), the start time in /proc/<pid>/stat, the canonical form
// addresses are compared in and the `ip -j addr` parse. No root, no netns.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { canonicalIp, parseIpAddrJson } from '../../src/podnetns/addresses.ts';
import { nsKey, type NsId } from '../../src/podnetns/held.ts';
import {
  chooseNetns,
  parseStarttime,
  planCandidates,
  type Choice,
  type Looked,
  type PodProcess,
} from '../../src/podnetns/procscan.ts';
import { statLine } from '../helpers/podproc.ts';

const ns = (ino: number): NsId => ({ dev: 4n, ino: BigInt(ino) });
const HOST = ns(1000);
const SANDBOX = ns(2001);
const VISITED = ns(2002);
const OTHER = ns(2003);
const proc = (pid: number, starttime: number, netns: NsId): PodProcess => ({
  pid,
  starttime: BigInt(starttime),
  netns,
});

/** What is on the interfaces of each netns, by inode; an Error: looking failed; absent: it was gone. */
type World = Record<number, string[] | Error | { openError: string }>;

/** The whole choice, as findPodNetns makes it, with `world` standing for opening and looking. */
function decide(processes: PodProcess[], world: World, podIPs: string[]): Choice & { looked?: string[] } {
  const { candidates } = planCandidates(processes, HOST);
  const looked = new Map<string, Looked>();
  for (const c of candidates) {
    const w = world[Number(c.netns.ino)];
    const pid = c.pids[0]!;
    if (w === undefined) continue;
    if (w instanceof Error) looked.set(nsKey(c.netns), { pid, error: w.message });
    else if (Array.isArray(w)) looked.set(nsKey(c.netns), { pid, addresses: w });
    else looked.set(nsKey(c.netns), { pid, openError: w.openError });
  }
  return chooseNetns(candidates, looked, podIPs);
}

const POD_IP = '198.18.7.12';
const SANDBOX_ADDRS = ['127.0.0.1', POD_IP, '::1'];

// [what, the pod's processes, the world, the pod's IPs, the pid whose netns wins | the failure]
const TABLE: [
  string,
  PodProcess[],
  World,
  string[],
  { pid: number; ino: number } | { reason: string; detail: RegExp },
][] = [
  [
    'the sandbox and two containers sharing its netns: found through the oldest (the sandbox)',
    [proc(310, 900, SANDBOX), proc(300, 800, SANDBOX), proc(320, 950, SANDBOX)],
    { 2001: SANDBOX_ADDRS },
    [POD_IP],
    { pid: 300, ino: 2001 },
  ],
  [
    "a process of the pod in the host netns (CRI-O's conmon, older than the sandbox) never qualifies",
    [proc(290, 100, HOST), proc(300, 800, SANDBOX)],
    { 1000: SANDBOX_ADDRS, 2001: SANDBOX_ADDRS },
    [POD_IP],
    { pid: 300, ino: 2001 },
  ],
  [
    'only host-netns processes: no netns, even when the host holds the pod IP (hostNetwork)',
    [proc(290, 100, HOST), proc(291, 101, HOST)],
    { 1000: SANDBOX_ADDRS },
    [POD_IP],
    { reason: 'no_netns', detail: /no process of the pod outside the host netns/ },
  ],
  [
    'no process at all: no netns',
    [],
    {},
    [POD_IP],
    { reason: 'no_netns', detail: /no process of the pod outside the host netns/ },
  ],
  [
    'a process visiting another netns (older than the sandbox, without the pod IP) loses to the one holding it',
    [proc(250, 50, VISITED), proc(300, 800, SANDBOX)],
    { 2002: ['127.0.0.1', '198.18.9.9'], 2001: SANDBOX_ADDRS },
    [POD_IP],
    { pid: 300, ino: 2001 },
  ],
  [
    'two netns holding the pod IP: the one of the oldest process wins',
    [proc(300, 800, SANDBOX), proc(400, 700, OTHER)],
    { 2001: SANDBOX_ADDRS, 2003: [POD_IP] },
    [POD_IP],
    { pid: 400, ino: 2003 },
  ],
  [
    'the same start time: the lower pid wins (a stable answer)',
    [proc(401, 700, OTHER), proc(400, 700, SANDBOX)],
    { 2001: SANDBOX_ADDRS, 2003: [POD_IP] },
    [POD_IP],
    { pid: 400, ino: 2001 },
  ],
  [
    'a wrong IP: ip_mismatch listing what each netns holds',
    [proc(300, 800, SANDBOX), proc(250, 50, VISITED)],
    { 2001: SANDBOX_ADDRS, 2002: [] },
    ['198.18.7.99'],
    {
      reason: 'ip_mismatch',
      detail:
        /holds 198\.18\.7\.99: netns inode 2002 \(pid 250\) holds no address; netns inode 2001 \(pid 300\) holds 127\.0\.0\.1, 198\.18\.7\.12, ::1/,
    },
  ],
  [
    'a dual-stack pod is found by its IPv6 address alone, compared in canonical form',
    [proc(300, 800, SANDBOX)],
    { 2001: ['127.0.0.1', 'fd00:198:18::c'] },
    ['198.18.7.99', 'FD00:198:18:0:0:0:0:C'],
    { pid: 300, ino: 2001 },
  ],
  [
    'the pod has no IP in its status: ip_mismatch (fail closed), whatever the netns hold',
    [proc(300, 800, SANDBOX)],
    { 2001: SANDBOX_ADDRS },
    [],
    { reason: 'ip_mismatch', detail: /^the pod has no IP in its status$/ },
  ],
  [
    'status IPs that are no addresses: ip_mismatch naming them',
    [proc(300, 800, SANDBOX)],
    { 2001: SANDBOX_ADDRS },
    ['198.18.7.300', 'pod-ip'],
    { reason: 'ip_mismatch', detail: /\(198\.18\.7\.300, pod-ip\) are not IP addresses/ },
  ],
  [
    'looking inside failed (nsenter refused): ip_mismatch with the error, never taken on trust',
    [proc(300, 800, SANDBOX)],
    { 2001: new Error('nsenter: reassociate to namespace failed') },
    [POD_IP],
    { reason: 'ip_mismatch', detail: /netns inode 2001 \(pid 300\): nsenter: reassociate/ },
  ],
  [
    'every candidate netns was gone before it could be opened: no netns',
    [proc(300, 800, SANDBOX), proc(250, 50, VISITED)],
    {},
    [POD_IP],
    { reason: 'no_netns', detail: /the pod's 2 netns were gone before they could be opened/ },
  ],
  [
    'a netns that could not be opened (not gone: no CAP_SYS_PTRACE): no_netns with the error, not ip_mismatch',
    [proc(300, 800, SANDBOX)],
    { 2001: { openError: "EACCES: permission denied, open '/host/proc/300/ns/net'" } },
    [POD_IP],
    { reason: 'no_netns', detail: /the pod's netns could not be opened: netns inode 2001 \(pid 300\): EACCES/ },
  ],
  [
    'one netns unopenable, another holding the IP: that one',
    [proc(250, 50, VISITED), proc(300, 800, SANDBOX)],
    { 2002: { openError: 'EACCES' }, 2001: SANDBOX_ADDRS },
    [POD_IP],
    { pid: 300, ino: 2001 },
  ],
  [
    'the oldest netns gone, the next holds the IP: that one',
    [proc(250, 50, VISITED), proc(300, 800, SANDBOX)],
    { 2001: SANDBOX_ADDRS },
    [POD_IP],
    { pid: 300, ino: 2001 },
  ],
];

describe('chooseNetns over planCandidates', () => {
  for (const [what, processes, world, podIPs, want] of TABLE) {
    it(what, () => {
      const got = decide(processes, world, podIPs);
      if ('pid' in want) {
        assert.ok(
          got.ok,
          JSON.stringify(got, (_k, v: unknown) => (typeof v === 'bigint' ? String(v) : v)),
        );
        assert.equal(got.pid, want.pid);
        assert.equal(got.netns.ino, BigInt(want.ino));
      } else {
        assert.ok(!got.ok);
        assert.equal(got.reason, want.reason);
        assert.match(got.detail, want.detail);
      }
    });
  }
});

describe('planCandidates', () => {
  it('groups by netns, oldest first, the processes of each oldest first, and counts the host ones', () => {
    const { candidates, inHost } = planCandidates(
      [proc(5, 30, SANDBOX), proc(6, 10, OTHER), proc(7, 20, SANDBOX), proc(8, 1, HOST), proc(9, 40, OTHER)],
      HOST,
    );
    assert.equal(inHost, 1);
    assert.deepEqual(
      candidates.map((c) => [Number(c.netns.ino), c.pids, Number(c.starttime)]),
      [
        [2003, [6, 9], 10],
        [2001, [7, 5], 20],
      ],
    );
  });
  it('tells namespaces apart by device as well as inode', () => {
    const { candidates, inHost } = planCandidates([proc(5, 30, { dev: 5n, ino: HOST.ino })], HOST);
    assert.equal(inHost, 0);
    assert.equal(candidates.length, 1);
  });
});

describe('parseStarttime', () => {
  it('reads field 22', () => assert.equal(parseStarttime(statLine(42, 'pause', 987654)), 987654n));
  it('counts after the last ")": a command name with spaces and parentheses', () => {
    assert.equal(parseStarttime(statLine(42, 'a) b (c) 7 8', 4242)), 4242n);
    assert.equal(parseStarttime(statLine(42, ') S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999', 5)), 5n);
  });
  it('a start time beyond 2^53 is kept exact', () =>
    assert.equal(
      parseStarttime(statLine(1, 'x', 0).replace(' 0 1056768', ' 18446744073709551615 1056768')),
      18446744073709551615n,
    ));
  it('null for a text without ")" or without field 22', () => {
    assert.equal(parseStarttime('42 pause S 1'), null);
    assert.equal(parseStarttime('42 (pause) S 1 42 42'), null);
    assert.equal(parseStarttime(''), null);
  });
});

describe('canonicalIp', () => {
  const TABLE_IP: [string, string | null][] = [
    ['198.18.7.12', '198.18.7.12'],
    [' 198.18.7.12\n', '198.18.7.12'],
    ['FD00:198:18:0:0:0:0:C', 'fd00:198:18::c'],
    ['fd00:0198:0018::000c', 'fd00:198:18::c'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    ['::ffff:198.18.7.12', '198.18.7.12'],
    ['::FFFF:c612:70c', '198.18.7.12'],
    ['::1', '::1'],
    ['fe80::1%eth0', null],
    ['198.18.7.300', null],
    ['198.018.7.12', null],
    ['pod-ip', null],
    ['', null],
  ];
  for (const [given, want] of TABLE_IP)
    it(`${JSON.stringify(given)} -> ${want}`, () => assert.equal(canonicalIp(given), want));
});

describe('parseIpAddrJson', () => {
  it('every local address once, canonical, in order', () => {
    const text = JSON.stringify([
      {
        ifindex: 1,
        ifname: 'lo',
        addr_info: [
          { family: 'inet', local: '127.0.0.1', prefixlen: 8 },
          { family: 'inet6', local: '::1', prefixlen: 128 },
        ],
      },
      {
        ifindex: 2,
        ifname: 'eth0',
        addr_info: [
          { family: 'inet', local: '198.18.7.12', prefixlen: 24 },
          { family: 'inet6', local: 'FD00::C', prefixlen: 64 },
        ],
      },
      { ifindex: 3, ifname: 'eth1', addr_info: [{ family: 'inet', local: '198.18.7.12', prefixlen: 24 }] },
      { ifindex: 4, ifname: 'down0', addr_info: [] },
      { ifindex: 5, ifname: 'odd', addr_info: [{ family: 'inet' }, null, { local: 42 }] },
      { ifindex: 6, ifname: 'none' },
    ]);
    assert.deepEqual(parseIpAddrJson(text), ['127.0.0.1', '::1', '198.18.7.12', 'fd00::c']);
  });
  it('throws on output that is not a JSON array', () => {
    assert.throws(() => parseIpAddrJson('{}'), /did not print a JSON array/);
    assert.throws(() => parseIpAddrJson('1: lo: <LOOPBACK>'), SyntaxError);
  });
});

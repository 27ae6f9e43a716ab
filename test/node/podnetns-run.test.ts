// runInNetns (src/podnetns/run.ts): a program run by nsenter in a netns held by fd, the fd handed
// to the child as its fd 3. Inside the right netns, the agent never leaving its own; input,
// exit codes, the time limit and the output cap; a closed or reused fd refused before anything
// runs. Root (ip netns add).

import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, openSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { openNetns, type HeldNetns } from '../../src/podnetns/held.ts';
import { MAX_OUTPUT, runInNetns } from '../../src/podnetns/run.ts';
import { netnsAddresses } from '../../src/podnetns/addresses.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { Netns } from '../helpers/netns.ts';

const defer = cleanupAfterEach();

async function held(): Promise<{ ns: Netns; netns: HeldNetns }> {
  const ns = new Netns('run');
  defer(async () => ns.remove());
  ns.exec(['ip', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
  ns.exec(['ip', 'addr', 'add', '198.18.50.7/24', 'dev', 'eth0']);
  const netns = await openNetns(ns.path, 4242);
  defer(async () => netns.close());
  return { ns, netns };
}

describe('runInNetns', () => {
  it('runs the program inside the held netns; the agent stays in its own', async () => {
    const { ns, netns } = await held();
    const own = readlinkSync('/proc/self/ns/net');
    const r = await runInNetns(netns, ['readlink', '/proc/self/ns/net']);
    assert.deepEqual(r, { code: 0, stdout: `net:[${statSync(ns.path).ino}]\n`, stderr: '', error: null });
    assert.equal(readlinkSync('/proc/self/ns/net'), own);
    assert.deepEqual(await netnsAddresses(netns), ['127.0.0.1', '::1', '198.18.50.7']);
  });

  it('the netns fd is opened O_CLOEXEC: no child inherits it unless handed it', async () => {
    const { netns } = await held();
    const flags = /flags:\s+(\d+)/.exec(readFileSync(`/proc/self/fdinfo/${netns.fd}`, 'utf8'))![1]!;
    assert.ok((parseInt(flags, 8) & 0o2000000) !== 0, `flags ${flags}`);
  });

  it("the child gets fd 3 (the netns) and none of the agent's other files", async () => {
    const { ns, netns } = await held();
    const mine = Array.from({ length: 8 }, () => openSync('/proc/self/stat', 'r'));
    defer(async () => mine.forEach((fd) => closeSync(fd)));
    const r = await runInNetns(netns, ['sh', '-c', 'readlink /proc/$$/fd/3; ls /proc/$$/fd']);
    assert.equal(r.code, 0, r.stderr);
    const [fd3, ...fds] = r.stdout.trim().split('\n');
    assert.equal(fd3, ns.path);
    // (fds the agent itself inherited without close-on-exec, as from a test harness, pass on.)
    const leaked = fds.map(Number).filter((fd) => fd !== 3 && [netns.fd, ...mine].includes(fd));
    assert.deepEqual(leaked, [], 'no other fd of the agent, not even the netns under its own number');
  });

  it("programs are looked up on the agent's PATH first, then in the sbin dirs", async () => {
    const { netns } = await held();
    const shims = mkdtempSync(path.join(os.tmpdir(), 'mcni-podnetns-shim-'));
    defer(async () => rmSync(shims, { recursive: true, force: true }));
    writeFileSync(path.join(shims, 'ip'), '#!/bin/sh\necho shim "$@"\n', { mode: 0o755 });
    const saved = process.env.PATH;
    defer(async () => void (process.env.PATH = saved));
    process.env.PATH = `${shims}:${saved ?? ''}`;
    assert.equal((await runInNetns(netns, ['ip', 'link'])).stdout, 'shim link\n');
    // A PATH without the sbin dirs (a container's): ip and nsenter are still found.
    process.env.PATH = '/nonexistent';
    const r = await runInNetns(netns, ['ip', '-br', 'link', 'show', 'eth0']);
    assert.equal(r.code, 0, r.stderr + (r.error ?? ''));
    assert.match(r.stdout, /^eth0@peer0 /);
  });

  it('input goes to stdin; stdout and stderr come back; a non-zero exit is a result, not a throw', async () => {
    const { netns } = await held();
    const r = await runInNetns(netns, ['sh', '-c', 'cat; echo to-stderr >&2; exit 3'], { input: '*nat\nCOMMIT\n' });
    assert.deepEqual(r, { code: 3, stdout: '*nat\nCOMMIT\n', stderr: 'to-stderr\n', error: null });
  });

  it('a program that does not exist: nsenter says so, with its exit code', async () => {
    const { netns } = await held();
    const r = await runInNetns(netns, ['mcni-no-such-program']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /mcni-no-such-program/);
  });

  it('the time limit kills the child and answers at once', async () => {
    const { netns } = await held();
    const r = await runInNetns(netns, ['sleep', '30'], { timeoutMs: 300 });
    assert.equal(r.code, null);
    assert.match(r.error ?? '', /sleep in the netns of pid 4242 did not finish within 300 ms; killed/);
  });

  it('output is capped at 1 MiB on each stream: more kills the child', async () => {
    const { netns } = await held();
    const exact = await runInNetns(netns, ['head', '-c', String(MAX_OUTPUT), '/dev/zero']);
    assert.equal(exact.code, 0);
    assert.equal(exact.stdout.length, MAX_OUTPUT);
    const more = await runInNetns(netns, ['head', '-c', String(MAX_OUTPUT + 1), '/dev/zero']);
    assert.match(more.error ?? '', /head in the netns of pid 4242 wrote more than 1048576 bytes on stdout; killed/);
    const err = await runInNetns(netns, ['sh', '-c', `head -c ${2 * MAX_OUTPUT} /dev/zero >&2`]);
    assert.match(err.error ?? '', /wrote more than 1048576 bytes on stderr; killed/);
  });

  it('a closed netns, or an fd that no longer holds it, is refused before anything runs', async () => {
    const { netns } = await held();
    const fd = netns.fd;
    netns.close();
    const closed = await runInNetns(netns, ['true']);
    assert.match(
      closed.error ?? '',
      /the netns \(dev \d+, inode \d+\) found through pid 4242 is closed; find it again/,
    );
    // Someone else's file under a number that looks like the netns'.
    const other = openSync('/proc/self/stat', 'r');
    defer(async () => closeSync(other));
    const forged: HeldNetns = { fd: other, dev: 4n, ino: 1n, pid: 4242, close() {} };
    const reused = await runInNetns(forged, ['true']);
    assert.match(reused.error ?? '', new RegExp(`fd ${other} no longer holds the netns`));
    assert.ok(fd >= 0);
    assert.match((await runInNetns(forged, [])).error ?? '', /no program given/);
  });
});

// src/ambient/seqpacket.ts and its addon on real SOCK_SEQPACKET sockets in a temp dir: fd passing
// (a file, a real netns), the 1024-byte limit, timeouts, peer close, EPIPE without SIGPIPE, the
// socket file's mode and removal, and no fd leaked over many messages. Then the build step:
// up-to-date checks and its message when there is no compiler.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  closeSync,
  copyFileSync,
  fstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ESLint } from 'eslint';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildNative } from '../../scripts/native.ts';
import {
  connectSeqpacket,
  listenSeqpacket,
  MAX_MESSAGE,
  type SeqpacketConn,
  type SeqpacketServer,
} from '../../src/ambient/seqpacket.ts';
import { ROOT } from '../helpers/cli.ts';
import { Netns } from '../helpers/netns.ts';
import { fdSnapshot, fdsOpenedSince } from '../helpers/fds.ts';

/** O_CLOEXEC (02000000) in the fd's flags, as /proc shows them (octal). */
function isCloexec(fd: number): boolean {
  const flags = /^flags:\s+([0-7]+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))?.[1];
  assert.ok(flags !== undefined);
  return (parseInt(flags, 8) & 0o2000000) !== 0;
}

let pairs = 0;
/** A server, a client and the accepted side, in `dir` (a socket name of its own: a failed test's is left). */
async function pair(
  dir: string,
  name = `zds-${++pairs}.sock`,
): Promise<{ srv: SeqpacketServer; a: SeqpacketConn; b: SeqpacketConn }> {
  const srv = listenSeqpacket(path.join(dir, name));
  const accepted = srv.accept();
  const a = await connectSeqpacket(path.join(dir, name));
  const b = await accepted;
  return { srv, a, b };
}

function closeAll(...xs: { close(): void }[]): void {
  for (const x of xs) x.close();
}

// A promise that never settles is a failure here, not a hung suite.

/** A copy of the module and the addon loader it imports under `root`, so the addon path is root's. */
function copyModule(root: string): string {
  for (const f of ['src/ambient/seqpacket.ts', 'src/podnetns/addon.ts']) {
    mkdirSync(path.dirname(path.join(root, f)), { recursive: true });
    copyFileSync(path.join(ROOT, f), path.join(root, f));
  }
  return path.join(root, 'src/ambient/seqpacket.ts');
}

describe('ambient seqpacket', { timeout: 60_000 }, () => {
  let dir: string;
  before(() => {
    buildNative({ root: ROOT });
    dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-seqp-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("loads in the project's Node 24 (node_modules/.bin/node)", () => {
    const code =
      "import { listenSeqpacket, connectSeqpacket } from './src/ambient/seqpacket.ts';" +
      `const p = ${JSON.stringify(path.join(dir, 'load.sock'))};` +
      'const s = listenSeqpacket(p); const c = await connectSeqpacket(p); c.close(); s.close();' +
      'console.log(process.version);';
    const r = spawnSync(path.join(ROOT, 'node_modules/.bin/node'), ['--input-type=module', '-e', code], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^v24\./);
  });

  it('says where the addon should be and how to build it when it is missing', () => {
    // A copy of the module where no dist/native/ is beside it.
    const copy = copyModule(path.join(dir, 'nobuild'));
    const code = `import { listenSeqpacket } from ${JSON.stringify(copy)}; listenSeqpacket('/nonexistent/x.sock');`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], { encoding: 'utf8' });
    assert.notEqual(r.status, 0);
    assert.match(
      r.stderr,
      /seqpacket: cannot load the native addon .*nobuild\/dist\/native\/seqpacket\.node: .*npm run build compiles it/,
    );
  });

  it('listens, connects, accepts; datagrams go both ways whole', async () => {
    const { srv, a, b } = await pair(dir);
    try {
      await a.send(Buffer.from('hello'));
      await a.send(Buffer.from('two'));
      assert.deepEqual(await b.recv(1000), { data: Buffer.from('hello'), fds: [] });
      assert.deepEqual(await b.recv(1000), { data: Buffer.from('two'), fds: [] });
      await b.send(Buffer.alloc(MAX_MESSAGE, 7));
      const m = await a.recv(1000);
      assert.equal(m?.data.length, MAX_MESSAGE);
    } finally {
      closeAll(a, b, srv);
    }
  });

  it("passes an open file's fd: a new fd number of the same (dev, ino)", async () => {
    const { srv, a, b } = await pair(dir);
    const file = path.join(dir, 'payload');
    writeFileSync(file, 'x');
    const fd = openSync(file, 'r');
    try {
      await a.send(Buffer.from('add'), [fd]);
      const m = await b.recv(1000);
      assert.ok(m);
      assert.equal(m.fds.length, 1);
      const got = m.fds[0]!;
      assert.notEqual(got, fd);
      const [want, have] = [fstatSync(fd), fstatSync(got)];
      assert.deepEqual([have.dev, have.ino], [want.dev, want.ino]);
      assert.equal(isCloexec(got), true, 'received close-on-exec, so no child inherits a pod netns');
      closeSync(got);
    } finally {
      closeSync(fd);
      closeAll(a, b, srv);
    }
  });

  it('passes a netns fd: the receiver holds the same netns inode', async () => {
    const ns = new Netns('seqp');
    let fd: number | undefined;
    const socks: { close(): void }[] = [];
    try {
      const { srv, a, b } = await pair(dir);
      socks.push(a, b, srv);
      fd = openSync(ns.path, 'r');
      await a.send(Buffer.from('add'), [fd]);
      const m = await b.recv(1000);
      assert.ok(m);
      const got = m.fds[0]!;
      const ino = fstatSync(got).ino;
      assert.equal(ino, statSync(ns.path).ino);
      // ...and that inode is the netns a process in it sees as its own.
      assert.equal(ns.exec(['readlink', '/proc/self/ns/net']).trim(), `net:[${ino}]`);
      closeSync(got);
    } finally {
      if (fd !== undefined) closeSync(fd);
      closeAll(...socks);
      ns.remove();
    }
  });

  it(`refuses a message over ${MAX_MESSAGE} bytes as truncated and closes the fds it brought`, async () => {
    const { srv, a, b } = await pair(dir);
    const fd = openSync('/dev/null', 'r');
    try {
      const before = fdSnapshot();
      await a.send(Buffer.alloc(MAX_MESSAGE + 1, 1), [fd, fd, fd]);
      await assert.rejects(b.recv(1000), { code: 'ERR_SEQPACKET_TRUNCATED', message: /larger than 1024 bytes/ });
      assert.deepEqual(fdsOpenedSince(before), [], 'no fd of the refused message stays open');
      // The connection goes on.
      await a.send(Buffer.from('next'));
      assert.equal((await b.recv(1000))?.data.toString(), 'next');
    } finally {
      closeSync(fd);
      closeAll(a, b, srv);
    }
  });

  it('refuses a message with more fds than fit (MSG_CTRUNC) and leaks none', async () => {
    const { srv, a, b } = await pair(dir);
    const fd = openSync('/dev/null', 'r');
    try {
      const before = fdSnapshot();
      await a.send(Buffer.from('many'), Array<number>(40).fill(fd));
      await assert.rejects(b.recv(1000), { code: 'ERR_SEQPACKET_TRUNCATED', message: /more than \d+ fds/ });
      assert.deepEqual(fdsOpenedSince(before), []);
    } finally {
      closeSync(fd);
      closeAll(a, b, srv);
    }
  });

  it('recv gives null when nothing comes in time, and the next message still arrives', async () => {
    const { srv, a, b } = await pair(dir);
    try {
      assert.equal(await b.recv(20), null);
      await a.send(Buffer.from('late'));
      assert.equal((await b.recv(1000))?.data.toString(), 'late');
    } finally {
      closeAll(a, b, srv);
    }
  });

  it("rejects recv with a clear 'closed' error once the peer closed, pending or later", async () => {
    const { srv, a, b } = await pair(dir);
    try {
      const pending = b.recv(5000);
      a.close();
      await assert.rejects(pending, { code: 'ERR_SEQPACKET_CLOSED', message: /closed by the peer/ });
      await assert.rejects(b.recv(5000), { code: 'ERR_SEQPACKET_CLOSED', message: /closed by the peer/ });
      assert.equal(b.closed, false);
    } finally {
      closeAll(a, b, srv);
    }
  });

  it('send after the peer closed rejects with EPIPE, and no SIGPIPE is raised', async () => {
    let sigpipes = 0;
    const onPipe = () => sigpipes++;
    process.on('SIGPIPE', onPipe);
    const { srv, a, b } = await pair(dir);
    try {
      a.close();
      await assert.rejects(b.send(Buffer.from('x')), { code: 'EPIPE', syscall: 'sendmsg', message: /broken pipe/ });
      await sleep(50); // a signal comes through libuv's signal pipe
      assert.equal(sigpipes, 0);
      // The detector works: a real SIGPIPE is seen. (Linux raises none for SEQPACKET today;
      // MSG_NOSIGNAL is there because POSIX allows it to.)
      process.kill(process.pid, 'SIGPIPE');
      await sleep(50);
      assert.equal(sigpipes, 1);
    } finally {
      process.off('SIGPIPE', onPipe);
      closeAll(a, b, srv);
    }
  });

  it("a peer gone with our datagrams unread: what waits says ECONNRESET / EPIPE, not the poll's EBADF", async () => {
    // The kernel then flags our socket with an error (POLLERR), which libuv reports as EBADF: a ztunnel
    // that crashed with an Add unread would read as a bad fd in the agent's logs.
    const { srv, a, b } = await pair(dir);
    try {
      // b fills a's queue until a send has to wait; a never reads.
      const sends: Promise<unknown>[] = [];
      let waiting: Promise<unknown> | undefined;
      for (let i = 0; i < 100_000 && waiting === undefined; i++) {
        const s = b.send(Buffer.alloc(MAX_MESSAGE, 7)).then(
          () => 'sent',
          (e: unknown) => e,
        );
        sends.push(s);
        const first = await Promise.race([s, sleep(0).then(() => 'waiting')]);
        if (first === 'waiting') waiting = s;
      }
      assert.ok(waiting, 'a send that waits for room');
      const recv = b.recv(5000).then(
        () => assert.fail('no message'),
        (e: unknown) => e,
      );
      a.close();
      const [recvErr, sendErr] = (await Promise.all([recv, waiting])) as NodeJS.ErrnoException[];
      assert.equal(recvErr?.code, 'ECONNRESET', recvErr?.message);
      assert.equal(recvErr?.syscall, 'recvmsg');
      assert.equal(sendErr?.code, 'EPIPE', sendErr?.message);
      // Then it reads as the peer's close.
      await assert.rejects(b.recv(1000), { code: 'ERR_SEQPACKET_CLOSED', message: /closed by the peer/ });
      await Promise.all(sends);
    } finally {
      closeAll(a, b, srv);
    }
  });

  it('close is idempotent; it rejects what waits and what comes after', async () => {
    const { srv, a, b } = await pair(dir);
    const pending = b.recv(5000);
    b.close();
    b.close();
    assert.equal(b.closed, true);
    await assert.rejects(pending, { code: 'ERR_SEQPACKET_CLOSED', message: /close\(\) was called/ });
    await assert.rejects(b.recv(10), { code: 'ERR_SEQPACKET_CLOSED' });
    await assert.rejects(b.send(Buffer.from('x')), { code: 'ERR_SEQPACKET_CLOSED' });
    closeAll(a, srv, srv);
  });

  it('creates the socket file 0600 whatever the umask, and an asked mode exactly', () => {
    const old = process.umask(0);
    try {
      const p = path.join(dir, 'mode.sock');
      const srv = listenSeqpacket(p);
      assert.equal((statSync(p).mode & 0o7777).toString(8), '600');
      srv.close();
      process.umask(0o077);
      const srv2 = listenSeqpacket(p, { mode: 0o660 });
      assert.equal((statSync(p).mode & 0o7777).toString(8), '660');
      srv2.close();
    } finally {
      process.umask(old);
    }
  });

  it('bind itself creates the file with the mode, not wider (no chmod window)', () => {
    // The addon's bind alone (listenSeqpacket chmods after it only when the umask took bits).
    const mod = { exports: {} as { socket(): number; bind(fd: number, p: string, mode: number): number } };
    process.dlopen(mod, path.join(ROOT, 'dist/native/seqpacket.node'));
    const old = process.umask(0);
    const p = path.join(dir, 'raw.sock');
    const fd = mod.exports.socket();
    try {
      assert.equal(mod.exports.bind(fd, p, 0o600), 0);
      assert.equal((statSync(p).mode & 0o7777).toString(8), '600');
    } finally {
      process.umask(old);
      closeSync(fd);
      rmSync(p, { force: true });
    }
  });

  it('close() unlinks the socket file, but not one that replaced it', async () => {
    const p = path.join(dir, 'unlink.sock');
    listenSeqpacket(p).close();
    assert.throws(() => statSync(p), { code: 'ENOENT' });
    const srv = listenSeqpacket(p);
    rmSync(p);
    writeFileSync(p, 'a newer agent');
    srv.close();
    assert.equal(statSync(p).isFile(), true);
    rmSync(p);
  });

  it('accept rejects once the server is closed, pending or later', async () => {
    const p = path.join(dir, 'accept.sock');
    const srv = listenSeqpacket(p);
    const pending = srv.accept();
    srv.close();
    await assert.rejects(pending, { code: 'ERR_SEQPACKET_CLOSED', message: /server was closed/ });
    await assert.rejects(srv.accept(), { code: 'ERR_SEQPACKET_CLOSED' });
  });

  it('errors carry the code, syscall and path: a taken path, a missing listener', async () => {
    const p = path.join(dir, 'taken.sock');
    const srv = listenSeqpacket(p);
    try {
      assert.throws(() => listenSeqpacket(p), { code: 'EADDRINUSE', syscall: 'bind', path: p });
      await assert.rejects(connectSeqpacket(path.join(dir, 'none.sock')), {
        code: 'ENOENT',
        syscall: 'connect',
        message: /none\.sock: no such file or directory/,
      });
    } finally {
      srv.close();
    }
  });

  it('leaks no fd over 2,000 send+recv with fds', async () => {
    const { srv, a, b } = await pair(dir);
    const file = openSync('/dev/null', 'r');
    try {
      const before = fdSnapshot();
      for (let i = 0; i < 2000; i++) {
        await a.send(Buffer.alloc(60, i), [file]);
        const m = await b.recv(1000);
        assert.equal(m?.fds.length, 1);
        closeSync(m.fds[0]!);
        await b.send(Buffer.from([8, 1]));
        await a.recv(1000);
      }
      assert.deepEqual(fdsOpenedSince(before), []);
    } finally {
      closeSync(file);
      closeAll(a, b, srv);
    }
  });
});

describe('addon error paths (a fault-injecting build of the addon)', () => {
  let dir: string;
  before(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-fault-'))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('fds received with a message the addon cannot hand to JS are closed, not leaked', () => {
    // The real source, with napi_create_array_with_length failing on demand (as it does when the
    // heap is exhausted) for a message that brought fds; loaded through a copy of the TS module.
    const copy = copyModule(dir);
    const source = path.join(dir, 'fault.c');
    writeFileSync(
      source,
      [
        '#define _GNU_SOURCE',
        '#define NAPI_VERSION 8',
        '#include <stdlib.h>',
        '#include <node_api.h>',
        'static napi_status fault_array(napi_env env, size_t n, napi_value *out) {',
        '  if (n > 2 && getenv("FAULT_ARRAY") != NULL) return napi_generic_failure;',
        '  return napi_create_array_with_length(env, n, out);',
        '}',
        '#define napi_create_array_with_length fault_array',
        `#include ${JSON.stringify(path.join(ROOT, 'src/ambient/native/seqpacket.c'))}`,
        '',
      ].join('\n'),
    );
    buildNative({ root: ROOT, source, out: path.join(dir, 'dist/native/seqpacket.node') });
    const marker = path.join(dir, 'passed-file');
    writeFileSync(marker, '');
    const code = `
      import { openSync, closeSync, readdirSync, readlinkSync } from 'node:fs';
      import { listenSeqpacket, connectSeqpacket } from ${JSON.stringify(copy)};
      const held = () => readdirSync('/proc/self/fd').filter((fd) => {
        try { return readlinkSync('/proc/self/fd/' + fd) === ${JSON.stringify(marker)}; } catch { return false; }
      }).length;
      const srv = listenSeqpacket(${JSON.stringify(path.join(dir, 'f.sock'))});
      const accepted = srv.accept();
      const a = await connectSeqpacket(${JSON.stringify(path.join(dir, 'f.sock'))});
      const b = await accepted;
      const file = openSync(${JSON.stringify(marker)}, 'r');
      await a.send(Buffer.from('add'), [file]);
      closeSync(file);
      const err = await b.recv(1000).then(() => 'received', (e) => e.message);
      console.log(JSON.stringify({ err, held: held() }));
      a.close(); b.close(); srv.close();`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], {
      encoding: 'utf8',
      env: { ...process.env, FAULT_ARRAY: '1' },
    });
    assert.equal(r.status, 0, r.stderr);
    const got = JSON.parse(r.stdout) as { err: string; held: number };
    assert.match(got.err, /napi_create_array_with_length|cannot hand/);
    assert.equal(got.held, 0, 'the received fd of the file is still open in the receiver');
  });
});

describe('native build (scripts/native.ts)', () => {
  let dir: string;
  before(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-native-'))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('builds once, does nothing the second time, rebuilds when the C source is touched or cc changes', async () => {
    const source = path.join(dir, 'seqpacket.c');
    const out = path.join(dir, 'out/seqpacket.node');
    copyFileSync(path.join(ROOT, 'src/ambient/native/seqpacket.c'), source);
    assert.equal(buildNative({ root: ROOT, source, out }), true);
    const first = statSync(out).mtimeMs;
    assert.equal(buildNative({ root: ROOT, source, out }), false);
    assert.equal(statSync(out).mtimeMs, first);
    await sleep(20);
    assert.equal(spawnSync('touch', [source]).status, 0);
    assert.equal(buildNative({ root: ROOT, source, out }), true);
    // Another compiler command: built again, then up to date with it.
    assert.equal(buildNative({ root: ROOT, source, out, cc: 'gcc' }), true);
    assert.equal(buildNative({ root: ROOT, source, out, cc: 'gcc' }), false);
    assert.deepEqual(
      readdirSync(path.dirname(out)).sort(),
      ['seqpacket.node', 'seqpacket.node.cmd'],
      'no temp file left',
    );
  });

  it('says what to install when there is no C compiler', () => {
    const out = path.join(dir, 'nocc/seqpacket.node');
    assert.throws(() => buildNative({ root: ROOT, out, cc: '/nonexistent/cc' }), {
      message: /no C compiler: \/nonexistent\/cc is not on PATH; .*setup-host\.sh.*apt-get install gcc/,
    });
  });

  it('fails with the compiler output and no addon left behind when the source does not compile', () => {
    const source = path.join(dir, 'bad.c');
    const out = path.join(dir, 'bad/seqpacket.node');
    writeFileSync(source, 'int f(void) { return }\n');
    assert.throws(() => buildNative({ root: ROOT, source, out }), {
      message: /cc failed \(exit 1\) compiling .*bad\.c.*expected expression/s,
    });
    assert.deepEqual(readdirSync(path.dirname(out)), []);
  });
});

describe('src/ambient/ import zone (eslint.config.js)', () => {
  const eslint = new ESLint({ cwd: ROOT });
  const refusals = async (file: string, code: string): Promise<string[]> => {
    const [r] = await eslint.lintText(code, { filePath: path.join(ROOT, file) });
    assert.ok(r);
    return r.messages
      .filter((m) => m.ruleId === 'no-restricted-imports' || m.ruleId === 'no-restricted-syntax')
      .map((m) => m.message);
  };
  const CASES: [string, string, RegExp | null][] = [
    ['src/ambient/zz.ts', "import { x } from '../install/apply.ts';", /src\/ambient\/ does not import src\/install\//],
    ['src/ambient/zds/zz.ts', "export { x } from '../../repair/repair.ts';", /or src\/repair\//],
    ['src/ambient/zz.ts', "const m = () => import('../repair/repair.ts');", /or src\/repair\//],
    ['src/ambient/zz.ts', "import { x } from '../../cni-plugin/netns/iptables.ts';", /only cni-plugin\/shared\//],
    ['src/ambient/zz.ts', "import { x } from '../podnetns/index.ts';\nimport { y } from './seqpacket.ts';", null],
  ];
  for (const [file, code, want] of CASES) {
    it(`${file}: ${code.split('\n')[0]} ${want ? 'is refused' : 'is allowed'}`, async () => {
      const got = await refusals(file, code);
      if (want === null) assert.deepEqual(got, []);
      else
        assert.ok(
          got.some((m) => want.test(m)),
          got.join('\n'),
        );
    });
  }
});

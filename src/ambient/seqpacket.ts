// SOCK_SEQPACKET Unix sockets with SCM_RIGHTS fd passing: the transport of ZDS, the agent <->
// ztunnel protocol (one protobuf message per datagram, an Add carrying the pod's netns fd).
// Node's `net` has neither (a SEQPACKET fd is ERR_INVALID_FD_TYPE there), so the syscalls are
// our small N-API addon (src/ambient/native/seqpacket.c, built into dist/native/ by npm run
// build); this module is the only one that loads it. Every socket is nonblocking: a call that
// would block waits for the event loop's readiness (uv_poll) and is made again.

import { constants as osConstants } from 'node:os';
import { chmodSync, lstatSync, rmSync, unlinkSync } from 'node:fs';
import { ADDON_PATH, loadAddon } from '../podnetns/addon.ts';
import { getSystemErrorMessage, getSystemErrorName } from 'node:util';

export interface SeqpacketMessage {
  readonly data: Buffer;
  /** Received close-on-exec; the receiver owns and closes them. */
  readonly fds: number[];
}

export interface SeqpacketConn {
  /** One datagram; `fds` go as SCM_RIGHTS and must stay open until the promise settles. Rejects on EPIPE etc. */
  send(data: Buffer, fds?: readonly number[]): Promise<void>;
  /**
   * The next datagram, or null when none came within timeoutMs. Rejects (code ERR_SEQPACKET_CLOSED)
   * once the peer closed or close() was called, and on a message larger than MAX_MESSAGE or with
   * more fds than fit (code ERR_SEQPACKET_TRUNCATED; its fds are closed, the connection stays usable).
   */
  recv(timeoutMs: number): Promise<SeqpacketMessage | null>;
  /** Idempotent; pending send/recv reject with ERR_SEQPACKET_CLOSED. */
  close(): void;
  /** True once close() was called (a peer's close shows as recv's ERR_SEQPACKET_CLOSED). */
  readonly closed: boolean;
}

export interface SeqpacketServer {
  /** The next connection; rejects once the server is closed. */
  accept(): Promise<SeqpacketConn>;
  /** Idempotent; unlinks the socket file it created (not one that replaced it since). */
  close(): void;
}

/** Both sides' receive buffer, as ztunnel's. */
export const MAX_MESSAGE = 1024;

interface Addon {
  socket(): number;
  bind(fd: number, path: string, mode: number): number;
  listen(fd: number, backlog: number): number;
  accept(fd: number): number;
  connect(fd: number, path: string): number;
  send(fd: number, data: Buffer, fds: readonly number[]): number;
  /** [bytes, msg_flags, ...fds] or -errno. */
  recv(fd: number, into: Buffer): number[] | number;
  close(fd: number): number;
  watch(fd: number, events: number, cb: (status: number, events: number) => void): Watch | number;
  setEvents(w: Watch, events: number): number;
  unwatch(w: Watch): number;
  readonly READABLE: number;
  readonly WRITABLE: number;
  readonly MSG_TRUNC: number;
  readonly MSG_CTRUNC: number;
  readonly RECV_MAX_FDS: number;
}
declare const watchBrand: unique symbol;
type Watch = { readonly [watchBrand]: true };

let addon: Addon | undefined;

/** Loaded on first use, so an agent that never speaks ZDS never needs the file. */
function native(): Addon {
  if (addon) return addon;
  let loaded: object;
  try {
    loaded = loadAddon();
  } catch (err) {
    throw new Error(
      `seqpacket: cannot load the native addon ${ADDON_PATH}: ${(err as Error).message}; ` +
        'npm run build compiles it from src/ambient/native/seqpacket.c',
      { cause: err },
    );
  }
  addon = loaded as Addon;
  return addon;
}

const EAGAIN = -osConstants.errno.EAGAIN;
const EINTR = -osConstants.errno.EINTR;

/** An Error like Node's for a failed syscall: code (EPIPE...), errno, syscall, path. */
function sysError(rc: number, syscall: string, what: string, path?: string): NodeJS.ErrnoException {
  const code = getSystemErrorName(rc);
  const err: NodeJS.ErrnoException = new Error(
    `seqpacket ${syscall}${path === undefined ? '' : ` ${path}`}: ${getSystemErrorMessage(rc)} (${code}); ${what}`,
  );
  err.code = code;
  err.errno = rc;
  err.syscall = syscall;
  if (path !== undefined) err.path = path;
  return err;
}

function seqError(code: 'ERR_SEQPACKET_CLOSED' | 'ERR_SEQPACKET_TRUNCATED', message: string): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(message);
  err.code = code;
  return err;
}

/** Throws when `rc` is -errno. */
function check(rc: number, syscall: string, what: string, path?: string): number {
  if (rc < 0) throw sysError(rc, syscall, what, path);
  return rc;
}

/**
 * One fd and its one readiness watch (libuv allows one per fd): `want` sets the interest
 * (readable, writable, none), so the watch runs only while someone waits.
 */
class Pollable {
  readonly fd: number;
  #watch: Watch | undefined;
  #events = 0;
  readonly #onReady: (status: number, events: number) => void;

  constructor(fd: number, onReady: (status: number, events: number) => void) {
    this.fd = fd;
    this.#onReady = onReady;
  }

  want(events: number): void {
    if (events === this.#events) return;
    const n = native();
    if (this.#watch === undefined) {
      const w = n.watch(this.fd, events, (status, ev) => this.#onReady(status, ev));
      if (typeof w === 'number') throw sysError(w, 'uv_poll', 'cannot watch the socket');
      this.#watch = w;
    } else {
      check(n.setEvents(this.#watch, events), 'uv_poll', 'cannot watch the socket');
    }
    this.#events = events;
  }

  /** libuv stopped the watch itself (it does on POLLERR): the next want() starts it again. */
  stopped(): void {
    this.#events = 0;
  }

  /** Stops watching and closes the fd (the watch first: libuv must not poll a closed fd). */
  close(): void {
    const n = native();
    if (this.#watch !== undefined) n.unwatch(this.#watch);
    this.#watch = undefined;
    this.#events = 0;
    n.close(this.fd);
  }
}

interface RecvWaiter {
  resolve(m: SeqpacketMessage | null): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}
interface SendWaiter {
  data: Buffer;
  fds: readonly number[];
  resolve(): void;
  reject(e: Error): void;
}

class Conn implements SeqpacketConn {
  readonly #p: Pollable;
  readonly #buf = Buffer.alloc(MAX_MESSAGE);
  readonly #recvs: RecvWaiter[] = [];
  readonly #sends: SendWaiter[] = [];
  #closed = false;
  #eof = false;

  constructor(fd: number) {
    this.#p = new Pollable(fd, (status, events) => this.#ready(status, events));
  }

  get closed(): boolean {
    return this.#closed;
  }

  send(data: Buffer, fds: readonly number[] = []): Promise<void> {
    if (this.#closed) return Promise.reject(closedError('send'));
    return new Promise((resolve, reject) => {
      // Datagrams go in call order: behind any already waiting for the socket to drain.
      this.#sends.push({ data, fds: [...fds], resolve, reject });
      if (this.#sends.length === 1) this.#flushSends();
    });
  }

  recv(timeoutMs: number): Promise<SeqpacketMessage | null> {
    if (this.#closed) return Promise.reject(closedError('recv'));
    if (this.#eof) return Promise.reject(peerClosedError());
    return new Promise((resolve, reject) => {
      const waiter: RecvWaiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          const i = this.#recvs.indexOf(waiter);
          if (i >= 0) this.#recvs.splice(i, 1);
          this.#rearm();
          resolve(null);
        }, timeoutMs),
      };
      this.#recvs.push(waiter);
      if (this.#recvs.length === 1) this.#drainRecvs();
    });
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#p.close();
    this.#failAll(closedError);
  }

  #failAll(err: (op: string) => Error): void {
    for (const w of this.#recvs.splice(0)) {
      clearTimeout(w.timer);
      w.reject(err('recv'));
    }
    for (const w of this.#sends.splice(0)) w.reject(err('send'));
  }

  #ready(status: number, _events: number): void {
    if (this.#closed) return;
    if (status < 0) {
      // libuv reports POLLERR as EBADF and stops the watch. On a Unix socket POLLERR is the peer's
      // reset (it closed with our datagrams unread: a ztunnel that crashed before reading an Add),
      // so the calls themselves say what happened (ECONNRESET, EPIPE, then the peer's close); the
      // poll's status is only for what they leave waiting (never seen: no busy loop either way).
      this.#p.stopped();
      this.#drainRecvs();
      this.#flushSends();
      if (this.#recvs.length > 0 || this.#sends.length > 0) {
        const err = sysError(status, 'uv_poll', 'the connection is unusable');
        this.#failAll(() => err);
        this.#rearm();
      }
      return;
    }
    this.#flushSends();
    this.#drainRecvs();
  }

  #flushSends(): void {
    const n = native();
    for (let w = this.#sends[0]; w !== undefined && !this.#closed; w = this.#sends[0]) {
      const rc = n.send(this.#p.fd, w.data, w.fds);
      if (rc === EAGAIN || rc === EINTR) break;
      this.#sends.shift();
      if (rc < 0) w.reject(sysError(rc, 'sendmsg', 'the datagram was not sent'));
      else w.resolve();
    }
    this.#rearm();
  }

  #drainRecvs(): void {
    const n = native();
    for (let w = this.#recvs[0]; w !== undefined && !this.#closed; w = this.#recvs[0]) {
      const r = n.recv(this.#p.fd, this.#buf);
      if (r === EAGAIN || r === EINTR) break;
      this.#recvs.shift();
      clearTimeout(w.timer);
      if (typeof r === 'number') {
        w.reject(sysError(r, 'recvmsg', 'no datagram was received'));
        continue;
      }
      const [bytes = 0, flags = 0, ...fds] = r;
      if (flags & (n.MSG_TRUNC | n.MSG_CTRUNC)) {
        // Its fds were closed by the addon already.
        w.reject(
          seqError(
            'ERR_SEQPACKET_TRUNCATED',
            flags & n.MSG_TRUNC
              ? `seqpacket recv: a message larger than ${MAX_MESSAGE} bytes was refused (truncated)`
              : `seqpacket recv: a message with more than ${n.RECV_MAX_FDS} fds was refused (control data truncated)`,
          ),
        );
        continue;
      }
      // A SEQPACKET read of 0 bytes and no fds is the peer's close (ZDS never sends an empty message).
      if (bytes === 0 && fds.length === 0) {
        this.#eof = true;
        w.reject(peerClosedError());
        for (const o of this.#recvs.splice(0)) {
          clearTimeout(o.timer);
          o.reject(peerClosedError());
        }
        break;
      }
      w.resolve({ data: Buffer.from(this.#buf.subarray(0, bytes)), fds });
    }
    this.#rearm();
  }

  /** Watches for what the waiters need, and nothing when none wait (then the loop may exit). */
  #rearm(): void {
    if (this.#closed) return;
    const n = native();
    this.#p.want((this.#recvs.length > 0 ? n.READABLE : 0) | (this.#sends.length > 0 ? n.WRITABLE : 0));
  }
}

function closedError(op: string): Error {
  return seqError('ERR_SEQPACKET_CLOSED', `seqpacket ${op}: the connection was closed (close() was called)`);
}

function peerClosedError(): Error {
  return seqError('ERR_SEQPACKET_CLOSED', 'seqpacket recv: the connection was closed by the peer');
}

class Server implements SeqpacketServer {
  readonly #p: Pollable;
  readonly #path: string;
  readonly #ino: number;
  readonly #dev: number;
  readonly #accepts: { resolve(c: SeqpacketConn): void; reject(e: Error): void }[] = [];
  #closed = false;

  constructor(fd: number, path: string) {
    this.#p = new Pollable(fd, (status) => this.#ready(status));
    this.#path = path;
    const st = lstatSync(path);
    this.#ino = st.ino;
    this.#dev = st.dev;
  }

  accept(): Promise<SeqpacketConn> {
    if (this.#closed) return Promise.reject(serverClosedError(this.#path));
    return new Promise((resolve, reject) => {
      this.#accepts.push({ resolve, reject });
      if (this.#accepts.length === 1) this.#drain();
    });
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#p.close();
    for (const w of this.#accepts.splice(0)) w.reject(serverClosedError(this.#path));
    // Only our own socket file: a newer agent may have bound the path since.
    try {
      const st = lstatSync(this.#path);
      if (st.ino === this.#ino && st.dev === this.#dev) unlinkSync(this.#path);
    } catch (err) {
      // Gone, or its dir is no longer a dir (ENOTDIR): nothing of ours is there to unlink.
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw err;
    }
  }

  #ready(status: number): void {
    if (this.#closed) return;
    if (status < 0) {
      const err = sysError(status, 'uv_poll', 'the listening socket is unusable', this.#path);
      for (const w of this.#accepts.splice(0)) w.reject(err);
    }
    this.#drain();
  }

  #drain(): void {
    const n = native();
    for (let w = this.#accepts[0]; w !== undefined && !this.#closed; w = this.#accepts[0]) {
      const fd = n.accept(this.#p.fd);
      if (fd === EAGAIN || fd === EINTR) break;
      // A connection that went before it was accepted: wait for the next.
      if (fd === -osConstants.errno.ECONNABORTED) continue;
      this.#accepts.shift();
      if (fd < 0) w.reject(sysError(fd, 'accept4', 'no connection was accepted', this.#path));
      else w.resolve(new Conn(fd));
    }
    if (!this.#closed) this.#p.want(this.#accepts.length > 0 ? n.READABLE : 0);
  }
}

function serverClosedError(path: string): Error {
  return seqError('ERR_SEQPACKET_CLOSED', `seqpacket accept ${path}: the server was closed`);
}

/**
 * Listens on a new socket file at `path`, created with `mode` (default 0o600) and never wider,
 * whatever the umask. Throws EADDRINUSE when the path exists: removing a stale socket is the
 * caller's decision.
 */
export function listenSeqpacket(path: string, opts: { mode?: number; backlog?: number } = {}): SeqpacketServer {
  const n = native();
  const mode = opts.mode ?? 0o600;
  const fd = check(n.socket(), 'socket', 'cannot create a SOCK_SEQPACKET socket');
  let bound = false;
  try {
    check(n.bind(fd, path, mode), 'bind', 'cannot listen there', path);
    bound = true;
    // Created with mode less the umask (never wider); exactly mode once the umask's bits are back.
    if ((lstatSync(path).mode & 0o7777) !== mode) chmodSync(path, mode);
    check(n.listen(fd, opts.backlog ?? 16), 'listen', 'cannot listen there', path);
    return new Server(fd, path);
  } catch (err) {
    n.close(fd);
    if (bound) rmSync(path, { force: true });
    throw err;
  }
}

/** Connects to a SEQPACKET listener at `path` (the fake ztunnel's side and the tests'). */
export function connectSeqpacket(path: string): Promise<SeqpacketConn> {
  try {
    const n = native();
    const fd = check(n.socket(), 'socket', 'cannot create a SOCK_SEQPACKET socket');
    const rc = n.connect(fd, path);
    if (rc < 0) {
      n.close(fd);
      throw sysError(rc, 'connect', rc === EAGAIN ? 'the listener backlog is full: retry' : 'cannot connect', path);
    }
    return Promise.resolve(new Conn(fd));
  } catch (err) {
    return Promise.reject(err as Error);
  }
}

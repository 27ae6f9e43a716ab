// A unix stream socket for the plugin's two short talks with the agent (the log socket, the pod
// lookup), on whichever runtime runs the plugin (scripts/plugin-runtime.ts). Under Bun its own
// Bun.connect is used: loading Bun's node:net and making one round trip through it cost about
// 5 ms of CPU on a cold process, Bun.connect about 1 ms (`npm run bench -- plugin`; docs/design.md
// "Start-up time"). Under Node (the sources, a node-sea build) it is node:net. Both give the same
// events: test/node/plugin-runtime-io.test.ts runs each case on both runtimes and compares.
//
// Before connecting, the path is checked (shared/trustedpath.ts): a socket that is not root's, or
// that sits below a directory another user can write, may be someone's stand-in for the agent,
// and is refused without a connection (docs/security.md, "Security: the trust model").

import { socketRefusal } from './shared/trustedpath.ts';

export interface UnixSocketEvents {
  /** Connected: writes go out now. */
  open(): void;
  /** Text as it arrives, UTF-8 decoded across chunk boundaries. */
  data(text: string): void;
  /** Connecting or the connection failed; nothing else is called after it. */
  error(message: string): void;
  /** The other end closed. */
  close(): void;
  /**
   * The socket is not to be trusted (why, with its path): not connected, nothing else is called.
   * Unlike error(), never "the agent is not running": the caller must not go on as if it were.
   * Without it, error() is called with the reason.
   */
  refused?(reason: string): void;
}

export interface UnixSocket {
  /** Sends `text` (queued until connected); never throws. */
  write(text: string): void;
  /** Closes once what was written is sent, then calls `done` (also when the socket failed). */
  end(done: () => void): void;
  destroy(): void;
}

interface BunSocket {
  write(data: string | Uint8Array): number;
  end(): void;
  terminate(): void;
  unref(): void;
}
interface BunConnect {
  connect(o: { unix: string; socket: Record<string, (s: BunSocket, arg?: never) => void> }): Promise<BunSocket>;
}

/** Opens a connection to `path`; `unref`: it never keeps the process alive by itself. */
export function connectUnix(path: string, on: UnixSocketEvents, { unref = false } = {}): UnixSocket {
  const refusal = socketRefusal(path);
  if (refusal !== null) {
    // Called after connectUnix returns, as every other event is.
    queueMicrotask(() => (on.refused ? on.refused(refusal) : on.error(refusal)));
    return { write: () => {}, end: (done) => done(), destroy: () => {} };
  }
  const bun = (globalThis as { Bun?: BunConnect }).Bun;
  return bun ? viaBun(bun, path, on, unref) : viaNode(path, on, unref);
}

function viaNode(path: string, on: UnixSocketEvents, unref: boolean): UnixSocket {
  const net = process.getBuiltinModule('node:net');
  const s = net.createConnection({ path });
  if (unref) s.unref();
  let failed = false;
  s.setEncoding('utf8');
  s.on('connect', () => on.open());
  s.on('data', (d: string) => on.data(d));
  s.on('error', (e) => {
    failed = true;
    s.destroy();
    on.error(e.message);
  });
  s.on('close', () => {
    if (!failed) on.close();
  });
  return {
    write: (text) => {
      if (!failed && !s.destroyed) s.write(text);
    },
    end: (done) => {
      if (failed || s.destroyed) done();
      else s.end(done);
    },
    destroy: () => s.destroy(),
  };
}

function viaBun(bun: BunConnect, path: string, on: UnixSocketEvents, unref: boolean): UnixSocket {
  const decoder = new TextDecoder();
  // Bun writes what the kernel takes now and returns how much: the rest waits here for drain.
  let pending: Uint8Array = new Uint8Array(0);
  const encoder = new TextEncoder();
  let sock: BunSocket | null = null;
  let state: 'connecting' | 'open' | 'done' = 'connecting';
  let ending: (() => void) | null = null;
  const finish = () => {
    if (state === 'done') return;
    state = 'done';
    const d = ending;
    ending = null;
    d?.();
  };
  // Done before Bun's end()/terminate(), which may call the close handler at once.
  const fail = (message: string) => {
    if (state === 'done') return;
    finish();
    sock?.terminate();
    on.error(message);
  };
  const pump = () => {
    if (sock === null || state !== 'open') return;
    while (pending.length > 0) {
      const n = sock.write(pending);
      if (n < 0) return fail(`${path}: the connection closed while writing`);
      if (n === 0) return; // drain calls pump again
      pending = pending.subarray(n);
    }
    if (ending !== null) {
      const s = sock;
      finish();
      s.end();
    }
  };
  bun
    .connect({
      unix: path,
      socket: {
        open: (s) => {
          sock = s;
          if (unref) s.unref();
          if (state === 'done') return s.terminate();
          state = 'open';
          on.open();
          pump();
        },
        data: (_s, chunk?: Uint8Array) => {
          if (state === 'open' && chunk) on.data(decoder.decode(chunk, { stream: true }));
        },
        drain: () => pump(),
        error: (_s, e?: Error) => fail(e?.message ?? 'socket error'),
        close: () => {
          if (state === 'done') return;
          finish();
          on.close();
        },
      },
    })
    .then(
      (s) => {
        sock ??= s;
      },
      (e: NodeJS.ErrnoException) => fail(e.code ? `connect ${e.code} ${path}` : e.message),
    );
  return {
    write: (text) => {
      if (state === 'done') return;
      const add = encoder.encode(text);
      const next = new Uint8Array(pending.length + add.length);
      next.set(pending);
      next.set(add, pending.length);
      pending = next;
      pump();
    },
    end: (done) => {
      if (state === 'done') return done();
      ending = done;
      pump();
    },
    destroy: () => {
      if (state === 'done') return;
      state = 'done';
      ending = null;
      sock?.terminate();
    },
  };
}

/** How one request/answer exchange ended (askUnix). */
export type UnixExchange<T> =
  /** `read` found a complete answer (or made one of what came before the close). */
  | { readonly answer: T }
  /** The socket is not to be trusted (why, with its path): not connected, nothing sent. */
  | { readonly refused: string }
  /** Connecting or the connection failed (the socket's own words). */
  | { readonly error: string }
  /** The other end closed and `read` found no answer in what it sent. */
  | { readonly closed: true }
  /** More than `maxAnswerBytes` came without a complete answer: the connection is dropped. */
  | { readonly tooLong: number }
  /** No answer within `timeoutMs`; `sent`: connected and the request written. */
  | { readonly timeout: true; readonly sent: boolean };

export interface AskOptions<T> {
  timeoutMs: number;
  maxAnswerBytes: number;
  /**
   * The answer in `text` (all that arrived, decoded), or null while it is not complete; `closed`:
   * the other end closed, nothing more will come.
   */
  read(text: string, closed: boolean): T | null;
}

/**
 * Connects to `path`, sends `request`, and settles once with what came back: the plugin's one
 * shape of talk with the agent (the pod lookup, the ambient ADD). Never rejects; the connection is
 * dropped when it settles, and a timer or an answer too long cannot leave it open.
 */
export function askUnix<T>(
  path: string,
  request: string,
  { timeoutMs, maxAnswerBytes, read }: AskOptions<T>,
): Promise<UnixExchange<T>> {
  return new Promise((resolve) => {
    let settled = false;
    let sent = false;
    let text = '';
    let bytes = 0;
    const finish = (how: UnixExchange<T>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(how);
    };
    const timer = setTimeout(() => finish({ timeout: true, sent }), timeoutMs);
    const socket: UnixSocket = connectUnix(path, {
      open: () => {
        sent = true;
        socket.write(request);
      },
      data: (chunk) => {
        text += chunk;
        const answer = read(text, false);
        if (answer !== null) return finish({ answer });
        bytes += Buffer.byteLength(chunk);
        if (bytes > maxAnswerBytes) finish({ tooLong: maxAnswerBytes });
      },
      error: (message) => finish({ error: message }),
      close: () => {
        const answer = read(text, true);
        finish(answer === null ? { closed: true } : { answer });
      },
      refused: (reason) => finish({ refused: reason }),
    });
  });
}

// The ZDS server: the node agent's end of the unix socket ztunnel connects to, to learn which pods
// it proxies and to get each pod's network namespace (an fd passed with SCM_RIGHTS).
//
// The protocol, as Istio's node agent and ztunnel speak it:
// - ztunnel connects (SOCK_SEQPACKET) and sends ZdsHello first;
// - the agent sends the snapshot: AddWorkload + the netns fd for each pod it holds a netns of,
//   KeepWorkload for each it could not find one for, then SnapshotSent; ztunnel drops every pod
//   the snapshot did not name;
// - then AddWorkload / DelWorkload as pods come and go: adds to the newest connection only (the
//   ztunnel that will own the pod), deletes to every connection (during a ztunnel rolling update
//   the old one still proxies pods it must let go of);
// - strictly one request, then its Ack (empty error: done; else a nack), per connection: acks
//   carry no id and correlate by order alone, so every send of a connection goes through one queue.
// - when a connection has been quiet for a while, a short read tells a live peer (nothing to read)
//   from a gone one (EOF); ztunnel never speaks unasked, so a message then is a protocol error.
//
// Deliberate differences from Istio's agent (docs/ambient.md, "The ZDS server"), each to fail closed:
// - a ZdsHello of any version but V1 is refused (the connection closed): Istio reads it unchecked;
// - a write or ack timeout drops the connection (Istio keeps it): a late ack would otherwise be
//   taken for the answer to the next request; ztunnel reconnects and gets a full snapshot;
// - a WorkloadResponse without an Ack is a protocol error (Istio takes it for success);
// - a connection counts (gauge, newest for adds) once its Hello was accepted, not from accept().

import { EventEmitter } from 'node:events';
import { closeSync } from 'node:fs';
import { Gauge } from 'prom-client';
import { registry } from '../monitoring/metrics.ts';
import { scope } from '../monitoring/logging.ts';
import { TokenBucket, realClock, type Clock } from '../orch/limits.ts';
import { MAX_MESSAGE, listenSeqpacket, type SeqpacketConn, type SeqpacketServer } from './seqpacket.ts';
import {
  ZDS_VERSION_V1,
  decodeWorkloadResponse,
  decodeZdsHello,
  encodeWorkloadRequest,
  type WorkloadInfo,
  type WorkloadRequest,
} from './zds.ts';

const log = scope('ambient');

// mesh_cni_ prefix as every metric of ours; Istio calls it ztunnel_connected, which reads like a
// yes/no but is a count: _connections says what is counted.
export const ztunnelConnections = new Gauge({
  name: 'mesh_cni_ztunnel_connections',
  help: 'ztunnel connections to the ZDS server that sent a valid hello and are still open (2 during a ztunnel update).',
  registers: [registry],
});

export interface ZdsTimings {
  /** New connections accepted per second at most (burst 1): a ztunnel in a connect loop costs little. */
  readonly acceptsPerSecond: number;
  /** How long a new connection has to send its ZdsHello. */
  readonly helloTimeoutMs: number;
  /** How long one request may take to be written. */
  readonly writeTimeoutMs: number;
  /** How long ztunnel has to answer one request. */
  readonly ackTimeoutMs: number;
  /** Quiet time on a connection before the liveness read. */
  readonly keepaliveIntervalMs: number;
  /** The liveness read's wait: nothing read in it means alive. */
  readonly keepaliveReadMs: number;
}

/** Istio's values (ztunnelserver.go: readWriteDeadline 5 s, keepalive 5 s, a 10 ms read, 5 accepts/s). */
export const DEFAULT_ZDS_TIMINGS: ZdsTimings = {
  acceptsPerSecond: 5,
  helloTimeoutMs: 5000,
  writeTimeoutMs: 5000,
  ackTimeoutMs: 5000,
  keepaliveIntervalMs: 5000,
  keepaliveReadMs: 10,
};

/** A pod of the snapshot. */
export interface SnapshotPod {
  readonly uid: string;
  readonly info: WorkloadInfo;
  /** The pod's netns, held open by the caller at least until the snapshot is sent; null: not found (Keep). */
  readonly netnsFd: number | null;
}

export interface ZtunnelServerOptions {
  /** The socket file ztunnel connects to (a stale one is the caller's to remove). */
  readonly path: string;
  /** The pods to send a new connection, read when its Hello arrives. */
  readonly snapshot: () => readonly SnapshotPod[] | Promise<readonly SnapshotPod[]>;
  readonly timings?: Partial<ZdsTimings>;
  readonly clock?: Clock;
}

export type ZtunnelErrorReason = 'no_connection' | 'nack' | 'timeout' | 'closed' | 'protocol' | 'too_large';

/** A request ztunnel did not do; `message` names ztunnel and the pod. */
export class ZtunnelError extends Error {
  readonly reason: ZtunnelErrorReason;
  constructor(reason: ZtunnelErrorReason, message: string) {
    super(message);
    this.name = 'ZtunnelError';
    this.reason = reason;
  }
}

/**
 * What the server reports, for the caller and for tests to wait on. Emitted synchronously, in
 * this order per connection: `connected` (before the snapshot is read: hold its fds open from
 * here), then `snapshot` once SnapshotSent was acked, `disconnected` whenever it goes (also during
 * the snapshot, and on close()); a connection that never said a valid Hello only gets `refused`.
 */
export interface ZdsServerEvents {
  /** A connection sent a valid Hello: it counts from now on; the snapshot is read next. */
  connected: [id: number];
  /** A connection's snapshot was acked (pods: how many, Adds and Keeps). */
  snapshot: [id: number, pods: number];
  /** A counted connection is gone. */
  disconnected: [id: number, reason: string];
  /** A connection that never counted was closed (no Hello, another version, garbage). */
  refused: [reason: string];
}

interface Job {
  readonly req: WorkloadRequest;
  readonly data: Buffer;
  readonly fds: readonly number[];
  readonly what: string;
  resolve(): void;
  reject(e: ZtunnelError): void;
}

function describe(req: WorkloadRequest): string {
  return req.kind === 'snapshot_sent' ? 'SnapshotSent' : `${req.kind} of pod ${req.uid}`;
}

/** A request as one datagram, refused here if ztunnel's 1024-byte buffer could not take it. */
function encode(req: WorkloadRequest): Buffer {
  const data = encodeWorkloadRequest(req);
  if (data.length > MAX_MESSAGE) {
    throw new ZtunnelError(
      'too_large',
      `ZDS ${describe(req)} is ${data.length} bytes, over the ${MAX_MESSAGE} ztunnel reads in one message; not sent`,
    );
  }
  return data;
}

/** The connection was dropped: why, and whether a deadline did it. */
class Dropped extends Error {
  readonly kind: 'timeout' | 'closed';
  constructor(message: string, kind: 'timeout' | 'closed') {
    super(message);
    this.kind = kind;
  }
}

/** One ztunnel connection: its Hello, its snapshot, then its queue of requests and keepalives. */
class Connection {
  readonly id: number;
  readonly #conn: SeqpacketConn;
  readonly #server: ZtunnelServer;
  readonly #t: ZdsTimings;
  readonly #queue: Job[] = [];
  #wake: (() => void) | null = null;
  #dropped: string | null = null;
  #counted = false;

  constructor(id: number, conn: SeqpacketConn, server: ZtunnelServer, t: ZdsTimings) {
    this.id = id;
    this.#conn = conn;
    this.#server = server;
    this.#t = t;
  }

  /** Queues a request behind the others; settles with its ack. */
  request(req: WorkloadRequest, fds: readonly number[]): Promise<void> {
    const data = encode(req);
    if (this.#dropped !== null) return Promise.reject(this.#closedError(describe(req)));
    return new Promise((resolve, reject) => {
      this.#queue.push({ req, data, fds, what: describe(req), resolve, reject });
      this.#wake?.();
    });
  }

  /** The connection's whole life; never rejects. */
  async run(): Promise<void> {
    try {
      await this.#hello();
      // close() may have dropped it while its Hello was being read: never counted then (counted,
      // it would stay in the gauge and among the connections, and hold the snapshot's fds for good).
      if (this.#dropped !== null) throw new Dropped(this.#dropped, 'closed');
      this.#counted = true;
      this.#server.connectionUp(this);
      await this.#snapshot();
      for (;;) {
        const job = await this.#next();
        if (job === null) await this.#keepalive();
        else await this.#send(job);
      }
    } catch (err) {
      this.drop(err instanceof Dropped ? err.message : `unexpected failure: ${(err as Error).message}`);
    }
  }

  /** Closes the connection (idempotent): queued requests fail, ztunnel reconnects. */
  drop(reason: string): void {
    if (this.#dropped !== null) return;
    this.#dropped = reason;
    this.#conn.close();
    for (const job of this.#queue.splice(0)) job.reject(this.#closedError(job.what));
    this.#wake?.();
    if (this.#counted) this.#server.connectionDown(this, reason);
    else this.#server.emit('refused', reason);
  }

  #closedError(what: string): ZtunnelError {
    return new ZtunnelError(
      'closed',
      `ztunnel connection ${this.id} closed (${this.#dropped}) before ${what} was acked`,
    );
  }

  #fail(reason: string, kind: 'timeout' | 'closed' = 'closed'): never {
    this.drop(reason);
    throw new Dropped(reason, kind);
  }

  /** A receive that never throws: errors and stray fds become a drop. */
  async #recv(timeoutMs: number, waitingFor: string): Promise<Buffer | null> {
    let msg;
    try {
      msg = await this.#conn.recv(timeoutMs);
    } catch (err) {
      return this.#fail(`reading ${waitingFor} from ztunnel: ${(err as Error).message}`);
    }
    if (msg === null) return null;
    if (msg.fds.length > 0) {
      closeFds(msg.fds);
      this.#fail(`ztunnel protocol error: ${waitingFor} came with ${msg.fds.length} fds`);
    }
    return msg.data;
  }

  async #hello(): Promise<void> {
    const data = await this.#recv(this.#t.helloTimeoutMs, 'the ZdsHello');
    if (data === null) this.#fail(`ztunnel sent no ZdsHello within ${this.#t.helloTimeoutMs} ms`);
    let version;
    try {
      version = decodeZdsHello(data).version;
    } catch (err) {
      return this.#fail(`ztunnel protocol error: ${(err as Error).message}`);
    }
    if (version !== ZDS_VERSION_V1) {
      this.#fail(
        `ztunnel speaks ZDS version ${version}, this agent only V1 (${ZDS_VERSION_V1}): ` +
          'run a ztunnel and a node agent of the same mesh release',
      );
    }
  }

  async #snapshot(): Promise<void> {
    let pods: readonly SnapshotPod[];
    try {
      pods = await this.#server.readSnapshot();
    } catch (err) {
      return this.#fail(`cannot read the pod snapshot for ztunnel: ${(err as Error).message}`);
    }
    for (const pod of pods) {
      const req: WorkloadRequest =
        pod.netnsFd === null ? { kind: 'keep', uid: pod.uid } : { kind: 'add', uid: pod.uid, info: pod.info };
      let data: Buffer;
      try {
        data = encode(req);
      } catch (err) {
        // Cannot happen with Kubernetes' name limits (all four strings fit in ~610 bytes); if it
        // does, ztunnel drops that pod and its traffic fails, as a pod it never got would.
        log.error('a pod of the snapshot cannot be sent to ztunnel', { uid: pod.uid, error: (err as Error).message });
        continue;
      }
      // A nack of one pod is ztunnel's to retry (it keeps the pod pending); the snapshot goes on.
      const nack = await this.#exchange(req, data, pod.netnsFd === null ? [] : [pod.netnsFd]);
      if (nack !== null) log.warn('ztunnel refused a pod of the snapshot', { uid: pod.uid, error: nack });
    }
    const nack = await this.#exchange({ kind: 'snapshot_sent' }, encode({ kind: 'snapshot_sent' }), []);
    if (nack !== null) log.warn('ztunnel refused SnapshotSent', { conn: this.id, error: nack });
    // Dropped since the ack came (close()): it said 'disconnected' already, which ends its events.
    if (this.#dropped !== null) throw new Dropped(this.#dropped, 'closed');
    this.#server.emit('snapshot', this.id, pods.length);
  }

  /** The next queued request, or null after keepaliveIntervalMs of quiet. */
  async #next(): Promise<Job | null> {
    if (this.#dropped !== null) throw new Dropped(this.#dropped, 'closed');
    const queued = this.#queue.shift();
    if (queued !== undefined) return queued;
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      this.#wake = resolve;
      timer = setTimeout(resolve, this.#t.keepaliveIntervalMs);
    });
    clearTimeout(timer);
    this.#wake = null;
    if (this.#dropped !== null) throw new Dropped(this.#dropped, 'closed');
    return this.#queue.shift() ?? null;
  }

  async #keepalive(): Promise<void> {
    const data = await this.#recv(this.#t.keepaliveReadMs, 'the keepalive read');
    if (data !== null) this.#fail('ztunnel protocol error: a message arrived unasked');
  }

  async #send(job: Job): Promise<void> {
    let nack: string | null;
    try {
      nack = await this.#exchange(job.req, job.data, job.fds);
    } catch (err) {
      const kind = err instanceof Dropped ? err.kind : 'closed';
      job.reject(new ZtunnelError(kind, `ztunnel did not ack the ${job.what}: ${(err as Error).message}`));
      throw err;
    }
    if (nack === null) job.resolve();
    else job.reject(new ZtunnelError('nack', `ztunnel refused the ${job.what}: ${nack}`));
  }

  /** One request and its ack; the ack's error (a nack) or null. Anything else drops the connection. */
  async #exchange(req: WorkloadRequest, data: Buffer, fds: readonly number[]): Promise<string | null> {
    const what = describe(req);
    let timer: NodeJS.Timeout | undefined;
    const sent = await Promise.race([
      this.#conn.send(data, fds).then(
        () => 'sent' as const,
        (err: Error) => err,
      ),
      new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), this.#t.writeTimeoutMs))),
    ]);
    clearTimeout(timer);
    if (sent === 'timeout')
      this.#fail(`writing the ${what} to ztunnel took over ${this.#t.writeTimeoutMs} ms`, 'timeout');
    if (sent !== 'sent') this.#fail(`writing the ${what} to ztunnel: ${sent.message}`);
    const answer = await this.#recv(this.#t.ackTimeoutMs, `the ack of the ${what}`);
    if (answer === null) this.#fail(`ztunnel did not ack the ${what} within ${this.#t.ackTimeoutMs} ms`, 'timeout');
    let resp;
    try {
      resp = decodeWorkloadResponse(answer);
    } catch (err) {
      return this.#fail(`ztunnel protocol error: ${(err as Error).message}`);
    }
    if (resp.ack === null) this.#fail(`ztunnel protocol error: its answer to the ${what} holds no Ack`);
    return resp.ack.error === '' ? null : resp.ack.error;
  }
}

function closeFds(fds: readonly number[]): void {
  for (const fd of fds) {
    try {
      closeSync(fd);
    } catch {
      // Already gone: nothing to release.
    }
  }
}

/** The ZDS server: listens at `path` until close(). */
export class ZtunnelServer extends EventEmitter<ZdsServerEvents> {
  readonly path: string;
  readonly #listener: SeqpacketServer;
  readonly #snapshot: ZtunnelServerOptions['snapshot'];
  readonly #t: ZdsTimings;
  readonly #bucket: TokenBucket;
  readonly #abort = new AbortController();
  /** Counted connections, oldest first: the last one gets the adds. */
  readonly #conns: Connection[] = [];
  readonly #all = new Set<Connection>();
  readonly #running: Promise<void>;
  #nextId = 1;

  constructor(opts: ZtunnelServerOptions) {
    super();
    this.path = opts.path;
    this.#snapshot = opts.snapshot;
    this.#t = { ...DEFAULT_ZDS_TIMINGS, ...opts.timings };
    this.#bucket = new TokenBucket(this.#t.acceptsPerSecond, 1, opts.clock ?? realClock);
    this.#listener = listenSeqpacket(opts.path);
    this.#running = this.#acceptLoop();
  }

  /** Connections that said Hello and are open. */
  get connections(): number {
    return this.#conns.length;
  }

  /**
   * Hands ztunnel a new pod: AddWorkload and its netns fd, to the newest connection, and waits for
   * the ack. Rejects with a ZtunnelError naming ztunnel when no ztunnel is connected, on a nack,
   * a timeout or a lost connection: the pod is not proxied. The fd stays the caller's; it must
   * stay open until this settles.
   */
  podAdded(uid: string, info: WorkloadInfo, netnsFd: number): Promise<void> {
    const conn = this.#conns.at(-1);
    if (conn === undefined) {
      return Promise.reject(
        new ZtunnelError(
          'no_connection',
          `no ztunnel connection on ${this.path}: pod ${uid} cannot be handed to ztunnel; ` +
            'is ztunnel running on this node?',
        ),
      );
    }
    try {
      return conn.request({ kind: 'add', uid, info }, [netnsFd]);
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  /** Tells every connected ztunnel to drop the pod; rejects naming the ones that did not ack. */
  async podDeleted(uid: string): Promise<void> {
    const req: WorkloadRequest = { kind: 'del', uid };
    const results = await Promise.allSettled(this.#conns.map((c) => c.request(req, [])));
    const failed = results.flatMap((r) => (r.status === 'rejected' ? [(r.reason as Error).message] : []));
    if (failed.length > 0) {
      const nack = results.some((r) => r.status === 'rejected' && (r.reason as ZtunnelError).reason === 'nack');
      throw new ZtunnelError(nack ? 'nack' : 'closed', failed.join('; '));
    }
  }

  /** Stops accepting and closes every connection; their queued requests fail. */
  async close(): Promise<void> {
    this.#abort.abort(new Error('ZDS server closed'));
    try {
      this.#listener.close();
    } finally {
      // Whatever the socket file's fate, no ztunnel stays connected to a closed server.
      for (const c of [...this.#all]) c.drop('the ZDS server was closed');
      await this.#running;
    }
  }

  /** @internal */
  readSnapshot(): Promise<readonly SnapshotPod[]> {
    return Promise.resolve().then(() => this.#snapshot());
  }

  /** @internal */
  connectionUp(c: Connection): void {
    this.#conns.push(c);
    ztunnelConnections.inc();
    log.info('ztunnel connected', { conn: c.id, connections: this.#conns.length });
    this.emit('connected', c.id);
  }

  /** @internal */
  connectionDown(c: Connection, reason: string): void {
    const i = this.#conns.indexOf(c);
    if (i >= 0) {
      this.#conns.splice(i, 1);
      ztunnelConnections.dec();
    }
    log.warn('ztunnel disconnected', { conn: c.id, reason, connections: this.#conns.length });
    this.emit('disconnected', c.id, reason);
  }

  async #acceptLoop(): Promise<void> {
    const signal = this.#abort.signal;
    // close() ends the loop whether or not a pending accept() settles when the listener closes.
    const closed = new Promise<null>((resolve) => signal.addEventListener('abort', () => resolve(null)));
    for (;;) {
      try {
        await this.#bucket.take(signal);
      } catch {
        return;
      }
      let sc: SeqpacketConn | null;
      try {
        sc = await Promise.race([this.#listener.accept(), closed]);
      } catch (err) {
        if (signal.aborted) return;
        // One failed accept (EMFILE, ENFILE, ENOMEM: the node short of something for a moment)
        // must not end the server: ztunnel could then never connect until the agent restarts,
        // and every ambient pod would fail its ADD. Tried again at the accept rate, as Istio does.
        log.error('the ZDS server cannot accept a ztunnel connection; trying again', {
          path: this.path,
          error: (err as Error).message,
        });
        continue;
      }
      if (sc === null) return;
      if (signal.aborted) {
        sc.close();
        return;
      }
      const c = new Connection(this.#nextId++, sc, this, this.#t);
      this.#all.add(c);
      void c.run().finally(() => this.#all.delete(c));
    }
  }
}

// A fake ztunnel for the ZDS server's tests: it speaks ztunnel's side of ZDS over the same
// seqpacket module, as ztunnel's src/inpod does (protocol.rs, statemanager.rs, workloadmanager.rs):
// - it connects with backoff (from 10 ms, doubling, capped: ztunnel caps at 15 s), sends
//   ZdsHello, then answers every request with an Ack; it never speaks unasked;
// - Add without an fd, anything else with one, Add without workload_info, Keep after
//   SnapshotSent and a second SnapshotSent are protocol errors: a nack, then the connection
//   closed and made anew, as ztunnel does;
// - every fd it receives is closed once its netns inode is read (fstat), whatever happens.
// Knobs: nack a UID, delay the acks, drop the connection, the Hello's version. Start two for a
// ztunnel rolling update.

import { closeSync, fstatSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectSeqpacket, type SeqpacketConn } from '../../src/ambient/seqpacket.ts';
import {
  ZDS_VERSION_V1,
  decodeWorkloadRequest,
  encodeWorkloadResponse,
  encodeZdsHello,
  type WorkloadInfo,
} from '../../src/ambient/zds.ts';

/** What the fake got, in order; `conn` counts its connections from 1. */
export type FakeRecord =
  | {
      readonly kind: 'add';
      readonly conn: number;
      readonly uid: string;
      readonly info: WorkloadInfo | null;
      readonly netnsIno: bigint;
      readonly acked: boolean;
    }
  | { readonly kind: 'keep'; readonly conn: number; readonly uid: string; readonly acked: boolean }
  | { readonly kind: 'del'; readonly conn: number; readonly uid: string; readonly acked: boolean }
  | { readonly kind: 'snapshot_sent'; readonly conn: number; readonly acked: boolean }
  /** A message ztunnel refuses as a protocol error (nacked, then the connection closed). */
  | { readonly kind: 'protocol_error'; readonly conn: number; readonly error: string }
  | { readonly kind: 'connected'; readonly conn: number }
  | { readonly kind: 'disconnected'; readonly conn: number };

export interface FakeZtunnelOptions {
  readonly path: string;
  /** The Hello's version; default V1. */
  readonly version?: number;
  /** Reconnect after a drop or a protocol error; default true. */
  readonly reconnect?: boolean;
  /** Backoff cap in ms (ztunnel's is 15 s); default 100. */
  readonly maxBackoffMs?: number;
  /**
   * Ztunnel's proxies (test/helpers/ztunnel-listeners.ts): `add` gets each Add's netns fd while
   * the fake still holds it (it may hand it to a child; the fake closes it after) and `del` each
   * Del's UID, both before the ack, as ztunnel acks once the proxy started or stopped. A failing
   * `add` is nacked with its message (a proxy start failure), the connection kept.
   */
  readonly workloads?: FakeWorkloads;
  /**
   * Check before each ack that no next request came early (the agent must wait for the ack);
   * default true. It costs a timer tick (~1.5 ms) a message: a benchmark turns it off.
   */
  readonly checkOneInFlight?: boolean;
}

/** What starts and stops ztunnel's proxies of a workload (see FakeZtunnelOptions.workloads). */
export interface FakeWorkloads {
  add(uid: string, netnsFd: number): Promise<void>;
  del(uid: string): Promise<void>;
}

export class FakeZtunnel {
  readonly records: FakeRecord[] = [];
  /** Messages answered with this error (a proxy start failure: nacked, the connection kept). */
  readonly nackUids = new Map<string, string>();
  /** Each ack waits this long first. */
  ackDelayMs = 0;
  /** Open fds received and not yet closed: always 0 between messages. */
  openFds = 0;
  readonly #o: Required<Omit<FakeZtunnelOptions, 'workloads'>>;
  readonly #workloads: FakeWorkloads | undefined;
  #conn: SeqpacketConn | null = null;
  /** Ends the current connection's ack delay (drop, stop). */
  #connAbort: AbortController | null = null;
  #conns = 0;
  #stopped = false;
  readonly #waiters: { pred: (r: FakeRecord) => boolean; resolve: (r: FakeRecord) => void }[] = [];
  readonly #running: Promise<void>;

  constructor(opts: FakeZtunnelOptions) {
    const { workloads, ...rest } = opts;
    this.#o = { version: ZDS_VERSION_V1, reconnect: true, maxBackoffMs: 100, checkOneInFlight: true, ...rest };
    this.#workloads = workloads;
    this.#running = this.#run();
  }

  /** Connections made so far. */
  get connections(): number {
    return this.#conns;
  }

  /** The records of one kind, of one connection if given. */
  of<K extends FakeRecord['kind']>(kind: K, conn?: number): Extract<FakeRecord, { kind: K }>[] {
    return this.records.filter(
      (r): r is Extract<FakeRecord, { kind: K }> => r.kind === kind && (conn === undefined || r.conn === conn),
    );
  }

  /** The first record, past or to come, that `pred` matches. */
  waitFor(pred: (r: FakeRecord) => boolean): Promise<FakeRecord> {
    const seen = this.records.find(pred);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve) => this.#waiters.push({ pred, resolve }));
  }

  /** The record the `n`th record of `kind` (from 1) will be. */
  waitForNth<K extends FakeRecord['kind']>(kind: K, n: number): Promise<Extract<FakeRecord, { kind: K }>> {
    let seen = 0;
    return this.waitFor((r) => r.kind === kind && ++seen === n) as Promise<Extract<FakeRecord, { kind: K }>>;
  }

  /** Closes the current connection as a crashed ztunnel would; it reconnects if `reconnect`. */
  drop(): void {
    this.#connAbort?.abort();
    this.#conn?.close();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#connAbort?.abort();
    this.#conn?.close();
    await this.#running;
  }

  #record(r: FakeRecord): void {
    this.records.push(r);
    for (let i = 0; i < this.#waiters.length; i++) {
      const w = this.#waiters[i]!;
      if (w.pred(r)) {
        this.#waiters.splice(i--, 1);
        w.resolve(r);
      }
    }
  }

  async #run(): Promise<void> {
    let backoff = 10;
    while (!this.#stopped) {
      let conn: SeqpacketConn;
      try {
        conn = await connectSeqpacket(this.#o.path);
      } catch {
        await sleep(backoff);
        backoff = Math.min(this.#o.maxBackoffMs, backoff * 2);
        continue;
      }
      backoff = 10;
      const id = ++this.#conns;
      this.#conn = conn;
      this.#connAbort = new AbortController();
      if (this.#stopped) conn.close();
      this.#record({ kind: 'connected', conn: id });
      await this.#serve(conn, id).catch(() => {});
      conn.close();
      this.#conn = null;
      this.#record({ kind: 'disconnected', conn: id });
      if (!this.#o.reconnect) return;
    }
  }

  /** One connection: Hello, then request -> ack until the agent or a knob ends it. */
  async #serve(conn: SeqpacketConn, id: number): Promise<void> {
    await conn.send(encodeZdsHello({ version: this.#o.version }));
    let snapshotSent = false;
    for (;;) {
      const msg = await conn.recv(60_000);
      if (msg === null) continue;
      this.openFds += msg.fds.length;
      // First the fds, so nothing below can leak one (ztunnel's maybe_get_fd does the same).
      let netnsIno: bigint | null = null;
      let proxyError: string | undefined;
      try {
        if (msg.fds.length === 1) {
          netnsIno = fstatSync(msg.fds[0]!, { bigint: true }).ino;
          const add = this.#workloads ? decodedAdd(msg.data) : null;
          if (add) await this.#workloads!.add(add, msg.fds[0]!).catch((e: Error) => (proxyError = e.message));
        }
      } finally {
        for (const fd of msg.fds) closeSync(fd);
        this.openFds -= msg.fds.length;
      }
      const protocolError = async (error: string) => {
        this.#record({ kind: 'protocol_error', conn: id, error });
        await conn.send(encodeWorkloadResponse({ ack: { error } }));
        throw new Error(error);
      };
      if (msg.fds.length > 1) return protocolError(`Expected 1 FD, got ${msg.fds.length}`);
      let req;
      try {
        req = decodeWorkloadRequest(msg.data);
      } catch (err) {
        return protocolError(`failure to read message: ${(err as Error).message}`);
      }
      if (req.kind === 'add' && netnsIno === null) return protocolError('No control message');
      if (req.kind !== 'add' && netnsIno !== null) return protocolError('Unexpected control message');
      if (req.kind === 'add' && req.info === null) return protocolError('workload_info is required but not present');
      if (req.kind === 'keep' && snapshotSent) return protocolError('pod keep received after snapshot');
      if (req.kind === 'snapshot_sent') {
        if (snapshotSent) return protocolError('pod snapshot received already');
        snapshotSent = true;
      }
      if (req.kind === 'del') await this.#workloads?.del(req.uid);
      const nack = req.kind === 'snapshot_sent' ? undefined : (this.nackUids.get(req.uid) ?? proxyError);
      const acked = nack === undefined;
      if (req.kind === 'add') this.#record({ ...req, conn: id, netnsIno: netnsIno!, acked });
      else if (req.kind === 'snapshot_sent') this.#record({ kind: 'snapshot_sent', conn: id, acked });
      else if (req.kind === 'keep') this.#record({ kind: 'keep', conn: id, uid: req.uid, acked });
      else this.#record({ kind: 'del', conn: id, uid: req.uid, acked });
      if (this.ackDelayMs > 0) await sleep(this.ackDelayMs, undefined, { signal: this.#connAbort?.signal });
      // The agent must wait for this ack before its next request (acks correlate by order alone).
      const early = this.#o.checkOneInFlight ? await conn.recv(0) : null;
      if (early !== null) {
        for (const fd of early.fds) closeSync(fd);
        return protocolError('a request came before the ack of the previous one');
      }
      await conn.send(encodeWorkloadResponse({ ack: { error: nack ?? '' } }));
    }
  }
}

/** The UID of an Add request with workload info, else null (the checks below judge the rest). */
function decodedAdd(data: Buffer): string | null {
  try {
    const req = decodeWorkloadRequest(data);
    return req.kind === 'add' && req.info !== null ? req.uid : null;
  } catch {
    return null;
  }
}

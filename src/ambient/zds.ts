// The ZDS messages (the node agent <-> ztunnel protocol), encoded and decoded by hand.
// The schema is the mesh's zds.proto (proto3, package istio.workload.zds): this is its wire
// format, field numbers and all, so a ztunnel built from its own source reads what we write.
// Hand-rolled because the schema is eleven small messages of strings: a protobuf library and a
// code generator would be the biggest part of ambient mode's code. Each message travels alone in
// one SOCK_SEQPACKET datagram, with no length prefix (the datagram is the frame).
//
// Field numbers (zds.proto):
//   WorkloadRequest  oneof payload { add = 1; del = 2; snapshot_sent = 3; keep = 5 }  (4 unused)
//   AddWorkload      uid = 1; workload_info = 2
//   WorkloadInfo     name = 1; namespace = 2; service_account = 3  (4 reserved, was trust_domain)
//   KeepWorkload     uid = 1
//   DelWorkload      uid = 2  (not 1)
//   SnapshotSent     (empty)
//   ZdsHello         version = 1 (enum Version { NOT_USED = 0; V1 = 1 })
//   WorkloadResponse oneof payload { ack = 1 }
//   Ack              error = 1 (empty: success)
//
// Encoding follows proto3's canonical form, as prost and Go's protobuf write it: a string field
// holding "" is left out; a message field (workload_info, a oneof member) is written when set,
// even when empty. Decoding follows the protobuf rules: unknown fields of every wire type are
// skipped, a repeated scalar field keeps its last value, a repeated message field is merged, and
// of several oneof members the last one wins. Anything malformed is refused with ZdsDecodeError.

/** WorkloadInfo: who the pod is, for ztunnel's logs and certificates. */
export interface WorkloadInfo {
  readonly name: string;
  readonly namespace: string;
  readonly serviceAccount: string;
}

/** What the agent sends (WorkloadRequest's oneof payload). */
export type WorkloadRequest =
  /** AddWorkload: a pod to proxy; the datagram carries its netns fd. info null: not sent. */
  | { readonly kind: 'add'; readonly uid: string; readonly info: WorkloadInfo | null }
  /** KeepWorkload: a pod whose netns the agent cannot hand over; only before snapshot_sent. */
  | { readonly kind: 'keep'; readonly uid: string }
  /** DelWorkload: stop proxying the pod. */
  | { readonly kind: 'del'; readonly uid: string }
  /** SnapshotSent: every pod was named; ztunnel drops the ones that were not. */
  | { readonly kind: 'snapshot_sent' };

/** ZdsHello: ztunnel's first message. */
export interface ZdsHello {
  /** The Version enum's number (proto3 enums are open: any int32 may arrive). */
  readonly version: number;
}

/** WorkloadResponse: ztunnel's answer to each request. */
export interface WorkloadResponse {
  /** null: the response had no payload (an empty datagram, or only fields we do not know). */
  readonly ack: { readonly error: string } | null;
}

/** The protocol versions (enum Version). */
export const ZDS_VERSION_NOT_USED = 0;
export const ZDS_VERSION_V1 = 1;

/** A datagram that is not the message it should be: what, and at which byte. */
export class ZdsDecodeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ZdsDecodeError';
  }
}

// ---- wire types --------------------------------------------------------------------------------

const VARINT = 0;
const I64 = 1;
const LEN = 2;
const SGROUP = 3;
const EGROUP = 4;
const I32 = 5;
const WIRE_NAMES = ['varint', 'fixed64', 'length-delimited', 'start-group', 'end-group', 'fixed32'];

/** tag = field number << 3 | wire type, as a varint (field numbers here are all < 16: one byte). */
function tag(field: number, wireType: number): number {
  return (field << 3) | wireType;
}

// ---- encoding ----------------------------------------------------------------------------------

function varint(n: number): number[] {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

/** A length-delimited field: tag, length, bytes. */
function lenField(field: number, body: Buffer): Buffer {
  return Buffer.concat([Buffer.from([tag(field, LEN), ...varint(body.length)]), body]);
}

/** A string field; "" is proto3's default and is not written. */
function stringField(field: number, value: string, what: string): Buffer {
  if (value === '') return Buffer.alloc(0);
  // A lone UTF-16 surrogate has no UTF-8 form: Buffer.from would write U+FFFD in its place and
  // ztunnel would proxy a pod under a UID we never sent.
  if (!value.isWellFormed()) throw new TypeError(`ZDS ${what} is not well-formed Unicode (a lone surrogate)`);
  return lenField(field, Buffer.from(value, 'utf8'));
}

function encodeWorkloadInfo(info: WorkloadInfo): Buffer {
  return Buffer.concat([
    stringField(1, info.name, 'WorkloadInfo.name'),
    stringField(2, info.namespace, 'WorkloadInfo.namespace'),
    stringField(3, info.serviceAccount, 'WorkloadInfo.service_account'),
  ]);
}

/** The bytes of a WorkloadRequest, as one datagram carries them. */
export function encodeWorkloadRequest(req: WorkloadRequest): Buffer {
  switch (req.kind) {
    case 'add': {
      const parts = [stringField(1, req.uid, 'AddWorkload.uid')];
      if (req.info !== null) parts.push(lenField(2, encodeWorkloadInfo(req.info)));
      return lenField(1, Buffer.concat(parts));
    }
    case 'del':
      return lenField(2, stringField(2, req.uid, 'DelWorkload.uid'));
    case 'snapshot_sent':
      return lenField(3, Buffer.alloc(0));
    case 'keep':
      return lenField(5, stringField(1, req.uid, 'KeepWorkload.uid'));
  }
}

/** ztunnel's side (the fake ztunnel of the tests): a ZdsHello. Version 0 is proto3's default: no bytes. */
export function encodeZdsHello(hello: ZdsHello): Buffer {
  if (!Number.isInteger(hello.version) || hello.version < 0 || hello.version > 0x7fffffff) {
    throw new TypeError(`ZDS hello version ${hello.version} is not a non-negative int32`);
  }
  return hello.version === 0 ? Buffer.alloc(0) : Buffer.from([tag(1, VARINT), ...varint(hello.version)]);
}

/** ztunnel's side (the fake ztunnel of the tests): a WorkloadResponse. */
export function encodeWorkloadResponse(resp: WorkloadResponse): Buffer {
  if (resp.ack === null) return Buffer.alloc(0);
  return lenField(1, stringField(1, resp.ack.error, 'Ack.error'));
}

// ---- decoding ----------------------------------------------------------------------------------

/** One field as read off the wire; unknown fields never reach a message's decoder. */
interface Field {
  readonly field: number;
  readonly wireType: number;
  /** Where the field's tag starts in the reader's buffer. */
  readonly at: number;
  /** varint: the number; length-delimited: the bytes; fixed32/fixed64: null (never a field of ours). */
  readonly value: bigint | Buffer | null;
  /** length-delimited: where the bytes start in the reader's buffer. */
  readonly start: number;
}

// Group nesting a skipped field may have; protobuf implementations stop at 100 levels too.
const MAX_GROUP_DEPTH = 100;
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

class Reader {
  pos = 0;
  readonly #buf: Buffer;
  readonly #what: string;
  /** The offset of #buf in the datagram, so errors name the datagram's byte. */
  readonly #base: number;

  constructor(buf: Buffer, what: string, base: number) {
    this.#buf = buf;
    this.#what = what;
    this.#base = base;
  }

  get done(): boolean {
    return this.pos >= this.#buf.length;
  }

  fail(msg: string, at: number = this.pos): never {
    throw new ZdsDecodeError(`cannot decode ZDS ${this.#what}: ${msg} at byte ${this.#base + at}`);
  }

  /** A varint of at most 10 bytes (64 bits); the 10th byte may only hold the 64th bit. */
  varint(): bigint {
    const start = this.pos;
    let value = 0n;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.#buf.length) this.fail('truncated varint (the datagram ends inside it)', start);
      const b = this.#buf[this.pos++]!;
      if (i === 9 && b > 1) this.fail('varint longer than 64 bits', start);
      value |= BigInt(b & 0x7f) << BigInt(7 * i);
      if ((b & 0x80) === 0) return value;
    }
    return this.fail('varint longer than 10 bytes', start);
  }

  skip(n: number, what: string): void {
    const left = this.#buf.length - this.pos;
    if (n > left) this.fail(`${what} runs past the end (${n} bytes, ${left} left)`);
    this.pos += n;
  }

  bytes(field: number): Buffer {
    const at = this.pos;
    const n = this.varint();
    const left = this.#buf.length - this.pos;
    if (n > BigInt(left)) this.fail(`field ${field}'s length ${n} runs past the end (${left} bytes left)`, at);
    const out = this.#buf.subarray(this.pos, this.pos + Number(n));
    this.pos += Number(n);
    return out;
  }

  /** The next field, with unknown-to-everyone wire types refused and groups skipped whole. */
  next(): Field | null {
    for (;;) {
      if (this.done) return null;
      const at = this.pos;
      const t = this.varint();
      const wireType = Number(t & 7n);
      if (t >> 3n > 0x1fffffffn) this.fail(`field number ${t >> 3n} is out of range`, at);
      const field = Number(t >> 3n);
      if (field === 0) this.fail('field number 0 is not allowed', at);
      switch (wireType) {
        case VARINT:
          return { field, wireType, value: this.varint(), at, start: at };
        case LEN: {
          const value = this.bytes(field);
          return { field, wireType, value, at, start: this.pos - value.length };
        }
        case I64:
          this.skip(8, `field ${field} (fixed64)`);
          return { field, wireType, value: null, at, start: at };
        case I32:
          this.skip(4, `field ${field} (fixed32)`);
          return { field, wireType, value: null, at, start: at };
        case SGROUP:
          // Groups are proto2's; no field of ours is one, so a group is always unknown: skipped.
          this.#skipGroup(field, 1);
          continue;
        case EGROUP:
          return this.fail(`end-group for field ${field} without its start-group`, at);
        default:
          return this.fail(`wire type ${wireType} (field ${field}) does not exist`, at);
      }
    }
  }

  #skipGroup(group: number, depth: number): void {
    if (depth > MAX_GROUP_DEPTH) this.fail(`groups nested deeper than ${MAX_GROUP_DEPTH}`);
    for (;;) {
      if (this.done) this.fail(`group ${group} has no end-group`);
      const at = this.pos;
      const t = this.varint();
      const wireType = Number(t & 7n);
      const field = Number(t >> 3n);
      if (field === 0) this.fail('field number 0 is not allowed', at);
      if (wireType === EGROUP) {
        if (field !== group) this.fail(`end-group for field ${field} inside group ${group}`, at);
        return;
      }
      if (wireType === VARINT) this.varint();
      else if (wireType === LEN) this.bytes(field);
      else if (wireType === I64) this.skip(8, `field ${field} (fixed64)`);
      else if (wireType === I32) this.skip(4, `field ${field} (fixed32)`);
      else if (wireType === SGROUP) this.#skipGroup(field, depth + 1);
      else this.fail(`wire type ${wireType} (field ${field}) does not exist`, at);
    }
  }

  /** A known field must come with the wire type its declared type has. */
  expect(f: Field, wireType: number, name: string): void {
    if (f.wireType !== wireType) {
      this.fail(
        `field ${f.field} (${name}) has wire type ${f.wireType} (${WIRE_NAMES[f.wireType]}), ` +
          `expected ${wireType} (${WIRE_NAMES[wireType]})`,
        f.at,
      );
    }
  }

  string(f: Field, name: string): string {
    this.expect(f, LEN, name);
    try {
      return UTF8.decode(f.value as Buffer);
    } catch {
      return this.fail(`field ${f.field} (${name}) is not valid UTF-8`, f.at);
    }
  }

  /** A nested message: a reader over the field's bytes, errors naming the datagram's bytes. */
  sub(f: Field, name: string, what: string): Reader {
    this.expect(f, LEN, name);
    return new Reader(f.value as Buffer, what, this.#base + f.start);
  }
}

interface MutableInfo {
  name: string;
  namespace: string;
  serviceAccount: string;
}

function decodeWorkloadInfoInto(r: Reader, into: MutableInfo): void {
  for (let f = r.next(); f !== null; f = r.next()) {
    if (f.field === 1) into.name = r.string(f, 'name');
    else if (f.field === 2) into.namespace = r.string(f, 'namespace');
    else if (f.field === 3) into.serviceAccount = r.string(f, 'service_account');
  }
}

/** A uid-only message (KeepWorkload uid = 1, DelWorkload uid = 2), merged into `uid`. */
function decodeUidInto(r: Reader, uidField: number, uid: string): string {
  for (let f = r.next(); f !== null; f = r.next()) {
    if (f.field === uidField) uid = r.string(f, 'uid');
  }
  return uid;
}

/** ztunnel's side (the fake ztunnel of the tests): a WorkloadRequest. No payload is refused, as ztunnel does. */
export function decodeWorkloadRequest(data: Buffer): WorkloadRequest {
  const r = new Reader(data, 'WorkloadRequest', 0);
  // The oneof: the last member on the wire wins; the same member twice is merged.
  let req = null as WorkloadRequest | null;
  for (let f = r.next(); f !== null; f = r.next()) {
    switch (f.field) {
      case 1: {
        const prev: Extract<WorkloadRequest, { kind: 'add' }> | null = req?.kind === 'add' ? req : null;
        let uid: string = prev?.uid ?? '';
        let info: MutableInfo | null = prev?.info ? { ...prev.info } : null;
        const sub = r.sub(f, 'add', 'AddWorkload');
        for (let g = sub.next(); g !== null; g = sub.next()) {
          if (g.field === 1) uid = sub.string(g, 'uid');
          else if (g.field === 2) {
            info ??= { name: '', namespace: '', serviceAccount: '' };
            decodeWorkloadInfoInto(sub.sub(g, 'workload_info', 'WorkloadInfo'), info);
          }
        }
        req = { kind: 'add', uid, info };
        break;
      }
      case 2: {
        const uid = decodeUidInto(r.sub(f, 'del', 'DelWorkload'), 2, req?.kind === 'del' ? req.uid : '');
        req = { kind: 'del', uid };
        break;
      }
      case 3:
        // SnapshotSent has no fields: whatever it holds is unknown and skipped.
        for (const sub = r.sub(f, 'snapshot_sent', 'SnapshotSent'); sub.next() !== null;);
        req = { kind: 'snapshot_sent' };
        break;
      case 5: {
        const uid = decodeUidInto(r.sub(f, 'keep', 'KeepWorkload'), 1, req?.kind === 'keep' ? req.uid : '');
        req = { kind: 'keep', uid };
        break;
      }
    }
  }
  if (req === null) return r.fail('no payload (none of add, del, snapshot_sent, keep)', 0);
  return req;
}

/** A ZdsHello. The version is returned as sent (NOT_USED, V1, or a number from the future): the caller judges it. */
export function decodeZdsHello(data: Buffer): ZdsHello {
  const r = new Reader(data, 'ZdsHello', 0);
  let version = ZDS_VERSION_NOT_USED;
  for (let f = r.next(); f !== null; f = r.next()) {
    if (f.field === 1) {
      r.expect(f, VARINT, 'version');
      // An enum is an int32 written as a varint (a negative one sign-extended to 64 bits).
      version = Number(BigInt.asIntN(32, f.value as bigint));
    }
  }
  return { version };
}

/** A WorkloadResponse. */
export function decodeWorkloadResponse(data: Buffer): WorkloadResponse {
  const r = new Reader(data, 'WorkloadResponse', 0);
  let ack: { error: string } | null = null;
  for (let f = r.next(); f !== null; f = r.next()) {
    if (f.field === 1) {
      const sub = r.sub(f, 'ack', 'Ack');
      ack ??= { error: '' };
      for (let g = sub.next(); g !== null; g = sub.next()) {
        if (g.field === 1) ack.error = sub.string(g, 'error');
      }
    }
  }
  return { ack };
}

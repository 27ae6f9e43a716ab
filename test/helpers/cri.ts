// A CRI client for tests and benchmarks: it drives a container runtime's CRI socket over gRPC as
// kubelet does (runtime.v1.RuntimeService), for the few calls a pod sandbox's life needs.
//
// Written over node:http2 with a hand-written protobuf encoder/decoder for just the messages in
// cri.proto (which documents their field numbers), rather than @grpc/grpc-js + @grpc/proto-loader:
// proto-loader depends on protobufjs, whose package runs a postinstall script (7.6.6 today), and
// this project approves install scripts for node and esbuild only (.npmrc strict-allow-scripts).

import http2 from 'node:http2';
import net from 'node:net';

// ---- protobuf, the subset we need: varints, length-delimited fields, nested messages, maps ----

type Part = Buffer;

function varint(n: number | bigint): Buffer {
  let v = BigInt(n);
  if (v < 0n) v = BigInt.asUintN(64, v);
  const out: number[] = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) b |= 0x80;
    out.push(b);
  } while (v !== 0n);
  return Buffer.from(out);
}

const tag = (field: number, wire: number) => varint((field << 3) | wire);

/** A length-delimited field (string, bytes or nested message); proto3 leaves empty ones out. */
function bytesField(field: number, value: Buffer): Part {
  return Buffer.concat([tag(field, 2), varint(value.length), value]);
}

export function str(field: number, value: string | undefined): Part {
  return value ? bytesField(field, Buffer.from(value, 'utf8')) : Buffer.alloc(0);
}

export function uint(field: number, value: number | boolean | undefined): Part {
  const n = typeof value === 'boolean' ? Number(value) : (value ?? 0);
  return n ? Buffer.concat([tag(field, 0), varint(n)]) : Buffer.alloc(0);
}

export function msg(field: number, ...parts: Part[]): Part {
  return bytesField(field, Buffer.concat(parts));
}

/** map<string, string>: one entry message (key = 1, value = 2) per pair. */
export function map(field: number, record: Record<string, string> | undefined): Part {
  const entry = ([k, v]: [string, string]) => bytesField(field, Buffer.concat([str(1, k), str(2, v)]));
  const entries = Object.entries(record ?? {}).map(entry);
  return Buffer.concat(entries);
}

/** A decoded message: field number -> its values in order (varints as bigint, the rest as bytes). */
export type Decoded = Map<number, (bigint | Buffer)[]>;

export function decode(buf: Buffer): Decoded {
  const out: Decoded = new Map();
  let i = 0;
  const readVarint = (): bigint => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      if (i >= buf.length) throw new Error('protobuf: truncated varint');
      const b = buf[i++]!;
      v |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return v;
      shift += 7n;
      if (shift > 63n) throw new Error('protobuf: varint longer than 10 bytes');
    }
  };
  while (i < buf.length) {
    const key = readVarint();
    const field = Number(key >> 3n);
    const wire = Number(key & 7n);
    let value: bigint | Buffer;
    if (wire === 0) value = readVarint();
    else if (wire === 2) {
      const len = Number(readVarint());
      if (i + len > buf.length) throw new Error(`protobuf: field ${field} runs past the message end`);
      value = buf.subarray(i, i + len);
      i += len;
    } else if (wire === 1 || wire === 5) {
      const len = wire === 1 ? 8 : 4;
      value = buf.subarray(i, i + len);
      i += len;
    } else throw new Error(`protobuf: field ${field} has wire type ${wire}, which this decoder does not read`);
    (out.get(field) ?? out.set(field, []).get(field)!).push(value);
  }
  return out;
}

const bytesOf = (d: Decoded, field: number): Buffer | undefined => {
  const v = d.get(field)?.at(-1);
  return Buffer.isBuffer(v) ? v : undefined;
};
export const getString = (d: Decoded, field: number): string => bytesOf(d, field)?.toString('utf8') ?? '';
export const getUint = (d: Decoded, field: number): number => {
  const v = d.get(field)?.at(-1);
  return typeof v === 'bigint' ? Number(v) : 0;
};
export const getMessage = (d: Decoded, field: number): Decoded | undefined => {
  const b = bytesOf(d, field);
  return b === undefined ? undefined : decode(b);
};
export const getMessages = (d: Decoded, field: number): Decoded[] =>
  (d.get(field) ?? []).filter((v): v is Buffer => Buffer.isBuffer(v)).map(decode);

// ---- gRPC over HTTP/2 on a unix socket ----

export class GrpcError extends Error {
  readonly code: number;
  constructor(method: string, code: number, message: string) {
    super(`${method}: gRPC status ${code}: ${message}`);
    this.code = code;
  }
}

export class GrpcUnixClient {
  readonly #session: http2.ClientHttp2Session;
  readonly #socketPath: string;

  constructor(socketPath: string) {
    this.#socketPath = socketPath;
    this.#session = http2.connect('http://localhost', { createConnection: () => net.connect(socketPath) });
    // A refused or broken connection fails the calls in flight; nothing else to do with it here.
    this.#session.on('error', () => {});
  }

  /** One unary call: `path` is /package.Service/Method. */
  call(path: string, request: Buffer, timeoutMs = 60_000): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const frame = Buffer.alloc(5 + request.length);
      frame.writeUInt8(0, 0); // not compressed
      frame.writeUInt32BE(request.length, 1);
      request.copy(frame, 5);
      const req = this.#session.request({
        ':method': 'POST',
        ':path': path,
        'content-type': 'application/grpc',
        te: 'trailers',
        'grpc-timeout': `${Math.max(1, Math.ceil(timeoutMs))}m`,
      });
      const chunks: Buffer[] = [];
      let status: string | undefined;
      let message = '';
      const takeStatus = (h: http2.IncomingHttpHeaders) => {
        if (h['grpc-status'] !== undefined) {
          status = String(h['grpc-status']);
          message = decodeURIComponent(String(h['grpc-message'] ?? ''));
        }
      };
      req.setTimeout(timeoutMs + 5_000, () => req.close(http2.constants.NGHTTP2_CANCEL));
      req.on('response', takeStatus);
      req.on('trailers', takeStatus);
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('error', (e) => reject(new Error(`${path} over ${this.#socketPath}: ${e.message}`)));
      req.on('close', () => {
        if (status === undefined) {
          return reject(new Error(`${path} over ${this.#socketPath}: the stream closed without a gRPC status`));
        }
        if (status !== '0') return reject(new GrpcError(path, Number(status), message));
        const body = Buffer.concat(chunks);
        if (body.length < 5) return resolve(Buffer.alloc(0));
        if (body[0] !== 0) return reject(new Error(`${path}: a compressed reply, which this client never asked for`));
        resolve(body.subarray(5, 5 + body.readUInt32BE(1)));
      });
      req.end(frame);
    });
  }

  close(): void {
    this.#session.close();
  }
}

// ---- the CRI calls ----

const RUNTIME = '/runtime.v1.RuntimeService';
const IMAGES = '/runtime.v1.ImageService';

export interface SandboxSpec {
  readonly name: string;
  readonly namespace: string;
  readonly uid: string;
  readonly attempt?: number;
  readonly hostname?: string;
  readonly labels?: Record<string, string>;
  readonly annotations?: Record<string, string>;
  /** cgroupfs syntax, e.g. /mcni-cri-123/podUID */
  readonly cgroupParent?: string;
  readonly logDirectory?: string;
}

export interface SandboxStatus {
  readonly id: string;
  readonly ready: boolean;
  readonly ip: string;
  readonly name: string;
  readonly namespace: string;
  readonly uid: string;
}

export interface SandboxListItem {
  readonly id: string;
  readonly ready: boolean;
  readonly name: string;
}

const metadataOf = (m: Decoded | undefined) => ({
  name: m ? getString(m, 1) : '',
  uid: m ? getString(m, 2) : '',
  namespace: m ? getString(m, 3) : '',
});

export class CriClient {
  readonly #grpc: GrpcUnixClient;

  constructor(socketPath: string) {
    this.#grpc = new GrpcUnixClient(socketPath);
  }

  async version(): Promise<{ runtimeName: string; runtimeVersion: string; runtimeApiVersion: string }> {
    const r = decode(await this.#grpc.call(`${RUNTIME}/Version`, str(1, 'v1'), 5_000));
    return { runtimeName: getString(r, 2), runtimeVersion: getString(r, 3), runtimeApiVersion: getString(r, 4) };
  }

  /** RunPodSandbox: returns once the runtime has the sandbox running and its network set up. */
  async runPodSandbox(s: SandboxSpec, runtimeHandler = ''): Promise<string> {
    const config = msg(
      1,
      msg(1, str(1, s.name), str(2, s.uid), str(3, s.namespace), uint(4, s.attempt)),
      str(2, s.hostname ?? s.name),
      str(3, s.logDirectory),
      map(6, s.labels),
      map(7, s.annotations),
      // linux: the pod's own network, pid and ipc namespaces (POD = 0, kubelet's choice for a pod
      // without hostNetwork), sent as an explicit empty message as kubelet does.
      msg(8, str(1, s.cgroupParent), msg(2, msg(1))),
    );
    const r = decode(
      await this.#grpc.call(`${RUNTIME}/RunPodSandbox`, Buffer.concat([config, str(2, runtimeHandler)])),
    );
    const id = getString(r, 1);
    if (!id) throw new Error(`RunPodSandbox ${s.namespace}/${s.name}: the runtime returned no sandbox id`);
    return id;
  }

  async podSandboxStatus(id: string): Promise<SandboxStatus> {
    const r = decode(await this.#grpc.call(`${RUNTIME}/PodSandboxStatus`, str(1, id)));
    const st = getMessage(r, 1);
    if (!st) throw new Error(`PodSandboxStatus ${id}: no status in the reply`);
    const network = getMessage(st, 5);
    return {
      id: getString(st, 1),
      ready: getUint(st, 3) === 0,
      ip: network ? getString(network, 1) : '',
      ...metadataOf(getMessage(st, 2)),
    };
  }

  /** The sandbox's network namespace path, from the runtime's verbose status (info["info"]). */
  async podSandboxNetns(id: string): Promise<string> {
    const r = decode(await this.#grpc.call(`${RUNTIME}/PodSandboxStatus`, Buffer.concat([str(1, id), uint(2, true)])));
    const entry = getMessages(r, 2).find((e) => getString(e, 1) === 'info');
    if (!entry) throw new Error(`PodSandboxStatus ${id}: no verbose info (the runtime is not containerd?)`);
    type Info = { runtimeSpec?: { linux?: { namespaces?: { type: string; path?: string }[] } } };
    const info = JSON.parse(getString(entry, 2)) as Info;
    const ns = info.runtimeSpec?.linux?.namespaces?.find((n) => n.type === 'network')?.path;
    if (!ns) throw new Error(`PodSandboxStatus ${id}: no network namespace path in the runtime spec`);
    return ns;
  }

  async stopPodSandbox(id: string): Promise<void> {
    await this.#grpc.call(`${RUNTIME}/StopPodSandbox`, str(1, id));
  }

  async removePodSandbox(id: string): Promise<void> {
    await this.#grpc.call(`${RUNTIME}/RemovePodSandbox`, str(1, id));
  }

  async listPodSandbox(labelSelector: Record<string, string> = {}): Promise<SandboxListItem[]> {
    const filter = Object.keys(labelSelector).length === 0 ? Buffer.alloc(0) : msg(1, map(3, labelSelector));
    const r = decode(await this.#grpc.call(`${RUNTIME}/ListPodSandbox`, filter));
    return getMessages(r, 1).map((p) => ({
      id: getString(p, 1),
      ready: getUint(p, 3) === 0,
      name: metadataOf(getMessage(p, 2)).name,
    }));
  }

  /** Whether the runtime's CRI image store has `image` (a reference or id). */
  async hasImage(image: string): Promise<boolean> {
    const r = decode(await this.#grpc.call(`${IMAGES}/ImageStatus`, msg(1, str(1, image)), 5_000));
    return getMessage(r, 1) !== undefined;
  }

  close(): void {
    this.#grpc.close();
  }
}

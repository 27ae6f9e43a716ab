// The agent's side of an ambient pod's CNI ADD: the plugin (cni-plugin/ambient.ts) POSTs /cmdadd
// over <run dir>/pluginevent.sock (wire: cni-plugin/shared/pluginevent.ts) and starts the pod only
// on a 200. As Istio's cni-watcher.go: the pod is read again from this node's pod watch (a few
// tries: the watch may be a moment behind the kubelet), must still be ambient by the agent's own
// decision, then the dataplane enrolls it with the ADD's IPs and netns path (in-pod rules,
// ztunnel, probe ipset, annotation). Every failure is a 500 whose text names what failed, so the
// pod event the runtime records says ztunnel when ztunnel is the cause.
//
// Anything on the node that can reach the socket may send anything: the socket is 0600 in a 0750
// dir (listenUnix), connections are capped, the headers and the body are bounded in size and time.

import type { V1Pod } from '@kubernetes/client-node';
import http from 'node:http';
import { BOUNDED_SERVER_OPTIONS } from '../monitoring/httpbounds.ts';
import { scope } from '../monitoring/logging.ts';
import { knownCounter } from '../monitoring/metrics.ts';
import { listenUnix } from '../monitoring/unixsocket.ts';
import { isPodWithUid } from '../../cni-plugin/shared/poduid.ts';
import {
  CMDADD_FAILURES,
  CMDADD_MAX_BODY_BYTES,
  CMDADD_PATH,
  parseCmdAddRequest,
  type CmdAddFailure,
  type CmdAddReply,
  type CmdAddRequest,
} from '../../cni-plugin/shared/pluginevent.ts';
import type { AmbientPodInfo } from './enablement.ts';

const log = scope('ambient');

/** Every status the /cmdadd server answers with. */
const RESPONSE_CODES = [200, 400, 404, 405, 413, 500] as const;
type ResponseCode = (typeof RESPONSE_CODES)[number];

const requests = knownCounter({
  name: 'mesh_cni_plugin_requests_total',
  help: "Requests of the CNI plugin on the agent's plugin event socket (ambient mode's /cmdadd), by HTTP response code.",
  series: RESPONSE_CODES.map((c) => ({ response_code: `${c}` as const })),
});

/** What the server needs of a pod for the dataplane (enablement.ts AmbientPodInfo). */
export type EnrollPod = AmbientPodInfo;

export interface CmdAddDeps {
  /** This node's pod watch (src/orch/podsource.ts PodSource). */
  readonly pods: { get(namespace: string, name: string): V1Pod | undefined };
  /** The dataplane (dataplane.ts MeshDataplane); its EnrollError's `reason` says what failed. */
  readonly dataplane: { addPodToMesh(pod: EnrollPod, netnsPath: string | null): Promise<void> };
  /** The agent's own decision: isAmbientPod with its namespace labels, selectors and rules. */
  readonly isAmbient: (pod: V1Pod) => boolean;
  /** V1Pod -> the dataplane's pod (enablement.ts ambientPodOf); its IPs are replaced by the ADD's. */
  readonly toEnrollPod: (pod: V1Pod) => EnrollPod;
}

export interface CmdAddOptions {
  /** Reads of the watch for a pod it does not hold (yet), and the wait between them (Istio: 10 x 10 ms). */
  readonly podReadAttempts: number;
  readonly podReadDelayMs: number;
  /**
   * Connections held at once; one more closes the oldest. Each ADD holds one while its pod is
   * enrolled, and after a reboot the runtime starts all of the node's pods together (kubelet's
   * default is 110 pods, 250 a common maximum): a cap below that cut in-flight ADDs (code 11).
   */
  readonly maxConnections: number;
  readonly maxBodyBytes: number;
}

export const DEFAULT_CMDADD: CmdAddOptions = {
  podReadAttempts: 10,
  podReadDelayMs: 10,
  maxConnections: 256,
  maxBodyBytes: CMDADD_MAX_BODY_BYTES,
};

export interface CmdAddServer {
  readonly address: string;
  close(): Promise<void>;
}

class Refusal extends Error {
  readonly status: ResponseCode;
  readonly reason: CmdAddFailure;
  constructor(status: ResponseCode, reason: CmdAddFailure, message: string) {
    super(message);
    this.status = status;
    this.reason = reason;
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** An address as the dataplane keeps it: the CIDR's prefix length dropped. */
function bareIp(cidr: string): string {
  const slash = cidr.indexOf('/');
  return slash < 0 ? cidr : cidr.slice(0, slash);
}

/** The pod the ADD names, from the watch: the same uid (or a mirror of it), waited for a moment. */
async function readPod(deps: CmdAddDeps, req: CmdAddRequest, o: CmdAddOptions): Promise<V1Pod> {
  for (let attempt = 1; ; attempt++) {
    const pod = deps.pods.get(req.podNamespace, req.podName);
    if (pod && (req.podUid === '' || isPodWithUid(pod, req.podUid))) return pod;
    if (attempt >= o.podReadAttempts) break;
    await sleep(o.podReadDelayMs);
  }
  throw new Refusal(
    500,
    'not_found',
    `pod ${req.podNamespace}/${req.podName} (uid ${req.podUid || 'not given'}) not found in the node agent's cache`,
  );
}

async function handle(deps: CmdAddDeps, req: CmdAddRequest, o: CmdAddOptions): Promise<void> {
  const pod = await readPod(deps, req, o);
  const what = `pod ${req.podNamespace}/${req.podName}`;
  if (!deps.isAmbient(pod)) {
    throw new Refusal(
      500,
      'not_eligible',
      `${what} is unexpectedly not eligible for ambient mode in the node agent (its labels, its namespace's or a sidecar changed?)`,
    );
  }
  const base = deps.toEnrollPod(pod);
  const enroll: EnrollPod = {
    ...base,
    ips: req.ips.map((ip) => bareIp(ip.address)),
    // A static pod: the runtime names it by the kubelet's UID, which its cgroups carry.
    ...(req.podUid !== '' && req.podUid !== base.uid ? { mirrorUid: req.podUid } : {}),
  };
  try {
    await deps.dataplane.addPodToMesh(enroll, req.netns);
  } catch (e) {
    const raw = (e as { reason?: unknown }).reason;
    const reason: CmdAddFailure =
      typeof raw === 'string' && (CMDADD_FAILURES as readonly string[]).includes(raw)
        ? (raw as CmdAddFailure)
        : 'internal';
    const msg = (e as Error).message ?? String(e);
    // The runtime shows this text in the pod's events: ztunnel's failures say ztunnel.
    const text = reason === 'ztunnel' && !/ztunnel/i.test(msg) ? `ztunnel: ${msg}` : msg;
    throw new Refusal(500, reason, `cannot enroll ${what} in ambient mode: ${text}`);
  }
}

function reply(res: http.ServerResponse, status: ResponseCode, body: CmdAddReply): void {
  requests.inc({ response_code: `${status}` });
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    connection: 'close',
  });
  res.end(text);
}

/** Reads the body up to `max` bytes; a longer one is refused (413) as soon as it is seen to be. */
function readBody(req: http.IncomingMessage, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > max) {
      reject(new Refusal(413, 'bad_request', `request body of ${declared} bytes is over the limit of ${max}`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > max) {
        req.removeAllListeners('data');
        req.pause();
        reject(new Refusal(413, 'bad_request', `request body over the limit of ${max} bytes`));
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** Serves POST /cmdadd on `address` until closed. */
export async function startCmdAddServer(
  address: string,
  deps: CmdAddDeps,
  options: Partial<CmdAddOptions> = {},
): Promise<CmdAddServer> {
  const o: CmdAddOptions = { ...DEFAULT_CMDADD, ...options };
  // Bounded as the agent's other HTTP servers; listenUnix caps the connections.
  const server = http.createServer(BOUNDED_SERVER_OPTIONS, (req, res) => {
    void (async () => {
      const started = Date.now();
      let pod: string | null = null;
      try {
        if (req.url !== CMDADD_PATH)
          throw new Refusal(404, 'bad_request', `no such path ${JSON.stringify(req.url)}; POST ${CMDADD_PATH}`);
        if (req.method !== 'POST') throw new Refusal(405, 'bad_request', `${req.method} ${CMDADD_PATH}: POST only`);
        const body = await readBody(req, o.maxBodyBytes);
        let cmd: CmdAddRequest | null;
        try {
          cmd = parseCmdAddRequest(JSON.parse(body.toString('utf8')));
        } catch {
          cmd = null;
        }
        if (cmd === null)
          throw new Refusal(
            400,
            'bad_request',
            'bad request: expected {"netns","podName","podNamespace","podUid","ips"}',
          );
        pod = `${cmd.podNamespace}/${cmd.podName}`;
        await handle(deps, cmd, o);
        log.info('ambient pod enrolled on its ADD', {
          pod,
          elapsedMs: Date.now() - started,
        });
        reply(res, 200, { ok: true });
      } catch (e) {
        const r = e instanceof Refusal ? e : new Refusal(500, 'internal', `internal error: ${(e as Error).message}`);
        log.warn('ambient ADD refused', {
          pod,
          status: r.status,
          reason: r.reason,
          error: r.message,
        });
        // A body refused half-read: the rest is not read, the connection closes after the answer.
        if (r.status === 413) res.shouldKeepAlive = false;
        reply(res, r.status, { ok: false, reason: r.reason, message: r.message });
        if (r.status === 413) res.on('finish', () => req.socket.destroy());
      }
    })();
  });
  const close = await listenUnix(server, address, 'ambient plugin events', 'the plugin event socket', {
    maxConnections: o.maxConnections,
  });
  log.info("serving the plugin's ambient ADDs", { path: address });
  return { address, close };
}

// A small HTTPS server speaking the Kubernetes REST dialect for pods (list, watch, patch, delete,
// status), events, daemonsets, nodes (get, patch, status) and service-account TokenRequests, with
// bearer-token auth, RBAC per token (what a Role/ClusterRole would allow, on the paths we use) and
// fault knobs. Good enough for the real kubectl and @kubernetes/client-node; the one cluster piece
// tests cannot have for real.
//
// What it models of the real API server: one global resourceVersion counter, a watch cache that
// replays events after a given resourceVersion (410 Gone once "compacted"), selector-filtered
// watches that turn objects leaving the selector into DELETED, Status objects for errors, Table
// output for kubectl, chunked watch streams with bookmarks and timeoutSeconds.

import type { CoreV1Event, V1DaemonSet, V1Namespace, V1Node, V1Pod } from '@kubernetes/client-node';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import {
  matchesFields,
  matchesLabels,
  parseFieldSelector,
  parseLabelSelector,
  type FieldRequirement,
  type LabelRequirement,
} from './selectors.ts';
import { makeTestCerts } from './certs.ts';

export interface RequestRecord {
  method: string;
  path: string;
  query: string;
  status: number;
  time: number;
  /**
   * Objects the real API server would read to answer (the fleet bench's cost model): a consistent
   * list (no resourceVersion) goes to etcd, which has no index by node: every pod of the cluster
   * (of the namespace); a list from the watch cache (resourceVersion=0, or a resourceVersion with no
   * limit) and a watch-list's initial events: the pods its index gives (the node's, with a
   * spec.nodeName selector); a GET: one; a watch from a resourceVersion: the events it replays.
   */
  objectsRead?: number;
}

export interface TestApiServer {
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly caPem: string;
  readonly token: string;
  upsertPod(pod: V1Pod): V1Pod;
  getPod(namespace: string, name: string): V1Pod | undefined;
  deletePodFromStore(namespace: string, name: string): void;
  listPods(): V1Pod[];
  /** Namespaces (list, watch, get; labels are what ambient mode reads). */
  upsertNamespace(ns: V1Namespace): V1Namespace;
  deleteNamespaceFromStore(name: string): void;
  /** How many namespace watch streams are open now (not counted in openWatches). */
  openNamespaceWatches(): number;
  upsertDaemonSet(ds: V1DaemonSet): V1DaemonSet;
  deleteDaemonSetFromStore(namespace: string, name: string): void;
  /** Nodes: get (--cleanup-on-exit=auto reads its own node); patch of the node and of its status. */
  upsertNode(node: V1Node): V1Node;
  deleteNodeFromStore(name: string): void;
  events(): CoreV1Event[];
  readonly requests: ReadonlyArray<RequestRecord>;
  faults: {
    status?: { code: number; retryAfterSeconds?: number; paths?: RegExp; count?: number };
    delayMs?: number;
    silentWatches?: boolean;
    /** A server without the WatchList feature: sendInitialEvents is refused (422), as before 1.32. */
    rejectWatchList?: boolean;
    /** A server (or proxy) that ignores sendInitialEvents: a plain watch, no initial-events-end bookmark. */
    ignoreWatchList?: boolean;
    /** A server that refuses a list with resourceVersion=0 (400); a consistent list still works. */
    rejectRv0List?: boolean;
    /**
     * An API server (of several) whose watch cache is behind: a resourceVersion=0 list ("any age")
     * answers this older state; a list not older than a resourceVersion it has not reached is
     * answered by a fresh one (the real one waits for its cache, or the client reached another).
     */
    laggingCache?: { readonly resourceVersion: string; readonly pods: readonly V1Pod[] };
    /**
     * Rewrites each TokenRequest answer before it is sent (what an admission webhook or a proxy
     * between the agent and the API server could hand back); the token minted stays valid.
     */
    tokenAnswer?: (answer: TokenRequestAnswer) => unknown;
  };
  closeWatches(): void;
  expireResourceVersions(): void;
  stop(): Promise<void>;
  start(): Promise<void>;
  writeOrchconfig(file: string, opts?: { token?: string; insecure?: boolean }): string;
  close(): Promise<void>;
  /** Extras beyond the shared contract: how many watch streams are open now. */
  openWatches(): number;
  /** TLS connections accepted since start (each one a handshake). */
  connections(): number;
  /** Serves a certificate from a new CA from now on (cutting open connections); returns the new CA. */
  rotateCertificate(): Promise<string>;
  /**
   * Makes a service account known (TokenRequest answers only for known ones), with these rules if
   * given (else it keeps its rules; a new one starts with none), and returns a fresh token of it,
   * as the kubelet would project into a pod that runs as it.
   */
  serviceAccount(namespace: string, name: string, rules?: readonly RbacRule[]): string;
  /** Replaces the rules of the identity the token belongs to. */
  setRules(token: string, rules: readonly RbacRule[]): void;
  /** Tokens minted through TokenRequest, oldest first. */
  issuedTokens(): IssuedToken[];
  /** Caps the lifetime of minted tokens (as --service-account-max-token-expiration, but any length). */
  tokenMaxSeconds: number | undefined;
  /** How far the server's clock runs ahead of this machine's (ms): shows in the times it writes. */
  clockSkewMs: number;
}

/** A TokenRequest as the server answers it: the token is an (unsigned) JWT with a real one's claims. */
export interface TokenRequestAnswer {
  kind: 'TokenRequest';
  apiVersion: string;
  metadata: Record<string, unknown>;
  spec: { audiences: string[]; expirationSeconds: number; boundObjectRef: null };
  status: { token: string; expirationTimestamp: string };
}

/**
 * A JWT with these claims and no valid signature, shaped as the API server's service-account
 * tokens are: what the agent reads of a token (its claims, never verified).
 */
export function unsignedJwt(claims: Record<string, unknown>): string {
  const part = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
  return `${part({ alg: 'RS256', kid: 'test' })}.${part(claims)}.${Buffer.from('not-a-signature').toString('base64url')}`;
}

/** One rule of a Role (namespace set) or ClusterRole (unset), as the test server enforces it. */
export interface RbacRule {
  readonly verbs: readonly string[];
  /** '' is the core group. */
  readonly apiGroups: readonly string[];
  /** `pods`, `pods/status`, `serviceaccounts/token`, ...; `*` for all. */
  readonly resources: readonly string[];
  readonly resourceNames?: readonly string[];
  readonly namespace?: string;
}

export interface IssuedToken {
  readonly token: string;
  /** namespace/name */
  readonly serviceAccount: string;
  readonly audiences: readonly string[];
  readonly expirationTimestamp: string;
}

/** Everything: the default token's rules, so tests that do not care about RBAC are not bound by it. */
export const ALLOW_ALL: readonly RbacRule[] = [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }];
/** What deploy/ grants the plugin's account, known to every test server. */
export const PLUGIN_SERVICE_ACCOUNT = { namespace: 'mesh-system', name: 'mesh-cni-plugin' } as const;
const PLUGIN_RULES: readonly RbacRule[] = [{ verbs: ['get'], apiGroups: [''], resources: ['pods'] }];
/** The audience a real API server accepts by default (--api-audiences defaults to its issuer). */
export const DEFAULT_AUDIENCE = 'https://kubernetes.default.svc.cluster.local';

export interface TestApiServerOptions {
  token?: string;
  /** Rules of the default token (ALLOW_ALL unless given). */
  rules?: readonly RbacRule[];
  /** How often a watch that asked for bookmarks gets one (the real server: about a minute). */
  bookmarkIntervalMs?: number;
}

type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface HistoryEntry {
  readonly rv: number;
  readonly type: EventType;
  readonly obj: V1Pod;
  /** The object before this change (MODIFIED/DELETED), to tell "left the selector" apart. */
  readonly old: V1Pod | undefined;
}

interface PodFilter {
  readonly namespace: string | undefined;
  readonly labels: readonly LabelRequirement[];
  readonly fields: readonly FieldRequirement[];
}

interface Watch {
  readonly res: ServerResponse;
  readonly filter: PodFilter;
  readonly table: TableMode | undefined;
  silent: boolean;
  timers: NodeJS.Timeout[];
  sentHeaders: boolean;
}

interface TableMode {
  readonly includeObject: 'None' | 'Metadata' | 'Object';
}

class HttpError extends Error {
  readonly code: number;
  readonly reason: string;
  readonly retryAfterSeconds: number | undefined;
  constructor(code: number, reason: string, message: string, retryAfterSeconds?: number) {
    super(message);
    this.code = code;
    this.reason = reason;
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  409: 'Conflict',
  410: 'Expired',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

export function statusObject(
  code: number,
  message: string,
  reason = REASONS[code] ?? 'Unknown',
  retryAfterSeconds?: number,
) {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(retryAfterSeconds !== undefined ? { details: { retryAfterSeconds } } : {}),
    code,
  };
}

const clone = <T>(o: T): T => structuredClone(o);
const key = (ns: string, name: string) => `${ns}/${name}`;
const nowTimestamp = () => new Date().toISOString().replace(/\.\d+Z$/, 'Z');

/** RFC 7386 JSON merge patch. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return clone(patch);
  const out: Record<string, unknown> =
    target !== null && typeof target === 'object' && !Array.isArray(target)
      ? { ...(target as Record<string, unknown>) }
      : {};
  for (const [k, v] of Object.entries(patch as Record<string, unknown>)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** Strategic merge patch, as far as this server needs: maps merge, `$patch: delete`/`replace` honoured, lists replaced. */
function strategicMergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return clone(patch);
  const p = patch as Record<string, unknown>;
  if (p.$patch === 'delete') return undefined;
  const base: Record<string, unknown> =
    p.$patch !== 'replace' && target !== null && typeof target === 'object' && !Array.isArray(target)
      ? { ...(target as Record<string, unknown>) }
      : {};
  for (const [k, v] of Object.entries(p)) {
    if (k.startsWith('$')) continue;
    if (v === null) delete base[k];
    else {
      const merged = strategicMergePatch(base[k], v);
      if (merged === undefined) delete base[k];
      else base[k] = merged;
    }
  }
  return base;
}

/** RFC 6902 JSON patch (add, remove, replace, test; what kubectl and clients send). */
function jsonPatch(target: unknown, ops: unknown): unknown {
  if (!Array.isArray(ops)) throw new HttpError(400, 'BadRequest', 'a JSON patch must be an array of operations');
  let doc = clone(target);
  for (const op of ops as Array<{ op?: string; path?: string; value?: unknown }>) {
    const parts = String(op.path ?? '')
      .split('/')
      .slice(1)
      .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
    if (parts.length === 0) {
      if (op.op === 'test') continue;
      doc = clone(op.value);
      continue;
    }
    let parent = doc as Record<string, unknown> | unknown[];
    for (const p of parts.slice(0, -1)) {
      const next = (parent as Record<string, unknown>)[p];
      if (next === null || typeof next !== 'object') {
        throw new HttpError(422, 'Invalid', `JSON patch path ${op.path} does not exist`);
      }
      parent = next as Record<string, unknown>;
    }
    const last = parts[parts.length - 1]!;
    const isArr = Array.isArray(parent);
    const idx = isArr ? (last === '-' ? (parent as unknown[]).length : Number(last)) : -1;
    switch (op.op) {
      case 'add':
        if (isArr) (parent as unknown[]).splice(idx, 0, clone(op.value));
        else (parent as Record<string, unknown>)[last] = clone(op.value);
        break;
      case 'replace':
      case 'remove': {
        const exists = isArr ? idx < (parent as unknown[]).length : Object.hasOwn(parent, last);
        if (!exists) throw new HttpError(422, 'Invalid', `JSON patch ${op.op} of missing path ${op.path}`);
        if (op.op === 'replace') {
          if (isArr) (parent as unknown[])[idx] = clone(op.value);
          else (parent as Record<string, unknown>)[last] = clone(op.value);
        } else if (isArr) (parent as unknown[]).splice(idx, 1);
        else delete (parent as Record<string, unknown>)[last];
        break;
      }
      case 'test':
        if (
          JSON.stringify(isArr ? (parent as unknown[])[idx] : (parent as Record<string, unknown>)[last]) !==
          JSON.stringify(op.value)
        ) {
          throw new HttpError(422, 'Invalid', `JSON patch test failed at ${op.path}`);
        }
        break;
      default:
        throw new HttpError(422, 'Invalid', `unsupported JSON patch operation ${String(op.op)}`);
    }
  }
  return doc;
}

function age(ts: string | Date | undefined): string {
  if (!ts) return '<unknown>';
  const s = Math.max(0, Math.floor((Date.now() - new Date(ts).getTime()) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  return `${Math.floor(s / 3600)}h`;
}

const POD_COLUMNS = [
  { name: 'Name', type: 'string', format: 'name', description: 'Name', priority: 0 },
  { name: 'Ready', type: 'string', format: '', description: 'ready containers', priority: 0 },
  { name: 'Status', type: 'string', format: '', description: 'phase', priority: 0 },
  { name: 'Restarts', type: 'string', format: '', description: 'restarts', priority: 0 },
  { name: 'Age', type: 'string', format: '', description: 'age', priority: 0 },
];

function podRow(pod: V1Pod, mode: TableMode) {
  const statuses = pod.status?.containerStatuses ?? [];
  const ready = statuses.filter((c) => c.ready).length;
  const restarts = statuses.reduce((n, c) => n + (c.restartCount ?? 0), 0);
  const object =
    mode.includeObject === 'Object'
      ? pod
      : mode.includeObject === 'Metadata'
        ? { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: pod.metadata }
        : undefined;
  return {
    cells: [
      pod.metadata?.name ?? '',
      `${ready}/${pod.spec?.containers?.length ?? 0}`,
      pod.status?.phase ?? 'Pending',
      String(restarts),
      age(pod.metadata?.creationTimestamp),
    ],
    ...(object ? { object } : {}),
  };
}

function tableMode(req: IncomingMessage, q: URLSearchParams): TableMode | undefined {
  const accept = req.headers.accept ?? '';
  if (!/as=Table/.test(accept.split(',')[0] ?? '')) return undefined;
  const inc = q.get('includeObject');
  return { includeObject: inc === 'None' || inc === 'Object' ? inc : 'Metadata' };
}

const TABLE_CONTENT_TYPE = 'application/json;as=Table;v=v1;g=meta.k8s.io';

/** What RBAC decides on: the request's verb, group, resource[/subresource], namespace and name. */
interface RequestAttributes {
  readonly verb: string;
  readonly group: string;
  readonly resource: string;
  readonly namespace: string | undefined;
  readonly name: string | undefined;
}

/** The attributes of a resource request, or undefined for a non-resource path (discovery, /version). */
export function requestAttributes(method: string, pathname: string, q: URLSearchParams): RequestAttributes | undefined {
  const m = /^\/(?:api\/v1|apis\/([^/]+)\/v1)(?:\/namespaces\/([^/]+))?\/([^/]+)(?:\/([^/]+))?(?:\/([^/]+))?$/.exec(
    pathname,
  );
  if (!m) return undefined;
  const name = m[4] === undefined ? undefined : decodeURIComponent(m[4]);
  const watch = q.get('watch') === 'true' || q.get('watch') === '1';
  const verbs: Record<string, string> = {
    GET: name ? 'get' : watch ? 'watch' : 'list',
    POST: 'create',
    PATCH: 'patch',
    PUT: 'update',
    DELETE: name ? 'delete' : 'deletecollection',
  };
  return {
    verb: verbs[method] ?? method.toLowerCase(),
    group: m[1] ?? '',
    resource: m[5] === undefined ? m[3]! : `${m[3]}/${m[5]}`,
    namespace: m[2] === undefined ? undefined : decodeURIComponent(m[2]),
    name,
  };
}

const has = (list: readonly string[] | undefined, v: string) =>
  list !== undefined && (list.includes(v) || list.includes('*'));

export function allows(rules: readonly RbacRule[], a: RequestAttributes): boolean {
  return rules.some(
    (r) =>
      has(r.verbs, a.verb) &&
      has(r.apiGroups, a.group) &&
      has(r.resources, a.resource) &&
      (r.namespace === undefined || r.namespace === a.namespace) &&
      (r.resourceNames === undefined || (a.name !== undefined && r.resourceNames.includes(a.name))),
  );
}

interface Identity {
  readonly user: string;
  rules: readonly RbacRule[];
}

export async function startTestApiServer(opts: TestApiServerOptions = {}): Promise<TestApiServer> {
  const token = opts.token ?? `test-token-${randomUUID()}`;
  // Who each bearer token is, and until when (minted tokens expire; the others do not).
  const admin: Identity = { user: 'mesh-cni-test-admin', rules: opts.rules ?? ALLOW_ALL };
  const tokens = new Map<string, { identity: Identity; expiresAt?: number; audiences: readonly string[] }>([
    [token, { identity: admin, audiences: [DEFAULT_AUDIENCE] }],
  ]);
  const accounts = new Map<string, Identity>();
  const issued: IssuedToken[] = [];
  let tokenMaxSeconds: number | undefined;
  let clockSkewMs = 0;
  const account = (ns: string, name: string, rules?: readonly RbacRule[]): Identity => {
    let id = accounts.get(key(ns, name));
    if (!id) accounts.set(key(ns, name), (id = { user: `system:serviceaccount:${ns}:${name}`, rules: [] }));
    if (rules) id.rules = rules;
    return id;
  };
  account(PLUGIN_SERVICE_ACCOUNT.namespace, PLUGIN_SERVICE_ACCOUNT.name, PLUGIN_RULES);
  const bookmarkIntervalMs = opts.bookmarkIntervalMs ?? 1000;
  let certs = await makeTestCerts();

  const pods = new Map<string, V1Pod>();
  const daemonSets = new Map<string, V1DaemonSet>();
  const nodes = new Map<string, V1Node>();
  // Namespaces: a store, their own history and watches (the pod machinery stays pods-only).
  const namespaces = new Map<string, V1Namespace>();
  const nsHistory: { rv: number; type: EventType; obj: V1Namespace }[] = [];
  const nsWatches = new Set<{ res: ServerResponse; timers: NodeJS.Timeout[] }>();
  const events: CoreV1Event[] = [];
  const history: HistoryEntry[] = [];
  const watches = new Set<Watch>();
  const sockets = new Set<Socket>();
  const requests: RequestRecord[] = [];
  const faults: TestApiServer['faults'] = {};
  let rv = 1000;
  // Watches and lists from a resourceVersion below this get 410 Gone (the watch cache "compacted").
  let oldestValidRv = 0;

  const nextRv = () => ++rv;

  function podMatches(f: PodFilter, pod: V1Pod | undefined): boolean {
    if (!pod) return false;
    if (f.namespace !== undefined && pod.metadata?.namespace !== f.namespace) return false;
    return matchesLabels(f.labels, pod.metadata?.labels) && matchesFields(f.fields, pod);
  }

  /** The event a watch with this filter sees for a change, or none. */
  function eventFor(f: PodFilter, h: HistoryEntry): { type: EventType; object: V1Pod } | undefined {
    const now = h.type !== 'DELETED' && podMatches(f, h.obj);
    const before = h.old !== undefined && podMatches(f, h.old);
    if (h.type === 'DELETED') return before ? { type: 'DELETED', object: h.obj } : undefined;
    if (now && before) return { type: 'MODIFIED', object: h.obj };
    if (now) return { type: 'ADDED', object: h.obj };
    if (before) {
      // Left the selector: the real watch cache reports it as deleted, with the new resourceVersion.
      const gone = clone(h.old!);
      gone.metadata!.resourceVersion = h.obj.metadata!.resourceVersion;
      return { type: 'DELETED', object: gone };
    }
    return undefined;
  }

  function writeEvent(w: Watch, type: string, object: unknown): void {
    if (w.silent || faults.silentWatches) {
      // A hung stream never recovers: once it dropped something it must stay silent.
      w.silent = true;
      return;
    }
    if (w.res.writableEnded || w.res.destroyed) return;
    let obj = object;
    if (w.table && (type === 'ADDED' || type === 'MODIFIED' || type === 'DELETED')) {
      const first = !w.sentHeaders;
      w.sentHeaders = true;
      obj = {
        kind: 'Table',
        apiVersion: 'meta.k8s.io/v1',
        metadata: { resourceVersion: (object as V1Pod).metadata?.resourceVersion },
        ...(first ? { columnDefinitions: POD_COLUMNS } : {}),
        rows: [podRow(object as V1Pod, w.table)],
      };
    }
    w.res.write(JSON.stringify({ type, object: obj }) + '\n');
  }

  function endWatch(w: Watch): void {
    for (const t of w.timers) clearTimeout(t);
    watches.delete(w);
    if (!w.res.writableEnded) w.res.end();
  }

  function record(type: EventType, obj: V1Pod, old: V1Pod | undefined): void {
    const h: HistoryEntry = {
      rv: Number(obj.metadata!.resourceVersion),
      type,
      obj: clone(obj),
      old: old ? clone(old) : undefined,
    };
    history.push(h);
    for (const w of watches) {
      const ev = eventFor(w.filter, h);
      if (ev) writeEvent(w, ev.type, ev.object);
    }
  }

  // The watch cache's index of pods by spec.nodeName (what makes a node's list cheap), kept so that
  // the fleet bench's 150,000 pods do not make every node's list a scan of all of them.
  const byNode = new Map<string, Set<string>>();
  function index(k: string, p: V1Pod): void {
    const node = p.spec?.nodeName ?? '';
    let set = byNode.get(node);
    if (!set) byNode.set(node, (set = new Set()));
    set.add(k);
  }
  function unindex(k: string, old: V1Pod | undefined): void {
    if (old) byNode.get(old.spec?.nodeName ?? '')?.delete(k);
  }
  /** The pods a filter can match, by the index when it names a node. */
  function candidates(filter: PodFilter): [string, V1Pod][] {
    const node = filter.fields.find((f) => f.field === 'spec.nodeName' && f.op === '=');
    if (!node) return [...pods.entries()];
    return [...(byNode.get(node.value) ?? [])].map((k) => [k, pods.get(k)!]);
  }

  function storePod(pod: V1Pod, old: V1Pod | undefined): V1Pod {
    const p = clone(pod);
    p.apiVersion ??= 'v1';
    p.kind ??= 'Pod';
    p.metadata!.resourceVersion = String(nextRv());
    const k = key(p.metadata!.namespace!, p.metadata!.name!);
    pods.set(k, p);
    unindex(k, old);
    index(k, p);
    record(old ? 'MODIFIED' : 'ADDED', p, old);
    return clone(p);
  }

  function removePod(ns: string, name: string): V1Pod | undefined {
    const old = pods.get(key(ns, name));
    if (!old) return undefined;
    pods.delete(key(ns, name));
    unindex(key(ns, name), old);
    const gone = clone(old);
    gone.metadata!.resourceVersion = String(nextRv());
    record('DELETED', gone, old);
    return clone(gone);
  }

  function upsertPod(pod: V1Pod): V1Pod {
    const p = clone(pod);
    p.metadata ??= {};
    if (!p.metadata.name) throw new Error('upsertPod: metadata.name is required');
    p.metadata.namespace ??= 'default';
    const old = pods.get(key(p.metadata.namespace, p.metadata.name));
    if (old && p.metadata.uid && p.metadata.uid !== old.metadata?.uid) {
      // Another object under the same name: the old one is gone first, as in a real cluster.
      removePod(p.metadata.namespace, p.metadata.name);
      return upsertPod(p);
    }
    p.metadata.uid ??= old?.metadata?.uid ?? randomUUID();
    p.metadata.creationTimestamp ??= old?.metadata?.creationTimestamp ?? (nowTimestamp() as unknown as Date);
    return storePod(p, old);
  }

  function parseFilter(q: URLSearchParams, namespace: string | undefined): PodFilter {
    try {
      return {
        namespace,
        labels: parseLabelSelector(q.get('labelSelector') ?? ''),
        fields: parseFieldSelector(q.get('fieldSelector') ?? ''),
      };
    } catch (e) {
      throw new HttpError(400, 'BadRequest', (e as Error).message);
    }
  }

  function checkRv(raw: string | null, what: string, notOlderThan = false): number | undefined {
    if (raw === null || raw === '' || raw === '0') return undefined;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 0)
      throw new HttpError(400, 'BadRequest', `invalid resourceVersion ${JSON.stringify(raw)} in ${what}`);
    if (n < oldestValidRv && !notOlderThan) {
      throw new HttpError(410, 'Expired', `too old resource version: ${n} (${oldestValidRv})`);
    }
    return n;
  }

  /** Pods the watch cache's index gives for this filter: the node's with a spec.nodeName=X selector. */
  function indexedCost(filter: PodFilter): number {
    const node = filter.fields.find((f) => f.field === 'spec.nodeName' && f.op === '=');
    if (!node)
      return filter.namespace === undefined
        ? pods.size
        : [...pods.values()].filter((p) => p.metadata?.namespace === filter.namespace).length;
    return byNode.get(node.value)?.size ?? 0;
  }

  /** What etcd reads for a consistent list: every pod of the range (cluster or namespace), after `after`. */
  function etcdCost(filter: PodFilter, after: string): number {
    if (filter.namespace === undefined && after === '') return pods.size;
    let n = 0;
    for (const [k, p] of pods)
      if (k > after && (filter.namespace === undefined || p.metadata?.namespace === filter.namespace)) n++;
    return n;
  }

  function listPodsResponse(
    req: IncomingMessage,
    q: URLSearchParams,
    namespace: string | undefined,
    rec?: RequestRecord,
  ) {
    const filter = parseFilter(q, namespace);
    const rawRv = q.get('resourceVersion');
    if (rawRv === '0' && faults.rejectRv0List) {
      throw new HttpError(400, 'BadRequest', 'injected fault: resourceVersion=0 lists are refused by this server');
    }
    // A list not older than a resourceVersion is served from the watch cache as it is now, however
    // old the resourceVersion (only an exact or paginated read needs it still in etcd).
    if (q.get('resourceVersionMatch') === 'NotOlderThan') checkRv(rawRv, 'list', true);
    else checkRv(rawRv, 'list');
    const lagging = rawRv === '0' && !q.get('continue') ? faults.laggingCache : undefined;
    if (lagging) {
      if (rec) rec.objectsRead = lagging.pods.length;
      const items = lagging.pods.filter((p) => podMatches(filter, p)).map(clone);
      const metadata = { resourceVersion: lagging.resourceVersion };
      return { contentType: 'application/json', body: { kind: 'PodList', apiVersion: 'v1', metadata, items } };
    }
    let listRv = rv;
    let after = '';
    const cont = q.get('continue');
    if (cont) {
      let tok: { rv?: number; after?: string };
      try {
        tok = JSON.parse(Buffer.from(cont, 'base64url').toString('utf8')) as { rv?: number; after?: string };
      } catch {
        throw new HttpError(400, 'BadRequest', 'invalid continue token');
      }
      if ((tok.rv ?? 0) < oldestValidRv) {
        throw new HttpError(
          410,
          'Expired',
          'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
        );
      }
      listRv = tok.rv ?? rv;
      after = tok.after ?? '';
    }
    // The watch cache answers resourceVersion=0, and any resourceVersion without a limit; the rest is etcd.
    const fromCache =
      rawRv !== null && rawRv !== '' && !cont && (rawRv === '0' || !(Number(q.get('limit') ?? '0') > 0));
    if (rec) rec.objectsRead = fromCache ? indexedCost(filter) : etcdCost(filter, after);
    const all = candidates(filter)
      .filter(([k, p]) => k > after && podMatches(filter, p))
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    const limit = Number(q.get('limit') ?? '0');
    const page = limit > 0 ? all.slice(0, limit) : all;
    const more = limit > 0 && all.length > limit;
    const metadata: Record<string, unknown> = { resourceVersion: String(listRv) };
    if (more) {
      metadata.continue = Buffer.from(JSON.stringify({ rv: listRv, after: page[page.length - 1]![0] })).toString(
        'base64url',
      );
      metadata.remainingItemCount = all.length - limit;
    }
    const table = tableMode(req, q);
    if (table) {
      return {
        contentType: TABLE_CONTENT_TYPE,
        body: {
          kind: 'Table',
          apiVersion: 'meta.k8s.io/v1',
          metadata,
          columnDefinitions: POD_COLUMNS,
          rows: page.map(([, p]) => podRow(p, table)),
        },
      };
    }
    return {
      contentType: 'application/json',
      body: { kind: 'PodList', apiVersion: 'v1', metadata, items: page.map(([, p]) => p) },
    };
  }

  function startWatch(
    req: IncomingMessage,
    res: ServerResponse,
    q: URLSearchParams,
    namespace: string | undefined,
    rec: RequestRecord,
  ): void {
    const filter = parseFilter(q, namespace);
    const rawRv = q.get('resourceVersion');
    const table = tableMode(req, q);
    // The streaming watch-list (KEP-3157): initial events, then a bookmark annotated
    // k8s.io/initial-events-end, then the watch goes on. Checked before the stream opens, as the
    // real server validates its ListOptions (an error answer, not an ERROR event).
    const initialEvents = q.get('sendInitialEvents') === 'true' && !faults.ignoreWatchList;
    if (q.get('sendInitialEvents') !== null && !faults.ignoreWatchList) {
      const invalid = (why: string) => new HttpError(422, 'Invalid', `ListOptions.meta.k8s.io "" is invalid: ${why}`);
      if (faults.rejectWatchList) {
        throw invalid(
          'sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
        );
      }
      if (q.get('resourceVersionMatch') !== 'NotOlderThan') {
        throw invalid(
          'resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan',
        );
      }
      if (q.get('allowWatchBookmarks') !== 'true') {
        throw invalid('allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks');
      }
    }
    res.writeHead(200, {
      'content-type': table ? TABLE_CONTENT_TYPE : 'application/json',
      'cache-control': 'no-cache, private',
    });
    res.flushHeaders();
    rec.status = 200;
    const w: Watch = { res, filter, table, silent: faults.silentWatches === true, timers: [], sentHeaders: false };
    watches.add(w);
    res.on('close', () => endWatch(w));
    let from: number | undefined;
    try {
      from = checkRv(rawRv, 'watch');
    } catch (e) {
      // The real server answers an expired watch with 200 and an ERROR event, then ends the stream.
      const err = e as HttpError;
      writeEvent(w, 'ERROR', statusObject(err.code, err.message, err.reason));
      endWatch(w);
      return;
    }
    if (initialEvents) {
      // The state now (the server waits until its cache is at least as new as asked), then the mark.
      const now = candidates(filter)
        .map(([, p]) => p)
        .filter((p) => podMatches(filter, p));
      rec.objectsRead = indexedCost(filter);
      for (const p of now) writeEvent(w, 'ADDED', p);
      writeEvent(w, 'BOOKMARK', {
        kind: 'Pod',
        apiVersion: 'v1',
        metadata: { resourceVersion: String(rv), annotations: { 'k8s.io/initial-events-end': 'true' } },
      });
    } else if (from === undefined) {
      // No resourceVersion: "start at most recent", with synthetic ADDED for what exists now.
      rec.objectsRead = indexedCost(filter);
      for (const [, p] of candidates(filter).filter(([, p]) => podMatches(filter, p))) writeEvent(w, 'ADDED', p);
    } else {
      rec.objectsRead = 0;
      // history is in resourceVersion order: start at the first entry after `from`.
      let lo = 0;
      for (let hi = history.length; lo < hi;) {
        const mid = (lo + hi) >>> 1;
        if (history[mid]!.rv <= from) lo = mid + 1;
        else hi = mid;
      }
      for (let i = lo; i < history.length; i++) {
        const h = history[i]!;
        const ev = eventFor(filter, h);
        if (ev) {
          rec.objectsRead = (rec.objectsRead ?? 0) + 1;
          writeEvent(w, ev.type, ev.object);
        }
      }
    }
    if (q.get('allowWatchBookmarks') === 'true') {
      const tick = () => {
        writeEvent(w, 'BOOKMARK', { kind: 'Pod', apiVersion: 'v1', metadata: { resourceVersion: String(rv) } });
        w.timers.push(setTimeout(tick, bookmarkIntervalMs).unref());
      };
      w.timers.push(setTimeout(tick, bookmarkIntervalMs).unref());
    }
    const timeout = Number(q.get('timeoutSeconds') ?? '0');
    if (timeout > 0) w.timers.push(setTimeout(() => endWatch(w), timeout * 1000).unref());
  }

  async function readBody(req: IncomingMessage): Promise<unknown> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    if (text.trim() === '') return undefined;
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new HttpError(400, 'BadRequest', `cannot parse request body as JSON: ${(e as Error).message}`);
    }
  }

  function getPodOr404(ns: string, name: string): V1Pod {
    const p = pods.get(key(ns, name));
    if (!p) throw new HttpError(404, 'NotFound', `pods "${name}" not found`);
    return p;
  }

  function applyPatch(req: IncomingMessage, current: V1Pod, patch: unknown): V1Pod {
    const ct = (req.headers['content-type'] ?? '').split(';')[0]!.trim();
    switch (ct) {
      case 'application/merge-patch+json':
        return mergePatch(current, patch) as V1Pod;
      case 'application/strategic-merge-patch+json':
        return strategicMergePatch(current, patch) as V1Pod;
      case 'application/json-patch+json':
        return jsonPatch(current, patch) as V1Pod;
      default:
        throw new HttpError(
          415,
          'UnsupportedMediaType',
          `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got ${JSON.stringify(ct)})`,
        );
    }
  }

  /** Writes `next` over `current` as an update: identity immutable, optimistic concurrency on resourceVersion. */
  function updatePod(current: V1Pod, next: V1Pod, givenRv: string | undefined): V1Pod {
    const name = current.metadata!.name!;
    if (next.metadata?.name !== name || next.metadata?.namespace !== current.metadata!.namespace) {
      throw new HttpError(422, 'Invalid', `Pod "${name}" is invalid: metadata.name/namespace: field is immutable`);
    }
    if (next.metadata?.uid !== current.metadata!.uid) {
      throw new HttpError(
        409,
        'Conflict',
        `Operation cannot be fulfilled on pods "${name}": the UID in the request (${String(next.metadata?.uid)}) does not match ${current.metadata!.uid}`,
      );
    }
    if (givenRv !== undefined && givenRv !== '' && givenRv !== current.metadata!.resourceVersion) {
      throw new HttpError(
        409,
        'Conflict',
        `Operation cannot be fulfilled on pods "${name}": the object has been modified; please apply your changes to the latest version and try again`,
      );
    }
    return storePod(next, current);
  }

  async function podRoutes(
    req: IncomingMessage,
    ns: string,
    name: string,
    sub: string | undefined,
  ): Promise<{ code: number; body: unknown }> {
    const method = req.method ?? 'GET';
    if (sub !== undefined && sub !== 'status')
      throw new HttpError(404, 'NotFound', `the server could not find the requested resource (pods/${sub})`);
    if (method === 'GET') return { code: 200, body: getPodOr404(ns, name) };
    if (method === 'PATCH' || method === 'PUT') {
      const body = await readBody(req);
      const current = getPodOr404(ns, name);
      let next: V1Pod;
      let givenRv: string | undefined;
      if (method === 'PATCH') {
        next = applyPatch(req, current, body);
        givenRv = next.metadata?.resourceVersion;
        if (givenRv === current.metadata!.resourceVersion) givenRv = undefined;
      } else {
        if (body === null || typeof body !== 'object') throw new HttpError(400, 'BadRequest', 'PUT needs a Pod object');
        next = body as V1Pod;
        givenRv = next.metadata?.resourceVersion;
        next.metadata ??= {};
        next.metadata.uid ??= current.metadata!.uid;
        next.metadata.namespace ??= ns;
        next.metadata.creationTimestamp = current.metadata!.creationTimestamp;
      }
      if (sub === 'status') {
        // The status subresource changes status, labels and annotations (what the real pod
        // status strategy lets through), never the spec; a uid in the body stays a precondition.
        const meta = next.metadata ?? {};
        next = {
          ...clone(current),
          metadata: { ...clone(current.metadata!), uid: meta.uid, labels: meta.labels, annotations: meta.annotations },
          status: next.status,
        };
      } else if (method === 'PUT') {
        // The main resource ignores status changes.
        next = { ...next, status: clone(current.status) };
      }
      return { code: 200, body: updatePod(current, next, givenRv) };
    }
    if (method === 'DELETE' && sub === undefined) {
      const body = (await readBody(req)) as { preconditions?: { uid?: string; resourceVersion?: string } } | undefined;
      const current = getPodOr404(ns, name);
      const pre = body?.preconditions;
      if (pre?.uid && pre.uid !== current.metadata!.uid) {
        throw new HttpError(
          409,
          'Conflict',
          `Operation cannot be fulfilled on Pod "${name}": Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${current.metadata!.uid}`,
        );
      }
      if (pre?.resourceVersion && pre.resourceVersion !== current.metadata!.resourceVersion) {
        throw new HttpError(
          409,
          'Conflict',
          `Operation cannot be fulfilled on Pod "${name}": Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in object meta: ${current.metadata!.resourceVersion}`,
        );
      }
      return { code: 200, body: removePod(ns, name) };
    }
    throw new HttpError(405, 'MethodNotAllowed', `the server does not allow this method on the requested resource`);
  }

  /**
   * A node's status read and its patches: the main resource takes spec and metadata (taints), the
   * status subresource status (and labels, annotations), as the node strategies do; a
   * resourceVersion or uid in the patch is a precondition (409). A strategic merge patch merges
   * status.conditions by type (their patch merge key), so a writer of one condition keeps the others.
   */
  async function nodeRoutes(
    req: IncomingMessage,
    name: string,
    sub: string | undefined,
  ): Promise<{ code: number; body: unknown }> {
    const current = nodes.get(name);
    if (!current) throw new HttpError(404, 'NotFound', `nodes "${name}" not found`);
    if (req.method === 'GET') return { code: 200, body: current };
    const patch = (await readBody(req)) as V1Node | undefined;
    let next = applyPatch(req, current as V1Pod, patch) as V1Node;
    const smp = (req.headers['content-type'] ?? '').startsWith('application/strategic-merge-patch+json');
    const patched = patch?.status?.conditions;
    if (smp && Array.isArray(patched)) {
      const merged = [...(current.status?.conditions ?? [])];
      for (const c of patched) {
        const at = merged.findIndex((o) => o.type === c.type);
        if (at >= 0) merged[at] = c;
        else merged.push(c);
      }
      next = { ...next, status: { ...next.status, conditions: merged } };
    }
    const meta = next.metadata ?? {};
    const conflict = (why: string) =>
      new HttpError(409, 'Conflict', `Operation cannot be fulfilled on nodes "${name}": ${why}`);
    if (meta.name !== name) throw new HttpError(422, 'Invalid', `Node "${name}" is invalid: metadata.name: immutable`);
    if (meta.uid !== current.metadata!.uid) throw conflict('the UID in the request does not match');
    if (meta.resourceVersion !== current.metadata!.resourceVersion)
      throw conflict('the object has been modified; please apply your changes to the latest version and try again');
    const stored: V1Node =
      sub === 'status'
        ? {
            ...clone(current),
            metadata: { ...clone(current.metadata!), labels: meta.labels, annotations: meta.annotations },
            status: next.status,
          }
        : { ...next, status: clone(current.status) };
    stored.metadata!.resourceVersion = String(nextRv());
    nodes.set(name, stored);
    return { code: 200, body: clone(stored) };
  }

  const discovery = () => ({
    version: {
      major: '1',
      minor: '32',
      gitVersion: 'v1.32.0-mesh-cni-test',
      platform: 'linux/amd64',
      goVersion: 'go1.23',
      compiler: 'gc',
    },
    api: {
      kind: 'APIVersions',
      versions: ['v1'],
      serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: `127.0.0.1:${port}` }],
    },
    apis: {
      kind: 'APIGroupList',
      apiVersion: 'v1',
      groups: [
        {
          name: 'apps',
          versions: [{ groupVersion: 'apps/v1', version: 'v1' }],
          preferredVersion: { groupVersion: 'apps/v1', version: 'v1' },
        },
      ],
    },
    coreV1: {
      kind: 'APIResourceList',
      groupVersion: 'v1',
      resources: [
        {
          name: 'pods',
          singularName: 'pod',
          namespaced: true,
          kind: 'Pod',
          verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
          shortNames: ['po'],
          categories: ['all'],
        },
        { name: 'pods/status', singularName: '', namespaced: true, kind: 'Pod', verbs: ['get', 'patch', 'update'] },
        {
          name: 'events',
          singularName: 'event',
          namespaced: true,
          kind: 'Event',
          verbs: ['create', 'get', 'list'],
          shortNames: ['ev'],
        },
      ],
    },
    appsV1: {
      kind: 'APIResourceList',
      groupVersion: 'apps/v1',
      resources: [
        {
          name: 'daemonsets',
          singularName: 'daemonset',
          namespaced: true,
          kind: 'DaemonSet',
          verbs: ['get', 'list'],
          shortNames: ['ds'],
          categories: ['all'],
        },
      ],
    },
  });

  interface TokenRequestBody {
    spec?: { audiences?: string[]; expirationSeconds?: number };
  }

  /** TokenRequest: a new token of a known service account, acting as it until it expires. */
  function tokenRequest(ns: string, name: string, body: TokenRequestBody | undefined): { code: number; body: unknown } {
    const id = accounts.get(key(ns, name));
    if (!id) throw new HttpError(404, 'NotFound', `serviceaccounts "${name}" not found`);
    const asked = body?.spec?.expirationSeconds ?? 3600;
    if (!Number.isInteger(asked) || asked < 600) {
      throw new HttpError(
        422,
        'Invalid',
        `TokenRequest.authentication.k8s.io "${name}" is invalid: spec.expirationSeconds: Invalid value: ${asked}: may not specify a duration less than 10 minutes`,
      );
    }
    const seconds = Math.min(asked, tokenMaxSeconds ?? asked);
    const audiences = body?.spec?.audiences?.length ? body.spec.audiences : [DEFAULT_AUDIENCE];
    const expiresAt = Date.now() + seconds * 1000;
    // As the real one: iat and exp in whole seconds of the server's clock, exp = iat + lifetime.
    const iat = Math.floor((Date.now() + clockSkewMs) / 1000);
    const t = unsignedJwt({
      aud: audiences,
      exp: iat + seconds,
      iat,
      nbf: iat,
      iss: DEFAULT_AUDIENCE,
      jti: randomUUID(),
      'kubernetes.io': { namespace: ns, serviceaccount: { name, uid: randomUUID() } },
      sub: id.user,
    });
    tokens.set(t, { identity: id, expiresAt, audiences });
    const expirationTimestamp = new Date((iat + seconds) * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
    issued.push({ token: t, serviceAccount: key(ns, name), audiences, expirationTimestamp });
    const answer: TokenRequestAnswer = {
      kind: 'TokenRequest',
      apiVersion: 'authentication.k8s.io/v1',
      metadata: { name, namespace: ns, creationTimestamp: nowTimestamp() },
      spec: { audiences, expirationSeconds: seconds, boundObjectRef: null },
      status: { token: t, expirationTimestamp },
    };
    return { code: 201, body: faults.tokenAnswer ? faults.tokenAnswer(answer) : answer };
  }

  async function route(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    rec: RequestRecord,
  ): Promise<{ code: number; body: unknown; contentType?: string } | undefined> {
    const method = req.method ?? 'GET';
    const p = url.pathname.replace(/\/+$/, '') || '/';
    const q = url.searchParams;
    if (method === 'GET') {
      const d = discovery();
      if (p === '/version') return { code: 200, body: d.version };
      if (p === '/api') return { code: 200, body: d.api };
      if (p === '/apis') return { code: 200, body: d.apis };
      if (p === '/api/v1') return { code: 200, body: d.coreV1 };
      if (p === '/apis/apps/v1') return { code: 200, body: d.appsV1 };
    }
    if (p === '/api/v1/namespaces' && method === 'GET') return namespaceRoutes(req, res, q, rec);
    const nsGet = /^\/api\/v1\/namespaces\/([^/]+)$/.exec(p);
    if (nsGet && method === 'GET') {
      const name = decodeURIComponent(nsGet[1]!);
      const n = namespaces.get(name);
      if (!n) throw new HttpError(404, 'NotFound', `namespaces "${name}" not found`);
      rec.objectsRead = 1;
      return { code: 200, body: clone(n) };
    }
    let m = /^\/api\/v1(?:\/namespaces\/([^/]+))?\/pods$/.exec(p);
    if (m) {
      const ns = m[1] === undefined ? undefined : decodeURIComponent(m[1]);
      if (method === 'GET') {
        if (q.get('watch') === 'true' || q.get('watch') === '1') {
          startWatch(req, res, q, ns, rec);
          return undefined;
        }
        const r = listPodsResponse(req, q, ns, rec);
        return { code: 200, body: r.body, contentType: r.contentType };
      }
      if (method === 'POST' && ns !== undefined) {
        const body = (await readBody(req)) as V1Pod | undefined;
        const name = body?.metadata?.name;
        if (!name) throw new HttpError(422, 'Invalid', 'Pod is invalid: metadata.name: Required value');
        if (pods.has(key(ns, name))) throw new HttpError(409, 'AlreadyExists', `pods "${name}" already exists`);
        const pod = clone(body);
        pod.metadata!.namespace = ns;
        delete pod.metadata!.uid;
        delete pod.metadata!.resourceVersion;
        return { code: 201, body: upsertPod(pod) };
      }
      throw new HttpError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource');
    }
    m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)(?:\/([^/]+))?$/.exec(p);
    if (m) {
      if (method === 'GET') rec.objectsRead = 1;
      return podRoutes(req, decodeURIComponent(m[1]!), decodeURIComponent(m[2]!), m[3]);
    }
    m = /^\/api\/v1(?:\/namespaces\/([^/]+))?\/events$/.exec(p);
    if (m) {
      const ns = m[1] === undefined ? undefined : decodeURIComponent(m[1]);
      if (method === 'POST' && ns !== undefined) {
        const ev = ((await readBody(req)) ?? {}) as CoreV1Event;
        ev.metadata ??= {};
        if (ev.metadata.namespace && ev.metadata.namespace !== ns) {
          throw new HttpError(
            400,
            'BadRequest',
            `the namespace of the provided object does not match the namespace sent on the request`,
          );
        }
        ev.metadata.namespace = ns;
        ev.metadata.name ??= `${ev.metadata.generateName ?? 'event.'}${randomUUID().slice(0, 8)}`;
        ev.metadata.uid = randomUUID();
        ev.metadata.resourceVersion = String(nextRv());
        ev.kind = 'Event';
        ev.apiVersion = 'v1';
        events.push(clone(ev));
        return { code: 201, body: ev };
      }
      if (method === 'GET') {
        return {
          code: 200,
          body: {
            kind: 'EventList',
            apiVersion: 'v1',
            metadata: { resourceVersion: String(rv) },
            items: events.filter((e) => ns === undefined || e.metadata?.namespace === ns),
          },
        };
      }
      throw new HttpError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource');
    }
    m = /^\/api\/v1\/namespaces\/([^/]+)\/serviceaccounts\/([^/]+)\/token$/.exec(p);
    if (m && method === 'POST')
      return tokenRequest(
        decodeURIComponent(m[1]!),
        decodeURIComponent(m[2]!),
        (await readBody(req)) as TokenRequestBody | undefined,
      );
    m = /^\/apis\/apps\/v1\/namespaces\/([^/]+)\/daemonsets(?:\/([^/]+))?$/.exec(p);
    if (m && method === 'GET') {
      const ns = decodeURIComponent(m[1]!);
      if (m[2] === undefined) {
        const items = [...daemonSets.values()].filter((ds) => ds.metadata?.namespace === ns);
        return {
          code: 200,
          body: { kind: 'DaemonSetList', apiVersion: 'apps/v1', metadata: { resourceVersion: String(rv) }, items },
        };
      }
      const name = decodeURIComponent(m[2]);
      const ds = daemonSets.get(key(ns, name));
      if (!ds) throw new HttpError(404, 'NotFound', `daemonsets.apps "${name}" not found`);
      return { code: 200, body: ds };
    }
    m = /^\/api\/v1\/nodes\/([^/]+)$/.exec(p);
    if (m && method === 'GET') {
      const name = decodeURIComponent(m[1]!);
      const node = nodes.get(name);
      if (!node) throw new HttpError(404, 'NotFound', `nodes "${name}" not found`);
      return { code: 200, body: node };
    }
    m = /^\/api\/v1\/nodes\/([^/]+)(?:\/(status))?$/.exec(p);
    if (m && (method === 'PATCH' || method === 'GET')) return nodeRoutes(req, decodeURIComponent(m[1]!), m[2]);
    throw new HttpError(404, 'NotFound', 'the server could not find the requested resource');
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'https://localhost');
    const rec: RequestRecord = {
      method: req.method ?? 'GET',
      path: url.pathname,
      query: url.search.replace(/^\?/, ''),
      status: 0,
      time: Date.now(),
    };
    requests.push(rec);
    const send = (
      code: number,
      body: unknown,
      headers: Record<string, string> = {},
      contentType = 'application/json',
    ) => {
      rec.status = code;
      if (res.headersSent || res.destroyed) return;
      const text = JSON.stringify(body);
      res.writeHead(code, { 'content-type': contentType, 'content-length': Buffer.byteLength(text), ...headers });
      res.end(text);
    };
    try {
      if (faults.delayMs) await new Promise((r) => setTimeout(r, faults.delayMs));
      const auth = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
      const who = auth ? tokens.get(auth[1]!) : undefined;
      if (
        !who ||
        (who.expiresAt !== undefined && who.expiresAt <= Date.now()) ||
        !who.audiences.includes(DEFAULT_AUDIENCE)
      ) {
        throw new HttpError(401, 'Unauthorized', 'Unauthorized');
      }
      const attrs = requestAttributes(req.method ?? 'GET', url.pathname.replace(/\/+$/, ''), url.searchParams);
      if (attrs && !allows(who.identity.rules, attrs)) {
        const res = attrs.resource.split('/')[0];
        throw new HttpError(
          403,
          'Forbidden',
          `${res}${attrs.name ? ` "${attrs.name}"` : ''} is forbidden: User "${who.identity.user}" cannot ${attrs.verb} resource "${attrs.resource}" in API group "${attrs.group}"${attrs.namespace !== undefined ? ` in the namespace "${attrs.namespace}"` : ' at the cluster scope'}`,
        );
      }
      const f = faults.status;
      if (f && (!f.paths || f.paths.test(url.pathname))) {
        if (f.count !== undefined) {
          f.count--;
          if (f.count <= 0) delete faults.status;
        }
        throw new HttpError(f.code, REASONS[f.code] ?? 'Unknown', `injected fault: ${f.code}`, f.retryAfterSeconds);
      }
      const out = await route(req, res, url, rec);
      if (out) send(out.code, out.body, {}, out.contentType);
    } catch (e) {
      if (e instanceof HttpError) {
        const headers: Record<string, string> =
          e.retryAfterSeconds !== undefined ? { 'retry-after': String(e.retryAfterSeconds) } : {};
        send(e.code, statusObject(e.code, e.message, e.reason, e.retryAfterSeconds), headers);
      } else {
        send(500, statusObject(500, `internal error in the test API server: ${(e as Error).stack ?? String(e)}`));
      }
    }
  }

  const server = https.createServer({ cert: certs.certPem, key: certs.keyPem }, (req, res) => void handle(req, res));
  let handshakes = 0;
  server.on('secureConnection', () => handshakes++);
  server.on('connection', (s: Socket) => {
    s.setNoDelay(true);
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  const host = '127.0.0.1';
  let port = 0;
  let listening = false;

  async function start(): Promise<void> {
    if (listening) return;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    port = (server.address() as AddressInfo).port;
    listening = true;
  }

  function closeWatches(): void {
    for (const w of [...watches]) endWatch(w);
    for (const w of [...nsWatches]) endNsWatch(w);
  }

  function endNsWatch(w: { res: ServerResponse; timers: NodeJS.Timeout[] }): void {
    for (const t of w.timers) clearTimeout(t);
    nsWatches.delete(w);
    if (!w.res.writableEnded) w.res.end();
  }

  function writeNs(res: ServerResponse, type: string, object: unknown): void {
    if (!res.writableEnded && !res.destroyed) res.write(JSON.stringify({ type, object }) + '\n');
  }

  function recordNs(type: EventType, obj: V1Namespace): void {
    const h = { rv: Number(obj.metadata!.resourceVersion), type, obj: clone(obj) };
    nsHistory.push(h);
    for (const w of nsWatches) writeNs(w.res, type, h.obj);
  }

  function upsertNamespace(ns: V1Namespace): V1Namespace {
    const n = clone(ns);
    n.metadata ??= {};
    if (!n.metadata.name) throw new Error('upsertNamespace: metadata.name is required');
    const old = namespaces.get(n.metadata.name);
    n.apiVersion ??= 'v1';
    n.kind ??= 'Namespace';
    n.metadata.uid ??= old?.metadata?.uid ?? randomUUID();
    n.metadata.resourceVersion = String(nextRv());
    n.status ??= { phase: 'Active' };
    namespaces.set(n.metadata.name, n);
    recordNs(old ? 'MODIFIED' : 'ADDED', n);
    return clone(n);
  }

  function removeNamespace(name: string): void {
    const old = namespaces.get(name);
    if (!old) return;
    namespaces.delete(name);
    const gone = clone(old);
    gone.metadata!.resourceVersion = String(nextRv());
    recordNs('DELETED', gone);
  }

  function namespaceRoutes(req: IncomingMessage, res: ServerResponse, q: URLSearchParams, rec: RequestRecord) {
    const list = () => [...namespaces.values()].sort((a, b) => (a.metadata!.name! < b.metadata!.name! ? -1 : 1));
    if (q.get('watch') !== 'true' && q.get('watch') !== '1') {
      checkRv(q.get('resourceVersion'), 'list', q.get('resourceVersionMatch') === 'NotOlderThan');
      rec.objectsRead = namespaces.size;
      const metadata = { resourceVersion: String(rv) };
      return { code: 200, body: { kind: 'NamespaceList', apiVersion: 'v1', metadata, items: list() } };
    }
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-cache, private' });
    res.flushHeaders();
    rec.status = 200;
    const w = { res, timers: [] as NodeJS.Timeout[] };
    nsWatches.add(w);
    res.on('close', () => endNsWatch(w));
    let from: number | undefined;
    try {
      from = checkRv(q.get('resourceVersion'), 'watch');
    } catch (e) {
      const err = e as HttpError;
      writeNs(res, 'ERROR', statusObject(err.code, err.message, err.reason));
      endNsWatch(w);
      return undefined;
    }
    if (from === undefined) for (const n of list()) writeNs(res, 'ADDED', n);
    else for (const h of nsHistory) if (h.rv > from) writeNs(res, h.type, h.obj);
    if (q.get('allowWatchBookmarks') === 'true') {
      const tick = () => {
        writeNs(res, 'BOOKMARK', { kind: 'Namespace', apiVersion: 'v1', metadata: { resourceVersion: String(rv) } });
        w.timers.push(setTimeout(tick, bookmarkIntervalMs).unref());
      };
      w.timers.push(setTimeout(tick, bookmarkIntervalMs).unref());
    }
    const timeout = Number(q.get('timeoutSeconds') ?? '0');
    if (timeout > 0) w.timers.push(setTimeout(() => endNsWatch(w), timeout * 1000).unref());
    return undefined;
  }

  async function stop(): Promise<void> {
    if (!listening) return;
    listening = false;
    closeWatches();
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const s of sockets) s.destroy();
    await closed;
  }

  await start();
  const url = `https://${host}:${port}`;

  const api: TestApiServer = {
    url,
    host,
    get port() {
      return port;
    },
    get caPem() {
      return certs.caPem;
    },
    token,
    upsertPod,
    getPod: (ns, name) => {
      const p = pods.get(key(ns, name));
      return p ? clone(p) : undefined;
    },
    deletePodFromStore: (ns, name) => void removePod(ns, name),
    listPods: () => [...pods.values()].map(clone),
    upsertNamespace,
    deleteNamespaceFromStore: (name) => removeNamespace(name),
    openNamespaceWatches: () => nsWatches.size,
    upsertDaemonSet: (ds) => {
      const d = clone(ds);
      d.metadata ??= {};
      d.metadata.namespace ??= 'default';
      d.apiVersion ??= 'apps/v1';
      d.kind ??= 'DaemonSet';
      const old = daemonSets.get(key(d.metadata.namespace, d.metadata.name!));
      d.metadata.uid ??= old?.metadata?.uid ?? randomUUID();
      d.metadata.creationTimestamp ??= old?.metadata?.creationTimestamp ?? (nowTimestamp() as unknown as Date);
      d.metadata.resourceVersion = String(nextRv());
      daemonSets.set(key(d.metadata.namespace, d.metadata.name!), d);
      return clone(d);
    },
    deleteDaemonSetFromStore: (ns, name) => void daemonSets.delete(key(ns, name)),
    upsertNode: (node) => {
      const n = clone(node);
      n.metadata ??= {};
      n.apiVersion ??= 'v1';
      n.kind ??= 'Node';
      n.metadata.uid ??= nodes.get(n.metadata.name!)?.metadata?.uid ?? randomUUID();
      n.metadata.resourceVersion = String(nextRv());
      nodes.set(n.metadata.name!, n);
      return clone(n);
    },
    deleteNodeFromStore: (name) => void nodes.delete(name),
    events: () => events.map(clone),
    requests,
    faults,
    closeWatches,
    rotateCertificate: async () => {
      // A new CA and serving certificate; every open connection (watches too) is cut, so
      // clients reconnect and must trust the new CA.
      certs = await makeTestCerts();
      server.setSecureContext({ cert: certs.certPem, key: certs.keyPem });
      closeWatches();
      for (const sock of sockets) sock.destroy();
      return certs.caPem;
    },
    expireResourceVersions: () => {
      // Everything handed out so far is now too old; open watches learn it the way real ones do.
      oldestValidRv = nextRv();
      for (const w of [...nsWatches]) {
        writeNs(w.res, 'ERROR', statusObject(410, `too old resource version (${oldestValidRv})`, 'Expired'));
        endNsWatch(w);
      }
      for (const w of [...watches]) {
        writeEvent(
          w,
          'ERROR',
          statusObject(410, `too old resource version: ${oldestValidRv - 1} (${oldestValidRv})`, 'Expired'),
        );
        endWatch(w);
      }
    },
    stop,
    start,
    writeOrchconfig: (file, o = {}) => {
      const cluster: Record<string, unknown> = { server: url };
      if (o.insecure) cluster['insecure-skip-tls-verify'] = true;
      else cluster['certificate-authority-data'] = Buffer.from(certs.caPem).toString('base64');
      const config = {
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'mesh-cni-test', cluster }],
        users: [{ name: 'mesh-cni-test', user: { token: o.token ?? token } }],
        contexts: [
          { name: 'mesh-cni-test', context: { cluster: 'mesh-cni-test', user: 'mesh-cni-test', namespace: 'default' } },
        ],
        'current-context': 'mesh-cni-test',
        preferences: {},
      };
      writeFileSync(file, JSON.stringify(config, null, 2), { mode: 0o600 });
      return file;
    },
    close: stop,
    serviceAccount: (ns, name, rules) => {
      const id = account(ns, name, rules);
      const t = `sa-${ns}-${name}-${randomUUID()}`;
      tokens.set(t, { identity: id, audiences: [DEFAULT_AUDIENCE] });
      return t;
    },
    setRules: (t, rules) => {
      const who = tokens.get(t);
      if (!who) throw new Error('setRules: unknown token');
      who.identity.rules = rules;
    },
    issuedTokens: () => issued.map((t) => ({ ...t })),
    get tokenMaxSeconds() {
      return tokenMaxSeconds;
    },
    set tokenMaxSeconds(v) {
      tokenMaxSeconds = v;
    },
    get clockSkewMs() {
      return clockSkewMs;
    },
    set clockSkewMs(v) {
      clockSkewMs = v;
    },
    openWatches: () => watches.size,
    connections: () => handshakes,
  };
  return api;
}

/** One HTTPS request to the test server with its CA and token; for tests that poke the API directly. */
export function apiRequest(
  server: Pick<TestApiServer, 'host' | 'port' | 'caPem' | 'token'>,
  method: string,
  pathAndQuery: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: unknown; text: string }> {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const req = https.request(
      {
        host: server.host,
        port: server.port,
        method,
        path: pathAndQuery,
        ca: server.caPem,
        headers: {
          authorization: `Bearer ${server.token}`,
          accept: 'application/json',
          ...(text !== undefined
            ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }
            : {}),
          ...headers,
        },
        timeout: 10_000,
      },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (data += d));
        res.on('end', () => {
          let parsed: unknown;
          try {
            parsed = data === '' ? undefined : JSON.parse(data);
          } catch {
            parsed = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: parsed, text: data });
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${pathAndQuery}: no answer in 10s`)));
    req.on('error', reject);
    req.end(text);
  });
}

/** Opens a watch and collects its events until `close()`; `next(pred)` waits for a matching one. */
export function openWatch(server: Pick<TestApiServer, 'host' | 'port' | 'caPem' | 'token'>, pathAndQuery: string) {
  const got: Array<{ type: string; object: Record<string, unknown> }> = [];
  const waiters: Array<() => void> = [];
  let ended = false;
  let buf = '';
  const req = https.request(
    {
      host: server.host,
      port: server.port,
      method: 'GET',
      path: pathAndQuery,
      ca: server.caPem,
      headers: { authorization: `Bearer ${server.token}` },
    },
    (res) => {
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line.trim()) got.push(JSON.parse(line) as { type: string; object: Record<string, unknown> });
        }
        for (const w of waiters.splice(0)) w();
      });
      res.on('end', () => {
        ended = true;
        for (const w of waiters.splice(0)) w();
      });
    },
  );
  req.on('error', () => {
    ended = true;
  });
  req.end();
  return {
    events: got,
    ended: () => ended,
    async next(pred: (e: { type: string; object: Record<string, unknown> }) => boolean, timeoutMs = 5000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const hit = got.find(pred);
        if (hit) return hit;
        if (ended)
          throw new Error(
            `watch ${pathAndQuery} ended without the expected event; got ${JSON.stringify(got.map((e) => e.type))}`,
          );
        const left = deadline - Date.now();
        if (left <= 0)
          throw new Error(
            `no expected event on watch ${pathAndQuery} within ${timeoutMs} ms; got ${JSON.stringify(got.map((e) => e.type))}`,
          );
        await new Promise<void>((r) => {
          const t = setTimeout(r, left);
          waiters.push(() => {
            clearTimeout(t);
            r();
          });
        });
      }
    },
    close: () => req.destroy(),
  };
}

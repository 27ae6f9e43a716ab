// Pod lookups for the plugin, answered from this node's pod watch (built once by the agent's
// wiring, src/agent.ts, and shared with repair) over a unix socket (--pod-lookup-uds-address).
// Reading the pod from the API server costs the plugin a TLS set-up and handshake (~30 ms) on
// every pod start; the agent already holds a warm watch of the pods of its node, so it answers
// in about a millisecond. The plugin falls back to the API server
// whenever this answer is not there (no socket, a miss, a timeout): never less safe, only faster.
//
// Wire format: cni-plugin/shared/podlookup.ts (one request line, one reply line, then closed).
// A pod not (yet) in the watch, or cached under another uid, is waited for up to `waitMs`: the
// runtime calls the plugin for a pod the kubelet just saw, and our watch sees it at about the
// same moment.
//
// An answer must never give the plugin fewer rules than the API server's current pod would
// (fewer rules would let a pod's traffic bypass the mesh), so the agent answers only when its cache
// is the pod the runtime means, as the live watch sees it: the request names the pod's uid
// (K8S_POD_UID), the cached pod has that uid, and the watch is up (listed and watching). No uid (a
// pod deleted and re-created under the same name is another pod the cache may not have seen go),
// another uid, a watch that is listing, backing off or stopped: a miss, and the plugin reads the
// pod from the API server. A watch that went silent without closing looks up until its silence
// timeout; the uid still pins the pod object, so what it can hide is only an annotation edit to
// that same pod in that window, which no ADD design catches either (rules are derived once per
// ADD).

import type { V1Pod } from '@kubernetes/client-node';
import net from 'node:net';
import type { Component } from '../component.ts';
import { disabledComponent } from '../component.ts';
import { LineSplitter } from '../monitoring/lines.ts';
import { scope } from '../monitoring/logging.ts';
import { combinations, knownCounter } from '../monitoring/metrics.ts';
import { listenUnix } from '../monitoring/unixsocket.ts';
import { socketRefusal } from '../../cni-plugin/shared/trustedpath.ts';
import { orchApi, type OrchClientArgs } from '../orch/client.ts';
import { nodePodSource, type PodSource } from '../orch/podsource.ts';
import { isPodWithUid } from '../../cni-plugin/shared/poduid.ts';
import {
  POD_LOOKUP_MAX_REQUEST_BYTES as MAX_REQUEST_BYTES,
  type PodLookupReply,
  type PodLookupRequest,
} from '../../cni-plugin/shared/podlookup.ts';

const log = scope('install');

const lookups = knownCounter({
  name: 'mesh_cni_pod_lookups_total',
  help: 'Pod lookups the plugin asked the agent for, by result: hit (answered from the watch), miss (the plugin asks the API server), bad_request.',
  series: combinations({ result: ['hit', 'miss', 'bad_request'] }),
});

export interface PodLookupOptions {
  /** How long a lookup waits for a pod the watch has not delivered yet. */
  readonly waitMs: number;
  /** Connections held at once; one more closes the oldest. */
  readonly maxConnections: number;
  /** The request line must be complete this soon after connecting. */
  readonly requestTimeoutMs: number;
  /**
   * Ambient mode: the labels of a namespace as the agent's namespace watch holds them, sent with
   * a hit so the plugin decides without the API server; undefined (not known, not synced): none
   * sent, and the plugin reads the namespace itself.
   */
  readonly namespaceLabels?: (namespace: string) => Readonly<Record<string, string>> | undefined;
}

export const DEFAULT_POD_LOOKUP: PodLookupOptions = { waitMs: 250, maxConnections: 256, requestTimeoutMs: 1000 };

type LookupAnswer = PodLookupReply<V1Pod>;
type Request = PodLookupRequest;

function parseRequest(line: Buffer): Request | null {
  try {
    const r = JSON.parse(line.toString('utf8')) as Partial<Request>;
    if (typeof r.namespace !== 'string' || typeof r.name !== 'string' || r.namespace === '' || r.name === '')
      return null;
    return { namespace: r.namespace, name: r.name, uid: typeof r.uid === 'string' ? r.uid : '' };
  } catch {
    return null;
  }
}

/** Lookups in the watch of this node's pods that can wait a moment for a pod to arrive. */
export class NodePods {
  readonly #source: PodSource;
  readonly #waiters = new Set<{ req: Request; done: (pod: V1Pod) => void }>();

  /** Reads `source`, which whoever built it starts and stops. */
  constructor(source: PodSource) {
    this.#source = source;
    // Lookups read the source's cache; the handler only wakes lookups waiting for a pod.
    source.addHandler({
      upsert: (pod) => {
        for (const w of this.#waiters) if (matches(pod, w.req)) w.done(pod);
      },
      remove: () => {},
    });
  }

  get synced(): Promise<void> {
    return this.#source.synced;
  }

  status(): Record<string, unknown> {
    return { ...this.#source.status(), waiting: this.#waiters.size };
  }

  /**
   * The pod, waiting up to `waitMs` for it, or why not (see the top of this file for when the
   * cache may answer). Only a live watch is waited on: while it is down, a miss at once lets the
   * plugin ask the API server sooner.
   */
  lookup(req: Request, waitMs: number): Promise<LookupAnswer> {
    const what = `pod ${req.namespace}/${req.name}`;
    if (req.uid === '')
      return Promise.resolve({
        miss: `no pod uid in the request (K8S_POD_UID): this node's pod watch cannot tell which ${what} is meant`,
      });
    if (this.#source.state !== 'watching')
      return Promise.resolve({ miss: `this node's pod watch is not current (${this.#source.state})` });
    const cached = this.#source.get(req.namespace, req.name);
    if (cached && matches(cached, req)) return Promise.resolve({ pod: cached });
    return new Promise((resolve) => {
      const waiter = {
        req,
        done: (pod: V1Pod | null) => {
          clearTimeout(timer);
          this.#waiters.delete(waiter);
          resolve(pod ? { pod } : { miss: `${what} uid ${req.uid} is not in this node's pod watch` });
        },
      };
      const timer = setTimeout(() => waiter.done(null), waitMs);
      this.#waiters.add(waiter);
    });
  }
}

function matches(pod: V1Pod, req: Request): boolean {
  return pod.metadata?.namespace === req.namespace && pod.metadata?.name === req.name && isPodWithUid(pod, req.uid);
}

/** What the pod lookup reads of the settings. */
export interface PodLookupArgs {
  /** --pod-lookup-uds-address; empty: off. */
  readonly address: string;
  /** NODE_NAME: the node whose pods are served; empty: off. */
  readonly nodeName: string;
  /** For a node watch of the lookup's own, when it is handed none. */
  readonly orch: OrchClientArgs;
}

/**
 * Serves pod lookups from `nodePods`, the node's pod watch the agent runs. Without one (a lookup
 * on its own, as tests and benchmarks run it) it starts a node watch for itself and stops it after.
 */
export async function startPodLookup(
  args: PodLookupArgs,
  options: Partial<PodLookupOptions> = {},
  nodePods?: PodSource,
): Promise<Component> {
  const opts: PodLookupOptions = { ...DEFAULT_POD_LOOKUP, ...options };
  const { address, nodeName } = args;
  if (address === '') return disabledComponent('pod-lookup');
  if (nodeName === '') {
    // Watching every pod of the cluster from every node is not an option.
    log.warn('NODE_NAME is not set: the plugin will read pods from the API server itself', { address });
    return disabledComponent('pod-lookup');
  }
  const own = nodePods ? undefined : nodePodSource(orchApi(args.orch), nodeName, 'install');
  own?.start();
  const pods = new NodePods(nodePods ?? own!);
  const server = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    // The plugin writes its request at once: a sender still not done at the deadline is cut,
    // however often it sends a byte (an idle timer alone would let a byte a second hold a slot).
    const requestDeadline = setTimeout(() => socket.destroy(), opts.requestTimeoutMs);
    socket.setTimeout(opts.waitMs + 1000, () => socket.destroy());
    socket.on('close', () => clearTimeout(requestDeadline));
    let answered = false;
    const answer = (reply: object) => {
      if (answered) return;
      answered = true;
      // Nothing more is read (see `first`), so the peer's end is never seen: close once sent.
      socket.end(JSON.stringify(reply) + '\n', () => socket.destroy());
    };
    // One request a connection: after the first line (or a too long one) nothing more is read
    // or parsed, so one connection can start one lookup, hold one request's bytes, no more.
    let requested = false;
    const first =
      <A extends unknown[]>(handle: (...args: A) => void) =>
      (...args: A) => {
        if (requested) return;
        requested = true;
        clearTimeout(requestDeadline);
        socket.off('data', onData);
        socket.pause();
        handle(...args);
      };
    const lines = new LineSplitter(
      MAX_REQUEST_BYTES,
      first((line: Buffer) => {
        const req = parseRequest(line);
        if (!req) {
          lookups.inc({ result: 'bad_request' });
          answer({ miss: 'bad request: expected {"namespace","name","uid"}' });
          return;
        }
        void pods.lookup(req, opts.waitMs).then((found) => {
          let reply = found;
          const nsLabels = 'pod' in reply ? opts.namespaceLabels?.(req.namespace) : undefined;
          if ('pod' in reply && nsLabels) reply = { pod: reply.pod, namespaceLabels: nsLabels };
          lookups.inc({ result: 'pod' in reply ? 'hit' : 'miss' });
          if ('miss' in reply)
            log.debug('pod lookup miss', { pod: `${req.namespace}/${req.name}`, uid: req.uid, reason: reply.miss });
          answer(reply);
        });
      }),
      first(() => {
        lookups.inc({ result: 'bad_request' });
        answer({ miss: 'bad request: too long' });
      }),
    );
    const onData = (chunk: Buffer) => lines.push(chunk);
    socket.on('data', onData);
  });
  let close: () => Promise<void>;
  try {
    // At the limit a new connection closes the oldest: held connections cannot lock the plugin out.
    close = await listenUnix(server, address, 'pod lookups', '--pod-lookup-uds-address', {
      maxConnections: opts.maxConnections,
    });
  } catch (e) {
    // A speed-up, not a duty: without it the plugin reads pods from the API server itself, unless
    // its own check refuses the path (someone else could answer there): then it fails every ADD
    // that asks with code 11 (cni-plugin/orch/agentlookup.ts). Its check says which, here too.
    const refusal = socketRefusal(address);
    log.error(
      refusal === null
        ? 'cannot serve pod lookups; the plugin reads pods from the API server instead'
        : `cannot serve pod lookups, and the plugin refuses that path too (${refusal}): every ADD that ` +
            'asks it for a pod fails with CNI error 11 until the path is fixed',
      { error: (e as Error).message },
    );
    await own?.stop();
    return { ...disabledComponent('pod-lookup'), status: () => ({ enabled: false, error: (e as Error).message }) };
  }
  log.info('serving pod lookups to the plugin', { path: address, node: nodeName });
  return {
    name: 'pod-lookup',
    notReadyReasons: () => [],
    status: () => ({ address, ...pods.status() }),
    stop: async () => {
      await close();
      await own?.stop();
    },
  };
}

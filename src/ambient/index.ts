// Ambient mode as a part of the agent (--ambient-enabled): the namespace watch, the dataplane
// (src/ambient/dataplane.ts) and the informer (informer.ts) on the node's one pod watch, in
// Istio's order (its nodeagent's server start-up): wait for the pod and namespace caches, build the
// dataplane's start-up state from the running pods that should be ambient (snapshot.ts
// podsAtStart: never from the pods' annotation), then start the informer queue.
// /readyz says not ready until then. The start runs in the background, retried with backoff,
// so the agent's other parts (the pod lookup, the installer) come up meanwhile: an ambient pod's
// ADD before then fails (no enrollment, the plugin's error) and the kubelet retries it.
//
// Stop: the informer stops, then the dataplane, told by the agent's --cleanup-on-exit decision
// whether this is an upgrade (keep the host rule, the ipset and every pod's rules: ztunnel keeps
// its proxies) or an uninstall (host rule and ipset removed too).

import type { V1Pod } from '@kubernetes/client-node';
import type { Component } from '../component.ts';
import type { AmbientArgs } from './args.ts';
import { scope } from '../monitoring/logging.ts';
import type { OrchApi } from '../orch/api.ts';
import { realClock, type Clock } from '../orch/limits.ts';
import { NamespaceSource } from '../orch/namespacesource.ts';
import type { PodSource } from '../orch/podsource.ts';
import { Backoff } from '../orch/limits.ts';
import { apiAnnotator } from './annotator.ts';
import { startCmdAddServer, type CmdAddServer } from './cmdadd.ts';
import { createDataplane, type MeshDataplane } from './dataplane.ts';
import { ambientPodOf, ambientRules, isAmbientPod, neverAmbient } from './enablement.ts';
import { AmbientInformer } from './informer.ts';
import { podsAtStart } from './snapshot.ts';

const log = scope('ambient');

/** Uninstall or upgrade (the installer's --cleanup-on-exit decision, src/install/uninstall.ts). */
export type CleanupDecider = () => Promise<{ readonly cleanup: boolean; readonly why: string }>;

/** How long ambient mode's event queue is given to drain when it stops (a part of the stop's bound). */
export const STOP_GRACE_MS = 5000;

export interface AmbientDeps {
  /** The node's pod watch (never a second one). */
  readonly pods: PodSource;
  readonly api: OrchApi;
  readonly decideCleanup: CleanupDecider;
  /** Tests: a fake; else createDataplane with the API annotator. */
  readonly dataplane?: MeshDataplane;
  /** Tests: a namespace watch of their own timing; else one with the defaults. */
  readonly namespaces?: NamespaceSource;
  readonly clock?: Clock;
  /** How long the queue's reconciles under way get at stop. */
  readonly stopGraceMs?: number;
}

export interface AmbientComponent extends Component {
  /** A namespace's labels from the namespace watch (the pod lookup answers the plugin with them). */
  namespaceLabels(name: string): Readonly<Record<string, string>> | undefined;
  /** The agent's own decision for a pod of this node. */
  isAmbient(pod: V1Pod): boolean;
  /** Resolves once the dataplane started and the informer runs (tests). */
  readonly started: Promise<void>;
}

type State = 'waiting_for_caches' | 'starting_dataplane' | 'starting_cmdadd' | 'running' | 'stopped';

export function startAmbient(args: AmbientArgs, deps: AmbientDeps): AmbientComponent {
  const clock = deps.clock ?? realClock;
  const namespaces = deps.namespaces ?? new NamespaceSource(deps.api);
  const dataplane = deps.dataplane ?? createDataplane(args, { annotator: apiAnnotator(deps.api) });
  const selectors = args.enablementSelectors;
  const rules = ambientRules(args);
  const isAmbient = (pod: V1Pod, labels = namespaces.labels(pod.metadata?.namespace ?? '')) =>
    isAmbientPod(pod, labels, selectors, rules);
  const informer = new AmbientInformer({
    pods: deps.pods,
    namespaceLabels: (n) => namespaces.labels(n),
    selectors,
    isAmbient,
    neverAmbient,
    dataplane,
    clock,
  });
  deps.pods.addHandler(informer.podHandler);
  namespaces.addHandler(informer.namespaceHandler);
  namespaces.start();

  const stopping = new AbortController();
  let state: State = 'waiting_for_caches';
  let lastError = '';
  let startFailures = 0;
  let enrolledAtStart = 0;
  let cmdAdd: CmdAddServer | undefined;
  const until = <T>(p: Promise<T>) =>
    Promise.race([
      p,
      new Promise<never>((_, reject) => {
        if (stopping.signal.aborted) reject(new Error('stopping'));
        stopping.signal.addEventListener('abort', () => reject(new Error('stopping')), { once: true });
      }),
    ]);

  const run = async (): Promise<void> => {
    await until(Promise.all([deps.pods.synced, namespaces.synced]));
    state = 'starting_dataplane';
    const backoff = new Backoff({ baseMs: 1000, maxMs: 30_000, jitter: 'full' });
    for (;;) {
      // Every running pod that should be ambient (this agent remembers nothing of a previous
      // run's): their netns from /proc, rules made so, the ipset rebuilt, then ztunnel's snapshot.
      const at = podsAtStart(deps.pods.pods(), (p) => isAmbient(p), neverAmbient);
      try {
        // Not cut short by stop: stop waits for it, then stops what it started.
        await dataplane.start(at.enroll.map(ambientPodOf), at.leftover.map(ambientPodOf));
        enrolledAtStart = at.enroll.length;
        break;
      } catch (e) {
        if (stopping.signal.aborted) throw e;
        startFailures++;
        lastError = e instanceof Error ? e.message : String(e);
        const delay = backoff.next();
        log.error('cannot start ambient mode; retrying', { error: lastError, retryInMs: Math.round(delay) });
        await clock.sleep(delay, stopping.signal);
      }
    }
    state = 'starting_cmdadd';
    // The plugin's ADDs of new ambient pods: only now, with the dataplane up (before, they fail
    // closed: the plugin cannot reach the socket and the kubelet retries).
    for (;;) {
      try {
        cmdAdd = await startCmdAddServer(args.pluginEventUdsAddress, {
          pods: deps.pods,
          dataplane,
          isAmbient: (pod) => isAmbient(pod),
          toEnrollPod: ambientPodOf,
        });
        break;
      } catch (e) {
        startFailures++;
        lastError = e instanceof Error ? e.message : String(e);
        const delay = backoff.next();
        log.error('cannot serve the plugin event socket; retrying', { error: lastError, retryInMs: Math.round(delay) });
        await clock.sleep(delay, stopping.signal);
      }
    }
    informer.start();
    state = 'running';
    log.info('ambient mode started', { enrolledAtStart });
  };
  const started = run();
  started.catch(() => {});

  const startReasons = (): string[] => {
    const failed = lastError ? [`ambient: start failed ${startFailures} time(s): ${lastError}`] : [];
    switch (state) {
      case 'waiting_for_caches':
        return ['ambient: waiting for the pod and namespace watches'];
      case 'starting_dataplane': {
        const why = dataplane.notReadyReasons();
        return [...(why.length > 0 ? why : ['ambient: starting the dataplane']), ...failed];
      }
      case 'starting_cmdadd':
        return ['ambient: the plugin event socket is not served yet', ...failed];
      case 'running':
        return dataplane.notReadyReasons();
      default:
        return [];
    }
  };

  return {
    name: 'ambient',
    started,
    namespaceLabels: (n) => namespaces.labels(n),
    isAmbient: (pod) => isAmbient(pod),
    notReadyReasons() {
      // A namespace watch failing for long is said in every state: the labels decided with are stale.
      return state === 'stopped' ? [] : [...startReasons(), ...namespaces.notReadyReasons()];
    },
    status: () => ({
      enabled: true,
      state,
      lastError,
      pluginEventSocket: cmdAdd?.address ?? '',
      dataplane: dataplane.status(),
      informer: informer.status(),
      namespaces: namespaces.status(),
    }),
    async stop(signal) {
      stopping.abort();
      await started.catch(() => {});
      await cmdAdd?.close();
      await informer.stop(deps.stopGraceMs ?? STOP_GRACE_MS);
      const decision = await deps.decideCleanup();
      log.info(decision.cleanup ? 'ambient: uninstall, removing the host rules' : 'ambient: keeping the node as is', {
        signal,
        why: decision.why,
      });
      try {
        await dataplane.stop(decision.cleanup);
      } finally {
        await namespaces.stop();
        state = 'stopped';
      }
    },
  };
}

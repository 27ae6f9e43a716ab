// Is this pod broken by the start-up race? A pure function of the pod and the --repair-* criteria.

import type { V1ContainerStateTerminated, V1Pod } from '@kubernetes/client-node';
import { isSidecarPod } from '../../cni-plugin/shared/sidecar.ts';
import type { RepairSettings } from '../config/settings.ts';

export type BrokenCriteria = Pick<
  RepairSettings,
  'sidecarAnnotation' | 'initContainerName' | 'initContainerExitCode' | 'initContainerTerminationMessage'
>;

export interface Broken {
  /** Human-readable why, for the log and the Event. */
  readonly why: string;
  /**
   * Identifies this broken state of this pod: the pod uid plus the failed run of the init container.
   * A later failed run (kubelet retried the init container) is a new state; a relist or resync
   * that shows the same run is not.
   */
  readonly stateKey: string;
}

export function detectBroken(pod: V1Pod, c: BrokenCriteria): Broken | undefined {
  const annotations = pod.metadata?.annotations;
  if (!annotations || !Object.hasOwn(annotations, c.sidecarAnnotation)) return undefined;
  // Only a pod the plugin's sidecar path would have redirected was started unredirected by the
  // race: any other is the ambient path's or none's, and sidecar rules put into it in place (or
  // a restart, which starts it the same way again) are not what the plugin gives it. All of it
  // is its author's to write, so this is the plugin's own predicate, not a second one.
  if (!isSidecarPod(pod)) return undefined;
  const status = pod.status?.initContainerStatuses?.find((s) => s.name === c.initContainerName);
  if (!status) return undefined;
  // Its newest run passed: redirection is in place now (repaired, in place or otherwise). The old
  // failed run stays in lastState for the pod's life; acting on it again after an agent restart
  // would re-repair, re-count or even delete a healthy pod. (Istio's matchesFilter skips it too.)
  if (status.state?.terminated?.exitCode === 0) return undefined;
  // The current state first: it is the newest failure; the last state covers a container that
  // kubelet already restarted and that is now waiting or running again.
  for (const [where, t] of [
    ['state', status.state?.terminated],
    ['lastState', status.lastState?.terminated],
  ] as const) {
    if (t && matches(t, c)) {
      // Timestamps are strings on the wire and Dates in typed V1Pod objects: normalise both.
      const at = t.finishedAt ?? t.startedAt;
      const run = t.containerID || (at ? new Date(at).toISOString() : `restart-${status.restartCount ?? 0}`);
      const msg = c.initContainerTerminationMessage
        ? ` with a message containing ${JSON.stringify(c.initContainerTerminationMessage)}`
        : '';
      return {
        why: `init container ${c.initContainerName} terminated (${where}) with exit code ${t.exitCode}${msg}: traffic redirection was not in place when the pod started`,
        stateKey: `${pod.metadata?.uid ?? ''}/${run}`,
      };
    }
  }
  return undefined;
}

function matches(t: V1ContainerStateTerminated, c: BrokenCriteria): boolean {
  if (t.exitCode !== c.initContainerExitCode) return false;
  return c.initContainerTerminationMessage === '' || (t.message ?? '').includes(c.initContainerTerminationMessage);
}

/** The pod already carries the broken-pod label with our value. */
export function hasLabel(pod: V1Pod, key: string, value: string): boolean {
  return pod.metadata?.labels?.[key] === value;
}

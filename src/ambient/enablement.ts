// Which of the node's pods are ambient, and what the agent reads off a pod to decide: the
// enablement rules shared with the plugin (cni-plugin/shared/enablement.ts), the redirection
// annotation (the agent's output; its owner can write it too), terminal phases and IPs. Pure.

import type { V1Pod } from '@kubernetes/client-node';
import {
  isAmbientPod as isAmbientPodShared,
  REDIRECTION_ANNOTATION,
  type AmbientRules,
  type EnablementSelector,
} from '../../cni-plugin/shared/enablement.ts';
import type { AmbientArgs } from './args.ts';

export {
  DATAPLANE_MODE_AMBIENT,
  DATAPLANE_MODE_LABEL,
  DATAPLANE_MODE_NONE,
  DEFAULT_ENABLEMENT_SELECTORS,
  labelSelectorMatches,
  namespaceSelected,
  neverAmbient,
  REDIRECTION_ANNOTATION,
  type AmbientRules,
  type EnablementSelector,
  type LabelSelector,
} from '../../cni-plugin/shared/enablement.ts';

/** The static pod's kubelet UID (its cgroup is named by it, not by the API's mirror pod UID). */
export const MIRROR_ANNOTATION = 'kubernetes.io/config.mirror';

/** What the dataplane needs of a pod (dataplane.ts AmbientPod, cmdadd.ts EnrollPod: this one shape). */
export interface AmbientPodInfo {
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  readonly serviceAccount: string;
  /** status.podIPs, or the ADD's prevResult IPs. */
  readonly ips: readonly string[];
  readonly annotations: Readonly<Record<string, string>>;
  /** The kubelet UID of a static pod (its cgroups carry it), if any. */
  readonly mirrorUid?: string;
}

/**
 * The pod decision (docs/ambient.md "How pods are selected"): not hostNetwork, no sidecar, not
 * labelled none, a selector matches.
 */
export function isAmbientPod(
  pod: V1Pod,
  namespaceLabels: Readonly<Record<string, string>> | undefined,
  selectors: readonly EnablementSelector[],
  rules?: AmbientRules,
): boolean {
  return isAmbientPodShared(pod, namespaceLabels, selectors, rules);
}

/** The rules of these settings: the namespaces the plugin leaves alone. */
export function ambientRules(args: Pick<AmbientArgs, 'excludeNamespaces'>): AmbientRules {
  return { excludeNamespaces: args.excludeNamespaces };
}

export type Redirection = 'enabled' | 'pending';

/**
 * What the pod's redirection annotation says: enabled, pending, or nothing. The agent writes it
 * for others to read, and so can the pod's owner: never the agent's record of enrollment (that
 * is the dataplane's own); it only marks a pod for a removal of our rules at start-up.
 */
export function redirectionOf(pod: V1Pod | undefined): Redirection | undefined {
  const v = pod?.metadata?.annotations?.[REDIRECTION_ANNOTATION];
  return v === 'enabled' || v === 'pending' ? v : undefined;
}

/** Succeeded or Failed: its processes are gone for good (Istio's CheckPodTerminal). */
export function isTerminal(pod: V1Pod): boolean {
  const phase = pod.status?.phase;
  return phase === 'Succeeded' || phase === 'Failed';
}

/** status.podIPs, else status.podIP; none while the pod has no address yet. */
export function podIPs(pod: V1Pod | undefined): string[] {
  const many = (pod?.status?.podIPs ?? []).map((p) => p.ip).filter((ip): ip is string => !!ip);
  if (many.length > 0) return many;
  const one = pod?.status?.podIP;
  return one ? [one] : [];
}

/** Same addresses in any order. */
export function sameIPs(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && [...a].sort().join(',') === [...b].sort().join(',');
}

export function ambientPodOf(pod: V1Pod): AmbientPodInfo {
  const mirror = pod.metadata?.annotations?.[MIRROR_ANNOTATION];
  return {
    uid: pod.metadata?.uid ?? '',
    namespace: pod.metadata?.namespace ?? '',
    name: pod.metadata?.name ?? '',
    serviceAccount: pod.spec?.serviceAccountName || 'default',
    ips: podIPs(pod),
    annotations: { ...(pod.metadata?.annotations ?? {}) },
    ...(mirror ? { mirrorUid: mirror } : {}),
  };
}

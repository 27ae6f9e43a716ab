// Which pod object the runtime means by K8S_POD_UID: the plugin checks the pod it read (from the
// agent or the API server), the agent checks its cached pod before answering a lookup. For a pod
// from the API server that is its own UID. For a static pod (a manifest the kubelet reads from
// disk) the kubelet runs the pod under the UID it hashed from the manifest, while the API server
// holds only the mirror pod the kubelet created for it: a UID of its own, and the kubelet's in
// kubernetes.io/config.mirror (which the API server lets no one but the node's kubelet set, and
// no one change).

export const MIRROR_ANNOTATION = 'kubernetes.io/config.mirror';

/** What is read of a pod here: the plugin's PodLike and client-node's V1Pod both fit. */
export interface PodIdentity {
  readonly metadata?: {
    readonly uid?: string;
    readonly annotations?: Readonly<Record<string, string>>;
  };
}

/** True when `pod` is the pod the runtime named by `uid`: its own UID, or a mirror of it. */
export function isPodWithUid(pod: PodIdentity, uid: string): boolean {
  const m = pod.metadata;
  return uid !== '' && (m?.uid === uid || m?.annotations?.[MIRROR_ANNOTATION] === uid);
}

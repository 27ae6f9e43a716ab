// Which pods are sidecar pods: the ones the plugin's sidecar path gives redirect rules. One
// predicate for every place that asks, so no pod lands between the sidecar path and ambient mode
// with no redirection at all: the plugin's sidecar path (its skip reasons), the ambient decision
// of the plugin and the agent (neverAmbient, shared/enablement.ts: a sidecar pod is never
// ambient), the agent's start-up snapshot and informer (a sidecar pod is never taken for
// enrolled), and the repair controller (only a pod the sidecar path would have redirected is
// broken by the start-up race).
//
// Everything read here is written by the pod's author (annotations, labels, containers), so a
// claim of a sidecar counts only when the sidecar path takes the pod: a pod that carries
// sidecar.mesh.io/status and no mesh-proxy container (or whose proxy is off, a gateway, or
// injection disabled) is no sidecar pod, and in an ambient namespace it is ambient.
// Deliberate difference (docs/ambient.md "How pods are selected"): Istio's ambient decision takes the
// status annotation alone for a sidecar (podHasSidecar) and its sidecar path then skips such a
// pod, which starts with no redirection.

/** Annotation keys on the pod that decide whether the sidecar path takes it. */
export const SIDECAR_STATUS_ANNOTATION = 'sidecar.mesh.io/status';
export const SIDECAR_INJECT = 'sidecar.mesh.io/inject';
export const INTERCEPTION_MODE_ANNOTATION = 'sidecar.mesh.io/interceptionMode';
/** The injected proxy container, whose env asks for DNS capture / invalid-packet drop. */
export const PROXY_CONTAINER_NAME = 'mesh-proxy';
/** A pod that runs its own redirect init container is left alone by the sidecar path. */
export const OWN_INIT_CONTAINER_NAME = 'mesh-init';

type Strings = Readonly<Record<string, string>>;

export interface ContainerLike {
  readonly name?: string;
  readonly args?: readonly string[];
  readonly env?: readonly { readonly name?: string; readonly value?: string }[];
  readonly securityContext?: { readonly runAsUser?: number | null; readonly runAsGroup?: number | null } | null;
}

/** The pod fields the sidecar decision reads (a V1Pod fits). */
export interface SidecarPodLike {
  readonly metadata?: { readonly labels?: Strings; readonly annotations?: Strings };
  readonly spec?: {
    readonly initContainers?: readonly ContainerLike[];
    readonly containers?: readonly ContainerLike[];
  };
}

/** What the plugin takes from the proxy container: whether there is one, its type, env and ids. */
export interface ProxyInfo {
  readonly present: boolean;
  /** `args[1]` when `args[0]` is `proxy` (`sidecar`, `router`, ...), else empty. */
  readonly type: string;
  readonly env: ReadonlyMap<string, string>;
  readonly runAsUser: unknown;
  readonly runAsGroup: unknown;
}

/**
 * Istio's ExtractPodInfo: every container named mesh-proxy counts, init containers first (the
 * proxy is one when it runs as a native sidecar), then the others. Env values merge, a later
 * container's winning; the last one with a securityContext gives runAsUser and runAsGroup, even
 * when that securityContext leaves them out.
 */
export function proxyInfo(pod: SidecarPodLike): ProxyInfo {
  const env = new Map<string, string>();
  let present = false;
  let type = '';
  let runAsUser: unknown;
  let runAsGroup: unknown;
  for (const c of [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])]) {
    if (c.name !== PROXY_CONTAINER_NAME) continue;
    present = true;
    if (c.args && c.args.length >= 2 && c.args[0] === 'proxy') type = c.args[1]!;
    for (const e of c.env ?? []) if (typeof e.name === 'string') env.set(e.name, e.value ?? '');
    if (c.securityContext) ({ runAsUser, runAsGroup } = c.securityContext);
  }
  return { present, type, env, runAsUser, runAsGroup };
}

/** Go's strconv.ParseBool, as Istio reads its flags: true, false, or null for anything else. */
export function goBool(v: string | undefined): boolean | null {
  if (v === undefined) return null;
  if (['1', 't', 'T', 'TRUE', 'true', 'True'].includes(v)) return true;
  if (['0', 'f', 'F', 'FALSE', 'false', 'False'].includes(v)) return false;
  return null;
}

/**
 * Why the sidecar path gives a pod no rules (logged), or null when it redirects it: Istio's
 * checks in its order (its own init container, DISABLE_ENVOY on the proxy, no proxy container, a
 * proxy that is no sidecar, inject disabled by label or else annotation, no status annotation),
 * then ours (interceptionMode NONE, which Istio refuses as invalid).
 */
export function sidecarSkipReason(pod: SidecarPodLike): string | null {
  const a = pod.metadata?.annotations ?? {};
  const all = [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
  if (all.some((c) => c.name === OWN_INIT_CONTAINER_NAME))
    return `it has its own ${OWN_INIT_CONTAINER_NAME} init container`;
  const proxy = proxyInfo(pod);
  if (goBool(proxy.env.get('DISABLE_ENVOY')) === true)
    return `DISABLE_ENVOY is true on ${PROXY_CONTAINER_NAME} (no proxy runs)`;
  if (!proxy.present) return `no ${PROXY_CONTAINER_NAME} container`;
  if (proxy.type !== '' && proxy.type !== 'sidecar') return `proxy type ${proxy.type} (not a sidecar)`;
  // The label is the newer API: when present it decides, even when the annotation says otherwise.
  const label = pod.metadata?.labels?.[SIDECAR_INJECT];
  const inject = label ?? a[SIDECAR_INJECT];
  if (goBool(inject) === false)
    return `${label !== undefined ? 'label' : 'annotation'} ${SIDECAR_INJECT} is ${JSON.stringify(inject)}: inject is disabled`;
  if (a[SIDECAR_STATUS_ANNOTATION] === undefined)
    return `no ${SIDECAR_STATUS_ANNOTATION} annotation (no sidecar injected)`;
  if (a[INTERCEPTION_MODE_ANNOTATION]?.trim() === 'NONE') return `${INTERCEPTION_MODE_ANNOTATION} is NONE`;
  return null;
}

/**
 * A sidecar pod: the sidecar path redirects it (or refuses it, code 100, when an annotation of
 * its is bad). Never ambient; any other pod an enablement selector picks is.
 */
export function isSidecarPod(pod: SidecarPodLike): boolean {
  return sidecarSkipReason(pod) === null;
}

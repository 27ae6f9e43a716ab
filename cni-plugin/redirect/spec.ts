// What to redirect: the `mesh-iptables` flags as one typed value, and the per-pod derivation from
// annotations (the way the injected init container would have been given those flags).

import {
  ALWAYS_EXCLUDED_INBOUND_PORTS,
  ANNOTATION,
  DEFAULT_EXCLUDED_OUTBOUND_PORTS,
  ENV_DNS_CAPTURE,
  ENV_INVALID_DROP,
  INBOUND_CAPTURE_PORT,
  INBOUND_TUNNEL_PORT,
  PROBE_PORT,
  PROXY_CONTAINER_NAME,
  PROXY_GID,
  PROXY_PORT,
  PROXY_UID,
  TPROXY_MARK,
  TPROXY_ROUTE_TABLE,
} from './constants.ts';
import { parseCidrList, parseInterfaceList, parsePortList, ValueError, type Cidr } from './net.ts';
import { goBool, proxyInfo, type ContainerLike, type ProxyInfo } from '../shared/sidecar.ts';

export type InterceptionMode = 'REDIRECT' | 'TPROXY';

/** One field per `mesh-iptables` flag that shapes the rules. */
export interface RedirectSpec {
  /** --proxy-port */
  readonly proxyPort: number;
  /** --inbound-capture-port */
  readonly inboundCapturePort: number;
  /** --inbound-tunnel-port */
  readonly inboundTunnelPort: number;
  /** --iptables-probe-port */
  readonly probePort: number;
  /** --proxy-uid / --proxy-gid (comma lists in the flags) */
  readonly proxyUids: readonly string[];
  readonly proxyGids: readonly string[];
  /** --mesh-inbound-interception-mode */
  readonly interceptionMode: InterceptionMode;
  /** --mesh-inbound-tproxy-mark / --mesh-inbound-tproxy-route-table */
  readonly tproxyMark: number;
  readonly tproxyRouteTable: number;
  /** --mesh-inbound-ports: '*' for all, [] disables inbound capture. */
  readonly inboundPorts: '*' | readonly number[];
  /** --mesh-local-exclude-ports (only used with inboundPorts '*') */
  readonly inboundExcludePorts: readonly number[];
  /** --mesh-outbound-ports */
  readonly outboundPorts: readonly number[];
  /** --mesh-local-outbound-ports-exclude */
  readonly outboundExcludePorts: readonly number[];
  /** --mesh-service-cidr: '*' for all, [] disables outbound capture. */
  readonly outboundCidrs: '*' | readonly Cidr[];
  /** --mesh-service-exclude-cidr */
  readonly outboundExcludeCidrs: readonly Cidr[];
  /** --mesh-exclude-interfaces */
  readonly excludeInterfaces: readonly string[];
  /** --orch-virt-interfaces */
  readonly virtInterfaces: readonly string[];
  /** --redirect-dns with --capture-all-dns (the plugin cannot read the pod's resolv.conf). */
  readonly captureDns: boolean;
  /** --drop-invalid */
  readonly dropInvalid: boolean;
}

const DEFAULT_SPEC: RedirectSpec = Object.freeze({
  proxyPort: PROXY_PORT,
  inboundCapturePort: INBOUND_CAPTURE_PORT,
  inboundTunnelPort: INBOUND_TUNNEL_PORT,
  probePort: PROBE_PORT,
  proxyUids: [PROXY_UID],
  proxyGids: [PROXY_GID],
  interceptionMode: 'REDIRECT',
  tproxyMark: TPROXY_MARK,
  tproxyRouteTable: TPROXY_ROUTE_TABLE,
  inboundPorts: '*',
  inboundExcludePorts: ALWAYS_EXCLUDED_INBOUND_PORTS,
  outboundPorts: [],
  outboundExcludePorts: DEFAULT_EXCLUDED_OUTBOUND_PORTS,
  outboundCidrs: '*',
  outboundExcludeCidrs: [],
  excludeInterfaces: [],
  virtInterfaces: [],
  captureDns: false,
  dropInvalid: false,
});

/** The slice of a V1Pod the plugin reads (kept structural: the plugin bundles no client library). */
export interface PodLike {
  readonly metadata?: {
    readonly name?: string;
    readonly namespace?: string;
    readonly uid?: string;
    readonly labels?: Readonly<Record<string, string>>;
    readonly annotations?: Readonly<Record<string, string>>;
  };
  readonly spec?: {
    readonly initContainers?: readonly ContainerLike[];
    readonly containers?: readonly ContainerLike[];
  };
}
/**
 * A bad value in the pod (an annotation, or the proxy's securityContext): names where and what,
 * so the pod owner can fix it. `key` is the annotation key or the field path.
 */
export class AnnotationError extends Error {
  readonly key: string;
  readonly value: string;
  /** `annotation`, or `container field` for the proxy's securityContext. */
  readonly what: string;
  constructor(key: string, value: string, why: string, what = 'annotation') {
    super(`${what} ${key}=${JSON.stringify(value)}: ${why}`);
    this.key = key;
    this.value = value;
    this.what = what;
  }
}

function field<T>(annotations: Readonly<Record<string, string>>, key: string, parse: (v: string) => T, fallback: T): T {
  const v = annotations[key];
  if (v === undefined) return fallback;
  try {
    return parse(v);
  } catch (e) {
    if (e instanceof ValueError) throw new AnnotationError(key, v, e.message);
    throw e;
  }
}

const wildcardOr =
  <T>(parse: (v: string) => T) =>
  (v: string): '*' | T =>
    v.trim() === '*' ? '*' : parse(v);

const envFlag = (info: ProxyInfo, name: string): boolean => goBool(info.env.get(name)) === true;

/**
 * The owner match for the proxy's own traffic: its runAsUser/runAsGroup, or 1337 when absent or
 * 0, as Istio does (a proxy under an assigned uid, OpenShift's 1000670000, would otherwise have
 * its own outbound traffic redirected back into itself).
 */
function ownerId(value: unknown, key: 'runAsUser' | 'runAsGroup', fallback: string): string {
  if (value === undefined || value === null || value === 0) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > 0xffff_fffe) {
    throw new AnnotationError(
      `spec.containers[${PROXY_CONTAINER_NAME}].securityContext.${key}`,
      String(value),
      'expected a uid/gid (a whole number from 0 to 4294967294)',
      'container field',
    );
  }
  return String(value);
}

/**
 * Annotations (and the proxy container's env and ids) over the base spec, as Istio's CNI plugin does:
 * excludeInboundPorts always gets the agent ports added; an absent excludeOutboundPorts keeps the
 * default. Throws AnnotationError on the first bad value, before anything is applied.
 */
export function specForPod(pod: PodLike): RedirectSpec {
  const base = DEFAULT_SPEC;
  const a = pod.metadata?.annotations ?? {};
  const proxy = proxyInfo(pod);
  const interceptionMode = field<InterceptionMode>(
    a,
    ANNOTATION.INTERCEPTION_MODE,
    (v) => {
      const m = v.trim();
      if (m === 'REDIRECT' || m === 'TPROXY') return m;
      throw new ValueError('expected REDIRECT or TPROXY');
    },
    base.interceptionMode,
  );
  const excludeInbound = field(a, ANNOTATION.EXCLUDE_INBOUND_PORTS, parsePortList, []);
  const inboundExcludePorts = [
    ...excludeInbound,
    ...base.inboundExcludePorts.filter((p) => !excludeInbound.includes(p)),
  ];
  const cidrsOrAll = wildcardOr(parseCidrList);
  const excludeCidrs = field(
    a,
    ANNOTATION.EXCLUDE_OUTBOUND_IP_RANGES,
    (v) => {
      if (v.trim() === '*') throw new ValueError('"*" would exclude everything; remove the include annotation instead');
      return parseCidrList(v);
    },
    base.outboundExcludeCidrs,
  );
  return Object.freeze({
    ...base,
    interceptionMode,
    inboundPorts: field(a, ANNOTATION.INCLUDE_INBOUND_PORTS, wildcardOr(parsePortList), base.inboundPorts),
    inboundExcludePorts,
    outboundPorts: field(a, ANNOTATION.INCLUDE_OUTBOUND_PORTS, parsePortList, base.outboundPorts),
    outboundExcludePorts: field(a, ANNOTATION.EXCLUDE_OUTBOUND_PORTS, parsePortList, base.outboundExcludePorts),
    outboundCidrs: field(a, ANNOTATION.INCLUDE_OUTBOUND_IP_RANGES, cidrsOrAll, base.outboundCidrs),
    outboundExcludeCidrs: excludeCidrs,
    excludeInterfaces: field(a, ANNOTATION.EXCLUDE_INTERFACES, parseInterfaceList, base.excludeInterfaces),
    // Present (even empty), the newer annotation decides, as in Istio.
    virtInterfaces:
      a[ANNOTATION.REROUTE_VIRTUAL_INTERFACES] !== undefined
        ? field(a, ANNOTATION.REROUTE_VIRTUAL_INTERFACES, parseInterfaceList, base.virtInterfaces)
        : field(a, ANNOTATION.KUBEVIRT_INTERFACES, parseInterfaceList, base.virtInterfaces),
    proxyUids: [ownerId(proxy.runAsUser, 'runAsUser', PROXY_UID)],
    proxyGids: [ownerId(proxy.runAsGroup, 'runAsGroup', PROXY_GID)],
    captureDns: base.captureDns || envFlag(proxy, ENV_DNS_CAPTURE),
    dropInvalid: base.dropInvalid || envFlag(proxy, ENV_INVALID_DROP),
  });
}

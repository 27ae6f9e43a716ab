// What to redirect: the `mesh-iptables` flags as one typed value, and the per-pod derivation from
// annotations (the way the injected init container would have been given those flags).

import {
  ALWAYS_EXCLUDED_INBOUND_PORTS, ANNOTATION, DEFAULT_EXCLUDED_OUTBOUND_PORTS, ENV_DNS_CAPTURE, ENV_INVALID_DROP,
  INBOUND_CAPTURE_PORT, INBOUND_TUNNEL_PORT, PROBE_PORT, PROXY_CONTAINER_NAME, PROXY_GID, PROXY_PORT, PROXY_UID,
  TPROXY_MARK, TPROXY_ROUTE_TABLE,
} from './constants.ts';
import { parseCidrList, parseInterfaceList, parsePortList, ValueError, type Cidr } from './net.ts';

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
  readonly metadata?: { readonly name?: string; readonly namespace?: string; readonly uid?: string; readonly annotations?: Readonly<Record<string, string>> };
  readonly spec?: {
    readonly initContainers?: readonly ContainerLike[];
    readonly containers?: readonly ContainerLike[];
  };
}
export interface ContainerLike {
  readonly name?: string;
  readonly env?: readonly { readonly name?: string; readonly value?: string }[];
}

/** A bad annotation: names the key and value so the pod owner can fix it. */
export class AnnotationError extends Error {
  readonly key: string;
  readonly value: string;
  constructor(key: string, value: string, why: string) {
    super(`annotation ${key}=${JSON.stringify(value)}: ${why}`);
    this.key = key;
    this.value = value;
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

const wildcardOr = <T>(parse: (v: string) => T) => (v: string): '*' | T => (v.trim() === '*' ? '*' : parse(v));

function envFlag(pod: PodLike, name: string): boolean {
  const proxy = pod.spec?.containers?.find((c) => c.name === PROXY_CONTAINER_NAME);
  const v = proxy?.env?.find((e) => e.name === name)?.value;
  return v !== undefined && /^(1|t|true)$/i.test(v.trim());
}

/**
 * Annotations (and the proxy container's env) over the base spec, as Istio's CNI plugin does:
 * excludeInboundPorts always gets the agent ports added; an absent excludeOutboundPorts keeps the
 * default. Throws AnnotationError on the first bad value, before anything is applied.
 */
export function specForPod(pod: PodLike): RedirectSpec {
  const base = DEFAULT_SPEC;
  const a = pod.metadata?.annotations ?? {};
  const interceptionMode = field<InterceptionMode>(a, ANNOTATION.INTERCEPTION_MODE, (v) => {
    const m = v.trim();
    if (m === 'REDIRECT' || m === 'TPROXY') return m;
    throw new ValueError('expected REDIRECT or TPROXY');
  }, base.interceptionMode);
  const excludeInbound = field(a, ANNOTATION.EXCLUDE_INBOUND_PORTS, parsePortList, []);
  const inboundExcludePorts = [...excludeInbound, ...base.inboundExcludePorts.filter((p) => !excludeInbound.includes(p))];
  const cidrsOrAll = wildcardOr(parseCidrList);
  const excludeCidrs = field(a, ANNOTATION.EXCLUDE_OUTBOUND_IP_RANGES, (v) => {
    if (v.trim() === '*') throw new ValueError('"*" would exclude everything; remove the include annotation instead');
    return parseCidrList(v);
  }, base.outboundExcludeCidrs);
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
    virtInterfaces: field(a, ANNOTATION.KUBEVIRT_INTERFACES, parseInterfaceList, base.virtInterfaces),
    captureDns: base.captureDns || envFlag(pod, ENV_DNS_CAPTURE),
    dropInvalid: base.dropInvalid || envFlag(pod, ENV_INVALID_DROP),
  });
}

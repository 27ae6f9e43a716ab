// The numbers the redirect rules, the plugin and mesh-validation must agree on. Defaults are the
// seed's `mesh-iptables` flag defaults; chain names are ours (MESH_*), shaped like Istio's.

import {
  INTERCEPTION_MODE_ANNOTATION,
  OWN_INIT_CONTAINER_NAME,
  PROXY_CONTAINER_NAME,
  SIDECAR_INJECT,
  SIDECAR_STATUS_ANNOTATION,
} from '../shared/sidecar.ts';

/** --proxy-port (-p): where outbound TCP is redirected (the proxy's outbound listener). */
export const PROXY_PORT = 15001;
/** --inbound-capture-port (-z): where inbound TCP is redirected. */
export const INBOUND_CAPTURE_PORT = 15006;
/** --inbound-tunnel-port (-e): never captured, the proxy terminates tunnels on it itself. */
export const INBOUND_TUNNEL_PORT = 15008;
/** --iptables-probe-port: mesh-validation listens here and expects its probe redirected here. */
export const PROBE_PORT = 15002;
/** --probe-timeout default. */
export const PROBE_TIMEOUT_MS = 5000;
/** The agent's DNS proxy (DNS_PROXY_ADDR localhost:15053). */
export const DNS_PROXY_PORT = 15053;
/**
 * --proxy-uid / --proxy-gid defaults: the proxy's own traffic is never captured. A pod's own
 * ids come from its mesh-proxy container's runAsUser/runAsGroup (spec.ts); these are used when
 * that leaves them out or sets 0.
 */
export const PROXY_UID = '1337';
export const PROXY_GID = '1337';
/** --mesh-inbound-tproxy-mark and --mesh-inbound-tproxy-route-table. */
export const TPROXY_MARK = 1337;
export const TPROXY_ROUTE_TABLE = 133;
export const TPROXY_RULE_PRIORITY = 32700;
/** Mark the proxy puts on its outbound-to-inbound loopback hop in TPROXY mode (Istio: 1338). */
export const OUTBOUND_MARK = 1338;
/** Agent ports that are never captured inbound (status, readiness, metrics). */
export const ALWAYS_EXCLUDED_INBOUND_PORTS: readonly number[] = [15020, 15021, 15090];
/** excludeOutboundPorts when the pod has no annotation (Istio's CNI default). */
export const DEFAULT_EXCLUDED_OUTBOUND_PORTS: readonly number[] = [15020];

/**
 * The address mesh-validation connects to. Documentation ranges (RFC 5737 / RFC 3849): never a
 * real destination, so a rule matching exactly it captures nothing but the probe, whatever the
 * pod's include/exclude ranges say.
 */
export const PROBE_ADDRESS_V4 = '192.0.2.6';
export const PROBE_ADDRESS_V6 = '2001:db8::6';

/** Source the proxy uses for inbound passthrough; must not be captured again. */
export const INBOUND_PASSTHROUGH_V4 = '127.0.0.6';
export const INBOUND_PASSTHROUGH_V6 = '::6';

export const CHAIN = {
  INBOUND: 'MESH_INBOUND',
  REDIRECT: 'MESH_REDIRECT',
  IN_REDIRECT: 'MESH_IN_REDIRECT',
  OUTPUT: 'MESH_OUTPUT',
  OUTPUT_DNS: 'MESH_OUTPUT_DNS',
  DIVERT: 'MESH_DIVERT',
  TPROXY: 'MESH_TPROXY',
  DROP: 'MESH_DROP',
} as const;

/** Every chain of ours starts so; the plugin touches no other chain, save for its one jump from each builtin it uses. */
export const OWN_CHAIN_PREFIX = 'MESH_';

/** Tables the plugin may have chains in, inside a pod netns (other rules in them are not ours and stay). */
export const OWNED_TABLES = ['nat', 'mangle', 'raw'] as const;
export type Table = (typeof OWNED_TABLES)[number];

/** Annotation keys on the pod. */
export const ANNOTATION = {
  STATUS: SIDECAR_STATUS_ANNOTATION,
  INJECT: SIDECAR_INJECT,
  INTERCEPTION_MODE: INTERCEPTION_MODE_ANNOTATION,
  INCLUDE_OUTBOUND_IP_RANGES: 'traffic.sidecar.mesh.io/includeOutboundIPRanges',
  EXCLUDE_OUTBOUND_IP_RANGES: 'traffic.sidecar.mesh.io/excludeOutboundIPRanges',
  INCLUDE_INBOUND_PORTS: 'traffic.sidecar.mesh.io/includeInboundPorts',
  EXCLUDE_INBOUND_PORTS: 'traffic.sidecar.mesh.io/excludeInboundPorts',
  INCLUDE_OUTBOUND_PORTS: 'traffic.sidecar.mesh.io/includeOutboundPorts',
  EXCLUDE_OUTBOUND_PORTS: 'traffic.sidecar.mesh.io/excludeOutboundPorts',
  EXCLUDE_INTERFACES: 'traffic.sidecar.mesh.io/excludeInterfaces',
  /** Deprecated by REROUTE_VIRTUAL_INTERFACES, read only when that one is absent. */
  KUBEVIRT_INTERFACES: 'traffic.sidecar.mesh.io/kubevirtInterfaces',
  REROUTE_VIRTUAL_INTERFACES: 'mesh.io/reroute-virtual-interfaces',
} as const;

// The proxy container and the pod's own init container: the sidecar decision's (shared/sidecar.ts).
export { OWN_INIT_CONTAINER_NAME, PROXY_CONTAINER_NAME };
export const ENV_DNS_CAPTURE = 'MESH_META_DNS_CAPTURE';
export const ENV_INVALID_DROP = 'INVALID_DROP';

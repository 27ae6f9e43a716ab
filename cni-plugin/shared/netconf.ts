// Our entry in the node's CNI config: the keys install-cni writes (src/install/template.ts makes
// its default template from MeshNetConf) and the plugin reads from stdin (cni-plugin/cni/
// protocol.ts parses only these keys, typed by NetConfKey). One type for both, as Istio's
// installer writes its entry from the plugin's own config type: a key renamed on one side and
// not the other does not compile. The runtime adds cniVersion, name and prevResult.

import type { EnablementSelector } from './enablement.ts';
import type { LogLevel } from './loglevels.ts';

/** Our entry's "type": the plugin binary's name in the CNI bin dir. */
export const PLUGIN_TYPE = 'mesh-cni';

/** `auto` detects what the host uses; `legacy`/`nft` pin it. */
export const IPTABLES_FLAVOURS = ['auto', 'legacy', 'nft'] as const;
export type IptablesFlavour = (typeof IPTABLES_FLAVOURS)[number];

/** `"orch": {...}`: how the plugin reaches the API server, and which pods it leaves alone. */
export interface MeshOrchConf {
  /** Path of the orchconfig install-cni writes (token and CA inline); needed by ADD and CHECK. */
  readonly orchconfig?: string;
  readonly cni_bin_dir?: string;
  readonly exclude_namespaces?: readonly string[];
  readonly node_name?: string;
  /**
   * For test set-ups only: a call that names a pod (K8S_POD_NAME) but no K8S_POD_NAMESPACE is
   * taken as a pod of this namespace. Empty (the default): it passes through untouched.
   */
  readonly assume_namespace_when_missing?: string;
}

/** Our entry as install-cni writes it. Every key but "type" is optional to the plugin. */
export interface MeshNetConf {
  readonly type: typeof PLUGIN_TYPE;
  /** Default warn. */
  readonly log_level?: LogLevel;
  /** The agent's plugin log socket (pluginlog.ts); empty: stderr only. */
  readonly log_uds_address?: string;
  /** The agent's pod lookup socket (podlookup.ts); empty: always ask the API server. */
  readonly pod_lookup_uds_address?: string;
  /** Pod lookup bounds in ms (defaults 10000 and 2000; tests and slow clusters tune them). */
  readonly pod_lookup_timeout_ms?: number;
  readonly pod_lookup_attempt_timeout_ms?: number;
  /** Default auto. */
  readonly iptables_flavour?: IptablesFlavour;
  /** Redirect with native nftables, not iptables: the agent's choice (--native-nftables). Default false. */
  readonly native_nftables?: boolean;
  /** Ambient mode (--ambient-enabled): an ambient pod is handed to the agent, no sidecar rules. Default false. */
  readonly ambient_enabled?: boolean;
  /** The agent's plugin event socket (pluginevent.ts); needed when ambient_enabled. */
  readonly pluginevent_uds_address?: string;
  /** --ambient-enablement-selector as the agent has it; absent: the default selectors. */
  readonly enablement_selectors?: readonly EnablementSelector[];
  readonly orch?: MeshOrchConf;
}

/** The keys the runtime puts beside ours in the config on stdin. */
export interface RuntimeNetConf {
  readonly cniVersion?: string;
  readonly name?: string;
  readonly prevResult?: Readonly<Record<string, unknown>>;
}

/** Every key the plugin reads, at the top level or under "orch". */
export type NetConfKey = keyof MeshNetConf | keyof RuntimeNetConf | keyof MeshOrchConf;

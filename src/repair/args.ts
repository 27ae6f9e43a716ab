// What repair reads of the settings, and nothing more: src/partargs.ts cuts it from the whole, as
// Istio's install-cni builds its config per part, so repair reads no other part's settings and a
// test hands it exactly what it needs.

import type { RepairSettings } from '../config/settings.ts';

export interface RepairArgs extends RepairSettings {
  /** NODE_NAME: the node this agent runs on; empty when unset. */
  readonly agentNodeName: string;
  /** POD_NAME: names this agent in Events. */
  readonly podName: string;
  /** PATH: where in-place repair's start-up check looks for nsenter. */
  readonly path: string;
  /**
   * The redirect backend the agent decided from --native-nftables (src/install/nftbackend.ts):
   * true, in-place repair writes a pod's rules as the nftables table inet mesh_pod, as the
   * plugin's entry says; false or absent, iptables.
   */
  readonly nativeNftables?: boolean;
}

// What ambient mode reads of the settings, and nothing more: src/partargs.ts cuts it from the
// whole (ambientArgs), as Istio's install-cni builds its AmbientArgs, so this part reads no other
// part's settings and a test hands it exactly what it needs.

import type { AmbientSettings } from '../config/settings.ts';

export interface AmbientArgs extends AmbientSettings {
  /** --exclude-namespaces: the namespaces the plugin leaves alone, whose pods are never ambient. */
  readonly excludeNamespaces: readonly string[];
  /** --host-proc-dir: the host's /proc, to find a pod's netns. */
  readonly hostProcDir: string;
  /** --host-netns-path: the host's own netns, which is never a pod's. */
  readonly hostNetnsPath: string;
  /**
   * The redirect backend the agent decided from --native-nftables (src/install/nfthost.ts): true,
   * the node's probe path and the pods' rules as nftables tables; false or absent, iptables and ipset.
   */
  readonly nativeNftables?: boolean;
}

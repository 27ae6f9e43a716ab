// The node's probe path as one shape, whichever way it is written: iptables + ipset
// (hostrules.ts, the default) or a native nftables table (hostnft.ts), chosen by the agent's
// redirect backend (--native-nftables). The dataplane, the start-up sync (hostprobes.ts) and the
// healer (hostheal.ts) call this and never ask which it is.
//
// A node that switched (docs/ambient.md "Native nftables"): the chosen backend is written whole,
// with every entry the other held and every enrolled pod's, before anything of the other goes, so
// a probe is never left un-SNATed: while both are there the first SNAT of a connection holds
// (nftables' chain hooks before iptables' nat POSTROUTING) and the other's is not applied again.

import type { HostStateBackend } from './hostheal.ts';

export type HostBackendKind = 'iptables' | 'nftables';

/** What a removal did: out, or left because another pod (`owner`) holds the IP, or none did. */
export type ProbeRemoval = { readonly removed: true } | { readonly removed: false; readonly owner: string | null };

export interface HostProbes extends HostStateBackend {
  readonly kind: HostBackendKind;
  /** Start-up: the rule and the (empty or kept) sets; what is in the sets stays. */
  apply(): Promise<'unchanged' | 'applied'>;
  /** The pod's IP in its set as `uid`'s (re-owned when another pod had it). */
  addProbeIP(ip: string, uid: string): Promise<void>;
  /** Many at once: all in, or (false) nothing known to be in. */
  addProbeIPs(entries: readonly (readonly [ip: string, uid: string])[]): Promise<boolean>;
  /** Out only if the entry is still `uid`'s; else its owner is said. */
  removeProbeIP(ip: string, uid: string): Promise<ProbeRemoval>;
  /** An entry with no pod UID on it (nothing to compare): out whatever it is. */
  dropProbeIP(ip: string): Promise<void>;
  /** Every entry of the enabled families: IP (canonicalIP's spelling) -> pod UID ('' for none). */
  entries(): Promise<Map<string, string>>;
  /**
   * Uninstall, or the other backend after a switch: everything of ours out. `absent`: nothing of
   * ours was there (nor the tools to have written it); `foreign`: a namesake not ours, left.
   */
  remove(): Promise<'removed' | 'absent' | 'foreign'>;
}

export interface HostSwitch {
  /** Entries the other backend held, copied into the chosen one before the sync. */
  readonly copied: number;
  /** What became of the other backend's state. */
  readonly other: 'removed' | 'absent' | 'foreign';
}

/**
 * The other backend's entries into `chosen` (already applied): the start-up sync then prunes what
 * no enrolled pod has and keeps the entries of pods without an IP yet, as it does in one backend.
 * When the other backend cannot be read (its tools not on the node), there is nothing of ours in it.
 */
export async function copyEntries(chosen: HostProbes, other: HostProbes): Promise<number> {
  let have: Map<string, string>;
  try {
    have = await other.entries();
  } catch {
    return 0;
  }
  const owned = [...have].filter(([, uid]) => /^[A-Za-z0-9][A-Za-z0-9-]{0,62}$/.test(uid));
  if (owned.length === 0) return 0;
  if (await chosen.addProbeIPs(owned)) return owned.length;
  let n = 0;
  for (const [ip, uid] of owned) {
    try {
      await chosen.addProbeIP(ip, uid);
      n++;
    } catch {
      // an entry the chosen backend refuses (its family not enabled) has no pod of ours to serve
    }
  }
  return n;
}

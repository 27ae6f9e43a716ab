// Ambient's host probe path in native nftables: what hostrules.ts does with an iptables rule and
// two ipsets, as one table of ours, `inet mesh_ambient_host`, holding a set of enrolled pod IPs
// per family (each element's comment the pod UID, as the ipset entries carry it) and one nat
// postrouting rule per family that SNATs the node's probes to those IPs to the probe address.
// The agent chooses it (docs/ambient.md "Native nftables"); iptables + ipset stays the default.
//
// Which connections are the node's probes: iptables has `-m owner --socket-exists` (a packet from
// a socket of this netns, not a forwarded one). nft has no such match. We use `meta skuid
// <kubelet's uid>`, as Istio's nftables mode does, which is narrower: nft evaluates skuid only
// for a packet that carries a full socket of this netns with an open file (the first packet of
// a connect(), which is what a nat chain sees), so a forwarded packet (kube-proxy's NodePort
// traffic, a pod's traffic routed through the node) never matches, and of the node's own
// sockets only those of kubelet's uid do. A process of another uid on the node keeps its own
// source address, as it should: its traffic is not a probe and must meet ztunnel.
//
// The table is ours by the applier's owner set (cni-plugin/redirect/nft.ts): a table of this
// name without it is someone else's, refused and never deleted. Writes keep the sets' elements
// (start-up must not empty them: every enrolled pod's probes would fail until the sync).
//
// It imports from the iptables backend (hostrules.ts) and the in-pod rules (podrules.ts) on
// purpose: the set names, the one spelling of an address and the entry diff are hostrules.ts's,
// and the probe SNAT addresses podrules.ts's, so both backends hold the same entries and a node
// switching backends copies them one to one.

import { isIPv4, isIPv6 } from 'node:net';
import type { NetnsRunner } from '../../cni-plugin/redirect/iptables.ts';
import {
  bodyDigest,
  deleteTableCommand,
  foreignTable,
  NftError,
  ownerCommands,
  readTable,
  runTransaction,
  type NftTableState,
} from '../../cni-plugin/redirect/nft.ts';
import { Serial } from '../concurrency.ts';
import type { HostProbes, ProbeRemoval } from './hostbackend.ts';
import type { HostDrift } from './hostheal.ts';
import { canonicalIP, missingEntries, probeSet } from './hostrules.ts';
import { AmbientRulesError, ipv6Text, PROBE_SNAT_V4, PROBE_SNAT_V6, type Family, type Runner } from './podrules.ts';

export const HOST_TABLE = 'mesh_ambient_host';
export const HOST_CHAIN = 'postrouting';

// A pod UID (RFC 4122 text) or at least something that cannot break out of nft's quoted comment.
const UID = /^[A-Za-z0-9][A-Za-z0-9-]{0,62}$/;

export interface NftHostOptions {
  readonly families: readonly Family[];
  /** The uid kubelet runs as (0 on most nodes): only its sockets' connections are SNATed. */
  readonly kubeletUid: number;
  readonly snat?: { readonly v4?: string; readonly v6?: string };
}

function checkUid(uid: string): void {
  if (!UID.test(uid)) throw new AmbientRulesError(`pod UID "${uid}" is not a UID (letters, digits and -)`);
}

/** Our rule for one family, as nft reads it (a counter, as every rule of ours). */
export function probeRule(family: Family, kubeletUid: number, snatAddress?: string): string {
  const given = snatAddress ?? (family === 4 ? PROBE_SNAT_V4 : PROBE_SNAT_V6);
  if (!(family === 4 ? isIPv4(given) : isIPv6(given) && !given.includes('%')))
    throw new AmbientRulesError(`probe SNAT address "${given}" is not an IPv${family} address`);
  if (!Number.isInteger(kubeletUid) || kubeletUid < 0 || kubeletUid > 0xfffffffe)
    throw new AmbientRulesError(`kubelet uid ${kubeletUid} is not a uid`);
  const [ip, snat] = family === 4 ? ['ip', given] : ['ip6', ipv6Text(given)];
  return (
    `meta l4proto tcp meta skuid ${kubeletUid} ${ip} daddr @${probeSet(family)} counter ` +
    `snat ${ip} to ${snat} comment "mesh-cni: the node's probes of ambient pods"`
  );
}

/**
 * The node's probe path as a table of ours in the node's nftables. One per host runner (the
 * agent's): it keeps the record of what it put in the sets, which a heal puts back, and orders
 * every change of the sets (a removal is a read, then a delete if the entry is still the pod's).
 */
export class NftHostProbes implements HostProbes {
  readonly kind = 'nftables';
  readonly name = `nftables (table inet ${HOST_TABLE})`;
  readonly holds = `table inet ${HOST_TABLE}`;
  readonly #nft: NetnsRunner;
  readonly #families: readonly Family[];
  readonly #rules: ReadonlyMap<Family, string>;
  readonly #digest: string;
  readonly #serial = new Serial();
  /** IP (canonicalIP's spelling) -> pod UID: what this agent put in the sets and has not taken out. */
  readonly #ledger = new Map<string, string>();

  constructor(run: Runner, opts: NftHostOptions) {
    this.#nft = {
      where: 'on this node',
      run: (argv, o) => run(argv, o.input === undefined || o.input === null ? undefined : { input: o.input }),
    };
    this.#families = [...opts.families];
    const snat = opts.snat ?? {};
    this.#rules = new Map(this.#families.map((f) => [f, probeRule(f, opts.kubeletUid, f === 4 ? snat.v4 : snat.v6)]));
    this.#digest = bodyDigest([...this.#rules.values()].join('\n'));
  }

  /** The table, our sets, the chain and its rules, keeping every element there; one transaction. */
  #writeCommands(): string[] {
    const t = `inet ${HOST_TABLE}`;
    const out = ownerCommands(HOST_TABLE, this.#digest);
    for (const f of this.#families) {
      const type = f === 4 ? 'ipv4_addr' : 'ipv6_addr';
      out.push(
        `add set ${t} ${probeSet(f)} { type ${type}; comment "enrolled ambient pods; element comment: pod UID"; }`,
      );
    }
    // Before the other nat postrouting chains (iptables' at srcnat): the first SNAT of a
    // connection is the one that holds, as Istio's jump is first in POSTROUTING.
    out.push(`add chain ${t} ${HOST_CHAIN} { type nat hook postrouting priority srcnat - 10; policy accept; }`);
    out.push(`flush chain ${t} ${HOST_CHAIN}`);
    for (const rule of this.#rules.values()) out.push(`add rule ${t} ${HOST_CHAIN} ${rule}`);
    return out;
  }

  /** Commands putting `ip` in its set as `uid`'s, whatever was there (added, then re-owned). */
  #elementCommands(ip: string, uid: string): { key: string; family: Family; commands: string[] } {
    checkUid(uid);
    const { family, text } = canonicalIP(ip);
    if (!this.#families.includes(family))
      throw new AmbientRulesError(`${ip} is an IPv${family} address and IPv${family} is not enabled`);
    const at = `inet ${HOST_TABLE} ${probeSet(family)}`;
    // add (a no-op when there), delete, add: the element ends up with this comment either way,
    // where a bare add would keep an old pod's UID and a bare delete fails when it is not there.
    return {
      key: text,
      family,
      commands: [
        `add element ${at} { ${text} }`,
        `delete element ${at} { ${text} }`,
        `add element ${at} { ${text} comment "${uid}" }`,
      ],
    };
  }

  /** Ours, or null when absent; a table of our name not ours is refused. */
  async #ours(): Promise<NftTableState | null> {
    const have = await readTable(this.#nft, HOST_TABLE);
    if (have !== null && have.digest === null) throw foreignTable(this.#nft, HOST_TABLE);
    return have;
  }

  /** Start-up: our table, sets (kept with their elements) and rules. */
  async apply(): Promise<'unchanged' | 'applied'> {
    return this.#serial.run(async () => {
      const have = await this.#ours();
      if (
        have !== null &&
        this.#ruleDrift(have).length === 0 &&
        this.#families.every((f) => have.sets.has(probeSet(f)))
      )
        return 'unchanged';
      await runTransaction(this.#nft, this.#writeCommands());
      return 'applied';
    });
  }

  async addProbeIP(ip: string, uid: string): Promise<void> {
    const { key, commands } = this.#elementCommands(ip, uid);
    await this.#serial.run(async () => {
      await runTransaction(this.#nft, commands);
      this.#ledger.set(key, uid);
    });
  }

  /** Many adds in one transaction: all in, or (false) none. */
  async addProbeIPs(entries: readonly (readonly [ip: string, uid: string])[]): Promise<boolean> {
    let each: { uid: string; key: string; commands: string[] }[];
    try {
      each = entries.map(([ip, uid]) => ({ uid, ...this.#elementCommands(ip, uid) }));
    } catch {
      return false; // one refused: the caller's adds one by one say which
    }
    return this.#serial.run(async () => {
      try {
        await runTransaction(
          this.#nft,
          each.flatMap((e) => e.commands),
        );
      } catch {
        return false;
      }
      for (const e of each) this.#ledger.set(e.key, e.uid);
      return true;
    });
  }

  /** The sets' elements now: IP -> UID comment ('' for none); empty when the table is not there. */
  async entries(): Promise<Map<string, string>> {
    const have = await this.#ours();
    const out = new Map<string, string>();
    for (const f of this.#families) {
      for (const [ip, uid] of have?.sets.get(probeSet(f))?.elements ?? []) out.set(canonicalIP(ip).text, uid);
    }
    return out;
  }

  /** Out of its set only if the element is still the pod's (same UID); else its owner is returned. */
  async removeProbeIP(ip: string, uid: string): Promise<ProbeRemoval> {
    checkUid(uid);
    const { family, text } = canonicalIP(ip);
    return this.#serial.run(async (): Promise<ProbeRemoval> => {
      // Out of the record first: a heal must not put back the entry of a pod that is leaving.
      if (this.#ledger.get(text) === uid) this.#ledger.delete(text);
      const have = await this.#ours();
      const elements = have?.sets.get(probeSet(family))?.elements;
      const owner = [...(elements ?? [])].find(([e]) => canonicalIP(e).text === text)?.[1];
      if (owner === undefined) return { removed: false, owner: null };
      if (owner !== uid) return { removed: false, owner };
      await runTransaction(this.#nft, [`delete element inet ${HOST_TABLE} ${probeSet(family)} { ${text} }`]);
      return { removed: true };
    });
  }

  /** An element with no pod UID on it: out of its set, whatever it is (gone already is fine). */
  async dropProbeIP(ip: string): Promise<void> {
    const { family, text } = canonicalIP(ip);
    await this.#serial.run(async () => {
      const have = await this.#ours();
      if (![...(have?.sets.get(probeSet(family))?.elements.keys() ?? [])].some((e) => canonicalIP(e).text === text))
        return;
      await runTransaction(this.#nft, [`delete element inet ${HOST_TABLE} ${probeSet(family)} { ${text} }`]);
    });
  }

  /**
   * Uninstall, or a switch back to iptables: our table out (rules, sets and elements); a table of
   * our name not ours stays. A node without nft has no table of ours: absent.
   */
  async remove(): Promise<'removed' | 'absent' | 'foreign'> {
    return this.#serial.run(async () => {
      this.#ledger.clear();
      let have: NftTableState | null;
      try {
        have = await readTable(this.#nft, HOST_TABLE);
      } catch (e) {
        if (e instanceof NftError && e.permanent && /^cannot run nft /.test(e.message)) return 'absent';
        throw e;
      }
      if (have === null) return 'absent';
      if (have.digest === null) return 'foreign';
      await runTransaction(this.#nft, [deleteTableCommand(have)]);
      return 'removed';
    });
  }

  /** What of our chain and rules differs: the digest of what we write, the counts, the sets named. */
  #ruleDrift(have: NftTableState): string[] {
    const rules = have.chains.get(HOST_CHAIN);
    if (rules === undefined) return [`the ${HOST_CHAIN} chain of table inet ${HOST_TABLE} is gone`];
    if (have.digest !== this.#digest) return [`table inet ${HOST_TABLE} holds rules of another setting`];
    if (rules.length === 0) return [`${HOST_CHAIN} is empty (flushed)`];
    const json = rules.map((r) => JSON.stringify(r.expr));
    const missing = this.#families.filter((f) => !json.some((j) => j.includes(`"@${probeSet(f)}"`)));
    if (rules.length !== this.#families.length || missing.length > 0 || rules.some((r) => !r.counter))
      return [`${HOST_CHAIN} holds other rules than ours`];
    return [];
  }

  async inspect(): Promise<HostDrift[]> {
    const have = await this.#ours();
    const drift: HostDrift[] = [];
    for (const family of this.#families) {
      const set = probeSet(family);
      if (have === null) {
        drift.push({ what: 'rule', family, detail: `table inet ${HOST_TABLE} is gone` });
        drift.push({ what: 'set', family, detail: `${set} is gone with it` });
      } else {
        for (const detail of this.#ruleDrift(have)) drift.push({ what: 'rule', family, detail });
        if (!have.sets.has(set)) drift.push({ what: 'set', family, detail: `${set} is gone` });
      }
      const there = new Map(
        [...(have?.sets.get(set)?.elements ?? [])].map(([ip, uid]) => [canonicalIP(ip).text, uid] as const),
      );
      const entry = missingEntries(this.#ledger, there, family, set);
      if (entry) drift.push(entry);
    }
    return drift;
  }

  /** Ours written again, the recorded elements with it, in one transaction. */
  async repair(): Promise<void> {
    await this.#serial.run(async () => {
      await this.#ours();
      const elements = [...this.#ledger].flatMap(([ip, uid]) => this.#elementCommands(ip, uid).commands);
      await runTransaction(this.#nft, [...this.#writeCommands(), ...elements]);
    });
  }
}

// The one rule model (docs/design.md "One rule model"): what a pod netns must hold for one IP
// family, whoever asks for it (the sidecar's REDIRECT or TPROXY redirection, rules.ts; ambient's
// in-pod redirection to ztunnel, src/ambient/podrules.ts; the node's probe rule, hostrules.ts
// there) and whatever writes it (iptables-restore documents, restoredoc.ts; one nftables table,
// nftrender.ts). Builders say what to match and what to do with it, never how a backend spells
// it: a backend that cannot say a term must refuse the plan, not guess. Pure types and tiny constructors; nothing here starts a process or reads a file.

import type { Table } from './constants.ts';
import type { Family } from './net.ts';

export type { Family, Table };

/** The kernel's own chains a hook can start from (netfilter's hook points). */
export type Builtin = 'PREROUTING' | 'INPUT' | 'FORWARD' | 'OUTPUT' | 'POSTROUTING';
export type Proto = 'tcp' | 'udp';

/** A mark or connmark: `value` under `mask` (absent: all 32 bits, as iptables-save then prints it bare). */
export interface Mark {
  readonly value: number;
  readonly mask?: number;
}
export const FULL_MASK = 0xffffffff;

/** A prefix of the plan's family: `addr` canonical (RFC 5952 for IPv6), `len` its prefix length. */
export interface Net {
  readonly addr: string;
  readonly len: number;
}

/** A match term that can be negated ("not this"). */
export interface Negatable<T> {
  readonly value: T;
  readonly not?: boolean;
}

/**
 * Extension matches, in the order the rule names them (iptables keeps that order, and prints it
 * back so: a renderer must keep it for the saved form to compare equal; nftables may reorder).
 */
export type Extension =
  /**
   * The protocol's own match (`-m tcp` / `-m udp`; Match.proto says which): ports in `dport` /
   * `sport`, either may be absent (both absent: the bare match Istio writes, a no-op past proto).
   */
  | {
      readonly kind: 'l4';
      readonly dport?: Negatable<number>;
      readonly sport?: Negatable<number>;
    }
  /** Any of several destination ports (`-m multiport --dports`). */
  | { readonly kind: 'dports'; readonly ports: readonly number[]; readonly not?: boolean }
  /** The local socket's owner (OUTPUT only): uid or gid, a decimal id. */
  | { readonly kind: 'owner'; readonly uid?: Negatable<string>; readonly gid?: Negatable<string> }
  /** The packet has a local socket (the node's own connections, not forwarded ones). */
  | { readonly kind: 'socket-exists' }
  /** Conntrack state, any of. */
  | { readonly kind: 'ctstate'; readonly states: readonly ('INVALID' | 'NEW' | 'RELATED' | 'ESTABLISHED')[] }
  /** The packet's mark. */
  | { readonly kind: 'mark'; readonly mark: Mark; readonly not?: boolean }
  /** The connection's mark. */
  | { readonly kind: 'connmark'; readonly mark: Mark; readonly not?: boolean }
  /**
   * The address is in a named ipset the agent keeps. nftrender.ts refuses it: the node's probe
   * path on nftables is its own table with its own sets, not a rendered plan (src/ambient/hostnft.ts).
   */
  | { readonly kind: 'set'; readonly name: string; readonly dir: 'src' | 'dst' };

/** What a rule matches: the basic fields (each at most once), then the extensions in order. */
export interface Match {
  readonly src?: Negatable<Net>;
  readonly dst?: Negatable<Net>;
  readonly iif?: Negatable<string>;
  readonly oif?: Negatable<string>;
  readonly proto?: Proto;
  readonly ext?: readonly Extension[];
}

/** What a matching packet gets. `jump` names one of the plan's own chains. */
export type Verdict =
  | { readonly kind: 'jump'; readonly chain: string }
  | { readonly kind: 'return' }
  | { readonly kind: 'accept' }
  | { readonly kind: 'drop' }
  /** nat: to `port` on the address the packet came in on (or lo for local traffic). */
  | { readonly kind: 'redirect'; readonly port: number }
  /** mangle PREROUTING: to the transparent socket on `addr`:`port` (`::` / `0.0.0.0`), setting `mark`. */
  | { readonly kind: 'tproxy'; readonly port: number; readonly addr: string; readonly mark: Mark }
  /** The packet mark: bits of `mark.mask` set to `mark.value` (iptables' --set-xmark). */
  | { readonly kind: 'mark-set'; readonly mark: Mark }
  /** The connection mark: bits of `mark.mask` set to `mark.value`. */
  | { readonly kind: 'connmark-set'; readonly mark: Mark }
  /** Packet mark -> connection mark (`save`) or back (`restore`), under both masks. */
  | {
      readonly kind: 'connmark-copy';
      readonly dir: 'save' | 'restore';
      readonly nfmask: number;
      readonly ctmask: number;
    }
  /** raw: the conntrack zone the connection is tracked in. */
  | { readonly kind: 'ct-zone'; readonly zone: number }
  /** nat POSTROUTING: source rewritten to `addr`. */
  | { readonly kind: 'snat'; readonly addr: string };

export interface Rule {
  readonly match: Match;
  readonly verdict: Verdict;
}

/** One chain of ours: its table, its name (ours all start MESH_), its rules in order; may be empty. */
export interface Chain {
  readonly table: Table;
  readonly name: string;
  readonly rules: readonly Rule[];
}

/**
 * The builtin `from` of `table` jumps into our `chain`, as its first rule: so no rule of
 * another's in that builtin decides before ours. Everything else of ours sits in our chains, so
 * removal is our hooks, then our chains.
 */
export interface Hook {
  readonly table: Table;
  readonly from: Builtin;
  readonly chain: string;
}

/**
 * Policy routing the rules need, in the order it is added (removal: the reverse).
 * - `fwmark-rule`: packets marked `mark` look up route table `table`, at a fixed `priority` (a
 *   second add then fails "File exists" instead of adding a duplicate).
 * - `local-route`: every destination is local in `table`, via lo (what sends marked packets to
 *   the proxy's transparent socket). `optional`: left out where lo has no IPv6 (the kernel refuses it).
 * - `lo-address`: an address on lo (the sidecar's IPv6 inbound passthrough source).
 */
export type Route =
  | { readonly kind: 'fwmark-rule'; readonly mark: Mark; readonly table: number; readonly priority: number }
  | { readonly kind: 'local-route'; readonly table: number; readonly optional?: boolean }
  | { readonly kind: 'lo-address'; readonly addr: Net };

/** Everything of ours one family of a pod netns must hold. */
export interface Plan {
  readonly family: Family;
  /** Our chains; a renderer orders them as its backend prints them. */
  readonly chains: readonly Chain[];
  /** One per builtin we start from. */
  readonly hooks: readonly Hook[];
  readonly routes: readonly Route[];
}

/** A host address as a Net of `family` (/32 or /128). */
export const host = (addr: string, family: Family): Net => ({ addr, len: family === 4 ? 32 : 128 });

/** Loopback of `family` (127.0.0.1/32 or ::1/128, what "to this host over lo" is matched by). */
export const loopbackNet = (family: Family): Net => host(family === 4 ? '127.0.0.1' : '::1', family);

/**
 * Collects a plan's chains rule by rule, in the order builders think in; chains appear in the
 * order first named. A builder adds to builtins through `hook`, which makes our chain and its
 * hook once.
 */
export class PlanBuilder {
  readonly #family: Family;
  readonly #chains = new Map<string, { table: Table; name: string; rules: Rule[] }>();
  readonly #hooks: Hook[] = [];
  readonly #routes: Route[] = [];

  constructor(family: Family) {
    this.#family = family;
  }

  /** Our chain `name` in `table` (made empty when new). */
  chain(table: Table, name: string): Rule[] {
    const key = `${table} ${name}`;
    let c = this.#chains.get(key);
    if (!c) this.#chains.set(key, (c = { table, name, rules: [] }));
    return c.rules;
  }

  add(table: Table, chain: string, match: Match, verdict: Verdict): void {
    this.chain(table, chain).push({ match, verdict });
  }

  /** `from` of `table` jumps first into our `chain` (once, however often asked). */
  hook(table: Table, from: Builtin, chain: string): void {
    this.chain(table, chain);
    if (!this.#hooks.some((h) => h.table === table && h.from === from)) this.#hooks.push({ table, from, chain });
  }

  route(r: Route): void {
    this.#routes.push(r);
  }

  /** Routes that must come before all others (the IPv6 passthrough address before TPROXY's). */
  routeFirst(r: Route): void {
    this.#routes.unshift(r);
  }

  plan(): Plan {
    return {
      family: this.#family,
      chains: [...this.#chains.values()].map((c) => ({ table: c.table, name: c.name, rules: [...c.rules] })),
      hooks: [...this.#hooks],
      routes: [...this.#routes],
    };
  }
}

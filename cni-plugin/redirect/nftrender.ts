// The nftables renderer of the one rule model (model.ts): a pod's plans (IPv4 and, when it has
// one, IPv6) -> the body of ONE `inet` table, for nft.ts to write in one transaction. Pure.
//
// Layout (docs/nftables.md "The table"): each netfilter hook a plan uses gets one base chain,
// named <table>_<hook> (`nat_output`), at the priority iptables' table of that name has there
// (nat: dstnat / -100 / 100 / srcnat; mangle: mangle, a `route` chain on output as iptables'
// mangle OUTPUT re-routes a packet whose mark changed; raw: raw), and nothing in it but a jump per
// family: `meta nfproto ipv4 counter jump nat4_MESH_OUTPUT`. Each plan's chains become regular
// chains named <table><family>_<name>, holding that plan's rules in order; so a rule with no
// address in it (`oifname "lo" counter return`) sees only its own family's packets, as in
// ip(6)tables, and an address match is spelled `ip` or `ip6` for it.
//
// Every rule has a `counter` right before its verdict. A term nft spells differently is mapped
// (the table below each function); a term this renderer cannot say exactly, or one in a place nft
// would reject, refuses the whole plan with an NftRenderError: a pod is never redirected by rules
// that differ from the plan in a way nobody chose. The differences we chose are in docs/nftables.md.

import { OWNED_TABLES, type Table } from './constants.ts';
import type { Builtin, Chain, Extension, Family, Mark, Match, Net, Negatable, Plan, Rule, Verdict } from './model.ts';
import { FULL_MASK } from './model.ts';

/** The pod's table: one per pod netns, both families. */
export const POD_TABLE = 'mesh_pod';

export class NftRenderError extends Error {}

const BUILTIN_ORDER: readonly Builtin[] = ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'];

/**
 * A base chain's `type ... hook ... priority ...`, per iptables table and builtin: the priorities
 * of iptables' own tables there, by nft's names where nft 1.0.6 takes one for that hook.
 */
const BASE: Record<Table, Partial<Record<Builtin, string>>> = {
  nat: {
    PREROUTING: 'type nat hook prerouting priority dstnat',
    INPUT: 'type nat hook input priority 100',
    OUTPUT: 'type nat hook output priority -100',
    POSTROUTING: 'type nat hook postrouting priority srcnat',
  },
  mangle: {
    PREROUTING: 'type filter hook prerouting priority mangle',
    INPUT: 'type filter hook input priority mangle',
    FORWARD: 'type filter hook forward priority mangle',
    OUTPUT: 'type route hook output priority mangle',
    POSTROUTING: 'type filter hook postrouting priority mangle',
  },
  raw: {
    PREROUTING: 'type filter hook prerouting priority raw',
    OUTPUT: 'type filter hook output priority raw',
  },
};

/** The base chain of `table`'s `from` hook. */
export const baseChainName = (table: Table, from: Builtin): string => `${table}_${from.toLowerCase()}`;
/** The regular chain holding plan chain `name` of `table` for `family`. */
export const chainName = (table: Table, family: Family, name: string): string => `${table}${family}_${name}`;

const NFPROTO: Record<Family, string> = { 4: 'ipv4', 6: 'ipv6' };
const ADDR: Record<Family, string> = { 4: 'ip', 6: 'ip6' };

const hex = (n: number): string => `0x${(n >>> 0).toString(16)}`;
const neg = (n: { readonly not?: boolean } | undefined): string => (n?.not ? '!= ' : '');
const isFull = (mask: number | undefined): boolean => mask === undefined || mask >>> 0 === FULL_MASK;

/** What a rule may hold: checked, so nothing a spec let through can reach nft's parser unquoted. */
const IFNAME = /^[A-Za-z0-9_.@-]{1,15}\+?$/;
const ID = /^[0-9]{1,10}$/;
const V4 = /^[0-9]{1,3}(\.[0-9]{1,3}){3}$/;
const V6 = /^[0-9a-f:.]{2,45}$/;

interface Ctx {
  readonly family: Family;
  readonly table: Table;
  readonly chain: string;
  readonly rule: Rule;
  /** Chain names of this plan and table (jump targets). */
  readonly chains: ReadonlySet<string>;
}

function refuse(c: Ctx, why: string): NftRenderError {
  return new NftRenderError(
    `cannot write IPv${c.family} ${c.table} chain ${c.chain} rule ${JSON.stringify(c.rule)} as nftables: ${why}`,
  );
}

function address(c: Ctx, addr: string): string {
  if (!(c.family === 4 ? V4 : V6).test(addr)) throw refuse(c, `"${addr}" is not an IPv${c.family} address`);
  return addr;
}

/** `10.0.0.0/8`, and a host bare (`127.0.0.6`), as `nft list` prints them. */
function net(c: Ctx, n: Net): string {
  const full = c.family === 4 ? 32 : 128;
  if (!Number.isInteger(n.len) || n.len < 0 || n.len > full) throw refuse(c, `bad prefix length ${n.len}`);
  return n.len === full ? address(c, n.addr) : `${address(c, n.addr)}/${n.len}`;
}

/** iptables' `eth+` (any name starting eth) is nft's `"eth*"`. */
function ifname(c: Ctx, name: string): string {
  if (!IFNAME.test(name)) throw refuse(c, `"${name}" is not an interface name`);
  return `"${name.replace(/\+$/, '*')}"`;
}

function id(c: Ctx, v: string): string {
  if (!ID.test(v)) throw refuse(c, `"${v}" is not a numeric uid or gid`);
  return v;
}

function port(c: Ctx, p: number): string {
  if (!Number.isInteger(p) || p < 1 || p > 65535) throw refuse(c, `${p} is not a port`);
  return String(p);
}

/** `meta mark 0x539`, `meta mark != 0x539`, `meta mark & 0xfff == 0x539` (iptables' value/mask). */
function markMatch(key: string, m: Mark, not: boolean | undefined): string {
  if (isFull(m.mask)) return `${key} ${not ? '!= ' : ''}${hex(m.value)}`;
  return `${key} & ${hex(m.mask!)} ${not ? '!=' : '=='} ${hex(m.value)}`;
}

/** iptables' --set-xmark value/mask: bits of mask cleared, then value xor'ed in. */
function markSet(key: string, m: Mark): string {
  if (isFull(m.mask)) return `${key} set ${hex(m.value)}`;
  return `${key} set ${key} & ${hex(~m.mask! >>> 0)} ^ ${hex(m.value)}`;
}

/**
 * iptables -m ... -> nft:
 *   -m tcp --dport P / ! --dport P      tcp dport P / tcp dport != P
 *   -m multiport --dports A,B           tcp dport { A, B } (an anonymous set)
 *   -m owner --uid-owner U / --gid-...  meta skuid U / meta skgid G
 *   -m owner --socket-exists            meta skuid >= 0 (true exactly when there is a socket file)
 *   -m conntrack --ctstate A,B          ct state a,b
 *   -m mark / -m connmark --mark V/M    meta mark & M == V / ct mark & M == V
 *   -m set                              refused: the table holds no set of the agent's
 */
function extension(c: Ctx, e: Extension, proto: string | undefined): string {
  switch (e.kind) {
    case 'l4': {
      if (proto === undefined) throw refuse(c, 'a port match needs the rule to name its protocol');
      const parts = [
        ...(e.sport ? [`${proto} sport ${neg(e.sport)}${port(c, e.sport.value)}`] : []),
        ...(e.dport ? [`${proto} dport ${neg(e.dport)}${port(c, e.dport.value)}`] : []),
      ];
      return parts.join(' ');
    }
    case 'dports':
      if (proto === undefined) throw refuse(c, 'a multiport match needs the rule to name its protocol');
      if (e.ports.length === 0) throw refuse(c, 'a multiport match with no ports');
      return `${proto} dport ${neg(e)}{ ${e.ports.map((p) => port(c, p)).join(', ')} }`;
    case 'owner': {
      if (!e.uid && !e.gid) throw refuse(c, 'an owner match with neither uid nor gid');
      const own = (key: string, v: Negatable<string> | undefined) =>
        v ? [`meta ${key} ${neg(v)}${id(c, v.value)}`] : [];
      return [...own('skuid', e.uid), ...own('skgid', e.gid)].join(' ');
    }
    case 'socket-exists':
      return 'meta skuid >= 0';
    case 'ctstate':
      if (e.states.length === 0) throw refuse(c, 'a conntrack match with no state');
      return `ct state ${e.states.map((s) => s.toLowerCase()).join(',')}`;
    case 'mark':
      return markMatch('meta mark', e.mark, e.not);
    case 'connmark':
      return markMatch('ct mark', e.mark, e.not);
    case 'set':
      throw refuse(c, `set ${e.name} is an ipset of the agent's; the pod's table holds no nft set of that name`);
  }
}

/** Where a target may stand: iptables allows it only in that table, and so does nft's hook check. */
const TARGET_TABLE: Partial<Record<Verdict['kind'], Table>> = {
  redirect: 'nat',
  snat: 'nat',
  tproxy: 'mangle',
  'ct-zone': 'raw',
};

/**
 * iptables -j ... -> nft (each after `counter`):
 *   -j CHAIN / RETURN / ACCEPT / DROP     jump <table><family>_CHAIN / return / accept / drop
 *   -j REDIRECT --to-ports P              redirect to :P
 *   -j TPROXY --on-port P --on-ip A ...   tproxy ip to A:P meta mark set M accept; then drop (below)
 *   -j MARK / CONNMARK --set-xmark V/M    meta mark set ... / ct mark set ...
 *   -j CONNMARK --save-mark / --restore   ct mark set meta mark / meta mark set ct mark (whole marks)
 *   -j CT --zone Z                        ct zone set Z
 *   -j SNAT --to-source A                 snat ip to A
 * One rule of the plan may be two lines: nft's tproxy finding no socket goes on to the next rule,
 * where iptables' TPROXY drops the packet; the second line drops it, so a pod whose proxy is not
 * listening gets no inbound connection past it (fail closed, as with iptables).
 */
function verdict(c: Ctx, v: Verdict, match: string): string[] {
  const table = TARGET_TABLE[v.kind];
  if (table !== undefined && table !== c.table) throw refuse(c, `${v.kind} is for the ${table} table`);
  const needsProto = () => {
    if (c.rule.match.proto === undefined) throw refuse(c, `${v.kind} to a port needs the rule to name tcp or udp`);
  };
  const line = (s: string) => [`${match}${match === '' ? '' : ' '}counter ${s}`];
  switch (v.kind) {
    case 'jump':
      if (!c.chains.has(v.chain)) throw refuse(c, `jump to ${v.chain}, which is no chain of this plan's ${c.table}`);
      return line(`jump ${chainName(c.table, c.family, v.chain)}`);
    case 'return':
    case 'accept':
    case 'drop':
      return line(v.kind);
    case 'redirect':
      needsProto();
      return line(`redirect to :${port(c, v.port)}`);
    case 'tproxy': {
      needsProto();
      const any = v.addr === (c.family === 4 ? '0.0.0.0' : '::');
      const at = any ? '' : c.family === 4 ? address(c, v.addr) : `[${address(c, v.addr)}]`;
      return [
        ...line(`tproxy ${ADDR[c.family]} to ${at}:${port(c, v.port)} ${markSet('meta mark', v.mark)} accept`),
        ...line('drop'),
      ];
    }
    case 'mark-set':
      return line(markSet('meta mark', v.mark));
    case 'connmark-set':
      return line(markSet('ct mark', v.mark));
    case 'connmark-copy':
      if (!isFull(v.nfmask) || !isFull(v.ctmask)) {
        throw refuse(c, 'a connmark save/restore under a mask (nft copies whole marks only)');
      }
      return line(v.dir === 'save' ? 'ct mark set meta mark' : 'meta mark set ct mark');
    case 'ct-zone':
      if (!Number.isInteger(v.zone) || v.zone < 0 || v.zone > 65535) throw refuse(c, `${v.zone} is not a zone`);
      return line(`ct zone set ${v.zone}`);
    case 'snat':
      return line(`snat ${ADDR[c.family]} to ${address(c, v.addr)}`);
  }
}

/** The nft lines of one plan rule (one, or two for TPROXY). */
function ruleLines(c: Ctx): string[] {
  const m: Match = c.rule.match;
  const a = ADDR[c.family];
  const terms = [
    ...(m.iif ? [`iifname ${neg(m.iif)}${ifname(c, m.iif.value)}`] : []),
    ...(m.oif ? [`oifname ${neg(m.oif)}${ifname(c, m.oif.value)}`] : []),
    ...(m.src ? [`${a} saddr ${neg(m.src)}${net(c, m.src.value)}`] : []),
    ...(m.dst ? [`${a} daddr ${neg(m.dst)}${net(c, m.dst.value)}`] : []),
    ...(m.proto ? [`meta l4proto ${m.proto}`] : []),
    ...(m.ext ?? []).map((e) => extension(c, e, m.proto)).filter((s) => s !== ''),
  ];
  return verdict(c, c.rule.verdict, terms.join(' '));
}

function block(name: string, lines: readonly string[]): string[] {
  return [`chain ${name} {`, ...lines.map((l) => `\t${l}`), '}'];
}

/**
 * The body of the pod's inet table for `plans` (at most one per family), as nft.ts takes it. The
 * plans' policy routing is not in it (ip rules and routes are no nftables objects): the caller
 * adds it with `ip -batch` (restoredoc.ts: ipBatchLines).
 */
export function renderNftBody(plans: readonly Plan[]): string {
  const fams = plans.map((p) => p.family);
  if (new Set(fams).size !== fams.length) throw new NftRenderError(`two plans for one family (${fams.join(', ')})`);
  const sorted = [...plans].sort((a, b) => a.family - b.family);
  const base = new Map<string, { table: Table; from: Builtin; jumps: string[] }>();
  const regular: string[] = [];
  for (const plan of sorted) {
    for (const table of OWNED_TABLES) {
      const chains: Chain[] = plan.chains.filter((ch) => ch.table === table).sort((x, y) => (x.name < y.name ? -1 : 1));
      const names = new Set(chains.map((ch) => ch.name));
      for (const ch of chains) {
        if (!/^[A-Za-z][A-Za-z0-9_-]{0,40}$/.test(ch.name)) {
          throw new NftRenderError(`IPv${plan.family} ${table} chain name ${JSON.stringify(ch.name)} is no nft name`);
        }
        const lines = ch.rules.flatMap((rule) =>
          ruleLines({ family: plan.family, table, chain: ch.name, rule, chains: names }),
        );
        regular.push(...block(chainName(table, plan.family, ch.name), lines));
      }
    }
    for (const h of plan.hooks) {
      if (BASE[h.table][h.from] === undefined) {
        throw new NftRenderError(`IPv${plan.family}: iptables' ${h.table} table has no ${h.from} chain to hook`);
      }
      if (!plan.chains.some((ch) => ch.table === h.table && ch.name === h.chain)) {
        throw new NftRenderError(
          `IPv${plan.family}: the ${h.table} ${h.from} hook jumps to ${h.chain}, no chain of the plan`,
        );
      }
      const key = baseChainName(h.table, h.from);
      const b = base.get(key) ?? base.set(key, { table: h.table, from: h.from, jumps: [] }).get(key)!;
      b.jumps.push(`meta nfproto ${NFPROTO[plan.family]} counter jump ${chainName(h.table, plan.family, h.chain)}`);
    }
  }
  const bases = [...base.entries()].sort(
    ([, x], [, y]) =>
      OWNED_TABLES.indexOf(x.table) - OWNED_TABLES.indexOf(y.table) ||
      BUILTIN_ORDER.indexOf(x.from) - BUILTIN_ORDER.indexOf(y.from),
  );
  const out = bases.flatMap(([name, b]) => block(name, [`${BASE[b.table][b.from]!}; policy accept;`, ...b.jumps]));
  return [...out, ...regular].join('\n') + '\n';
}

// The iptables renderer of the one rule model (model.ts): a Plan -> one iptables-restore document
// (and the `ip -batch` lines of its policy routing). Pure. Every rule is written in the exact form
// `iptables-save` prints it (`-m tcp` spelled out, addresses with their prefix length, masks as
// the kernel reports them, the basic options -s -d -i -o -p first), so that what is read back
// compares equal, line for line, with what we meant (iptables.ts: diffRules, reconcileRestore).
//
// Layout, for `iptables-restore --noflush` in a netns shared with others (docs/plugin.md
// "Rules"): per table, our chains made with -N (sorted, as iptables-save lists them), their
// rules, then each hook as `-I <builtin> 1 -j <ours>`. -N makes the document apply only to a
// netns without our chains (every first ADD); anything else is reconciled from what is there.
// Unused tables are left out: with nf_tables each table in a restore costs a kernel commit.

import { OWNED_TABLES } from './constants.ts';
import { FULL_MASK, type Builtin, type Extension, type Mark, type Match, type Net, type Negatable } from './model.ts';
import type { Plan, Route, Rule, Verdict } from './model.ts';

/** Builtins in the order iptables-save lists them; hooks are written in it. */
const BUILTIN_ORDER: readonly Builtin[] = ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'];

export const hex = (n: number): string => `0x${n.toString(16)}`;

/** A mark match as iptables-save prints it: the mask only when not all 32 bits. */
const markMatch = (m: Mark): string =>
  m.mask === undefined || m.mask === FULL_MASK ? hex(m.value) : `${hex(m.value)}/${hex(m.mask)}`;
/** A mark target (--set-xmark, --tproxy-mark): always value/mask. */
const markTarget = (m: Mark): string => `${hex(m.value)}/${hex(m.mask ?? FULL_MASK)}`;

const not = (n: { readonly not?: boolean }): string => (n.not ? '! ' : '');
const net = (n: Net): string => `${n.addr}/${n.len}`;

function basic(opt: string, v: Negatable<string> | undefined): string[] {
  return v === undefined ? [] : [`${not(v)}${opt} ${v.value}`];
}

function extension(e: Extension, proto: string | undefined): string {
  switch (e.kind) {
    case 'l4': {
      if (proto === undefined) throw new Error('a port match needs the rule to name its protocol');
      const sport = e.sport ? ` ${not(e.sport)}--sport ${e.sport.value}` : '';
      const dport = e.dport ? ` ${not(e.dport)}--dport ${e.dport.value}` : '';
      return `-m ${proto}${sport}${dport}`;
    }
    case 'dports':
      return `-m multiport ${not(e)}--dports ${e.ports.join(',')}`;
    case 'owner': {
      const uid = e.uid ? ` ${not(e.uid)}--uid-owner ${e.uid.value}` : '';
      const gid = e.gid ? ` ${not(e.gid)}--gid-owner ${e.gid.value}` : '';
      return `-m owner${uid}${gid}`;
    }
    case 'socket-exists':
      return '-m owner --socket-exists';
    case 'ctstate':
      return `-m conntrack --ctstate ${e.states.join(',')}`;
    case 'mark':
      return `-m mark ${not(e)}--mark ${markMatch(e.mark)}`;
    case 'connmark':
      return `-m connmark ${not(e)}--mark ${markMatch(e.mark)}`;
    case 'set':
      return `-m set --match-set ${e.name} ${e.dir}`;
  }
}

function target(v: Verdict): string {
  switch (v.kind) {
    case 'jump':
      return `-j ${v.chain}`;
    case 'return':
      return '-j RETURN';
    case 'accept':
      return '-j ACCEPT';
    case 'drop':
      return '-j DROP';
    case 'redirect':
      return `-j REDIRECT --to-ports ${v.port}`;
    case 'tproxy':
      return `-j TPROXY --on-port ${v.port} --on-ip ${v.addr} --tproxy-mark ${markTarget(v.mark)}`;
    case 'mark-set':
      return `-j MARK --set-xmark ${markTarget(v.mark)}`;
    case 'connmark-set':
      return `-j CONNMARK --set-xmark ${markTarget(v.mark)}`;
    case 'connmark-copy':
      return `-j CONNMARK --${v.dir}-mark --nfmask ${hex(v.nfmask)} --ctmask ${hex(v.ctmask)}`;
    case 'ct-zone':
      return `-j CT --zone ${v.zone}`;
    case 'snat':
      return `-j SNAT --to-source ${v.addr}`;
  }
}

/** A rule's body (what follows `-A <chain>`), as iptables-save prints it. */
export function ruleText(r: Rule): string {
  const m: Match = r.match;
  const parts = [
    ...(m.src ? [`${not(m.src)}-s ${net(m.src.value)}`] : []),
    ...(m.dst ? [`${not(m.dst)}-d ${net(m.dst.value)}`] : []),
    ...basic('-i', m.iif),
    ...basic('-o', m.oif),
    ...(m.proto ? [`-p ${m.proto}`] : []),
    ...(m.ext ?? []).map((e) => extension(e, m.proto)),
    target(r.verdict),
  ];
  return parts.join(' ');
}

/** The --noflush document that makes the plan's chains and hooks in a netns with none of ours. */
export function renderRestore(plan: Plan): string {
  const out: string[] = [];
  for (const t of OWNED_TABLES) {
    const chains = plan.chains.filter((c) => c.table === t).sort((a, b) => (a.name < b.name ? -1 : 1));
    if (chains.length === 0) continue;
    const hooks = plan.hooks
      .filter((h) => h.table === t)
      .sort((a, b) => BUILTIN_ORDER.indexOf(a.from) - BUILTIN_ORDER.indexOf(b.from));
    out.push(`*${t}`);
    for (const c of chains) out.push(`-N ${c.name}`);
    for (const c of chains) out.push(...c.rules.map((r) => `-A ${c.name} ${ruleText(r)}`));
    out.push(...hooks.map((h) => `-I ${h.from} 1 -j ${h.chain}`), 'COMMIT');
  }
  return out.join('\n') + '\n';
}

/** The fwmark as `ip rule` takes it: decimal when all 32 bits, else value/mask. */
const fwmark = (m: Mark): string =>
  m.mask === undefined || m.mask === FULL_MASK ? String(m.value) : `${hex(m.value)}/${hex(m.mask)}`;

/**
 * One route line for `ip -<family> -force -batch -`: `add` puts it there (replace where ip has
 * it, so a second add is no error), `del` takes it out.
 */
export function routeLine(r: Route, op: 'add' | 'del'): string {
  switch (r.kind) {
    case 'fwmark-rule':
      return `rule ${op} fwmark ${fwmark(r.mark)} lookup ${r.table} priority ${r.priority}`;
    case 'local-route':
      return `route ${op === 'add' ? 'replace' : 'del'} local default dev lo table ${r.table}`;
    case 'lo-address':
      return `address ${op === 'add' ? 'replace' : 'del'} ${net(r.addr)} dev lo`;
  }
}

/**
 * The plan's policy routing as `ip -batch` lines: in order to add, in reverse to delete.
 * `optionalRoutes: false` leaves out the routes marked optional (lo without IPv6).
 */
export function ipBatchLines(plan: Plan, op: 'add' | 'del' = 'add', optionalRoutes = true): string[] {
  const routes = plan.routes.filter((r) => optionalRoutes || !(r.kind === 'local-route' && r.optional));
  return (op === 'add' ? routes : [...routes].reverse()).map((r) => routeLine(r, op));
}

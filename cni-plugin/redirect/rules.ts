// The rule builder: RedirectSpec -> one iptables-restore document per IP family (plus the policy
// routing TPROXY needs). Pure. Rules are written in the exact form `iptables-save` prints them
// (`-m tcp`, `--set-xmark`, canonical CIDRs, our chains sorted, the jumps in kernel order),
// so CHECK and the tests can compare the saved state line by line with what we meant.
//
// Framing: the pod netns is shared with whatever else runs there (another chained plugin, the
// pod's own init containers), so the document is for `iptables-restore --noflush` and touches
// only what is ours: chains named MESH_*, and one jump into them from each builtin chain we use.
// A rule meant for builtin chain B goes into our chain MESH_B (so nat OUTPUT's rules lead our
// MESH_OUTPUT), and B gets `-I B 1 -j MESH_B`: first, so a foreign rule cannot decide before our
// redirection. Our chains are made with -N, so the document applies only to a netns with no
// chain of ours yet (every first ADD); anything else is reconciled from what is there
// (netns/iptables.ts: reconcileRestore), which DEL uses too. Unused tables are left out: with
// nf_tables each table in a restore costs a kernel commit (~15 ms measured), on every pod start.

import {
  CHAIN,
  DNS_PROXY_PORT,
  INBOUND_PASSTHROUGH_V4,
  INBOUND_PASSTHROUGH_V6,
  OUTBOUND_MARK,
  OWNED_TABLES,
  PROBE_ADDRESS_V4,
  PROBE_ADDRESS_V6,
  TPROXY_RULE_PRIORITY,
  type Table,
} from './constants.ts';
import type { Cidr, Family } from './net.ts';
import type { RedirectSpec } from './spec.ts';

export interface FamilyRules {
  readonly family: Family;
  /** Input for `iptables-restore` / `ip6tables-restore`. */
  readonly restore: string;
  /** Lines for `ip -4|-6 -batch -` (TPROXY policy routing, the IPv6 passthrough address); may be empty. */
  readonly ipBatch: readonly string[];
}

const BUILTIN: Record<Table, readonly string[]> = {
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
  raw: ['PREROUTING', 'OUTPUT'],
};

const hex = (n: number): string => `0x${n.toString(16)}`;

/** Our chain for the rules a builtin chain would hold: the builtin jumps to it, once. */
export const entryChain = (builtin: string): string => `MESH_${builtin}`;

class Doc {
  /** table -> chain -> rule bodies (without `-A <chain>`); builtin names stand for their entry chains. */
  readonly #chains = new Map<Table, Map<string, string[]>>();

  constructor() {
    for (const t of OWNED_TABLES) this.#chains.set(t, new Map());
  }

  add(table: Table, chain: string, rule: string): void {
    const chains = this.#chains.get(table)!;
    let rules = chains.get(chain);
    if (!rules) chains.set(chain, (rules = []));
    rules.push(rule);
  }

  /** The --noflush document: our chains (-N), their rules, then the jumps from the builtins. */
  render(): string {
    const out: string[] = [];
    for (const t of OWNED_TABLES) {
      const ours = new Map<string, string[]>();
      const jumps: string[] = [];
      for (const b of BUILTIN[t]) {
        const rules = [...(this.#chains.get(t)!.get(b) ?? []), ...(this.#chains.get(t)!.get(entryChain(b)) ?? [])];
        if (rules.length === 0) continue;
        ours.set(entryChain(b), rules);
        jumps.push(`-I ${b} 1 -j ${entryChain(b)}`);
      }
      for (const [c, rules] of this.#chains.get(t)!) if (!BUILTIN[t].includes(c) && !ours.has(c)) ours.set(c, rules);
      if (ours.size === 0) continue;
      const names = [...ours.keys()].sort();
      out.push(`*${t}`);
      for (const c of names) out.push(`-N ${c}`);
      for (const c of names) out.push(...ours.get(c)!.map((r) => `-A ${c} ${r}`));
      out.push(...jumps, 'COMMIT');
    }
    return out.join('\n') + '\n';
  }
}

function tcpPort(port: number, negate = false): string {
  return `-p tcp -m tcp ${negate ? '! ' : ''}--dport ${port}`;
}

/** Builds the rules for one family. */
export function buildFamilyRules(spec: RedirectSpec, family: Family): FamilyRules {
  const d = new Doc();
  const v6 = family === 6;
  const loopback = v6 ? '::1/128' : '127.0.0.1/32';
  const passthrough = v6 ? `${INBOUND_PASSTHROUGH_V6}/128` : `${INBOUND_PASSTHROUGH_V4}/32`;
  const probe = v6 ? `${PROBE_ADDRESS_V6}/128` : `${PROBE_ADDRESS_V4}/32`;
  const ofFamily = (cidrs: readonly Cidr[]): Cidr[] => cidrs.filter((c) => c.family === family);
  const tproxy = spec.interceptionMode === 'TPROXY';
  const inboundTable: Table = tproxy ? 'mangle' : 'nat';
  const ipBatch: string[] = [];

  // Interfaces the mesh never touches, and virtual-machine interfaces whose traffic is outbound.
  const includeAll = spec.outboundCidrs === '*';
  const includeCidrs = includeAll ? [] : ofFamily(spec.outboundCidrs);
  for (const iface of spec.virtInterfaces) {
    if (includeAll) d.add('nat', 'PREROUTING', `-i ${iface} -j ${CHAIN.REDIRECT}`);
    for (const c of includeCidrs) d.add('nat', 'PREROUTING', `-d ${c.text} -i ${iface} -j ${CHAIN.REDIRECT}`);
    d.add('nat', 'PREROUTING', `-i ${iface} -j RETURN`);
  }
  for (const iface of spec.excludeInterfaces) {
    d.add('nat', 'PREROUTING', `-i ${iface} -j RETURN`);
    d.add('nat', 'OUTPUT', `-o ${iface} -j RETURN`);
    if (tproxy) {
      d.add('mangle', 'PREROUTING', `-i ${iface} -j RETURN`);
      d.add('mangle', 'OUTPUT', `-o ${iface} -j RETURN`);
    }
  }
  if (spec.dropInvalid) {
    d.add('mangle', 'PREROUTING', `-m conntrack --ctstate INVALID -j ${CHAIN.DROP}`);
    d.add('mangle', CHAIN.DROP, '-j DROP');
  }

  d.add('nat', CHAIN.REDIRECT, `-p tcp -j REDIRECT --to-ports ${spec.proxyPort}`);
  d.add('nat', CHAIN.IN_REDIRECT, `-p tcp -j REDIRECT --to-ports ${spec.inboundCapturePort}`);

  // Inbound.
  const captureInbound = spec.inboundPorts === '*' || spec.inboundPorts.length > 0;
  if (captureInbound) {
    const mark = `${hex(spec.tproxyMark)}/0xffffffff`;
    if (tproxy) {
      // Marked packets are routed to lo by the policy route below, where the TPROXY socket sits.
      d.add('mangle', CHAIN.DIVERT, `-j MARK --set-xmark ${mark}`);
      d.add('mangle', CHAIN.DIVERT, '-j ACCEPT');
      d.add(
        'mangle',
        CHAIN.TPROXY,
        `! -d ${loopback} -p tcp -j TPROXY --on-port ${spec.inboundCapturePort} --on-ip ${v6 ? '::' : '0.0.0.0'} --tproxy-mark ${mark}`,
      );
      // Loops: already diverted, passthrough from the proxy, and app-to-self over lo.
      d.add('mangle', CHAIN.INBOUND, `-p tcp -m mark --mark ${hex(spec.tproxyMark)} -j RETURN`);
      d.add('mangle', CHAIN.INBOUND, `-s ${passthrough} -i lo -p tcp -j RETURN`);
      d.add('mangle', CHAIN.INBOUND, `-i lo -p tcp -m mark ! --mark ${hex(OUTBOUND_MARK)} -j RETURN`);
    }
    d.add(inboundTable, 'PREROUTING', `-p tcp -j ${CHAIN.INBOUND}`);
    d.add(inboundTable, CHAIN.INBOUND, `${tcpPort(spec.inboundTunnelPort)} -j RETURN`);
    const capture = (match: string): void => {
      if (tproxy) {
        d.add('mangle', CHAIN.INBOUND, `${match} -m conntrack --ctstate RELATED,ESTABLISHED -j ${CHAIN.DIVERT}`);
        d.add('mangle', CHAIN.INBOUND, `${match} -j ${CHAIN.TPROXY}`);
      } else {
        d.add('nat', CHAIN.INBOUND, `${match} -j ${CHAIN.IN_REDIRECT}`);
      }
    };
    if (spec.inboundPorts === '*') {
      for (const p of spec.inboundExcludePorts) d.add(inboundTable, CHAIN.INBOUND, `${tcpPort(p)} -j RETURN`);
      capture('-p tcp');
    } else {
      for (const p of spec.inboundPorts) capture(tcpPort(p));
    }
    if (tproxy) {
      // A fixed priority makes a second ADD fail with EEXIST instead of adding a duplicate rule.
      ipBatch.push(
        `rule add fwmark ${spec.tproxyMark} lookup ${spec.tproxyRouteTable} priority ${TPROXY_RULE_PRIORITY}`,
      );
      ipBatch.push(`route replace local default dev lo table ${spec.tproxyRouteTable}`);
    }
  }

  // Outbound.
  // (nat OUTPUT's entry chain is MESH_OUTPUT itself: the builtin's rules above lead it.)
  // The probe first: validation must see its connection redirected whatever the pod's ranges say.
  d.add('nat', CHAIN.OUTPUT, `-d ${probe} ${tcpPort(spec.probePort)} -j REDIRECT --to-ports ${spec.probePort}`);
  for (const p of spec.outboundExcludePorts) {
    d.add('nat', CHAIN.OUTPUT, `${tcpPort(p)} -j RETURN`);
    d.add('nat', CHAIN.OUTPUT, `-p udp -m udp --dport ${p} -j RETURN`);
  }
  d.add('nat', CHAIN.OUTPUT, `-s ${passthrough} -o lo -j RETURN`);
  const loopbackIncluded = !includeAll && spec.outboundCidrs.some((c) => c.loopback);
  const owners: [string, readonly string[]][] = [
    ['uid', spec.proxyUids],
    ['gid', spec.proxyGids],
  ];
  for (const [kind, ids] of owners) {
    for (const id of ids) {
      // The proxy calling a local app by its service VIP goes back through inbound capture.
      const notTunnel = spec.captureDns
        ? `-p tcp -m multiport ! --dports 53,${spec.inboundTunnelPort}`
        : tcpPort(spec.inboundTunnelPort, true);
      d.add(
        'nat',
        CHAIN.OUTPUT,
        `! -d ${loopback} -o lo ${notTunnel} -m owner --${kind}-owner ${id} -j ${CHAIN.IN_REDIRECT}`,
      );
      // App to itself over lo stays direct (unless the pod asked for loopback to be captured).
      if (!loopbackIncluded) {
        d.add(
          'nat',
          CHAIN.OUTPUT,
          spec.captureDns
            ? `-o lo -p tcp -m tcp ! --dport 53 -m owner ! --${kind}-owner ${id} -j RETURN`
            : `-o lo -m owner ! --${kind}-owner ${id} -j RETURN`,
        );
      }
      d.add('nat', CHAIN.OUTPUT, `-m owner --${kind}-owner ${id} -j RETURN`);
    }
  }
  if (spec.captureDns) {
    d.add('nat', CHAIN.OUTPUT, `-j ${CHAIN.OUTPUT_DNS}`);
    d.add('nat', CHAIN.OUTPUT_DNS, `-p tcp -m tcp --dport 53 -j REDIRECT --to-ports ${DNS_PROXY_PORT}`);
    d.add('nat', CHAIN.OUTPUT_DNS, `-p udp -m udp --dport 53 -j REDIRECT --to-ports ${DNS_PROXY_PORT}`);
    // Separate conntrack zones for proxy<->upstream and app<->proxy DNS, against UDP races.
    d.add('raw', 'OUTPUT', `-j ${CHAIN.OUTPUT_DNS}`);
    d.add('raw', 'PREROUTING', `-j ${CHAIN.INBOUND}`);
    for (const [kind, ids] of owners) {
      for (const id of ids) {
        d.add('raw', CHAIN.OUTPUT_DNS, `-p udp -m udp --dport 53 -m owner --${kind}-owner ${id} -j CT --zone 1`);
        d.add(
          'raw',
          CHAIN.OUTPUT_DNS,
          `-p udp -m udp --sport ${DNS_PROXY_PORT} -m owner --${kind}-owner ${id} -j CT --zone 2`,
        );
      }
    }
    d.add('raw', CHAIN.OUTPUT_DNS, '-p udp -m udp --dport 53 -j CT --zone 2');
    d.add('raw', CHAIN.INBOUND, '-p udp -m udp --sport 53 -j CT --zone 1');
  }
  d.add('nat', CHAIN.OUTPUT, `-d ${loopback} -j RETURN`);
  for (const c of ofFamily(spec.outboundExcludeCidrs)) d.add('nat', CHAIN.OUTPUT, `-d ${c.text} -j RETURN`);
  for (const p of spec.outboundPorts) d.add('nat', CHAIN.OUTPUT, `${tcpPort(p)} -j ${CHAIN.REDIRECT}`);
  if (includeAll) d.add('nat', CHAIN.OUTPUT, `-j ${CHAIN.REDIRECT}`);
  for (const c of includeCidrs) d.add('nat', CHAIN.OUTPUT, `-d ${c.text} -j ${CHAIN.REDIRECT}`);

  if (tproxy && captureInbound) {
    const m = hex(spec.tproxyMark);
    d.add(
      'mangle',
      'PREROUTING',
      `-p tcp -m mark --mark ${m} -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff`,
    );
    d.add('mangle', 'OUTPUT', `-o lo -p tcp -m mark --mark ${m} -j RETURN`);
    for (const [kind, ids] of owners) {
      for (const id of ids) {
        d.add(
          'mangle',
          'OUTPUT',
          `! -d ${loopback} -o lo -p tcp -m owner --${kind}-owner ${id} -j MARK --set-xmark ${hex(OUTBOUND_MARK)}/0xffffffff`,
        );
      }
    }
    d.add(
      'mangle',
      'OUTPUT',
      `-p tcp -m connmark --mark ${m} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff`,
    );
  }
  if (v6) ipBatch.unshift(`address replace ${INBOUND_PASSTHROUGH_V6}/128 dev lo`);
  return { family, restore: d.render(), ipBatch };
}

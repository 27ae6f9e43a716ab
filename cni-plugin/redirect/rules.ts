// The sidecar's rule builder: RedirectSpec -> the plan of what one IP family of the pod netns
// must hold (model.ts: chains, hooks, policy routing), rendered for iptables by restoredoc.ts in
// the exact form `iptables-save` prints (so CHECK and the tests compare the saved state line by
// line with what we meant). Pure.
//
// Framing: the pod netns is shared with whatever else runs there (another chained plugin, the
// pod's own init containers), so we touch only what is ours: chains named MESH_*, and one hook
// into them from each builtin chain we use. A rule meant for builtin chain B goes into our chain
// MESH_B (so nat OUTPUT's rules lead our MESH_OUTPUT), and B jumps to MESH_B first, so a foreign
// rule cannot decide before our redirection. The rendered document makes our chains with -N, so
// it applies only to a netns with no chain of ours yet (every first ADD); anything else is
// reconciled from what is there (iptables.ts: reconcileRestore), which DEL uses too.

import {
  CHAIN,
  DNS_PROXY_PORT,
  INBOUND_PASSTHROUGH_V4,
  INBOUND_PASSTHROUGH_V6,
  OUTBOUND_MARK,
  PROBE_ADDRESS_V4,
  PROBE_ADDRESS_V6,
  TPROXY_RULE_PRIORITY,
  type Table,
} from './constants.ts';
import {
  FULL_MASK,
  host,
  loopbackNet,
  PlanBuilder,
  type Builtin,
  type Extension,
  type Match,
  type Net,
  type Plan,
  type Verdict,
} from './model.ts';
import type { Cidr, Family } from './net.ts';
import { ipBatchLines, renderRestore } from './restoredoc.ts';
import type { RedirectSpec } from './spec.ts';

export interface FamilyRules {
  readonly family: Family;
  /** Input for `iptables-restore` / `ip6tables-restore`. */
  readonly restore: string;
  /** Lines for `ip -4|-6 -batch -` (TPROXY policy routing, the IPv6 passthrough address); may be empty. */
  readonly ipBatch: readonly string[];
}

const BUILTIN: Record<Table, readonly Builtin[]> = {
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
  raw: ['PREROUTING', 'OUTPUT'],
};

/** Our chain for the rules a builtin chain would hold: the builtin jumps to it, once. */
export const entryChain = (builtin: string): string => `MESH_${builtin}`;

const tcp = (port: number, not = false): Extension => ({ kind: 'l4', dport: { value: port, not } });
const udp = (port: number): Extension => ({ kind: 'l4', dport: { value: port } });
const cidrNet = (c: Cidr): Net => {
  const [addr, len] = c.text.split('/');
  return { addr: addr!, len: Number(len) };
};
const jump = (chain: string): Verdict => ({ kind: 'jump', chain });
const RETURN: Verdict = { kind: 'return' };

/**
 * The sidecar's plan for one family, REDIRECT or TPROXY as the spec says (one builder: the two
 * modes share the outbound half and differ in a few rules interleaved with it).
 */
export function sidecarPlan(spec: RedirectSpec, family: Family): Plan {
  const b = new PlanBuilder(family);
  // A rule meant for a builtin goes into its entry chain (MESH_<builtin>), which the builtin
  // then jumps to first; a rule put in an entry chain by name makes that hook too.
  const add = (table: Table, chain: string, match: Match, verdict: Verdict): void => {
    const from = BUILTIN[table].find((x) => x === chain || entryChain(x) === chain);
    if (from !== undefined) b.hook(table, from, (chain = entryChain(from)));
    b.add(table, chain, match, verdict);
  };
  const v6 = family === 6;
  const loopback = loopbackNet(family);
  const passthrough = host(v6 ? INBOUND_PASSTHROUGH_V6 : INBOUND_PASSTHROUGH_V4, family);
  const probe = host(v6 ? PROBE_ADDRESS_V6 : PROBE_ADDRESS_V4, family);
  const ofFamily = (cidrs: readonly Cidr[]): Cidr[] => cidrs.filter((c) => c.family === family);
  const tproxy = spec.interceptionMode === 'TPROXY';
  const inboundTable: Table = tproxy ? 'mangle' : 'nat';

  // Interfaces the mesh never touches, and virtual-machine interfaces whose traffic is outbound.
  const includeAll = spec.outboundCidrs === '*';
  const includeCidrs = includeAll ? [] : ofFamily(spec.outboundCidrs);
  for (const iface of spec.virtInterfaces) {
    const iif = { value: iface };
    if (includeAll) add('nat', 'PREROUTING', { iif }, jump(CHAIN.REDIRECT));
    for (const c of includeCidrs) add('nat', 'PREROUTING', { dst: { value: cidrNet(c) }, iif }, jump(CHAIN.REDIRECT));
    add('nat', 'PREROUTING', { iif }, RETURN);
  }
  for (const iface of spec.excludeInterfaces) {
    add('nat', 'PREROUTING', { iif: { value: iface } }, RETURN);
    add('nat', 'OUTPUT', { oif: { value: iface } }, RETURN);
    if (tproxy) {
      add('mangle', 'PREROUTING', { iif: { value: iface } }, RETURN);
      add('mangle', 'OUTPUT', { oif: { value: iface } }, RETURN);
    }
  }
  if (spec.dropInvalid) {
    add('mangle', 'PREROUTING', { ext: [{ kind: 'ctstate', states: ['INVALID'] }] }, jump(CHAIN.DROP));
    add('mangle', CHAIN.DROP, {}, { kind: 'drop' });
  }

  add('nat', CHAIN.REDIRECT, { proto: 'tcp' }, { kind: 'redirect', port: spec.proxyPort });
  add('nat', CHAIN.IN_REDIRECT, { proto: 'tcp' }, { kind: 'redirect', port: spec.inboundCapturePort });

  // Inbound.
  const captureInbound = spec.inboundPorts === '*' || spec.inboundPorts.length > 0;
  const mark = { value: spec.tproxyMark, mask: FULL_MASK };
  const lo = { value: 'lo' };
  if (captureInbound) {
    if (tproxy) {
      // Marked packets are routed to lo by the policy route below, where the TPROXY socket sits.
      add('mangle', CHAIN.DIVERT, {}, { kind: 'mark-set', mark });
      add('mangle', CHAIN.DIVERT, {}, { kind: 'accept' });
      add(
        'mangle',
        CHAIN.TPROXY,
        { dst: { value: loopback, not: true }, proto: 'tcp' },
        { kind: 'tproxy', port: spec.inboundCapturePort, addr: v6 ? '::' : '0.0.0.0', mark },
      );
      // Loops: already diverted, passthrough from the proxy, and app-to-self over lo.
      add('mangle', CHAIN.INBOUND, { proto: 'tcp', ext: [{ kind: 'mark', mark: { value: spec.tproxyMark } }] }, RETURN);
      add('mangle', CHAIN.INBOUND, { src: { value: passthrough }, iif: lo, proto: 'tcp' }, RETURN);
      add(
        'mangle',
        CHAIN.INBOUND,
        { iif: lo, proto: 'tcp', ext: [{ kind: 'mark', mark: { value: OUTBOUND_MARK }, not: true }] },
        RETURN,
      );
    }
    add(inboundTable, 'PREROUTING', { proto: 'tcp' }, jump(CHAIN.INBOUND));
    add(inboundTable, CHAIN.INBOUND, { proto: 'tcp', ext: [tcp(spec.inboundTunnelPort)] }, RETURN);
    const capture = (match: Match): void => {
      if (tproxy) {
        const established: Extension = { kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] };
        add('mangle', CHAIN.INBOUND, { ...match, ext: [...(match.ext ?? []), established] }, jump(CHAIN.DIVERT));
        add('mangle', CHAIN.INBOUND, match, jump(CHAIN.TPROXY));
      } else {
        add('nat', CHAIN.INBOUND, match, jump(CHAIN.IN_REDIRECT));
      }
    };
    if (spec.inboundPorts === '*') {
      for (const p of spec.inboundExcludePorts)
        add(inboundTable, CHAIN.INBOUND, { proto: 'tcp', ext: [tcp(p)] }, RETURN);
      capture({ proto: 'tcp' });
    } else {
      for (const p of spec.inboundPorts) capture({ proto: 'tcp', ext: [tcp(p)] });
    }
    if (tproxy) {
      // A fixed priority makes a second ADD fail with EEXIST instead of adding a duplicate rule.
      b.route({
        kind: 'fwmark-rule',
        mark: { value: spec.tproxyMark },
        table: spec.tproxyRouteTable,
        priority: TPROXY_RULE_PRIORITY,
      });
      b.route({ kind: 'local-route', table: spec.tproxyRouteTable });
    }
  }

  // Outbound.
  // (nat OUTPUT's entry chain is MESH_OUTPUT itself: the builtin's rules above lead it.)
  // The probe first: validation must see its connection redirected whatever the pod's ranges say.
  add(
    'nat',
    CHAIN.OUTPUT,
    { dst: { value: probe }, proto: 'tcp', ext: [tcp(spec.probePort)] },
    { kind: 'redirect', port: spec.probePort },
  );
  for (const p of spec.outboundExcludePorts) {
    add('nat', CHAIN.OUTPUT, { proto: 'tcp', ext: [tcp(p)] }, RETURN);
    add('nat', CHAIN.OUTPUT, { proto: 'udp', ext: [udp(p)] }, RETURN);
  }
  add('nat', CHAIN.OUTPUT, { src: { value: passthrough }, oif: lo }, RETURN);
  const loopbackIncluded = !includeAll && spec.outboundCidrs.some((c) => c.loopback);
  const owners: ['uid' | 'gid', readonly string[]][] = [
    ['uid', spec.proxyUids],
    ['gid', spec.proxyGids],
  ];
  const owner = (kind: 'uid' | 'gid', id: string, not = false): Extension =>
    kind === 'uid' ? { kind: 'owner', uid: { value: id, not } } : { kind: 'owner', gid: { value: id, not } };
  const notLoopback = { value: loopback, not: true };
  for (const [kind, ids] of owners) {
    for (const id of ids) {
      // The proxy calling a local app by its service VIP goes back through inbound capture.
      const notTunnel: Extension = spec.captureDns
        ? { kind: 'dports', ports: [53, spec.inboundTunnelPort], not: true }
        : tcp(spec.inboundTunnelPort, true);
      add(
        'nat',
        CHAIN.OUTPUT,
        { dst: notLoopback, oif: lo, proto: 'tcp', ext: [notTunnel, owner(kind, id)] },
        jump(CHAIN.IN_REDIRECT),
      );
      // App to itself over lo stays direct (unless the pod asked for loopback to be captured).
      if (!loopbackIncluded) {
        add(
          'nat',
          CHAIN.OUTPUT,
          spec.captureDns
            ? { oif: lo, proto: 'tcp', ext: [tcp(53, true), owner(kind, id, true)] }
            : { oif: lo, ext: [owner(kind, id, true)] },
          RETURN,
        );
      }
      add('nat', CHAIN.OUTPUT, { ext: [owner(kind, id)] }, RETURN);
    }
  }
  if (spec.captureDns) {
    const dnsProxy: Verdict = { kind: 'redirect', port: DNS_PROXY_PORT };
    add('nat', CHAIN.OUTPUT, {}, jump(CHAIN.OUTPUT_DNS));
    add('nat', CHAIN.OUTPUT_DNS, { proto: 'tcp', ext: [tcp(53)] }, dnsProxy);
    add('nat', CHAIN.OUTPUT_DNS, { proto: 'udp', ext: [udp(53)] }, dnsProxy);
    // Separate conntrack zones for proxy<->upstream and app<->proxy DNS, against UDP races.
    add('raw', 'OUTPUT', {}, jump(CHAIN.OUTPUT_DNS));
    add('raw', 'PREROUTING', {}, jump(CHAIN.INBOUND));
    for (const [kind, ids] of owners) {
      for (const id of ids) {
        add('raw', CHAIN.OUTPUT_DNS, { proto: 'udp', ext: [udp(53), owner(kind, id)] }, { kind: 'ct-zone', zone: 1 });
        add(
          'raw',
          CHAIN.OUTPUT_DNS,
          { proto: 'udp', ext: [{ kind: 'l4', sport: { value: DNS_PROXY_PORT } }, owner(kind, id)] },
          { kind: 'ct-zone', zone: 2 },
        );
      }
    }
    add('raw', CHAIN.OUTPUT_DNS, { proto: 'udp', ext: [udp(53)] }, { kind: 'ct-zone', zone: 2 });
    add(
      'raw',
      CHAIN.INBOUND,
      { proto: 'udp', ext: [{ kind: 'l4', sport: { value: 53 } }] },
      { kind: 'ct-zone', zone: 1 },
    );
  }
  add('nat', CHAIN.OUTPUT, { dst: { value: loopback } }, RETURN);
  for (const c of ofFamily(spec.outboundExcludeCidrs)) add('nat', CHAIN.OUTPUT, { dst: { value: cidrNet(c) } }, RETURN);
  for (const p of spec.outboundPorts) add('nat', CHAIN.OUTPUT, { proto: 'tcp', ext: [tcp(p)] }, jump(CHAIN.REDIRECT));
  if (includeAll) add('nat', CHAIN.OUTPUT, {}, jump(CHAIN.REDIRECT));
  for (const c of includeCidrs) add('nat', CHAIN.OUTPUT, { dst: { value: cidrNet(c) } }, jump(CHAIN.REDIRECT));

  if (tproxy && captureInbound) {
    const m = { value: spec.tproxyMark };
    const all = FULL_MASK;
    add(
      'mangle',
      'PREROUTING',
      { proto: 'tcp', ext: [{ kind: 'mark', mark: m }] },
      { kind: 'connmark-copy', dir: 'save', nfmask: all, ctmask: all },
    );
    add('mangle', 'OUTPUT', { oif: lo, proto: 'tcp', ext: [{ kind: 'mark', mark: m }] }, RETURN);
    for (const [kind, ids] of owners) {
      for (const id of ids) {
        add(
          'mangle',
          'OUTPUT',
          { dst: notLoopback, oif: lo, proto: 'tcp', ext: [owner(kind, id)] },
          { kind: 'mark-set', mark: { value: OUTBOUND_MARK, mask: all } },
        );
      }
    }
    add(
      'mangle',
      'OUTPUT',
      { proto: 'tcp', ext: [{ kind: 'connmark', mark: m }] },
      { kind: 'connmark-copy', dir: 'restore', nfmask: all, ctmask: all },
    );
  }
  if (v6) b.routeFirst({ kind: 'lo-address', addr: passthrough });
  return b.plan();
}

/** The sidecar's plan for one family, rendered for iptables and `ip -batch`. */
export function buildFamilyRules(spec: RedirectSpec, family: Family): FamilyRules {
  const plan = sidecarPlan(spec, family);
  return { family, restore: renderRestore(plan), ipBatch: ipBatchLines(plan) };
}

// Ambient mode's in-pod redirection to the node proxy (ztunnel), as Istio's
// cni/pkg/iptables/iptables.go (AppendInpodRules) and iptables_linux.go (ip rule/route) build it,
// with our chain names: the pod's options, the builder of its plan in the one rule model
// (cni-plugin/redirect/model.ts), and the applier, which is the sidecar's (iptables.ts: read what
// is there, reconcile ours in one restore, remove exactly ours) over the runner the caller passes
// in (the agent: inside the pod's netns). The node dataplane (dataplane.ts) applies them when it
// enrolls a pod (docs/ambient.md "Ambient mode's rules"), through podbackend.ts, which picks this
// iptables applier or the nftables one for the same plan.
//
// In-place repair writes a sidecar pod's rules (the plugin's plan) with src/repair/rulewriters.ts.
// This one is ambient's plan, its constants and its iptables writing.

import { isIPv4, isIPv6 } from 'node:net';
import type { Flavour, NetnsRunner, RunResult } from '../../cni-plugin/redirect/iptables.ts';
import { ensureRules, ipBatch, parseRules, removeRules, save } from '../../cni-plugin/redirect/iptables.ts';
import {
  host,
  loopbackNet,
  PlanBuilder,
  type Extension,
  type Mark,
  type Plan,
} from '../../cni-plugin/redirect/model.ts';
import type { Family } from '../../cni-plugin/redirect/net.ts';
import { ipBatchLines, renderRestore } from '../../cni-plugin/redirect/restoredoc.ts';

export type { Family, Flavour, RunResult };

export const CHAIN_PRERT = 'MESH_PRERT';
export const CHAIN_OUTPUT = 'MESH_OUTPUT';
/** The mark ztunnel puts on its own sockets (ztunnel's DEFAULT_INPOD_MARK, 1337). */
export const INPOD_MARK = 0x539;
export const INPOD_MASK = 0xfff;
/** The connmark of connections ztunnel answered, routed back to it through table 100. */
export const INPOD_TPROXY_MARK = 0x111;
export const INPOD_TPROXY_MASK = 0xfff;
export const INPOD_RESTORE_MASK = 0xffffffff;
export const ROUTE_TABLE = 100;
export const RULE_PRIORITY = 32764;

export const ZTUNNEL_OUTBOUND_PORT = 15001;
export const ZTUNNEL_INBOUND_PLAINTEXT_PORT = 15006;
/** HBONE: ztunnel terminates it itself, never redirected. */
export const ZTUNNEL_INBOUND_PORT = 15008;
export const DNS_CAPTURE_PORT = 15053;

/**
 * Where the node SNATs its own probes to (hostrules.ts), so the pod lets them past ztunnel: the
 * defaults of --host-probe-snat-ip / --host-probe-snat-ipv6, defined here once.
 */
export const PROBE_SNAT_V4 = '169.254.7.127';
export const PROBE_SNAT_V6 = 'fd16:9254:7127:1337:ffff:ffff:ffff:ffff';

export const ANNOTATION_BYPASS_INBOUND = 'ambient.mesh.io/bypass-inbound-capture';
export const ANNOTATION_DNS_CAPTURE = 'ambient.mesh.io/dns-capture';
export const ANNOTATION_VIRTUAL_INTERFACES = 'mesh.io/reroute-virtual-interfaces';

export interface InpodOptions {
  /** Ingress mode (ambient.mesh.io/bypass-inbound-capture): inbound is not captured, probes need no exemption. */
  readonly ingressMode: boolean;
  /** DNS to ztunnel's 15053 (the global setting, or the pod's ambient.mesh.io/dns-capture). */
  readonly dnsCapture: boolean;
  /** Interfaces whose inbound TCP is treated as outbound (mesh.io/reroute-virtual-interfaces). */
  readonly virtualInterfaces: readonly string[];
  readonly probeSnatV4?: string;
  readonly probeSnatV6?: string;
}

export class AmbientRulesError extends Error {}

// Linux interface names: 1-15 bytes, no '/', no whitespace; we also refuse iptables' '+'
// wildcard and '!' so that an annotation can only ever name one interface.
const IFACE = /^[A-Za-z0-9_.:@-]{1,15}$/;

/** A pod's annotations as options. A bad value is refused (Istio ignores it): fail closed. */
export function podOptions(annotations: Readonly<Record<string, string>>, globalDnsCapture: boolean): InpodOptions {
  const bool = (key: string): boolean | null => {
    const v = annotations[key];
    if (v === undefined) return null;
    // Exactly Go's strconv.ParseBool, as Istio reads these: the same manifest means the same here.
    if (['1', 't', 'T', 'TRUE', 'true', 'True'].includes(v)) return true;
    if (['0', 'f', 'F', 'FALSE', 'false', 'False'].includes(v)) return false;
    throw new AmbientRulesError(`annotation ${key}="${v}" is not a boolean; write "true" or "false"`);
  };
  const virtualInterfaces = (annotations[ANNOTATION_VIRTUAL_INTERFACES] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  const opts = {
    ingressMode: bool(ANNOTATION_BYPASS_INBOUND) ?? false,
    dnsCapture: bool(ANNOTATION_DNS_CAPTURE) ?? globalDnsCapture,
    virtualInterfaces,
  };
  validate(opts);
  return opts;
}

function validate(opts: InpodOptions): void {
  for (const i of opts.virtualInterfaces) {
    if (!IFACE.test(i))
      throw new AmbientRulesError(
        `${ANNOTATION_VIRTUAL_INTERFACES}: "${i}" is not an interface name (1-15 of A-Z a-z 0-9 _ . : @ -)`,
      );
  }
  if (opts.probeSnatV4 !== undefined && !isIPv4(opts.probeSnatV4))
    throw new AmbientRulesError(`probe SNAT address "${opts.probeSnatV4}" is not an IPv4 address`);
  if (opts.probeSnatV6 !== undefined && (!isIPv6(opts.probeSnatV6) || opts.probeSnatV6.includes('%')))
    throw new AmbientRulesError(`probe SNAT address "${opts.probeSnatV6}" is not an IPv6 address`);
}

/**
 * An IPv6 address as iptables-save prints it (lower case, the longest zero run compressed), so that
 * what we write compares equal to what we read back and a second apply changes nothing.
 */
export const ipv6Text = (ip: string): string => new URL(`http://[${ip}]/`).hostname.slice(1, -1);

const MARK: Mark = { value: INPOD_MARK, mask: INPOD_MASK };
const TPROXY_MARK: Mark = { value: INPOD_TPROXY_MARK, mask: INPOD_TPROXY_MASK };
const mark = (m: Mark, not = false): Extension => ({ kind: 'mark', mark: m, not });
/** Istio's bare `-m tcp` / `-m udp` with or without a port (a no-op past `-p` without one). */
const l4 = (port?: { dport?: number; sport?: number; not?: boolean }): Extension => ({
  kind: 'l4',
  ...(port?.dport !== undefined && { dport: { value: port.dport, not: port.not } }),
  ...(port?.sport !== undefined && { sport: { value: port.sport } }),
});

/**
 * The in-pod plan for one family: Istio's rules (AppendInpodRules), each in its chain in Istio's
 * order, and the policy routing of ztunnel's replies. The hooks come first in their builtins
 * (Istio appends them): a foreign rule that decided before ours would take the pod past ztunnel.
 */
export function inpodPlan(family: Family, opts: InpodOptions): Plan {
  validate(opts);
  const b = new PlanBuilder(family);
  const notLocal = { value: loopbackNet(family), not: true };
  const probe = host(
    family === 4 ? (opts.probeSnatV4 ?? PROBE_SNAT_V4) : ipv6Text(opts.probeSnatV6 ?? PROBE_SNAT_V6),
    family,
  );

  // Everything of ours sits in our chains, so removal is hooks + chains.
  b.hook('mangle', 'PREROUTING', CHAIN_PRERT);
  b.hook('mangle', 'OUTPUT', CHAIN_OUTPUT);
  b.hook('nat', 'OUTPUT', CHAIN_OUTPUT);
  if (opts.dnsCapture) {
    b.hook('raw', 'PREROUTING', CHAIN_PRERT);
    b.hook('raw', 'OUTPUT', CHAIN_OUTPUT);
  }
  b.hook('nat', 'PREROUTING', CHAIN_PRERT);

  // Inbound TCP on a virtual interface (VMs, DinD) is the pod's own outbound: to 15001, and out of our chain.
  for (const i of opts.virtualInterfaces) {
    b.add('nat', CHAIN_PRERT, { iif: { value: i }, proto: 'tcp' }, { kind: 'redirect', port: ZTUNNEL_OUTBOUND_PORT });
    b.add('nat', CHAIN_PRERT, { iif: { value: i }, proto: 'tcp' }, { kind: 'return' });
  }
  // Packets ztunnel marked: remember on the connection, so the replies route back to ztunnel.
  b.add('mangle', CHAIN_PRERT, { ext: [mark(MARK)] }, { kind: 'connmark-set', mark: TPROXY_MARK });
  // The node's own probes arrive SNATed to the probe address: not captured.
  if (!opts.ingressMode)
    b.add('nat', CHAIN_PRERT, { src: { value: probe }, proto: 'tcp', ext: [l4()] }, { kind: 'accept' });
  b.add('nat', CHAIN_OUTPUT, { dst: { value: probe }, proto: 'tcp', ext: [l4()] }, { kind: 'accept' });
  if (!opts.ingressMode) {
    b.add(
      'nat',
      CHAIN_PRERT,
      { dst: notLocal, proto: 'tcp', ext: [l4({ dport: ZTUNNEL_INBOUND_PORT, not: true }), mark(MARK, true)] },
      { kind: 'redirect', port: ZTUNNEL_INBOUND_PLAINTEXT_PORT },
    );
  }
  b.add(
    'mangle',
    CHAIN_OUTPUT,
    { ext: [{ kind: 'connmark', mark: TPROXY_MARK }] },
    { kind: 'connmark-copy', dir: 'restore', nfmask: INPOD_RESTORE_MASK, ctmask: INPOD_RESTORE_MASK },
  );
  if (opts.dnsCapture) {
    const toDns = { kind: 'redirect', port: DNS_CAPTURE_PORT } as const;
    b.add(
      'nat',
      CHAIN_OUTPUT,
      { oif: { value: 'lo', not: true }, proto: 'udp', ext: [mark(MARK, true), l4({ dport: 53 })] },
      toDns,
    );
    b.add('nat', CHAIN_OUTPUT, { dst: notLocal, proto: 'tcp', ext: [l4({ dport: 53 }), mark(MARK, true)] }, toDns);
    // ztunnel's upstream DNS and its replies get their own conntrack zone (against UDP conntrack races).
    b.add('raw', CHAIN_OUTPUT, { proto: 'udp', ext: [mark(MARK), l4({ dport: 53 })] }, { kind: 'ct-zone', zone: 1 });
    b.add(
      'raw',
      CHAIN_PRERT,
      { proto: 'udp', ext: [mark(MARK, true), l4({ sport: 53 })] },
      { kind: 'ct-zone', zone: 1 },
    );
  }
  b.add('nat', CHAIN_OUTPUT, { proto: 'tcp', ext: [mark(TPROXY_MARK)] }, { kind: 'accept' });
  // The app calling itself by its pod IP goes over lo: not through ztunnel.
  b.add('nat', CHAIN_OUTPUT, { dst: notLocal, oif: { value: 'lo' } }, { kind: 'accept' });
  b.add(
    'nat',
    CHAIN_OUTPUT,
    { dst: notLocal, proto: 'tcp', ext: [mark(MARK, true)] },
    { kind: 'redirect', port: ZTUNNEL_OUTBOUND_PORT },
  );

  // ztunnel's marked replies route to the pod itself (table 100); Istio replaces the route, so a
  // second add is no error. The local route is optional: the kernel refuses it where the pod's lo
  // has IPv6 off ("IPv6 is disabled on nexthop device"), and Istio skips it there too.
  b.route({ kind: 'local-route', table: ROUTE_TABLE, optional: family === 6 });
  b.route({ kind: 'fwmark-rule', mark: TPROXY_MARK, table: ROUTE_TABLE, priority: RULE_PRIORITY });
  return b.plan();
}

/** The in-pod plan of one family as an iptables-restore document (restoredoc.ts). */
export const inpodRestore = (family: Family, opts: InpodOptions): string => renderRestore(inpodPlan(family, opts));

// ---- applying: through the one applier (iptables.ts), over the agent's runner ----

/** How the agent runs a program in a netns (dataplane.ts: nsenter by fd; the host: runOnHost). */
export type Runner = (argv: readonly string[], opts?: { readonly input?: string }) => Promise<RunResult>;

/** The applier's runner over the agent's: `where` names the netns in messages. */
export function netnsRunner(run: Runner, where: string): NetnsRunner {
  return { where, run: (argv, o) => run(argv, o.input == null ? undefined : { input: o.input }) };
}

const IN_POD = "in the pod's netns";

/**
 * Whether the pod's lo carries IPv6 (Istio reads net.ipv6.conf.lo.disable_ipv6; the image has no
 * cat or sysctl to read it in the pod's netns, and lo loses ::1 exactly when IPv6 is off on it).
 */
export async function loHasIPv6(run: Runner): Promise<boolean> {
  const r = await run(['ip', '-6', '-o', 'addr', 'show', 'dev', 'lo']);
  if (r.error !== null || r.code !== 0)
    throw new AmbientRulesError(
      `ip -6 addr show dev lo failed ${IN_POD} (exit ${r.code}): ${(r.error ?? r.stderr).trim() || 'no output'}`,
    );
  return r.stdout.trim() !== '';
}

/** The pod's redirection to ztunnel, whatever of ours is there already (idempotent). */
export async function applyInpod(
  run: Runner,
  flavour: Flavour,
  families: readonly Family[],
  opts: InpodOptions,
): Promise<'unchanged' | 'applied'> {
  const runner = netnsRunner(run, IN_POD);
  let result: 'unchanged' | 'applied' = 'unchanged';
  for (const f of families) {
    const plan = inpodPlan(f, opts);
    const optional = f === 4 || (await loHasIPv6(run));
    await ipBatch(runner, f, ipBatchLines(plan, 'add', optional), 'add');
    if ((await ensureRules(runner, flavour, f, renderRestore(plan))) !== 'unchanged') result = 'applied';
  }
  return result;
}

/** Removes our hooks, chains, ip rule and route; nothing else. */
export async function removeInpod(run: Runner, flavour: Flavour, families: readonly Family[]): Promise<void> {
  const runner = netnsRunner(run, IN_POD);
  const opts: InpodOptions = { ingressMode: false, dnsCapture: false, virtualInterfaces: [] };
  for (const f of families) {
    await removeRules(runner, flavour, f);
    await ipBatch(runner, f, ipBatchLines(inpodPlan(f, opts), 'del'), 'del');
  }
}

/**
 * Whether the pod's netns redirects to ztunnel in each family: nat's hooks into our chains and our
 * outbound chain not empty. What the start-up checks when it is not to rewrite running pods' rules.
 */
export async function redirectsToZtunnel(run: Runner, flavour: Flavour, families: readonly Family[]): Promise<boolean> {
  for (const f of families) {
    const nat = parseRules(await save(netnsRunner(run, IN_POD), flavour, f)).get('nat');
    const jumps = (chain: string, to: string) => (nat?.get(chain) ?? []).some((l) => l === `-A ${chain} -j ${to}`);
    if (!jumps('PREROUTING', CHAIN_PRERT) || !jumps('OUTPUT', CHAIN_OUTPUT)) return false;
    if ((nat?.get(CHAIN_OUTPUT) ?? []).length === 0) return false;
  }
  return true;
}

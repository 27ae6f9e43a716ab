// Ambient mode's in-pod redirection to the node proxy (ztunnel), as Istio's
// cni/pkg/iptables/iptables.go (AppendInpodRules) and iptables_linux.go (ip rule/route) build it,
// with our chain names. Pure builders first; at the end, a small applier that runs the
// iptables/ip programs through a runner the caller passes in (the agent: inside the pod's netns).
// The node dataplane (dataplane.ts) applies them when it enrolls a pod (docs/ambient.md
// "Ambient mode's rules").

import { isIPv4, isIPv6 } from 'node:net';
import type { RunResult } from '../podnetns/program.ts';

export type Family = 4 | 6;
export type Flavour = 'legacy' | 'nft';
export type Table = 'mangle' | 'nat' | 'raw';

export const CHAIN_PRERT = 'MESH_PRERT';
export const CHAIN_OUTPUT = 'MESH_OUTPUT';
/**
 * In a pod's netns every MESH_* chain is ours, as Istio sweeps ISTIO_* leftovers there: a sidecar
 * mode's chains (same prefix, and a MESH_OUTPUT too) must not stay beside ztunnel's redirection.
 * Every other chain belongs to someone else.
 */
export const OWN_CHAIN_PREFIX = 'MESH_';

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

/** Where the node SNATs its own probes to (hostrules.ts), so the pod lets them past ztunnel. */
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

/** One rule: appended to `chain` of `table`, or inserted first when `first`. */
export interface Rule {
  readonly table: Table;
  readonly chain: string;
  readonly args: readonly string[];
  readonly first?: boolean;
}

const hex = (n: number): string => `0x${n.toString(16)}`;
const MARK = `${hex(INPOD_MARK)}/${hex(INPOD_MASK)}`;
const TPROXY_MARK = `${hex(INPOD_TPROXY_MARK)}/${hex(INPOD_TPROXY_MASK)}`;

/** The in-pod rules for one family, in Istio's order (AppendInpodRules). */
export function inpodRules(family: Family, opts: InpodOptions): Rule[] {
  validate(opts);
  const local = family === 4 ? '127.0.0.1/32' : '::1/128';
  const probe = family === 4 ? (opts.probeSnatV4 ?? PROBE_SNAT_V4) : ipv6Text(opts.probeSnatV6 ?? PROBE_SNAT_V6);
  const rules: Rule[] = [];
  const add = (table: Table, chain: string, ...args: string[]) => rules.push({ table, chain, args });

  // Jumps into our chains first: everything of ours sits in them, so removal is jumps + chains.
  add('mangle', 'PREROUTING', '-j', CHAIN_PRERT);
  add('mangle', 'OUTPUT', '-j', CHAIN_OUTPUT);
  add('nat', 'OUTPUT', '-j', CHAIN_OUTPUT);
  if (opts.dnsCapture) {
    add('raw', 'PREROUTING', '-j', CHAIN_PRERT);
    add('raw', 'OUTPUT', '-j', CHAIN_OUTPUT);
  }
  add('nat', 'PREROUTING', '-j', CHAIN_PRERT);

  // Inbound TCP on a virtual interface (VMs, DinD) is the pod's own outbound: to 15001, and out of our chain.
  for (const i of opts.virtualInterfaces) {
    add('nat', CHAIN_PRERT, '-i', i, '-p', 'tcp', '-j', 'REDIRECT', '--to-ports', `${ZTUNNEL_OUTBOUND_PORT}`);
    add('nat', CHAIN_PRERT, '-i', i, '-p', 'tcp', '-j', 'RETURN');
  }
  // Packets ztunnel marked: remember on the connection, so the replies route back to ztunnel.
  add('mangle', CHAIN_PRERT, '-m', 'mark', '--mark', MARK, '-j', 'CONNMARK', '--set-xmark', TPROXY_MARK);
  // The node's own probes arrive SNATed to the probe address: not captured.
  if (!opts.ingressMode) add('nat', CHAIN_PRERT, '-s', probe, '-p', 'tcp', '-m', 'tcp', '-j', 'ACCEPT');
  add('nat', CHAIN_OUTPUT, '-d', probe, '-p', 'tcp', '-m', 'tcp', '-j', 'ACCEPT');
  if (!opts.ingressMode) {
    // prettier-ignore
    add('nat', CHAIN_PRERT, '!', '-d', local, '-p', 'tcp', '!', '--dport', `${ZTUNNEL_INBOUND_PORT}`,
      '-m', 'mark', '!', '--mark', MARK, '-j', 'REDIRECT', '--to-ports', `${ZTUNNEL_INBOUND_PLAINTEXT_PORT}`);
  }
  // prettier-ignore
  add('mangle', CHAIN_OUTPUT, '-m', 'connmark', '--mark', TPROXY_MARK, '-j', 'CONNMARK', '--restore-mark',
    '--nfmask', hex(INPOD_RESTORE_MASK), '--ctmask', hex(INPOD_RESTORE_MASK));
  if (opts.dnsCapture) {
    // prettier-ignore
    add('nat', CHAIN_OUTPUT, '!', '-o', 'lo', '-p', 'udp', '-m', 'mark', '!', '--mark', MARK,
      '-m', 'udp', '--dport', '53', '-j', 'REDIRECT', '--to-port', `${DNS_CAPTURE_PORT}`);
    // prettier-ignore
    add('nat', CHAIN_OUTPUT, '!', '-d', local, '-p', 'tcp', '--dport', '53', '-m', 'mark', '!', '--mark', MARK,
      '-j', 'REDIRECT', '--to-ports', `${DNS_CAPTURE_PORT}`);
    // ztunnel's upstream DNS and its replies get their own conntrack zone (Istio issue 33469).
    // prettier-ignore
    add('raw', CHAIN_OUTPUT, '-p', 'udp', '-m', 'mark', '--mark', MARK, '-m', 'udp', '--dport', '53',
      '-j', 'CT', '--zone', '1');
    // prettier-ignore
    add('raw', CHAIN_PRERT, '-p', 'udp', '-m', 'mark', '!', '--mark', MARK, '-m', 'udp', '--sport', '53',
      '-j', 'CT', '--zone', '1');
  }
  add('nat', CHAIN_OUTPUT, '-p', 'tcp', '-m', 'mark', '--mark', TPROXY_MARK, '-j', 'ACCEPT');
  // The app calling itself by its pod IP goes over lo: not through ztunnel.
  add('nat', CHAIN_OUTPUT, '!', '-d', local, '-o', 'lo', '-j', 'ACCEPT');
  // prettier-ignore
  add('nat', CHAIN_OUTPUT, '!', '-d', local, '-p', 'tcp', '-m', 'mark', '!', '--mark', MARK,
    '-j', 'REDIRECT', '--to-ports', `${ZTUNNEL_OUTBOUND_PORT}`);
  return rules;
}

const TABLE_ORDER: readonly Table[] = ['mangle', 'nat', 'raw'];
const BUILTIN = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);
export const isOurs = (chain: string): boolean => chain.startsWith(OWN_CHAIN_PREFIX);
/** Which chains a reconcile owns (rewrites, deletes, and whose jumps it moves). */
export type Owns = (chain: string) => boolean;

function ruleLine(r: Rule): string {
  return `${r.first ? `-I ${r.chain} 1` : `-A ${r.chain}`} ${r.args.join(' ')}`;
}

/** Per table: our chains (in the order they first get a rule, then jump targets) and the rule lines. */
export function byTable(rules: readonly Rule[]): Map<Table, { chains: string[]; lines: string[] }> {
  const out = new Map<Table, { chains: string[]; lines: string[] }>();
  for (const t of TABLE_ORDER) {
    const mine = rules.filter((r) => r.table === t);
    if (mine.length === 0) continue;
    const chains: string[] = [];
    const declare = (c: string) => !BUILTIN.has(c) && !chains.includes(c) && chains.push(c);
    for (const r of mine) declare(r.chain);
    // a chain we only jump to (nat MESH_PRERT in ingress mode) exists too; targets (ACCEPT...) are not chains
    for (const r of mine) if (r.args.at(-2) === '-j' && isOurs(r.args.at(-1)!)) declare(r.args.at(-1)!);
    out.set(t, { chains, lines: mine.map(ruleLine) });
  }
  return out;
}

/**
 * An iptables-restore document for a netns without our chains: `:CHAIN - [0:0]` declares each
 * (with --noflush it creates it, or flushes it when there), then the rules in order.
 */
export function renderRestore(rules: readonly Rule[]): string {
  const out: string[] = [];
  for (const [table, { chains, lines }] of byTable(rules)) {
    out.push(`*${table}`, ...chains.map((c) => `:${c} - [0:0]`), ...lines, 'COMMIT');
  }
  return out.join('\n') + '\n';
}

/**
 * `ip -<family> -batch` lines that route ztunnel's marked replies to the pod itself (table 100).
 * `loRoute: false` leaves out the local route: the pod's lo has IPv6 off, where the kernel refuses
 * it ("IPv6 is disabled on nexthop device"); Istio skips it there too.
 */
export function inpodRouteCommands(family: Family, op: 'add' | 'del', loRoute = true): string[][] {
  const any = family === 4 ? '0.0.0.0/0' : '::/0';
  const rule = ['rule', op, 'fwmark', TPROXY_MARK, 'pref', `${RULE_PRIORITY}`, 'lookup', `${ROUTE_TABLE}`];
  // Istio: RouteReplace on add, so a second add is no error.
  const route = ['route', op === 'add' ? 'replace' : 'del', 'local', any, 'dev', 'lo', 'table', `${ROUTE_TABLE}`];
  if (!loRoute) return [rule];
  return op === 'add' ? [route, rule] : [rule, route];
}

/**
 * Whether the pod's lo carries IPv6 (Istio reads net.ipv6.conf.lo.disable_ipv6; the image has no
 * cat or sysctl to read it in the pod's netns, and lo loses ::1 exactly when IPv6 is off on it).
 */
async function loHasIPv6(run: Runner): Promise<boolean> {
  const r = await run(['ip', '-6', '-o', 'addr', 'show', 'dev', 'lo']);
  if (r.error !== null || r.code !== 0) throw failed('ip -6 addr show dev lo', r);
  return r.stdout.trim() !== '';
}

// ---- what is there: iptables-save, read for what is ours ----

/** table -> chain -> rule lines (`-A chain ...`); counters, policies and comments dropped. */
export type SavedRules = Map<string, Map<string, string[]>>;

export function parseSave(text: string): SavedRules {
  const out: SavedRules = new Map();
  let chains: Map<string, string[]> | null = null;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      chains = new Map();
      out.set(line.slice(1).trim(), chains);
    } else if (chains === null || line === '' || line.startsWith('#') || line === 'COMMIT') {
      continue;
    } else if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0]!;
      if (!chains.has(name)) chains.set(name, []);
    } else if (line.startsWith('-A ')) {
      const name = line.split(' ')[1]!;
      (chains.get(name) ?? chains.set(name, []).get(name)!).push(line);
    }
  }
  return out;
}

/**
 * Whether a saved rule jumps (-j/-g) into a chain `owns` claims. Quoted strings (comments; iptables-save
 * writes \" inside them) are blanked first: a rule of another's that merely mentions our chain in its
 * comment is not ours to delete.
 */
const jumpsTo = (owns: Owns, line: string): boolean => {
  const m = / -[jg] (\S+)/.exec(line.replace(/"(?:[^"\\]|\\.)*"/g, '""'));
  return m !== null && owns(m[1]!);
};

const BASIC_OPTIONS = ['-s', '-d', '-i', '-o', '-p'];

/**
 * How iptables-save prints a rule we wrote: the basic options (-s -d -i -o -p) first, bare
 * addresses with their prefix length, a port match's implicit `-m tcp`/`-m udp` right after
 * them, `--to-port` as `--to-ports`. Only for comparing; a form not covered here costs one
 * needless (atomic, correct) rewrite, never a wrong rule.
 */
export function canonicalRule(line: string, family: Family): string {
  const [, chain, ...t] = line.replace(/^-I (\S+) 1 /, '-A $1 ').split(' ');
  const basic = new Map<string, string[]>();
  const rest: string[] = [];
  for (let i = 0; i < t.length; i++) {
    const neg = t[i] === '!' && BASIC_OPTIONS.includes(t[i + 1]!);
    const opt = neg ? t[++i]! : t[i]!;
    if (BASIC_OPTIONS.includes(opt) && t[i + 1] !== undefined) {
      let value = t[++i]!;
      if ((opt === '-s' || opt === '-d') && !value.includes('/')) value += `/${family === 4 ? 32 : 128}`;
      basic.set(opt, neg ? ['!', opt, value] : [opt, value]);
    } else {
      rest.push(opt === '--to-port' ? '--to-ports' : opt);
    }
  }
  const proto = basic.get('-p')?.at(-1);
  const hasPort = rest.includes('--dport') || rest.includes('--sport');
  const explicit = rest.some((x, j) => x === '-m' && rest[j + 1] === proto);
  if ((proto === 'tcp' || proto === 'udp') && hasPort && !explicit) rest.unshift('-m', proto);
  return ['-A', chain!, ...BASIC_OPTIONS.flatMap((o) => basic.get(o) ?? []), ...rest].join(' ');
}

/** Ours in a parsed save: our chains whole, and the jumps into them in other chains, canonical. */
function oursIn(saved: SavedRules, tables: readonly string[], family: Family, owns: Owns): string[] {
  const out: string[] = [];
  for (const t of tables) {
    const chains = saved.get(t);
    if (!chains) continue;
    for (const [c, lines] of [...chains].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      if (owns(c)) out.push(`${t} :${c}`, ...lines.map((l) => `${t} ${canonicalRule(l, family)}`));
      else out.push(...lines.filter((l) => jumpsTo(owns, l)).map((l) => `${t} ${canonicalRule(l, family)}`));
    }
  }
  return out;
}

/** What `rules` would look like in iptables-save, in the same form as oursIn reads it. */
function wantedAsSaved(rules: readonly Rule[], family: Family, owns: Owns): string[] {
  const saved: SavedRules = new Map();
  for (const [t, { chains }] of byTable(rules)) {
    const m = new Map<string, string[]>(chains.map((c) => [c, []]));
    for (const r of rules.filter((x) => x.table === t)) {
      const list = m.get(r.chain) ?? m.set(r.chain, []).get(r.chain)!;
      if (r.first) list.unshift(`-A ${r.chain} ${r.args.join(' ')}`);
      else list.push(`-A ${r.chain} ${r.args.join(' ')}`);
    }
    saved.set(t, m);
  }
  return oursIn(saved, TABLE_ORDER, family, owns);
}

/**
 * The --noflush document that turns what is there into `want` (empty: remove all of ours), and
 * touches nothing that is not ours; null when what is there already equals it. Per table, in one
 * commit: our jumps out, our chains declared (created, or flushed), the ones not wanted deleted,
 * then our rules and jumps in order.
 */
export function reconcileDocument(
  want: readonly Rule[],
  saveText: string,
  family: Family,
  owns: Owns = isOurs,
): string | null {
  const have = parseSave(saveText);
  const tables = [...new Set<string>([...TABLE_ORDER, ...have.keys()])];
  const scope = tables.filter((t) => t === 'mangle' || t === 'nat' || t === 'raw' || t === 'filter');
  const haveOurs = oursIn(have, scope, family, owns);
  const wantOurs = wantedAsSaved(want, family, owns);
  if (haveOurs.join('\n') === wantOurs.join('\n')) return null;
  const wanted = byTable(want);
  const out: string[] = [];
  for (const t of scope) {
    const h = have.get(t) ?? new Map<string, string[]>();
    const w = wanted.get(t as Table);
    const thereChains = [...h.keys()].filter(owns);
    const jumps = [...h].filter(([c]) => !owns(c)).flatMap(([, lines]) => lines.filter((l) => jumpsTo(owns, l)));
    if (!w && thereChains.length === 0 && jumps.length === 0) continue;
    out.push(`*${t}`, ...jumps.map((l) => `-D ${l.slice(3)}`));
    const declared = [...(w?.chains ?? [])];
    for (const c of thereChains) if (!declared.includes(c)) declared.push(c);
    out.push(...declared.map((c) => `:${c} - [0:0]`));
    out.push(...thereChains.filter((c) => !w?.chains.includes(c)).map((c) => `-X ${c}`));
    out.push(...(w?.lines ?? []), 'COMMIT');
  }
  return out.join('\n') + '\n';
}

// ---- applying: the programs run through a runner (the agent: nsenter into the pod's netns) ----

/** The agent's one result type (src/podnetns/program.ts). */
export type { RunResult };
export type Runner = (argv: readonly string[], opts?: { readonly input?: string }) => Promise<RunResult>;

const bin = (flavour: Flavour, family: Family, what: 'save' | 'restore'): string =>
  `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-${what}`;

function failed(what: string, r: RunResult): AmbientRulesError {
  return new AmbientRulesError(`${what} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim() || 'no output'}`);
}

export async function saveRules(run: Runner, flavour: Flavour, family: Family): Promise<string> {
  const r = await run([bin(flavour, family, 'save')]);
  if (r.error !== null || r.code !== 0) throw failed(bin(flavour, family, 'save'), r);
  return r.stdout;
}

/**
 * Reconcile mode: read iptables-save, and when ours differs from `want`, rewrite ours in one
 * atomic `iptables-restore --noflush`; other components' rules stay as they are.
 */
export async function reconcileRules(
  run: Runner,
  flavour: Flavour,
  family: Family,
  want: readonly Rule[],
  owns: Owns = isOurs,
): Promise<'unchanged' | 'applied'> {
  const doc = reconcileDocument(want, await saveRules(run, flavour, family), family, owns);
  if (doc === null) return 'unchanged';
  const restore = bin(flavour, family, 'restore');
  const r = await run([restore, '--noflush', '-w', '5'], { input: doc });
  if (r.error !== null || r.code !== 0) throw failed(`${restore} --noflush`, r);
  return 'applied';
}

/**
 * `ip -batch` of `commands`. What the op wants that is already so is success: "File exists" for
 * an add, "No such ..." / "Cannot find" for a del (rule: ENOENT, route: ESRCH); anything else fails.
 */
async function ipBatch(run: Runner, family: Family, op: 'add' | 'del'): Promise<void> {
  const loRoute = family === 4 || op === 'del' || (await loHasIPv6(run));
  const input =
    inpodRouteCommands(family, op, loRoute)
      .map((c) => c.join(' '))
      .join('\n') + '\n';
  const r = await run(['ip', `-${family}`, '-force', '-batch', '-'], { input });
  if (r.error !== null) throw failed('ip -batch', r);
  const fine = op === 'add' ? /File exists/ : /No such|Cannot find/;
  const said = r.stderr.split('\n').filter((l) => l.trim() !== '');
  const real = said.filter((l) => !fine.test(l) && !/^Command failed/.test(l));
  // A failure is excused only by a line saying what the op wants is so: a non-zero exit that
  // says nothing (or nothing but "Command failed") left the rule or route unknown.
  if (r.code !== 0 && (real.length > 0 || !said.some((l) => fine.test(l))))
    throw new AmbientRulesError(
      `ip -${family} -batch (${op}) failed (exit ${r.code}): ${real.join('; ') || said.join('; ') || 'no output'}`,
    );
}

/** The pod's redirection to ztunnel, whatever of ours is there already (idempotent). */
export async function applyInpod(
  run: Runner,
  flavour: Flavour,
  families: readonly Family[],
  opts: InpodOptions,
): Promise<'unchanged' | 'applied'> {
  let result: 'unchanged' | 'applied' = 'unchanged';
  for (const f of families) {
    await ipBatch(run, f, 'add');
    if ((await reconcileRules(run, flavour, f, inpodRules(f, opts))) === 'applied') result = 'applied';
  }
  return result;
}

/** Removes our jumps, chains, ip rule and route; nothing else. */
export async function removeInpod(run: Runner, flavour: Flavour, families: readonly Family[]): Promise<void> {
  for (const f of families) {
    await reconcileRules(run, flavour, f, []);
    await ipBatch(run, f, 'del');
  }
}

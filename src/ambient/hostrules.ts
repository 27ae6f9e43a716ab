// Ambient mode's host probe path, as Istio's AppendHostRules and cni/pkg/ipset build it: the node's
// own connections to an enrolled pod (kubelet's probes) are SNATed to the probe address, which the
// pod's rules (podrules.ts) let past ztunnel. `--socket-exists` tells a node-local socket from a
// forwarded packet (kube-proxy, NodePort), which must still be captured. The pods are those whose
// IP is in an ipset; each entry carries the pod UID as comment, so that a late removal for an old
// pod never evicts a new pod that got the same IP.
//
// The rule is a plan in the one rule model (cni-plugin/redirect/model.ts), written and read back by
// the one applier (cni-plugin/redirect/iptables.ts) over a runner the caller passes in (the agent:
// the host netns), owning only MESH_POSTRT there; the sets are ipset's. Then the reader the healer
// (hostheal.ts) checks them with.

import { isIPv4, isIPv6 } from 'node:net';
import type { HostProbes, ProbeRemoval } from './hostbackend.ts';
import type { HostDrift, HostStateBackend } from './hostheal.ts';
import { Serial } from '../concurrency.ts';
import { diffRules, ensureRules, parseRules, removeRules } from '../../cni-plugin/redirect/iptables.ts';
import { host, PlanBuilder, type Plan } from '../../cni-plugin/redirect/model.ts';
import { renderRestore } from '../../cni-plugin/redirect/restoredoc.ts';
import {
  AmbientRulesError,
  ipv6Text,
  netnsRunner,
  PROBE_SNAT_V4,
  PROBE_SNAT_V6,
  type Family,
  type Flavour,
  type RunResult,
  type Runner,
} from './podrules.ts';

export const CHAIN_POSTRT = 'MESH_POSTRT';
export const PROBE_SET_V4 = 'mesh-inpod-probes-v4';
export const PROBE_SET_V6 = 'mesh-inpod-probes-v6';

export const probeSet = (family: Family): string => (family === 4 ? PROBE_SET_V4 : PROBE_SET_V6);
/** On the host only MESH_POSTRT is ours: other MESH_* chains there are not the probe path's to touch. */
const ownsHost = (chain: string): boolean => chain === CHAIN_POSTRT;

/** nat POSTROUTING -> MESH_POSTRT (first, as Istio inserts it) -> SNAT of node sockets to enrolled pods. */
export function hostPlan(family: Family, snatAddress?: string): Plan {
  const given = snatAddress ?? (family === 4 ? PROBE_SNAT_V4 : PROBE_SNAT_V6);
  if (!(family === 4 ? isIPv4(given) : isIPv6(given) && !given.includes('%')))
    throw new AmbientRulesError(`probe SNAT address "${given}" is not an IPv${family} address`);
  const b = new PlanBuilder(family);
  b.hook('nat', 'POSTROUTING', CHAIN_POSTRT);
  b.add(
    'nat',
    CHAIN_POSTRT,
    { proto: 'tcp', ext: [{ kind: 'socket-exists' }, { kind: 'set', name: probeSet(family), dir: 'dst' }] },
    { kind: 'snat', addr: host(family === 4 ? given : ipv6Text(given), family).addr },
  );
  return b.plan();
}

/** The host plan as an iptables-restore document (restoredoc.ts). */
export const hostRestore = (family: Family, snatAddress?: string): string =>
  renderRestore(hostPlan(family, snatAddress));

const ON_HOST = 'on the host';

// A pod UID (RFC 4122 text) or at least something that cannot break out of ipset's quoted comment.
const UID = /^[A-Za-z0-9][A-Za-z0-9-]{0,62}$/;

/**
 * One spelling per address, as Istio compares netip.Addr values (Unmap()ed): IPv6 in RFC 5952 form
 * (lower case, zeros compressed), an IPv4-mapped IPv6 address as the IPv4 one (its set, where the
 * SNAT rule matches it). `ipset save` prints its own spelling; a removal must find the entry
 * whatever spelling it was given, or the entry would outlive the pod.
 */
export function canonicalIP(ip: string): { family: Family; text: string } {
  if (isIPv4(ip)) return { family: 4, text: ip };
  // a zone (fe80::1%eth0) names no pod address; URL below would throw on it
  if (!isIPv6(ip) || ip.includes('%')) throw new AmbientRulesError(`"${ip}" is not an IP address`);
  const text = ipv6Text(ip);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(text);
  if (mapped) {
    const [hi, lo] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)];
    return { family: 4, text: [hi >> 8, hi & 0xff, lo >> 8, lo & 0xff].join('.') };
  }
  return { family: 6, text };
}

function checkUid(uid: string): void {
  if (!UID.test(uid)) throw new AmbientRulesError(`pod UID "${uid}" is not a UID (letters, digits and -)`);
}

/**
 * `ipset restore` input that makes our sets, keeping a set that is there (same type) and its
 * entries, as Istio's create-if-absent: the start-up sync adds the enrolled pods and prunes the
 * rest. Emptied here, every enrolled pod's probes would miss the SNAT until then, for as long as
 * a start failing after this kept failing, and a pod without an IP yet (the prune skipped for it)
 * would lose its entry anyway.
 */
export function probeSetsDocument(families: readonly Family[]): string {
  const lines: string[] = [];
  for (const f of families) lines.push(`create ${probeSet(f)} hash:ip family ${f === 4 ? 'inet' : 'inet6'} comment`);
  return lines.join('\n') + '\n';
}

/** `ipset` argv that adds (or re-owns: `-exist` replaces the comment) the pod's IP. */
export function addProbeCommand(ip: string, uid: string): string[] {
  checkUid(uid);
  const { family, text } = canonicalIP(ip);
  return ['add', probeSet(family), text, 'comment', uid, '-exist'];
}

/** The entries of `ipset save <set>`: IP (canonicalIP's spelling) -> the UID comment ('' for none). */
export function parseProbeSet(saveText: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of saveText.split('\n')) {
    const m = /^add \S+ (\S+)(?: .*?comment "([^"]*)")?/.exec(line.trim());
    if (m) out.set(isIPv4(m[1]!) || isIPv6(m[1]!) ? canonicalIP(m[1]!).text : m[1]!, m[2] ?? '');
  }
  return out;
}

// ---- applying ----

// What this agent keeps per host runner (the dataplane's one), owned by that runner's entry here,
// not by the module: two dataplanes (two runners) never wait on each other.
//
// `serial`: every change to the probe sets, one at a time. A removal is a list, then a delete when
// the entry is still the pod's (ipset has no compare-and-delete): an add of the same IP for a new
// pod landing in between would be deleted with it, and the new pod's probes would go to ztunnel.
// Only this agent writes these sets, so ordering its own calls here closes that window whatever
// the caller does.
//
// `ledger`: what this agent put in the sets through the runner and has not taken out since: IP
// (canonicalIP's spelling) -> pod UID. A heal puts exactly this back when someone else flushed or
// destroyed a set: pod annotations would name pods whose add never reached the set. Changed in
// the same serialized step as the set, so a heal never re-adds an entry a removal has just taken out.
interface ProbeSetsState {
  readonly serial: Serial;
  readonly ledger: Map<string, string>;
}
const byRunner = new WeakMap<Runner, ProbeSetsState>();
function stateOf(run: Runner): ProbeSetsState {
  let s = byRunner.get(run);
  if (s === undefined) byRunner.set(run, (s = { serial: new Serial(), ledger: new Map() }));
  return s;
}
const oneAtATime = <T>(run: Runner, fn: () => Promise<T>): Promise<T> => stateOf(run).serial.run(fn);
const ledger = (run: Runner): Map<string, string> => stateOf(run).ledger;

function failed(what: string, r: RunResult): AmbientRulesError {
  return new AmbientRulesError(`${what} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim() || 'no output'}`);
}

async function ipset(run: Runner, args: readonly string[], input?: string): Promise<RunResult> {
  const r = await run(['ipset', ...args], input === undefined ? undefined : { input });
  if (r.error !== null || r.code !== 0) throw failed(`ipset ${args.join(' ')}`, r);
  return r;
}

/** Start-up: our sets made (kept with their entries when there), then the SNAT rule. */
export async function applyHost(
  run: Runner,
  flavour: Flavour,
  families: readonly Family[],
  snat: { readonly v4?: string; readonly v6?: string } = {},
): Promise<'unchanged' | 'applied'> {
  await oneAtATime(run, () => ipset(run, ['restore', '-exist'], probeSetsDocument(families)));
  let result: 'unchanged' | 'applied' = 'unchanged';
  for (const f of families) {
    const doc = hostRestore(f, f === 4 ? snat.v4 : snat.v6);
    if ((await ensureRules(netnsRunner(run, ON_HOST), flavour, f, doc, ownsHost)) !== 'unchanged') result = 'applied';
  }
  return result;
}

export async function addProbeIP(run: Runner, ip: string, uid: string): Promise<void> {
  const argv = addProbeCommand(ip, uid);
  await oneAtATime(run, async () => {
    await ipset(run, argv);
    ledger(run).set(argv[2]!, uid);
  });
}

/** `ipset restore` lines adding each entry (checked as addProbeCommand checks them). */
const addLines = (entries: Iterable<readonly [ip: string, uid: string]>): string[] =>
  [...entries].map(([ip, uid]) => {
    const [, set, text] = addProbeCommand(ip, uid);
    return `add ${set} ${text} comment "${uid}"`;
  });

/**
 * Many adds in one `ipset restore -exist` (start-up: a node of 250 pods is one process, not 250).
 * False when it failed: ipset restore stops at the first bad line, so nothing is known to be in.
 */
export async function addProbeIPs(
  run: Runner,
  entries: readonly (readonly [ip: string, uid: string])[],
): Promise<boolean> {
  const input = addLines(entries)
    .map((l) => `${l}\n`)
    .join('');
  return oneAtATime(run, async () => {
    const r = await run(['ipset', 'restore', '-exist'], { input });
    if (r.error !== null || r.code !== 0) return false;
    for (const [ip, uid] of entries) ledger(run).set(canonicalIP(ip).text, uid);
    return true;
  });
}

/**
 * Removes the pod's IP only if the entry is still the pod's (same UID): when the IP went to a
 * newer pod, the entry stays and its owner is returned. Istio does the same list-then-delete;
 * here no add of ours through the same runner runs in between (oneAtATime).
 */
export async function removeProbeIP(run: Runner, ip: string, uid: string): Promise<ProbeRemoval> {
  checkUid(uid);
  const { family, text } = canonicalIP(ip);
  const set = probeSet(family);
  return oneAtATime(run, async (): Promise<ProbeRemoval> => {
    // Out of the record first: a heal must not put back an entry whose pod is leaving, even
    // when the delete below fails (the removal's retry deletes it).
    if (ledger(run).get(text) === uid) ledger(run).delete(text);
    const owner = parseProbeSet((await ipset(run, ['save', set])).stdout).get(text);
    if (owner === undefined) return { removed: false, owner: null };
    if (owner !== uid) return { removed: false, owner };
    // -exist: gone meanwhile is fine, what was asked holds
    await ipset(run, ['del', set, text, '-exist']);
    return { removed: true };
  });
}

/**
 * Uninstall: the rule and chain out first (a set in use cannot be destroyed), then the sets.
 * True when anything of ours was there. `flavour` null: no iptables on the node, only the sets.
 */
export async function removeHost(run: Runner, flavour: Flavour | null, families: readonly Family[]): Promise<boolean> {
  let any = false;
  for (const f of families) {
    if (flavour !== null && (await removeRules(netnsRunner(run, ON_HOST), flavour, f, ownsHost))) any = true;
    const r = await oneAtATime(run, () => {
      for (const ip of [...ledger(run).keys()]) if (canonicalIP(ip).family === f) ledger(run).delete(ip);
      return run(['ipset', 'destroy', probeSet(f)]);
    });
    if (r.error === null && r.code === 0) any = true;
    else if (!/does not exist/.test(r.stderr)) throw failed(`ipset destroy ${probeSet(f)}`, r);
  }
  return any;
}

// ---- healing: what of ours is there, read back (hostheal.ts runs it) ----

/** What differs between our nat rules in `saveText` (iptables-save -t nat) and the plan; null: none. */
export function hostRulesDrift(saveText: string, family: Family, snatAddress?: string): string | null {
  const have = parseRules(saveText);
  if (diffRules(parseRules(hostRestore(family, snatAddress)), have, ownsHost).length === 0) return null;
  const nat = have.get('nat');
  const chain = nat?.get(CHAIN_POSTRT);
  const jump = (nat?.get('POSTROUTING') ?? []).some((l) => l.split(' ').slice(-2).join(' ') === `-j ${CHAIN_POSTRT}`);
  if (chain === undefined) {
    return jump
      ? `the ${CHAIN_POSTRT} chain is gone`
      : `the ${CHAIN_POSTRT} chain and its jump from nat POSTROUTING are gone`;
  }
  if (!jump) return `the jump from nat POSTROUTING to ${CHAIN_POSTRT} is gone`;
  return chain.length === 0 ? `${CHAIN_POSTRT} is empty (flushed)` : `${CHAIN_POSTRT} holds other rules than ours`;
}

/** At most this many entries named in a log line; the count says the rest. */
const NAMED = 5;

/**
 * The drift of a family's set against what this agent enrolled (`ledger`: IP -> pod UID), for
 * either backend: the enrolled IPs `have` (the set's IP -> pod UID) lacks, or holds for another
 * pod, named up to NAMED; null when none.
 */
export function missingEntries(
  ledger: Iterable<readonly [string, string]>,
  have: ReadonlyMap<string, string>,
  family: Family,
  set: string,
): HostDrift | null {
  const ours = [...ledger].filter(([ip]) => canonicalIP(ip).family === family);
  const missing = ours.filter(([ip, uid]) => have.get(ip) !== uid);
  if (missing.length === 0) return null;
  const named = missing.slice(0, NAMED).map(([ip, uid]) => `${ip} (pod ${uid})`);
  if (missing.length > NAMED) named.push(`${missing.length - NAMED} more`);
  return {
    what: 'entry',
    family,
    detail: `${missing.length} of ${ours.length} enrolled IPs not in ${set}: ${named.join(', ')}`,
  };
}

/**
 * The node's probe path as iptables (the node's flavour) and ipset write it: MESH_POSTRT and its
 * jump, the probe sets, and in them the entries this agent wrote through `run`.
 */
export function iptablesHostState(
  run: Runner,
  flavour: Flavour,
  families: readonly Family[],
  snat: { readonly v4?: string; readonly v6?: string } = {},
): HostStateBackend {
  const snatOf = (f: Family) => (f === 4 ? snat.v4 : snat.v6);
  return {
    name: `iptables-${flavour} + ipset`,
    async inspect() {
      const drift: HostDrift[] = [];
      for (const family of families) {
        // Only the nat table: all of ours is there, and a busy node's whole save is megabytes.
        const save = `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-save`;
        const r = await run([save, '-t', 'nat']);
        if (r.error !== null || r.code !== 0) throw failed(`${save} -t nat`, r);
        const rule = hostRulesDrift(r.stdout, family, snatOf(family));
        if (rule !== null) drift.push({ what: 'rule', family, detail: rule });

        const set = probeSet(family);
        const s = await run(['ipset', 'save', set]);
        const gone = s.error === null && s.code !== 0 && /does not exist/.test(s.stderr);
        if (!gone && (s.error !== null || s.code !== 0)) throw failed(`ipset save ${set}`, s);
        if (gone) drift.push({ what: 'set', family, detail: `${set} is gone` });
        const have = gone ? new Map<string, string>() : parseProbeSet(s.stdout);
        const entry = missingEntries(ledger(run), have, family, set);
        if (entry) drift.push(entry);
      }
      return drift;
    },
    async repair() {
      // The sets (and their entries) before the rule: a rule naming a set that is not there is refused.
      await oneAtATime(run, () => {
        const entries = [...ledger(run)].filter(([ip]) => families.includes(canonicalIP(ip).family));
        return ipset(
          run,
          ['restore', '-exist'],
          probeSetsDocument(families) +
            addLines(entries)
              .map((l) => `${l}\n`)
              .join(''),
        );
      });
      for (const f of families)
        await ensureRules(netnsRunner(run, ON_HOST), flavour, f, hostRestore(f, snatOf(f)), ownsHost);
    },
  };
}

/**
 * The probe path as iptables (the node's flavour, detected when first needed) and ipset write it,
 * in the one shape the dataplane calls (hostbackend.ts). One per host runner: the ledger and the
 * order of set changes are that runner's (stateOf).
 */
export class IptablesHostProbes implements HostProbes {
  readonly kind = 'iptables';
  readonly name: string;
  readonly #run: Runner;
  readonly #flavour: () => Promise<Flavour>;
  readonly #families: readonly Family[];
  readonly #snat: { readonly v4?: string; readonly v6?: string };

  constructor(
    run: Runner,
    flavour: () => Promise<Flavour>,
    families: readonly Family[],
    snat: { readonly v4?: string; readonly v6?: string } = {},
  ) {
    this.#run = run;
    this.#flavour = flavour;
    this.#families = [...families];
    this.#snat = snat;
    this.name = 'iptables + ipset';
  }

  async #state(): Promise<HostStateBackend> {
    return iptablesHostState(this.#run, await this.#flavour(), this.#families, this.#snat);
  }

  async apply(): Promise<'unchanged' | 'applied'> {
    return applyHost(this.#run, await this.#flavour(), this.#families, this.#snat);
  }

  addProbeIP(ip: string, uid: string): Promise<void> {
    return addProbeIP(this.#run, ip, uid);
  }

  addProbeIPs(entries: readonly (readonly [ip: string, uid: string])[]): Promise<boolean> {
    return addProbeIPs(this.#run, entries);
  }

  removeProbeIP(ip: string, uid: string): Promise<ProbeRemoval> {
    return removeProbeIP(this.#run, ip, uid);
  }

  async dropProbeIP(ip: string): Promise<void> {
    const { family, text } = canonicalIP(ip);
    await oneAtATime(this.#run, () => ipset(this.#run, ['del', probeSet(family), text, '-exist']));
  }

  /** Both sets' entries; a set that is not there has none. */
  async entries(): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (const f of this.#families) {
      const r = await this.#run(['ipset', 'save', probeSet(f)]);
      if (r.error === null && r.code !== 0 && /does not exist/.test(r.stderr)) continue;
      if (r.error !== null || r.code !== 0) throw failed(`ipset save ${probeSet(f)}`, r);
      for (const [ip, uid] of parseProbeSet(r.stdout)) out.set(ip, uid);
    }
    return out;
  }

  /**
   * The rule, the chain and the sets out. A node without iptables (no flavour found) or without
   * ipset has none of ours there: absent, not an error.
   */
  async remove(): Promise<'removed' | 'absent'> {
    const flavour = await this.#flavour().catch(() => null);
    try {
      return (await removeHost(this.#run, flavour, this.#families)) ? 'removed' : 'absent';
    } catch (e) {
      if (/ENOENT|not found|No such file/.test((e as Error).message)) return 'absent';
      throw e;
    }
  }

  async inspect(): Promise<HostDrift[]> {
    return (await this.#state()).inspect();
  }

  async repair(drift: readonly HostDrift[]): Promise<void> {
    return (await this.#state()).repair(drift);
  }
}

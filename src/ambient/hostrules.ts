// Ambient mode's host probe path, as Istio's AppendHostRules and cni/pkg/ipset build it: the node's
// own connections to an enrolled pod (kubelet's probes) are SNATed to the probe address, which the
// pod's rules (podrules.ts) let past ztunnel. `--socket-exists` tells a node-local socket from a
// forwarded packet (kube-proxy, NodePort), which must still be captured. The pods are those whose
// IP is in an ipset; each entry carries the pod UID as comment, so that a late removal for an old
// pod never evicts a new pod that got the same IP.
//
// Pure builders first, then a small applier over a runner the caller passes in (the agent: the
// host netns). Not wired into the agent yet (issue 17).

import { isIPv4, isIPv6 } from 'node:net';
import {
  AmbientRulesError,
  PROBE_SNAT_V4,
  PROBE_SNAT_V6,
  reconcileRules,
  type Family,
  type Flavour,
  type Rule,
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
export function hostRules(family: Family, snatAddress?: string): Rule[] {
  const snat = snatAddress ?? (family === 4 ? PROBE_SNAT_V4 : PROBE_SNAT_V6);
  if (!(family === 4 ? isIPv4(snat) : isIPv6(snat)))
    throw new AmbientRulesError(`probe SNAT address "${snat}" is not an IPv${family} address`);
  return [
    { table: 'nat', chain: 'POSTROUTING', args: ['-j', CHAIN_POSTRT], first: true },
    {
      table: 'nat',
      chain: CHAIN_POSTRT,
      // prettier-ignore
      args: ['-m', 'owner', '--socket-exists', '-p', 'tcp', '-m', 'set', '--match-set', probeSet(family), 'dst',
        '-j', 'SNAT', '--to-source', snat],
    },
  ];
}

// A pod UID (RFC 4122 text) or at least something that cannot break out of ipset's quoted comment.
const UID = /^[A-Za-z0-9][A-Za-z0-9-]{0,62}$/;

function ipFamily(ip: string): Family {
  if (isIPv4(ip)) return 4;
  if (isIPv6(ip)) return 6;
  throw new AmbientRulesError(`"${ip}" is not an IP address`);
}

function checkUid(uid: string): void {
  if (!UID.test(uid)) throw new AmbientRulesError(`pod UID "${uid}" is not a UID (letters, digits and -)`);
}

/** `ipset restore` input that makes our sets (kept if there, same type) and empties them: the start state. */
export function probeSetsDocument(families: readonly Family[]): string {
  const lines: string[] = [];
  for (const f of families) {
    lines.push(`create ${probeSet(f)} hash:ip family ${f === 4 ? 'inet' : 'inet6'} comment`);
    lines.push(`flush ${probeSet(f)}`);
  }
  return lines.join('\n') + '\n';
}

/** `ipset` argv that adds (or re-owns: `-exist` replaces the comment) the pod's IP. */
export function addProbeCommand(ip: string, uid: string): string[] {
  checkUid(uid);
  return ['add', probeSet(ipFamily(ip)), ip, 'comment', uid, '-exist'];
}

/** The entries of `ipset save <set>`: IP -> the UID comment ('' for none). */
export function parseProbeSet(saveText: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of saveText.split('\n')) {
    const m = /^add \S+ (\S+)(?: .*?comment "([^"]*)")?/.exec(line.trim());
    if (m) out.set(m[1]!, m[2] ?? '');
  }
  return out;
}

export type ProbeRemoval = { readonly removed: true } | { readonly removed: false; readonly owner: string | null };

// ---- applying ----

function failed(what: string, r: RunResult): AmbientRulesError {
  return new AmbientRulesError(`${what} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim() || 'no output'}`);
}

async function ipset(run: Runner, args: readonly string[], input?: string): Promise<RunResult> {
  const r = await run(['ipset', ...args], input === undefined ? undefined : { input });
  if (r.error !== null || r.code !== 0) throw failed(`ipset ${args.join(' ')}`, r);
  return r;
}

/** Start-up: our sets made and emptied (the pods are added again as they are enrolled), then the SNAT rule. */
export async function applyHost(
  run: Runner,
  flavour: Flavour,
  families: readonly Family[],
  snat: { readonly v4?: string; readonly v6?: string } = {},
): Promise<'unchanged' | 'applied'> {
  await ipset(run, ['restore', '-exist'], probeSetsDocument(families));
  let result: 'unchanged' | 'applied' = 'unchanged';
  for (const f of families) {
    if ((await reconcileRules(run, flavour, f, hostRules(f, f === 4 ? snat.v4 : snat.v6), ownsHost)) === 'applied')
      result = 'applied';
  }
  return result;
}

export async function addProbeIP(run: Runner, ip: string, uid: string): Promise<void> {
  await ipset(run, addProbeCommand(ip, uid));
}

/**
 * Removes the pod's IP only if the entry is still the pod's (same UID): when the IP went to a
 * newer pod, the entry stays and its owner is returned. Istio does the same list-then-delete;
 * the agent serializes a node's enrollments, so nothing adds in between.
 */
export async function removeProbeIP(run: Runner, ip: string, uid: string): Promise<ProbeRemoval> {
  checkUid(uid);
  const set = probeSet(ipFamily(ip));
  const entries = parseProbeSet((await ipset(run, ['save', set])).stdout);
  const owner = entries.get(ip);
  if (owner === undefined) return { removed: false, owner: null };
  if (owner !== uid) return { removed: false, owner };
  // -exist: gone meanwhile is fine, what was asked holds
  await ipset(run, ['del', set, ip, '-exist']);
  return { removed: true };
}

/** Uninstall: the rule and chain out first (a set in use cannot be destroyed), then the sets. */
export async function removeHost(run: Runner, flavour: Flavour, families: readonly Family[]): Promise<void> {
  for (const f of families) {
    await reconcileRules(run, flavour, f, [], ownsHost);
    const r = await run(['ipset', 'destroy', probeSet(f)]);
    if ((r.error !== null || r.code !== 0) && !/does not exist/.test(r.stderr)) {
      throw failed(`ipset destroy ${probeSet(f)}`, r);
    }
  }
}

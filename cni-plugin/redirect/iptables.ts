// iptables in a netns through a runner: the same restore, save and reconcile for the plugin
// (which runs `nsenter --net=<CNI_NETNS>`, cni-plugin/netns/iptables.ts) and the agent's in-place
// repair (which runs `nsenter --net=/proc/self/fd/3` on a netns it holds by fd, src/podnetns/).
// Nothing here starts a process: the runner does, so this module stays importable by both
// bundles (the import zones: cni-plugin/redirect/ imports only itself and cni-plugin/shared/).

import { OWN_CHAIN_PREFIX, OWNED_TABLES } from './constants.ts';
import type { Family } from './net.ts';

export type Flavour = 'legacy' | 'nft';

export interface Detection {
  readonly flavour: Flavour;
  readonly why: string;
}

/**
 * What a run gave: one type for both bundles. The plugin's runner (cni-plugin/netns/exec.ts)
 * gives it, and the agent's (src/podnetns/program.ts) declares its RunResult as this one, so the
 * agent's in-place repair and ambient mode hand their runners here as they are.
 */
export interface RunResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Set when the binary could not be started or was killed for its time limit or its output. */
  readonly error: string | null;
}

export interface RunOptions {
  /** Written to the child's stdin, then closed; null or absent: no stdin. */
  readonly input?: string | null;
  /** Collect stdout (save does; restore and ip do not need it). */
  readonly stdout?: boolean;
  /** The caller has nothing else to do meanwhile: a runner may spawn synchronously. */
  readonly blocking?: boolean;
}

/** Runs argv (a binary on PATH and its arguments) in one netns; `where` names it in messages. */
export interface NetnsRunner {
  readonly where: string;
  run(argv: readonly string[], opts: RunOptions): RunResult | Promise<RunResult>;
}

export class NetnsError extends Error {}

const KUBELET_HINTS = [':KUBE-IPTABLES-HINT', ':KUBE-KUBELET-CANARY'];

function ruleCount(text: string): number {
  let n = 0;
  for (const line of text.split('\n')) if (line.startsWith('-')) n++;
  return n;
}

/**
 * Kubernetes' iptables-wrapper choice, from what `runner` sees: kubelet's KUBE-IPTABLES-HINT /
 * KUBE-KUBELET-CANARY chains decide when present, else whichever of `iptables-legacy-save` /
 * `iptables-nft-save` (v4 + v6) shows more rules; a tie means nft.
 */
export async function detectFlavour(runner: NetnsRunner): Promise<Detection> {
  const save = (bin: string) => Promise.resolve(runner.run([bin], { stdout: true }));
  const [l4, l6, n4, n6] = await Promise.all([
    save('iptables-legacy-save'),
    save('ip6tables-legacy-save'),
    save('iptables-nft-save'),
    save('ip6tables-nft-save'),
  ]);
  const legacyOk = l4.error === null && l4.code === 0;
  const nftOk = n4.error === null && n4.code === 0;
  if (!legacyOk && !nftOk) {
    throw new Error(
      `neither iptables-legacy-save nor iptables-nft-save runs ${runner.where} (${l4.error ?? l4.stderr.trim()}; ${n4.error ?? n4.stderr.trim()}); install iptables >= 1.8`,
    );
  }
  if (!legacyOk) return { flavour: 'nft', why: 'only iptables-nft is installed' };
  if (!nftOk) return { flavour: 'legacy', why: 'only iptables-legacy is installed' };
  const hinted = (t: string) => KUBELET_HINTS.some((h) => t.includes(h));
  if (hinted(n4.stdout) || hinted(n6.stdout)) return { flavour: 'nft', why: 'kubelet hint chains are in nf_tables' };
  if (hinted(l4.stdout) || hinted(l6.stdout))
    return { flavour: 'legacy', why: 'kubelet hint chains are in legacy iptables' };
  const legacy = ruleCount(l4.stdout) + ruleCount(l6.stdout);
  const nft = ruleCount(n4.stdout) + ruleCount(n6.stdout);
  return legacy > nft
    ? { flavour: 'legacy', why: `${runner.where} has ${legacy} legacy rules and ${nft} nf_tables rules` }
    : { flavour: 'nft', why: `${runner.where} has ${nft} nf_tables rules and ${legacy} legacy rules` };
}

function binary(flavour: Flavour, family: Family, what: 'restore' | 'save'): string {
  return `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-${what}`;
}

/**
 * One `iptables-restore --noflush` for the whole document: only the chains and rules it names
 * change; whatever else is in the netns (another plugin's, the pod's own) stays as it is.
 */
export async function restore(
  runner: NetnsRunner,
  flavour: Flavour,
  family: Family,
  doc: string,
  blocking = false,
): Promise<void> {
  const bin = binary(flavour, family, 'restore');
  const r = await runner.run([bin, '--noflush', '-w', '5'], { input: doc, stdout: false, blocking });
  if (r.error !== null || r.code !== 0) {
    throw new NetnsError(`${bin} ${runner.where} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim()}`);
  }
}

export async function save(runner: NetnsRunner, flavour: Flavour, family: Family): Promise<string> {
  const bin = binary(flavour, family, 'save');
  const r = await runner.run([bin], { stdout: true });
  if (r.error !== null || r.code !== 0)
    throw new NetnsError(`${bin} ${runner.where} failed: ${(r.error ?? r.stderr).trim()}`);
  return r.stdout;
}

/**
 * Our rules in the netns, whatever of ours is there already. `doc` (rules.ts) makes our chains
 * with -N, so on a netns without them (every first ADD) it is all it takes; when it fails (our
 * chains are there: a second ADD), what is there is read and reconciled in one more restore.
 */
export async function applyRules(
  runner: NetnsRunner,
  flavour: Flavour,
  family: Family,
  doc: string,
  blocking = false,
): Promise<'created' | 'reconciled'> {
  try {
    await restore(runner, flavour, family, doc, blocking);
    return 'created';
  } catch (first) {
    let have: RuleSet;
    try {
      have = parseRules(await save(runner, flavour, family));
    } catch {
      throw first;
    }
    // Nothing of ours there: the document itself failed, and its own error says why.
    if (![...have.values()].some((chains) => [...chains.keys()].some(isOurs))) throw first;
    const fix = reconcileRestore(parseRules(doc), have);
    if (fix !== null) await restore(runner, flavour, family, fix);
    return 'reconciled';
  }
}

/**
 * Our rules in a netns that has been running for a while (in-place repair): read first, and
 * restore only what differs. `unchanged`: they were right, nothing was written; `replaced`:
 * some of ours were there and wrong; `created`: none of ours were there. Only what is ours is
 * read and written, so another component's rules survive.
 */
export async function ensureRules(
  runner: NetnsRunner,
  flavour: Flavour,
  family: Family,
  doc: string,
  owns: Owns = isOurs,
): Promise<'unchanged' | 'replaced' | 'created'> {
  const want = parseRules(doc);
  const have = parseRules(await save(runner, flavour, family));
  if (diffRules(want, have, owns).length === 0) return 'unchanged';
  const hadOurs = [...have.values()].some((chains) => [...chains.keys()].some(owns));
  const fix = reconcileRestore(want, have, owns);
  if (fix !== null) await restore(runner, flavour, family, fix);
  return hadOurs ? 'replaced' : 'created';
}

/** DEL: our jumps, then our chains, out of the netns; nothing else. False when there was nothing of ours. */
export async function removeRules(
  runner: NetnsRunner,
  flavour: Flavour,
  family: Family,
  owns: Owns = isOurs,
): Promise<boolean> {
  const doc = reconcileRestore(null, parseRules(await save(runner, flavour, family)), owns);
  if (doc === null) return false;
  await restore(runner, flavour, family, doc);
  return true;
}

/**
 * `ip -batch` of `lines` (restoredoc.ts: ipBatchLines). What the op wants that is already so is
 * success: "File exists" for an add (a rule left by an earlier ADD), "No such ..." / "Cannot
 * find" for a del. A non-zero exit that says nothing else (or only "Command failed") left the
 * rule or route unknown: a failure.
 */
export async function ipBatch(
  runner: NetnsRunner,
  family: Family,
  lines: readonly string[],
  op: 'add' | 'del' = 'add',
): Promise<void> {
  if (lines.length === 0) return;
  const r = await runner.run(['ip', `-${family}`, '-force', '-batch', '-'], {
    input: lines.join('\n') + '\n',
    stdout: false,
  });
  const what = `ip -${family} -batch (${op}) failed ${runner.where}`;
  if (r.error !== null) throw new NetnsError(`${what}: ${r.error}`);
  const fine = op === 'add' ? /File exists/ : /No such|Cannot find/;
  const said = r.stderr.split('\n').filter((l) => l.trim() !== '');
  const real = said.filter((l) => !fine.test(l) && !/^Command failed/.test(l));
  if (r.code !== 0 && (real.length > 0 || !said.some((l) => fine.test(l))))
    throw new NetnsError(`${what} (exit ${r.code}): ${real.join('; ') || said.join('; ') || 'no output'}`);
}

/** table -> chain -> rules (`-A <chain> ...`), for the tables we may use; comments, counters and policies dropped. */
export type RuleSet = Map<string, Map<string, string[]>>;

/**
 * In a pod netns our chains are the MESH_* ones (the sidecar's and ambient's alike: either mode
 * sweeps the other's leftovers, as Istio sweeps ISTIO_*); everything else belongs to someone else.
 */
export const isOurs = (chain: string): boolean => chain.startsWith(OWN_CHAIN_PREFIX);
/**
 * Which chains a reconcile owns (rewrites, deletes, and whose jumps it moves): isOurs in a pod
 * netns; on the host, where other MESH_* chains are not ours to touch, exactly ambient's own.
 */
export type Owns = (chain: string) => boolean;

/**
 * A rule that jumps (-j) or goes (-g) into a chain `owns` claims: one of our jumps when it sits
 * in another chain. Quoted strings (comments; iptables-save writes \" inside them) are blanked
 * first: another's rule that only names our chain in its comment is not ours to delete.
 */
function jumpsTo(owns: Owns, rule: string): boolean {
  const m = / -[jg] (\S+)/.exec(rule.replace(/"(?:[^"\\]|\\.)*"/g, '""'));
  return m !== null && owns(m[1]!);
}

/**
 * Reads iptables-save output, or one of our restore documents: `-N X` declares a chain like
 * `:X`, and `-I X 1 rule` is read as the rule it puts first in X.
 */
export function parseRules(text: string): RuleSet {
  const out: RuleSet = new Map();
  let chains: Map<string, string[]> | null = null;
  const chain = (name: string): string[] => chains!.get(name) ?? chains!.set(name, []).get(name)!;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      const t = line.slice(1);
      chains = (OWNED_TABLES as readonly string[]).includes(t) ? new Map() : null;
      if (chains) out.set(t, chains);
    } else if (!chains || line === '' || line.startsWith('#') || line === 'COMMIT') {
      continue;
    } else if (line.startsWith(':')) {
      chain(line.slice(1).split(' ')[0]!);
    } else if (line.startsWith('-N ')) {
      chain(line.split(' ')[1]!);
    } else if (line.startsWith('-A ')) {
      chain(line.split(' ')[1]!).push(line);
    } else if (line.startsWith('-I ')) {
      const [, name, pos, ...rest] = line.split(' ');
      const rule = `-A ${name!} ${(/^\d+$/.test(pos!) ? rest : [pos!, ...rest]).join(' ')}`;
      chain(name!).unshift(rule);
    }
  }
  return out;
}

/**
 * Differences between what we meant and what is there, in what is ours only: our chains whole,
 * and in every other chain just the rules that jump into ours. [] when equal.
 */
export function diffRules(expected: RuleSet, actual: RuleSet, owns: Owns = isOurs): string[] {
  const jumpsToOurs = (rule: string) => jumpsTo(owns, rule);
  const problems: string[] = [];
  for (const table of OWNED_TABLES) {
    const e = expected.get(table) ?? new Map<string, string[]>();
    const a = actual.get(table) ?? new Map<string, string[]>();
    for (const chain of new Set([...e.keys(), ...a.keys()])) {
      const ours = owns(chain);
      if (ours && e.has(chain) !== a.has(chain)) {
        problems.push(`${table}: chain ${chain} ${e.has(chain) ? 'missing' : 'unexpected'}`);
        continue;
      }
      const want = ours ? (e.get(chain) ?? []) : (e.get(chain) ?? []).filter(jumpsToOurs);
      const have = ours ? (a.get(chain) ?? []) : (a.get(chain) ?? []).filter(jumpsToOurs);
      for (let i = 0; i < Math.max(want.length, have.length); i++) {
        if (want[i] !== have[i]) {
          problems.push(
            `${table} ${chain} ${ours ? 'rule' : 'jump'} ${i + 1}: expected ${want[i] ?? '(none)'}, found ${have[i] ?? '(none)'}`,
          );
          break;
        }
      }
    }
  }
  return problems;
}

/**
 * The --noflush document that turns what is there (`have`) into what we want (null: nothing of
 * ours, as DEL wants), touching nothing that is not ours; null when there is nothing to change.
 * Per table, in one commit: our jumps out, every chain of ours declared (created, or flushed if
 * there), the ones no longer wanted deleted, then our rules and our jumps (first in their chain).
 */
export function reconcileRestore(want: RuleSet | null, have: RuleSet, owns: Owns = isOurs): string | null {
  const jumpsToOurs = (rule: string) => jumpsTo(owns, rule);
  const out: string[] = [];
  for (const table of OWNED_TABLES) {
    const w = want?.get(table) ?? new Map<string, string[]>();
    const h = have.get(table) ?? new Map<string, string[]>();
    const oursWanted = [...w.keys()].filter(owns);
    const oursThere = [...h.keys()].filter(owns);
    const jumpsThere = [...h].filter(([c]) => !owns(c)).flatMap(([, rules]) => rules.filter(jumpsToOurs));
    if (oursWanted.length === 0 && oursThere.length === 0 && jumpsThere.length === 0) continue;
    out.push(`*${table}`);
    out.push(...jumpsThere.map((r) => `-D ${r.slice(3)}`));
    for (const c of [...new Set([...oursWanted, ...oursThere])].sort()) out.push(`:${c} - [0:0]`);
    for (const c of oursThere.filter((c) => !w.has(c)).sort()) out.push(`-X ${c}`);
    for (const c of oursWanted.sort()) out.push(...w.get(c)!);
    for (const [c, rules] of w) {
      if (!owns(c))
        out.push(
          ...rules
            .filter(jumpsToOurs)
            .reverse()
            .map((r) => `-I ${c} 1 ${r.slice(4 + c.length)}`),
        );
    }
    out.push('COMMIT');
  }
  return out.length === 0 ? null : out.join('\n') + '\n';
}

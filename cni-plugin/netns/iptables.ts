// iptables in a pod netns: pick the flavour the host uses, restore a document in one call per
// family, read it back. Everything runs through `nsenter --net=<CNI_NETNS>` (the plugin itself
// stays in the host netns, where the runtime runs it).
//
// Flavour detection follows Kubernetes' iptables-wrapper, read-only in the host netns: kubelet's
// KUBE-IPTABLES-HINT / KUBE-KUBELET-CANARY chains decide when present, else whichever of
// `iptables-legacy-save` / `iptables-nft-save` (v4 + v6) shows more rules; a tie means nft.

import { existsSync } from 'node:fs';
import { OWNED_TABLES } from '../redirect/constants.ts';
import type { Family } from '../redirect/net.ts';
import { exec, execNow, type ExecOptions, type ExecResult } from './exec.ts';

export type Flavour = 'legacy' | 'nft';

export interface Detection {
  readonly flavour: Flavour;
  readonly why: string;
}

const KUBELET_HINTS = [':KUBE-IPTABLES-HINT', ':KUBE-KUBELET-CANARY'];

function ruleCount(text: string): number {
  let n = 0;
  for (const line of text.split('\n')) if (line.startsWith('-')) n++;
  return n;
}

export async function detectFlavour(): Promise<Detection> {
  const save = (bin: string) => exec(bin, [], { timeoutMs: 5000 });
  const [l4, l6, n4, n6] = await Promise.all([
    save('iptables-legacy-save'), save('ip6tables-legacy-save'), save('iptables-nft-save'), save('ip6tables-nft-save'),
  ]);
  const legacyOk = l4.error === null && l4.code === 0;
  const nftOk = n4.error === null && n4.code === 0;
  if (!legacyOk && !nftOk) {
    throw new Error(`neither iptables-legacy-save nor iptables-nft-save runs on this host (${l4.error ?? l4.stderr.trim()}; ${n4.error ?? n4.stderr.trim()}); install iptables >= 1.8`);
  }
  if (!legacyOk) return { flavour: 'nft', why: 'only iptables-nft is installed' };
  if (!nftOk) return { flavour: 'legacy', why: 'only iptables-legacy is installed' };
  const hinted = (t: string) => KUBELET_HINTS.some((h) => t.includes(h));
  if (hinted(n4.stdout) || hinted(n6.stdout)) return { flavour: 'nft', why: 'kubelet hint chains are in nf_tables' };
  if (hinted(l4.stdout) || hinted(l6.stdout)) return { flavour: 'legacy', why: 'kubelet hint chains are in legacy iptables' };
  const legacy = ruleCount(l4.stdout) + ruleCount(l6.stdout);
  const nft = ruleCount(n4.stdout) + ruleCount(n6.stdout);
  return legacy > nft
    ? { flavour: 'legacy', why: `host has ${legacy} legacy rules and ${nft} nf_tables rules` }
    : { flavour: 'nft', why: `host has ${nft} nf_tables rules and ${legacy} legacy rules` };
}

function binary(flavour: Flavour, family: Family, what: 'restore' | 'save'): string {
  return `${family === 6 ? 'ip6tables' : 'iptables'}-${flavour}-${what}`;
}

export class NetnsError extends Error {}

/** Runs argv in the netns; `blocking`: the caller has nothing else to do meanwhile (see execNow). */
function nsenter(netns: string, argv: readonly string[], options: ExecOptions, blocking = false): ExecResult | Promise<ExecResult> {
  const args = [`--net=${netns}`, '--', ...argv];
  return blocking ? execNow('nsenter', args, options) : exec('nsenter', args, options);
}

/** One `iptables-restore` for the whole document (no --noflush: it replaces our tables). */
export async function restore(netns: string, flavour: Flavour, family: Family, doc: string, blocking = false): Promise<void> {
  const bin = binary(flavour, family, 'restore');
  const r = await nsenter(netns, [bin, '-w', '5'], { input: doc, stdout: false }, blocking);
  if (r.error !== null || r.code !== 0) {
    throw new NetnsError(`${bin} in ${netns} failed (exit ${r.code}): ${(r.error ?? r.stderr).trim()}`);
  }
}

/** `ip -batch`; "File exists" (a rule left by an earlier ADD) is success. */
export async function ipBatch(netns: string, family: Family, lines: readonly string[]): Promise<void> {
  if (lines.length === 0) return;
  const r = await nsenter(netns, ['ip', `-${family}`, '-force', '-batch', '-'], { input: lines.join('\n') + '\n', stdout: false });
  if (r.error !== null) throw new NetnsError(`ip -${family} -batch in ${netns}: ${r.error}`);
  if (r.code !== 0) {
    const real = r.stderr.split('\n').filter((l) => l.trim() !== '' && !/File exists|^Command failed/.test(l));
    if (real.length > 0) throw new NetnsError(`ip -${family} -batch in ${netns} failed: ${real.join('; ')}`);
  }
}

export async function save(netns: string, flavour: Flavour, family: Family): Promise<string> {
  const bin = binary(flavour, family, 'save');
  const r = await nsenter(netns, [bin], {});
  if (r.error !== null || r.code !== 0) throw new NetnsError(`${bin} in ${netns} failed: ${(r.error ?? r.stderr).trim()}`);
  return r.stdout;
}

/** table -> chain -> rules, for the tables we own; comments, counters and policies dropped. */
export type RuleSet = Map<string, Map<string, string[]>>;

export function parseRules(text: string): RuleSet {
  const out: RuleSet = new Map();
  let chains: Map<string, string[]> | null = null;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      const t = line.slice(1);
      chains = (OWNED_TABLES as readonly string[]).includes(t) ? new Map() : null;
      if (chains) out.set(t, chains);
    } else if (!chains || line === '' || line.startsWith('#') || line === 'COMMIT') {
      continue;
    } else if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0]!;
      if (!chains.has(name)) chains.set(name, []);
    } else if (line.startsWith('-A ')) {
      const name = line.split(' ')[1]!;
      if (!chains.has(name)) chains.set(name, []);
      chains.get(name)!.push(line);
    }
  }
  return out;
}

/** Differences between what we meant and what is there; [] when equal. Empty chains/tables match absent ones. */
export function diffRules(expected: RuleSet, actual: RuleSet): string[] {
  const problems: string[] = [];
  for (const table of OWNED_TABLES) {
    const e = expected.get(table) ?? new Map<string, string[]>();
    const a = actual.get(table) ?? new Map<string, string[]>();
    for (const chain of new Set([...e.keys(), ...a.keys()])) {
      const want = e.get(chain) ?? [];
      const have = a.get(chain) ?? [];
      if (want.length === 0 && have.length === 0) {
        if (e.has(chain) !== a.has(chain) && chain.startsWith('MESH_')) problems.push(`${table}: chain ${chain} ${e.has(chain) ? 'missing' : 'unexpected'}`);
        continue;
      }
      for (let i = 0; i < Math.max(want.length, have.length); i++) {
        if (want[i] !== have[i]) {
          problems.push(`${table} ${chain} rule ${i + 1}: expected ${want[i] ?? '(none)'}, found ${have[i] ?? '(none)'}`);
          break;
        }
      }
    }
  }
  return problems;
}

/** A netns reference that can still be entered (DEL may come after the runtime removed it). */
export function netnsExists(netns: string): boolean {
  return netns !== '' && existsSync(netns);
}

// Which redirect backend the node gets, native nftables or iptables, from --native-nftables and
// what the agent found on the node at start (nftprobe.ts): a pure decision with its reason, so
// the log, ControlZ and /readyz say the same why (docs/plugin.md "Native nftables").
//
// Native nftables needs nft >= 1.0.1 (the first release whose JSON the rules are written in
// reads back the same) built with JSON support, and a kernel whose nf_tables answers. `auto`
// takes it only where the node already uses nftables, seen as kube-proxy's nftables tables or a
// firewall of nftables alone: iptables-nft and legacy iptables tables mean the node's other
// users (kubelet, the CNI, kube-proxy in iptables mode) are on iptables, and our rules stay
// beside theirs. `true` on a node that cannot stays nftables: the entry says so, the plugin
// fails the pod's ADD rather than redirect it some other way, and /readyz names the fix.

import type { NativeNftablesMode } from '../config/flags.ts';

/** The oldest nft whose JSON the backend reads and writes. */
export const NFT_MIN_VERSION = '1.0.1';

export type RedirectBackend = 'nftables' | 'iptables';

/** What the probe found; every error is what the program or file said, for the reason shown. */
export interface NftHostFacts {
  /** The nft the agent runs; null: in none of the dirs searched (nftError says which). */
  readonly nftPath: string | null;
  /** `nft --version`, as "1.0.6"; null when it gave none (nftError says why). */
  readonly nftVersion: string | null;
  readonly nftError: string | null;
  /** Why `nft -j list tables` failed (a build without JSON says so); null: it worked or did not run. */
  readonly jsonError: string | null;
  /** `nft list tables` as "ip kube-proxy"; null when the kernel did not answer (tablesError says why). */
  readonly tables: readonly string[] | null;
  readonly tablesError: string | null;
  /** The kernel's legacy iptables tables (/proc/net/ip{,6}_tables_names); null: no ip_tables in this kernel. */
  readonly legacyTables: readonly string[] | null;
}

export interface BackendChoice {
  readonly backend: RedirectBackend;
  /** Why this backend, in words for the start log and ControlZ. */
  readonly why: string;
  /** Set when --native-nftables=true and the node cannot: /readyz's reason, with the fix. */
  readonly notReady: string | null;
}

/** "nftables v1.0.6 (Lester Gooch #5)" -> "1.0.6"; a missing patch level is 0; null: no version there. */
export function parseNftVersion(stdout: string): string | null {
  const m = /^nftables v(\d+)\.(\d+)(?:\.(\d+))?\b/m.exec(stdout);
  return m ? `${Number(m[1])}.${Number(m[2])}.${Number(m[3] ?? 0)}` : null;
}

/** Whether dotted version `v` is at least `min`, part by part as numbers. */
export function versionAtLeast(v: string, min: string): boolean {
  const a = v.split('.').map(Number);
  const b = min.split('.').map(Number);
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d > 0;
  }
  return true;
}

/** `nft list tables` ("table ip kube-proxy" lines) -> ["ip kube-proxy"]; other lines are skipped. */
export function parseTableList(text: string): string[] {
  return text
    .split('\n')
    .map((l) => /^table (\S+) (\S+)$/.exec(l.trim()))
    .filter((m) => m !== null)
    .map((m) => `${m[1]} ${m[2]}`);
}

/** Why the node cannot run native nftables; empty when it can. */
export function hostProblems(f: NftHostFacts): string[] {
  if (f.nftPath === null || f.nftVersion === null) return [f.nftError ?? 'nft gave no version'];
  const out: string[] = [];
  if (!versionAtLeast(f.nftVersion, NFT_MIN_VERSION))
    out.push(`nft ${f.nftVersion} (${f.nftPath}) is older than ${NFT_MIN_VERSION}`);
  if (f.jsonError !== null) out.push(`nft (${f.nftPath}) cannot list tables as JSON: ${f.jsonError}`);
  if (f.tables === null) out.push(`the kernel's nf_tables did not answer nft list tables: ${f.tablesError ?? ''}`);
  return out;
}

/** iptables-nft's tables as nft lists them: only ip and ip6 (native rule sets mostly use inet). */
const SHIM_TABLE = /^ip6? (filter|nat|mangle|raw|security)$/;

export function decideBackend(mode: NativeNftablesMode, facts: NftHostFacts | null): BackendChoice {
  if (mode === 'false') return { backend: 'iptables', why: '--native-nftables=false: iptables rules', notReady: null };
  if (facts === null) throw new Error(`internal: --native-nftables=${mode} decided without probing the node`);
  const problems = hostProblems(facts);
  const can = `nft ${facts.nftVersion} (${facts.nftPath}) with JSON, nf_tables in the kernel`;
  if (mode === 'true') {
    if (problems.length === 0) return { backend: 'nftables', why: `--native-nftables=true and ${can}`, notReady: null };
    const why =
      `--native-nftables=true, but this node cannot run native nftables: ${problems.join('; ')}; ` +
      `install nftables >= ${NFT_MIN_VERSION} built with JSON support where the agent runs it (its image) and ` +
      'on the node, with nf_tables in the kernel, or set --native-nftables=false';
    return { backend: 'nftables', why, notReady: why };
  }
  if (problems.length > 0)
    return {
      backend: 'iptables',
      why: `--native-nftables=auto: this node cannot run native nftables: ${problems.join('; ')}`,
      notReady: null,
    };
  const tables = facts.tables ?? [];
  const kubeProxy = tables.filter((t) => t.endsWith(' kube-proxy'));
  if (kubeProxy.length > 0)
    return {
      backend: 'nftables',
      why: `--native-nftables=auto: kube-proxy runs in nftables mode here (${kubeProxy.join(', ')}), and ${can}`,
      notReady: null,
    };
  const shim = tables.filter((t) => SHIM_TABLE.test(t));
  const legacy = facts.legacyTables ?? [];
  if (tables.length > 0 && shim.length === 0 && legacy.length === 0)
    return {
      backend: 'nftables',
      why: `--native-nftables=auto: this node's firewall is nftables alone (${tables.join(', ')}), and ${can}`,
      notReady: null,
    };
  const seen = [
    ...(legacy.length > 0 ? [`legacy iptables tables: ${legacy.join(', ')}`] : []),
    ...(shim.length > 0 ? [`iptables-nft tables: ${shim.join(', ')}`] : []),
  ];
  return {
    backend: 'iptables',
    why:
      `--native-nftables=auto: no kube-proxy nftables table on this node` +
      (seen.length > 0 ? `, and it uses iptables (${seen.join('; ')})` : ', and no firewall tables at all'),
    notReady: null,
  };
}

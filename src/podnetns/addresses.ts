// The addresses on a netns' interfaces (`ip -j addr show` run inside it), and the canonical text
// form both they and the pod's status IPs are compared in.

import { isIPv4, isIPv6 } from 'node:net';
import type { HeldNetns } from './held.ts';
import { runInNetns } from './run.ts';

/**
 * One text per address: IPv4 dotted, IPv6 as the URL standard writes it (lower case, the
 * longest zero run as ::), a v4-mapped IPv6 (::ffff:a.b.c.d) as its IPv4. null: not an address.
 */
export function canonicalIp(text: string): string | null {
  const t = text.trim();
  if (isIPv4(t)) return t;
  if (!isIPv6(t) || t.includes('%')) return null;
  let h: string;
  try {
    h = new URL(`http://[${t}]/`).hostname.slice(1, -1);
  } catch {
    return null;
  }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  if (!mapped) return h;
  const [hi, lo] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)];
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join('.');
}

/** Pure: the canonical addresses in `ip -j addr show` output, once each, in order. Throws on bad JSON. */
export function parseIpAddrJson(text: string): string[] {
  const links: unknown = JSON.parse(text);
  if (!Array.isArray(links)) throw new Error('ip -j addr show did not print a JSON array');
  const seen = new Set<string>();
  for (const link of links) {
    const infos = (link as { addr_info?: unknown } | null)?.addr_info;
    if (!Array.isArray(infos)) continue;
    for (const info of infos) {
      const local = (info as { local?: unknown } | null)?.local;
      const ip = typeof local === 'string' ? canonicalIp(local) : null;
      if (ip !== null) seen.add(ip);
    }
  }
  return [...seen];
}

/** The addresses on the netns' interfaces, canonical. Rejects with what failed and where. */
export async function netnsAddresses(netns: HeldNetns): Promise<string[]> {
  const where = `the netns (inode ${netns.ino}) of pid ${netns.pid}`;
  const r = await runInNetns(netns, ['ip', '-j', 'addr', 'show']);
  if (r.error !== null) throw new Error(`cannot list the addresses in ${where}: ${r.error}`);
  if (r.code !== 0) {
    throw new Error(`cannot list the addresses in ${where}: ip -j addr show exited ${r.code}: ${r.stderr.trim()}`);
  }
  try {
    return parseIpAddrJson(r.stdout);
  } catch (e) {
    throw new Error(`cannot read the addresses in ${where}: ${(e as Error).message}`, { cause: e });
  }
}

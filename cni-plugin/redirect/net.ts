// Strict parsers for the values that end up inside an iptables-restore document. Anything that
// is not exactly a port, a CIDR or an interface name is refused: an annotation is user input, and
// a newline smuggled into the restore text would add rules of the user's choosing.

export type Family = 4 | 6;

export interface Cidr {
  readonly family: Family;
  /** Canonical text as iptables-save prints it: network address, RFC 5952 for IPv6, always /len. */
  readonly text: string;
  readonly loopback: boolean;
}

export class ValueError extends Error {}

function parseV4(s: string): number[] | null {
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  const out: number[] = [];
  for (const p of parts) {
    if (!/^(0|[1-9][0-9]{0,2})$/.test(p)) return null;
    const n = Number(p);
    if (n > 255) return null;
    out.push(n);
  }
  return out;
}

/** IPv6 text -> 8 groups, or null. Accepts an embedded IPv4 tail. */
function parseV6(s: string): number[] | null {
  if (!/^[0-9a-fA-F:.]+$/.test(s) || s.length > 45) return null;
  let tail: number[] = [];
  let head = s;
  const lastColon = s.lastIndexOf(':');
  if (s.includes('.')) {
    const v4 = parseV4(s.slice(lastColon + 1));
    if (!v4) return null;
    tail = [(v4[0]! << 8) | v4[1]!, (v4[2]! << 8) | v4[3]!];
    head = s.slice(0, lastColon + 1);
    // `::1.2.3.4` keeps its `::`; `64:ff9b::1:1.2.3.4` drops the separator before the tail.
    if (!head.endsWith('::')) head = head.slice(0, -1);
  }
  const dbl = head.indexOf('::');
  if (dbl !== head.lastIndexOf('::')) return null;
  const groupsOf = (t: string): number[] | null => {
    if (t === '') return [];
    const out: number[] = [];
    for (const g of t.split(':')) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
      out.push(parseInt(g, 16));
    }
    return out;
  };
  let groups: number[];
  if (dbl >= 0) {
    const left = groupsOf(head.slice(0, dbl));
    const right = groupsOf(head.slice(dbl + 2));
    if (!left || !right) return null;
    const missing = 8 - tail.length - left.length - right.length;
    if (missing < 1) return null;
    groups = [...left, ...new Array<number>(missing).fill(0), ...right, ...tail];
  } else {
    const all = groupsOf(head);
    if (!all) return null;
    groups = [...all, ...tail];
  }
  return groups.length === 8 ? groups : null;
}

/** RFC 5952: lowercase, longest run (>= 2) of zero groups as `::`, first one on ties. */
export function formatV6(groups: readonly number[]): string {
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

function maskGroups(groups: readonly number[], bits: number, width: number): number[] {
  return groups.map((g, i) => {
    const keep = Math.max(0, Math.min(width, bits - i * width));
    const mask = keep === 0 ? 0 : ((0xffff_ffff << (width - keep)) >>> 0) & ((1 << width) - 1);
    return g & mask;
  });
}

/** `10.1.2.3/8` -> `10.0.0.0/8`; a bare address gets /32 or /128. */
export function parseCidr(raw: string): Cidr {
  const s = raw.trim();
  const slash = s.indexOf('/');
  const addr = slash < 0 ? s : s.slice(0, slash);
  const lenText = slash < 0 ? undefined : s.slice(slash + 1);
  const v4 = parseV4(addr);
  const v6 = v4 ? null : parseV6(addr);
  if (!v4 && !v6) throw new ValueError(`${JSON.stringify(raw)} is not an IPv4 or IPv6 address or CIDR`);
  const max = v4 ? 32 : 128;
  let len = max;
  if (lenText !== undefined) {
    if (!/^(0|[1-9][0-9]{0,2})$/.test(lenText) || Number(lenText) > max) {
      throw new ValueError(`${JSON.stringify(raw)} has a bad prefix length (0-${max})`);
    }
    len = Number(lenText);
  }
  if (v4) {
    const net = maskGroups(v4, len, 8);
    return { family: 4, text: `${net.join('.')}/${len}`, loopback: v4[0] === 127 };
  }
  const net = maskGroups(v6!, len, 16);
  const loopback = v6!.slice(0, 7).every((g) => g === 0) && v6![7] === 1;
  return { family: 6, text: `${formatV6(net)}/${len}`, loopback };
}

/** Canonical address text (no prefix), for addresses we print ourselves. */
export function canonicalAddress(raw: string): string {
  return parseCidr(raw).text.replace(/\/\d+$/, '');
}

export function parsePort(raw: string): number {
  const s = raw.trim();
  if (!/^[0-9]{1,5}$/.test(s) || Number(s) < 1 || Number(s) > 65535) {
    throw new ValueError(`${JSON.stringify(raw)} is not a port (1-65535)`);
  }
  return Number(s);
}

/** Comma list of ports, deduplicated, order kept; empty string -> []. */
export function parsePortList(raw: string): number[] {
  const out: number[] = [];
  for (const item of splitList(raw)) {
    const p = parsePort(item);
    if (!out.includes(p)) out.push(p);
  }
  return out;
}

export function parseCidrList(raw: string): Cidr[] {
  const out: Cidr[] = [];
  for (const item of splitList(raw)) {
    const c = parseCidr(item);
    if (!out.some((o) => o.text === c.text)) out.push(c);
  }
  return out;
}

/** Linux interface names (< 16 bytes, no '/', ':' or space), plus iptables' trailing `+` wildcard. */
export function parseInterfaceList(raw: string): string[] {
  const out: string[] = [];
  for (const item of splitList(raw)) {
    if (!/^[A-Za-z0-9_.@-]{1,15}\+?$/.test(item) || item === '.' || item === '..') {
      throw new ValueError(`${JSON.stringify(item)} is not an interface name`);
    }
    if (!out.includes(item)) out.push(item);
  }
  return out;
}

export function splitList(raw: string): string[] {
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

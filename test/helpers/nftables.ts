// Someone else's nftables tables in a test netns, for tests that check ours leave them alone:
// another CNI's `inet filter` and a nat of theirs, and how `nft -a list` prints them (handles
// too, so a table deleted and made again shows).

import type { Netns } from './netns.ts';

export const FOREIGN_TABLES = `
table inet filter {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 counter accept
	}
}
table ip nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 198.18.7.0/24 counter masquerade
	}
}
`;

/** The foreign tables as they are now in `ns`. */
export function foreignTables(ns: Netns): string {
  return ['inet filter', 'ip nat'].map((t) => ns.exec(['nft', '-a', 'list', 'table', ...t.split(' ')])).join('');
}

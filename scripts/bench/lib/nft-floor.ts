// The rules bench's check row for native nftables: a hand-written ruleset equivalent to what
// cni-plugin/redirect/rules.ts makes for the default sidecar pod in REDIRECT mode (IPv4), in its
// own `inet mesh_bench` table, loaded by one `nft -f -`: one netlink transaction of about the
// same number of rules and chains. The native floor itself is `nft -f` of what the renderer and
// applier fed nft; this one says what a table written by hand, with no owner set and no base
// chain per hook, would cost instead.
// Rule for rule, in the iptables document's order: MESH_PREROUTING -> prerouting (the base chain
// itself, no jump needed), MESH_INBOUND -> inbound (its four RETURN ports as one set),
// MESH_IN_REDIRECT -> in_redirect, MESH_OUTPUT -> output, MESH_REDIRECT -> out_redirect
// (`redirect` is a keyword). Base chains sit at the nat priority, as the iptables nat chains do.
// Every rule has a counter, as the native applier (cni-plugin/redirect/nft.ts) requires of ours,
// so the same body goes through that applier too.
// The default pod's values are written out (ports 15001, 15006, 15008, the probe 192.0.2.6:15002,
// uid/gid 1337): a floor stays what it is when the rules change.

export const NFT_FLOOR_TABLE = 'mesh_bench';

/** The table's body, in the form cni-plugin/redirect/nft.ts checkBody takes. */
export const SIDECAR_REDIRECT_NFT_BODY = `chain prerouting {
	type nat hook prerouting priority dstnat; policy accept;
	meta l4proto tcp counter jump inbound
}
chain inbound {
	tcp dport { 15008, 15020, 15021, 15090 } counter return
	meta l4proto tcp counter jump in_redirect
}
chain in_redirect {
	meta l4proto tcp counter redirect to :15006
}
chain output {
	type nat hook output priority -100; policy accept;
	ip daddr 192.0.2.6 tcp dport 15002 counter redirect to :15002
	tcp dport 15020 counter return
	udp dport 15020 counter return
	ip saddr 127.0.0.6 oifname "lo" counter return
	ip daddr != 127.0.0.1 oifname "lo" tcp dport != 15008 meta skuid 1337 counter jump in_redirect
	oifname "lo" meta skuid != 1337 counter return
	meta skuid 1337 counter return
	ip daddr != 127.0.0.1 oifname "lo" tcp dport != 15008 meta skgid 1337 counter jump in_redirect
	oifname "lo" meta skgid != 1337 counter return
	meta skgid 1337 counter return
	ip daddr 127.0.0.1 counter return
	counter jump out_redirect
}
chain out_redirect {
	meta l4proto tcp counter redirect to :15001
}
`;

/** The whole ruleset for `nft -f -`. */
export const SIDECAR_REDIRECT_NFT = `table inet ${NFT_FLOOR_TABLE} {\n${SIDECAR_REDIRECT_NFT_BODY}}\n`;

// Native nftables in a pod netns for the plugin (docs/nftables.md): the pod's plans rendered as
// one inet table (redirect/nftrender.ts) and written in one nft transaction (redirect/nft.ts),
// checked, removed. nft runs through `nsenter --net=<CNI_NETNS>` from the host's user namespace
// even for a pod whose own user namespace owns its netns: `meta skuid`/`skgid` are read in the
// netns's user namespace when a packet is matched, so the rule's 1337 is the proxy's uid inside
// the pod, and the kernel asks nothing of the writer's user namespace (unlike iptables' owner
// match, netns/userns.ts).

import { ipBatchLines } from '../redirect/restoredoc.ts';
import { applyTable, NftError, readTable, removeTable, tableDrift } from '../redirect/nft.ts';
import { POD_TABLE, renderNftBody } from '../redirect/nftrender.ts';
import type { Plan } from '../redirect/model.ts';
import { byPath, ipBatch } from './iptables.ts';

/** The table body for `plans`; throws NftRenderError for a plan nft cannot say exactly. */
export const podTableBody = (plans: readonly Plan[]): string => renderNftBody(plans);

/**
 * ADD: `body` (podTableBody of `plans`) as the table, whole, in one transaction (so the pod has all of it or none of it), then each
 * family's policy routing with `ip -batch` (in the pod's user namespace when it has one, as for
 * iptables). Returns how the table got there.
 */
export async function applyPodTable(
  netns: string,
  body: string,
  plans: readonly Plan[],
  userns: string | null,
): Promise<'created' | 'replaced'> {
  const how = await applyTable(byPath(netns), POD_TABLE, body, true);
  for (const p of plans) await ipBatch(netns, p.family, ipBatchLines(p), userns);
  return how;
}

/** CHECK: what differs between the pod's table and what `plans` make; [] when nothing does. */
export async function checkPodTable(netns: string, plans: readonly Plan[]): Promise<string[]> {
  const body = podTableBody(plans);
  const have = await readTable(byPath(netns), POD_TABLE);
  if (have === null) return [`nftables table inet ${POD_TABLE} is missing`];
  if (have.digest === null) return [`table inet ${POD_TABLE} is not mesh-cni's (no owner set)`];
  return tableDrift(body, have).map((p) => `table inet ${POD_TABLE}: ${p}`);
}

/**
 * DEL, and ADD with iptables (a pod that switched backends keeps nothing of ours in nftables):
 * our table out. `no-nft`: the host has no nft, so there is no table of ours it could have
 * written; any other failure (a hang, a crash, nft without JSON) throws.
 */
export async function removePodTable(netns: string): Promise<'removed' | 'absent' | 'foreign' | 'no-nft'> {
  try {
    return await removeTable(byPath(netns), POD_TABLE);
  } catch (e) {
    if (e instanceof NftError && e.permanent && /^cannot run nft /.test(e.message)) return 'no-nft';
    throw e;
  }
}

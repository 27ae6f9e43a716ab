// The host's iptables flavour, remembered for the boot. Detecting it runs four `*-save`
// commands in the host netns, and on a node with thousands of kube-proxy rules each can take
// tens of milliseconds: on every pod's critical path that is too much for an answer that does
// not change while the node runs. The first ADD after boot detects and writes the answer next to
// the log socket (the agent's run dir); later ones read it. A cache from another boot, older
// than an hour, or unreadable is ignored and rewritten.

import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Detection, Flavour } from './iptables.ts';

export const CACHE_FILE_NAME = 'iptables-flavour.json';
const MAX_AGE_MS = 3_600_000;

interface Cached {
  readonly flavour: Flavour;
  readonly why: string;
  readonly bootId: string;
  readonly at: number;
}

function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return 'unknown';
  }
}

/** Where the cache lives: beside the log socket; null (no cache) when no socket is configured. */
export function cacheFileFor(logUdsAddress: string): string | null {
  return logUdsAddress === '' ? null : path.join(path.dirname(logUdsAddress), CACHE_FILE_NAME);
}

export async function cachedFlavour(file: string | null, detect: () => Promise<Detection>, now = Date.now()): Promise<Detection & { readonly cached: boolean }> {
  const boot = bootId();
  if (file !== null) {
    try {
      const c = JSON.parse(readFileSync(file, 'utf8')) as Partial<Cached>;
      if ((c.flavour === 'nft' || c.flavour === 'legacy') && c.bootId === boot && typeof c.at === 'number' && now - c.at >= 0 && now - c.at < MAX_AGE_MS) {
        return { flavour: c.flavour, why: `${c.why ?? 'detected'} (remembered since ${new Date(c.at).toISOString()})`, cached: true };
      }
    } catch {
      // No cache yet, or a broken one: detect and rewrite it.
    }
  }
  const d = await detect();
  if (file !== null) {
    try {
      const tmp = `${file}.${process.pid}.tmp`;
      writeFileSync(tmp, JSON.stringify({ flavour: d.flavour, why: d.why, bootId: boot, at: now } satisfies Cached), { mode: 0o644 });
      renameSync(tmp, file);
    } catch {
      // A cache we cannot write costs speed, never correctness.
    }
  }
  return { ...d, cached: false };
}

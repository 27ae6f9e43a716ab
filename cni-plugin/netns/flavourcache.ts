// The host's iptables flavour, remembered for the boot. Detecting it runs four `*-save`
// commands in the host netns, and on a node with thousands of kube-proxy rules each can take
// tens of milliseconds: on every pod's critical path that is too much for an answer that does
// not change while the node runs. The first ADD after boot detects and writes the answer into
// a directory of its own beside the log socket (the agent's run dir); later ones read it. A cache
// from another boot, older than an hour, or unreadable is ignored and rewritten.
//
// The plugin runs as root, so the cache must not let anyone else choose what root writes or
// reads: the directory (made 0700 by the agent) is used only when it is a real directory, owned
// by us and writable by no one else, and it is used through the descriptor that was checked
// (/proc/self/fd/N/...), so swapping the path for a link afterwards changes nothing. The answer
// is written to a temp file of an unpredictable name opened O_CREAT|O_EXCL|O_NOFOLLOW, then
// renamed; read through the plugin's bounded regular-file reader (no link, no FIFO, 4 KiB).
// Anything else: no cache, only slower.

import { closeSync, constants, fstatSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';
import type { Detection, Flavour } from './iptables.ts';
import { readRegularFile } from '../regularfile.ts';

// Where the cache is, and the agent's making of its directory: one place for both bundles.
export { CACHE_DIR_NAME, CACHE_FILE_NAME, cacheFileFor } from '../shared/cachedir.ts';

/** The cache is one small JSON object; anything larger is not ours. */
const MAX_CACHE_BYTES = 4096;
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

/** The directory of `file` opened as checked (see the top); null when it must not be used. */
function openCacheDir(file: string): { fd: number; at: (name: string) => string } | null {
  let fd: number;
  try {
    fd = openSync(path.dirname(file), constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch {
    return null;
  }
  const st = fstatSync(fd);
  if (!st.isDirectory() || st.uid !== process.geteuid!() || (st.mode & 0o022) !== 0) {
    closeSync(fd);
    return null;
  }
  return { fd, at: (name) => `/proc/self/fd/${fd}/${name}` };
}

function readCache(at: (name: string) => string, name: string): Partial<Cached> | null {
  try {
    return JSON.parse(readRegularFile(at(name), MAX_CACHE_BYTES)) as Partial<Cached>;
  } catch {
    return null; // No cache yet, a broken one, a link or no regular file: detect and rewrite it.
  }
}

function writeCache(at: (name: string) => string, name: string, c: Cached): void {
  const { randomBytes } = process.getBuiltinModule('node:crypto');
  const tmp = at(`.${name}.${randomBytes(12).toString('hex')}.tmp`);
  try {
    const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      writeSync(fd, JSON.stringify(c));
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, at(name));
  } catch {
    // A cache we cannot write costs speed, never correctness.
    try {
      unlinkSync(tmp);
    } catch {
      // not made
    }
  }
}

export async function cachedFlavour(
  file: string | null,
  detect: () => Promise<Detection>,
  now = Date.now(),
): Promise<Detection & { readonly cached: boolean }> {
  const boot = bootId();
  const dir = file === null ? null : openCacheDir(file);
  const name = file === null ? '' : path.basename(file);
  try {
    const c = dir === null ? null : readCache(dir.at, name);
    if (
      c !== null &&
      (c.flavour === 'nft' || c.flavour === 'legacy') &&
      c.bootId === boot &&
      typeof c.at === 'number' &&
      now - c.at >= 0 &&
      now - c.at < MAX_AGE_MS
    ) {
      return {
        flavour: c.flavour,
        why: `${c.why ?? 'detected'} (remembered since ${new Date(c.at).toISOString()})`,
        cached: true,
      };
    }
    const d = await detect();
    if (dir !== null) writeCache(dir.at, name, { flavour: d.flavour, why: d.why, bootId: boot, at: now });
    return { ...d, cached: false };
  } finally {
    if (dir !== null) closeSync(dir.fd);
  }
}

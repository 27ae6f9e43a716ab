// Where the plugin keeps what it remembers for the boot (the host's iptables flavour, see
// cni-plugin/netns/flavourcache.ts): a directory of its own beside the log socket, in the agent's
// run dir. The agent makes it at start (src/monitoring/logserver.ts), the plugin checks and uses
// it: both derive the path here.

import { chmodSync, lstatSync, mkdirSync } from 'node:fs';
import path from 'node:path';

export const CACHE_DIR_NAME = 'plugin-cache';
export const CACHE_FILE_NAME = 'iptables-flavour.json';

/** Where the cache lives: its own directory beside the log socket; null (no cache) when no socket is configured. */
export function cacheFileFor(logUdsAddress: string): string | null {
  return logUdsAddress === '' ? null : path.join(path.dirname(logUdsAddress), CACHE_DIR_NAME, CACHE_FILE_NAME);
}

/**
 * The agent's part, at start: the cache directory beside its log socket, 0700. Throws when
 * something else is at that path (the plugin then keeps no cache: slower, never unsafe).
 */
export function prepareCacheDir(logUdsAddress: string): void {
  const file = cacheFileFor(logUdsAddress);
  if (file === null) return;
  const dir = path.dirname(file);
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  }
  const st = lstatSync(dir);
  if (!st.isDirectory() || st.uid !== process.geteuid!()) {
    throw new Error(
      `${dir} is not a directory of this agent's user; remove it so the plugin can cache the iptables flavour there`,
    );
  }
  chmodSync(dir, 0o700); // mkdir's mode is filtered by the umask, and an older dir may be wider.
}

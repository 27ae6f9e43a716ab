// The plugin's log file, for when the agent is down (docs/observability.md "The CNI plugin's logs", "When the
// agent is down"): the plugin appends the records its log socket would have taken to a file
// beside that socket, and the agent, when it starts serving the socket again, prints them and
// removes the file. Written by cni-plugin/log/fallbackfile.ts, read by
// src/monitoring/logreplay.ts; both derive the paths and bounds here. The lines are the log
// socket's own (shared/pluginlog.ts).

/** The file the plugin appends to, in the log socket's directory. */
export const PLUGIN_LOG_FILE_NAME = 'plugin-log.jsonl';

/** Past this size the file is renamed to `<name>.1` (one rotated file, the previous one dropped). */
export const PLUGIN_LOG_FILE_ROTATE_BYTES = 1024 * 1024;

/**
 * Never written past: the plugin drops its records rather than grow a file that cannot be
 * rotated (a rotation claim left by a killed run, a directory at `<name>.1`).
 */
export const PLUGIN_LOG_FILE_MAX_BYTES = 2 * PLUGIN_LOG_FILE_ROTATE_BYTES;

/** What one plugin run appends at most, in one write(2). */
export const PLUGIN_LOG_FILE_RUN_BYTES = 64 * 1024;

/** A claim left longer than this is a killed run's: the agent removes it at start. */
export const PLUGIN_LOG_FILE_STALE_CLAIM_MS = 10_000;

export interface PluginLogFiles {
  readonly dir: string;
  /** Appended to now. */
  readonly current: string;
  /** The one rotated file. */
  readonly rotated: string;
  /** Held (O_CREAT|O_EXCL) by the one run that rotates; see cni-plugin/log/fallbackfile.ts. */
  readonly claim: string;
}

/** The files beside `logUdsAddress`; null when no socket is configured (nor any file then). */
export function pluginLogFiles(logUdsAddress: string): PluginLogFiles | null {
  if (logUdsAddress === '') return null;
  const slash = logUdsAddress.lastIndexOf('/');
  const dir = slash < 0 ? '.' : logUdsAddress.slice(0, slash) || '/';
  const current = `${dir === '/' ? '' : dir}/${PLUGIN_LOG_FILE_NAME}`;
  return { dir, current, rotated: `${current}.1`, claim: `${current}.rotating` };
}

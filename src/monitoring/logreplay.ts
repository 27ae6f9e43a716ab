// The plugin's log file, printed once the log server listens again: while no agent listened, plugin
// runs appended their records to plugin-log.jsonl (and its rotated .1) beside the socket
// (cni-plugin/log/fallbackfile.ts; docs/observability.md "The CNI plugin's logs", "When the agent is down").
// Each line is read as a socket line is (pluginrecord.ts) and printed in scope `cni` with the
// plugin's time and `replayed=true`; then the file is gone.
//
// The directory is the socket's, which listenUnix has found root's and writable by root alone;
// still, what is at the file's path is judged on the fd before a byte is read: opened with
// O_NOFOLLOW|O_NONBLOCK (a link is refused, a FIFO neither blocks nor is read), and read only
// when a regular file of a trusted user (root, or the agent's own), one link, writable by no one
// else. Anything else is left where it is, and a warning says what to do. A file read is removed
// first (only while the path still names the inode opened), then read to its end from the fd,
// so what a late plugin run appends until then is read too. At most `maxFileBytes` of a file
// are read, each line at most `maxLineBytes` (the socket's limit).

import { constants } from 'node:fs';
import { lstat, open, unlink, type FileHandle } from 'node:fs/promises';
import { LineSplitter } from './lines.ts';
import { logRecord, scope } from './logging.ts';
import { combinations, knownCounter } from './metrics.ts';
import { parsePluginBytes } from './pluginrecord.ts';
import { PLUGIN_LOG_SCOPE } from '../../cni-plugin/shared/pluginlog.ts';
import {
  PLUGIN_LOG_FILE_MAX_BYTES,
  PLUGIN_LOG_FILE_STALE_CLAIM_MS,
  pluginLogFiles,
} from '../../cni-plugin/shared/pluginlogfile.ts';

const log = scope('monitoring');

/** Twice what the plugin writes at most: its cap, plus what concurrent runs add past it. */
export const MAX_FILE_BYTES = 2 * PLUGIN_LOG_FILE_MAX_BYTES;

const RESULTS = ['replayed', 'oversized', 'invalid_json', 'invalid_record'] as const;
type Result = (typeof RESULTS)[number];

const records = knownCounter({
  name: 'mesh_cni_plugin_log_file_records_total',
  help: "Lines read from the plugin's log file (written while the agent was down) at start: replayed (printed in scope cni), or dropped as oversized, invalid_json, invalid_record.",
  series: combinations({ result: RESULTS }),
});

export interface ReplayStatus {
  readonly done: boolean;
  readonly replayed: number;
  readonly dropped: number;
  /** Paths left in place, with why. */
  readonly refused: readonly string[];
}

const { O_RDONLY, O_NOFOLLOW, O_NONBLOCK, O_NOCTTY } = constants;

function trusted(uid: number): boolean {
  return uid === 0 || uid === process.geteuid?.();
}

/** Starts printing the files beside `logUdsAddress` (the rotated one first: it is older). */
export function replayPluginLogFiles(
  logUdsAddress: string,
  maxLineBytes: number,
  maxFileBytes = MAX_FILE_BYTES,
): { status(): ReplayStatus; readonly done: Promise<void> } {
  const files = pluginLogFiles(logUdsAddress);
  const st = { done: false, replayed: 0, dropped: 0, refused: [] as string[] };
  const count = (result: Result) => {
    records.inc({ result });
    if (result === 'replayed') st.replayed++;
    else st.dropped++;
  };
  const run = async () => {
    if (files === null) return;
    for (const file of [files.rotated, files.current]) {
      try {
        const why = await replayFile(file, maxLineBytes, maxFileBytes, count);
        if (why !== null) {
          st.refused.push(`${file}: ${why}`);
          log.warn(
            `not printing the plugin's log file: ${why}; remove it (the plugin writes its records there while the agent is down)`,
            { path: file },
          );
        }
      } catch (e) {
        log.warn("cannot print the plugin's log file", { path: file, error: (e as Error).message });
      }
    }
    await clearStaleClaim(files.claim);
  };
  const done = run().finally(() => {
    st.done = true;
  });
  return { status: () => ({ ...st, refused: [...st.refused] }), done };
}

/** Prints one file; why it was left alone, or null. */
async function replayFile(
  file: string,
  maxLineBytes: number,
  maxFileBytes: number,
  count: (r: Result) => void,
): Promise<string | null> {
  let fh: FileHandle;
  try {
    fh = await open(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return null;
    if (code === 'ELOOP') return 'it is a symbolic link';
    if (code === 'ENXIO') return 'it is a socket';
    throw e;
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) return 'it is not a regular file';
    if (!trusted(st.uid)) return `it is not root's (owner uid ${st.uid})`;
    if (st.nlink !== 1) return `it has ${st.nlink} links`;
    if ((st.mode & 0o022) !== 0) return `it is writable by others (mode 0${(st.mode & 0o777).toString(8)})`;
    const now = await lstat(file).catch(() => undefined);
    if (now !== undefined && now.ino === st.ino && now.dev === st.dev) await unlink(file);
    const lines = new LineSplitter(
      maxLineBytes,
      (line) => {
        const r = parsePluginBytes(line);
        if (r === null) return;
        if (!r.ok) return count(r.reason);
        logRecord(PLUGIN_LOG_SCOPE, r.entry.level, r.entry.msg, { ...r.entry.fields, replayed: true }, r.entry.time);
        count('replayed');
      },
      () => count('oversized'),
    );
    const buf = Buffer.allocUnsafe(64 * 1024);
    let read = 0;
    while (read < maxFileBytes) {
      const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, maxFileBytes - read), null);
      if (bytesRead === 0) break;
      read += bytesRead;
      lines.push(buf.subarray(0, bytesRead));
    }
    lines.end();
    const left = (await fh.stat()).size - read;
    if (left > 0)
      log.warn("the plugin's log file was longer than is read: the rest is dropped", {
        path: file,
        readBytes: read,
        droppedBytes: left,
      });
    else log.info("printed the plugin's log file, written while the agent was down", { path: file, bytes: read });
    return null;
  } finally {
    await fh.close();
  }
}

/** The rotation claim of a plugin run killed while rotating: no run rotates while it is there. */
async function clearStaleClaim(claim: string): Promise<void> {
  const st = await lstat(claim).catch(() => undefined);
  if (st === undefined || Date.now() - st.mtimeMs < PLUGIN_LOG_FILE_STALE_CLAIM_MS) return;
  await unlink(claim).then(
    () => log.info("removed a stale rotation claim of the plugin's log file", { path: claim }),
    (e: Error) =>
      log.warn("cannot remove a stale rotation claim of the plugin's log file", { path: claim, error: e.message }),
  );
}

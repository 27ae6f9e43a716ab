// Where the plugin's records go when the agent's log socket cannot be reached (the agent is down,
// upgrading, or not started yet): appended to plugin-log.jsonl beside the socket, which the agent
// prints and removes when it starts again (docs/observability.md "The CNI plugin's logs", "When the agent is
// down"; paths and bounds in shared/pluginlogfile.ts).
//
// Many plugin runs append at once (a runtime starts pods in parallel), with no lock to share:
// neither Node nor Bun has flock(2). So:
//   - each run appends all its records in ONE write(2) of at most 64 KiB to an O_APPEND fd: on a
//     local file system (the run dir is tmpfs) Linux holds the inode's lock for the whole write,
//     so concurrent runs' writes never interleave. A short write (a full disk) is ended with a
//     newline, so only that run's last record is torn and the agent drops just that line;
//   - past the rotation size, the run that holds the claim (a file made O_CREAT|O_EXCL) renames
//     the file to .1, and only if the path still names the inode it wrote to: two runs that saw
//     the same full file cannot rotate twice and drop the .1 just made. A run that loses the
//     claim goes on; one still holding the renamed file writes into .1, which loses nothing;
//   - the hard cap bounds the file when no rotation can happen (a claim left by a killed run).
//
// The directory is checked as the socket's is (shared/trustedpath.ts), the file is opened with
// O_NOFOLLOW|O_NONBLOCK|O_NOCTTY and judged on the fd (a regular file of root's, one link): a
// link, a FIFO, a device or another user's file put there is never written to, never waited on.
// Synchronous, a few syscalls, and only on the path where the socket failed; a failure here
// never fails the plugin's command.

import {
  closeSync,
  constants,
  fchmodSync,
  fstatSync,
  lstatSync,
  openSync,
  renameSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import {
  PLUGIN_LOG_FILE_MAX_BYTES,
  PLUGIN_LOG_FILE_ROTATE_BYTES,
  PLUGIN_LOG_FILE_RUN_BYTES,
  pluginLogFiles,
  type PluginLogFiles,
} from '../shared/pluginlogfile.ts';
import { untrustedDirChain } from '../shared/trustedpath.ts';

const { O_WRONLY, O_APPEND, O_CREAT, O_EXCL, O_NOFOLLOW, O_NOCTTY, O_NONBLOCK } = constants;
const APPEND = O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;

/** Why nothing was written, for the plugin's stderr; null when written, or when there is no run dir. */
export type NotWrittenReason = string | null;

function trusted(uid: number): boolean {
  return uid === 0 || uid === process.geteuid?.();
}

/** The lines (each '\n'-terminated) that fit in one run's write, as bytes. */
function batch(lines: readonly string[]): { buf: Buffer; dropped: number } {
  const parts: Buffer[] = [];
  let size = 0;
  let i = 0;
  for (; i < lines.length; i++) {
    const b = Buffer.from(lines[i]!, 'utf8');
    if (size + b.length > PLUGIN_LOG_FILE_RUN_BYTES) break;
    parts.push(b);
    size += b.length;
  }
  return { buf: Buffer.concat(parts, size), dropped: lines.length - i };
}

/** Appends `lines` to the file beside `logUdsAddress`. Never throws. */
export function appendToFallbackFile(logUdsAddress: string, lines: readonly string[]): NotWrittenReason {
  const files = pluginLogFiles(logUdsAddress);
  if (files === null || lines.length === 0) return null;
  try {
    return append(files, lines);
  } catch (e) {
    return `cannot write ${files.current}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
  }
}

function append(files: PluginLogFiles, lines: readonly string[]): NotWrittenReason {
  let refused: string | null;
  try {
    refused = untrustedDirChain(files.dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    // No run dir: no agent was ever set up on this node, so nothing will read a file.
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw e;
  }
  if (refused !== null) return `not writing ${files.current}: ${refused}`;
  let fd: number;
  try {
    fd = openSync(files.current, APPEND, 0o600);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ELOOP') return `not writing ${files.current}: it is a symbolic link`;
    if (code === 'ENXIO') return `not writing ${files.current}: it is a FIFO or socket`;
    throw e;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) return `not writing ${files.current}: it is not a regular file`;
    if (!trusted(st.uid) || st.nlink !== 1)
      return `not writing ${files.current}: it is not root's alone (owner uid ${st.uid}, ${st.nlink} links)`;
    if (st.size >= PLUGIN_LOG_FILE_MAX_BYTES)
      return `not writing ${files.current}: it is full (${st.size} bytes) and cannot be rotated; is ${files.claim} left from a killed run?`;
    // One of root's, wider than ours (made by hand): the records name pods, for root alone.
    if ((st.mode & 0o777) !== 0o600) fchmodSync(fd, 0o600);
    const { buf, dropped } = batch(lines);
    const n = writeSync(fd, buf);
    if (n < buf.length) writeSync(fd, '\n');
    const rotation = st.size + n >= PLUGIN_LOG_FILE_ROTATE_BYTES ? rotate(files, fd) : null;
    return dropped > 0
      ? `${dropped} records beyond ${PLUGIN_LOG_FILE_RUN_BYTES} bytes not written to ${files.current}`
      : rotation;
  } finally {
    closeSync(fd);
  }
}

/**
 * Renames the file written through `fd` to .1, when this run wins the claim and the path still
 * names that file: a run that wrote into a file another run had just rotated must not rename the
 * next one over the .1 just made.
 */
export function rotate(files: PluginLogFiles, fd: number): NotWrittenReason {
  const mine = fstatSync(fd);
  if (mine.size < PLUGIN_LOG_FILE_ROTATE_BYTES) return null;
  try {
    closeSync(openSync(files.claim, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, 0o600));
  } catch {
    return null; // another run is rotating (or its claim is stale: the hard cap holds until the agent clears it)
  }
  try {
    const now = lstatSync(files.current);
    if (now.ino === mine.ino && now.dev === mine.dev) renameSync(files.current, files.rotated);
    return null;
  } catch (e) {
    return `cannot rotate ${files.current} to ${files.rotated}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
  } finally {
    unlinkSync(files.claim);
  }
}

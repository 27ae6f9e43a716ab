// Every file the agent reads from a host mount or from its config goes through here. Those dirs
// are writable by others (root on the node, any DaemonSet mounting the net dir), so a name with
// a config extension may be a FIFO (open blocks forever), a link to /dev/zero (read never ends),
// or 50 MB of junk. Only regular files are read, opened non-blocking so a FIFO cannot hold the
// open, checked with fstat on the open fd (no race between check and read), and up to a size
// cap. Errors name the file and what it is, never its contents.

import { constants, type BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import { fileKind } from '../filekind.ts';

/** Largest config, token, CA or template file read: CNI configs are a few KiB. */
export const MAX_FILE_BYTES = 1024 * 1024;

export type UnsafeReason = 'not_regular' | 'too_large';

/** A file refused for what it is, not for an I/O error. */
export class UnsafeFileError extends Error {
  readonly file: string;
  readonly reason: UnsafeReason;
  constructor(file: string, reason: UnsafeReason, message: string) {
    super(message);
    this.name = 'UnsafeFileError';
    this.file = file;
    this.reason = reason;
  }
}

/** The stat identity of a file: equal identities mean the same bytes (outside the racy window). */
export function identity(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

export interface OpenOptions {
  /** Refuse a symbolic link as the last path component (O_NOFOLLOW). Default: follow. */
  readonly noFollow?: boolean;
}

/**
 * Opens `file` read-only without blocking and checks, on the fd, that it is a regular file.
 * The caller closes the handle. ENOENT and friends are thrown as they come.
 */
export async function openRegular(
  file: string,
  opts: OpenOptions = {},
): Promise<{ fh: fs.FileHandle; stat: BigIntStats }> {
  const flags = constants.O_RDONLY | constants.O_NONBLOCK | (opts.noFollow ? constants.O_NOFOLLOW : 0);
  let fh: fs.FileHandle;
  try {
    fh = await fs.open(file, flags);
  } catch (e) {
    // O_NOFOLLOW on a link fails with ELOOP: say what it is rather than "too many links".
    if ((e as NodeJS.ErrnoException).code === 'ELOOP' && opts.noFollow) {
      throw new UnsafeFileError(file, 'not_regular', `${file} is a symbolic link, which is not followed here`);
    }
    throw e;
  }
  try {
    const stat = await fh.stat({ bigint: true });
    if (!stat.isFile())
      throw new UnsafeFileError(file, 'not_regular', `${file} is ${fileKind(stat.mode)}, not a regular file`);
    return { fh, stat };
  } catch (e) {
    await fh.close();
    throw e;
  }
}

export interface ReadResult {
  readonly text: string;
  /** fstat of the fd, taken before the read. */
  readonly stat: BigIntStats;
}

/** Reads a regular file of at most `maxBytes` as UTF-8; throws UnsafeFileError for anything else. */
export async function readRegularFile(
  file: string,
  opts: OpenOptions & { maxBytes?: number } = {},
): Promise<ReadResult> {
  const max = opts.maxBytes ?? MAX_FILE_BYTES;
  const { fh, stat } = await openRegular(file, opts);
  try {
    const tooLarge = (size: string) =>
      new UnsafeFileError(
        file,
        'too_large',
        `${file} is ${size}, over the ${formatBytes(max)} limit for a file the agent reads`,
      );
    if (stat.size > BigInt(max)) throw tooLarge(formatBytes(Number(stat.size)));
    // The file may grow after the fstat: read on until EOF, but never past one byte over the cap.
    let buf = Buffer.allocUnsafe(Math.min(Number(stat.size), max) + 1);
    let n = 0;
    for (;;) {
      if (n === buf.length) {
        if (n > max) throw tooLarge('more than that');
        const bigger = Buffer.allocUnsafe(Math.min(buf.length * 2, max + 1));
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const { bytesRead } = await fh.read(buf, n, buf.length - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
    }
    return { text: buf.toString('utf8', 0, n), stat };
  } finally {
    await fh.close();
  }
}

/** Like readRegularFile, but null when the file does not exist. */
export async function readRegularFileIfExists(
  file: string,
  opts: OpenOptions & { maxBytes?: number } = {},
): Promise<ReadResult | null> {
  try {
    return await readRegularFile(file, opts);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
}

/** A file's text, null when it does not exist; anything but a regular file of at most 1 MiB is refused. */
export async function readRegularTextIfExists(file: string): Promise<string | null> {
  return (await readRegularFileIfExists(file))?.text ?? null;
}

function formatBytes(n: number): string {
  if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(n % (1024 * 1024) === 0 ? 0 : 1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(n % 1024 === 0 ? 0 : 1)} KiB`;
  return `${n} bytes`;
}

// Reads a file the plugin trusts only as far as its kind and size: the net dir it sits in may
// be written by others, and the plugin runs as root on every pod's start. Opened without
// following a final link and without blocking (a FIFO would hang every CNI call), checked on the
// open fd to be a regular file (a device such as /dev/zero never ends) of bounded size.

import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';

export class UnsafeFileError extends Error {}

export function readRegularFile(file: string, maxBytes: number): string {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ELOOP')
      throw new UnsafeFileError(`${file} is a symbolic link; not following it`);
    throw e;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new UnsafeFileError(`${file} is not a regular file`);
    if (st.size > maxBytes) throw new UnsafeFileError(`${file} is larger than ${maxBytes} bytes`);
    // One byte more than allowed: a file that grew since the fstat is caught too.
    const buf = Buffer.alloc(maxBytes + 1);
    let n = 0;
    for (;;) {
      const got = readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n > maxBytes) throw new UnsafeFileError(`${file} is larger than ${maxBytes} bytes`);
    }
    return buf.subarray(0, n).toString('utf8');
  } finally {
    closeSync(fd);
  }
}

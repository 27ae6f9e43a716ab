// What a file is, for messages that refuse it: "is a FIFO", "is a directory". Pure, on Node
// built-ins alone: the installer's safe reads and the pod-netns module both name files with it.

import { constants } from 'node:fs';

const KINDS = new Map<number, string>([
  [constants.S_IFREG, 'a regular file'],
  [constants.S_IFDIR, 'a directory'],
  [constants.S_IFIFO, 'a FIFO'],
  [constants.S_IFCHR, 'a character device'],
  [constants.S_IFBLK, 'a block device'],
  [constants.S_IFSOCK, 'a socket'],
  [constants.S_IFLNK, 'a symbolic link'],
]);

/** The kind of file a stat's mode says, with its article. */
export const fileKind = (mode: number | bigint): string =>
  KINDS.get(Number(mode) & constants.S_IFMT) ?? 'a file of an unknown kind';

// Serving on a unix socket that the CNI plugin (run as root by the container runtime) connects
// to: a path with a dir on the way that another user could write is refused at start (the
// plugin checks it too: cni-plugin/shared/trustedpath.ts), the directory is created 0750, the
// socket is 0600 from the moment it exists, a stale socket left by a killed agent is replaced,
// anything else at the path is refused, and on close the open connections are cut and the
// socket is removed only if it is still ours (a newer agent may have replaced it). At most
// `maxConnections` are held: one more closes the oldest, so senders that keep connections open
// cannot lock the plugin out (its runs are short; a new connection is far more likely to be a
// plugin run than the oldest one is). A connection the server has not served yet (`unserved`:
// waiting for its first read) is never the one closed to make room: when every other one is
// such, the newcomer is closed instead, so a stream of new connections cannot push a waiting
// plugin run out before its turn.

import { constants } from 'node:fs';
import { chmod, lstat, mkdir, open, stat, unlink } from 'node:fs/promises';
import type net from 'node:net';
import path from 'node:path';
import { untrustedDirChain } from '../../cni-plugin/shared/trustedpath.ts';
import { scope } from './logging.ts';

const log = scope('monitoring');

export interface Slots {
  readonly maxConnections: number;
  /** Called for a connection closed to make room, before it is destroyed. */
  readonly onEvict?: (socket: net.Socket) => void;
  /** Connections not to close to make room (the server owes them their first read). */
  readonly unserved?: (socket: net.Socket) => boolean;
  /** Called for a new connection closed because every open one is unserved. */
  readonly onReject?: (socket: net.Socket) => void;
}

/** Dirs shared with the rest of the node: a socket may be put there, their mode is not ours. */
const SYSTEM_DIRS = new Set(['/', '/run', '/var/run', '/tmp', '/var/tmp', '/dev/shm']);

/**
 * The sockets' dir 0750 (at most): mkdir's mode is filtered by the umask, and one found there
 * (the DaemonSet's hostPath, DirectoryOrCreate, makes /var/run/mesh-cni 0755) keeps its mode.
 * Only a real dir of ours (opened O_NOFOLLOW, checked and changed on the fd): a link, another
 * user's dir or a shared one (sticky or writable by all, /tmp, /run) is left as it is.
 */
async function tightenRunDir(dir: string, created: boolean): Promise<void> {
  let fh;
  try {
    fh = await open(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ELOOP' || code === 'ENOTDIR') return;
    throw e;
  }
  try {
    const st = await fh.stat();
    const mode = st.mode & 0o7777;
    if (
      !st.isDirectory() ||
      st.uid !== process.geteuid?.() ||
      SYSTEM_DIRS.has(path.resolve(dir)) ||
      (mode & 0o1002) !== 0
    )
      return;
    const want = created ? 0o750 : mode & 0o750;
    if (mode !== want) {
      await fh.chmod(want);
      if (!created)
        log.info('made the socket dir readable by root and its group only', {
          path: dir,
          was: mode.toString(8),
          now: want.toString(8),
        });
    }
  } finally {
    await fh.close();
  }
}

/** Starts `server` on `address` (`what` and `flag` name it in errors); resolves to its closer. */
export async function listenUnix(
  server: net.Server,
  address: string,
  what: string,
  flag: string,
  slots: Slots,
): Promise<() => Promise<void>> {
  const dir = path.dirname(address);
  const created = await mkdir(dir, { recursive: true, mode: 0o750 });
  // Whoever can write a dir on the way can move our socket (or a dir above it) aside and answer
  // the root plugin in our place: such a path is refused before anything listens there.
  const untrusted = untrustedDirChain(dir);
  if (untrusted !== null) {
    throw new Error(
      `cannot serve ${what} on ${address}: ${untrusted}, so another user could put a socket of theirs in ` +
        `ours' place and answer the plugin; choose a ${flag} whose directories are root's and writable by ` +
        'root alone (the default /var/run/mesh-cni is; docs/security.md "Socket paths")',
    );
  }
  await tightenRunDir(dir, created !== undefined);
  const existing = await lstat(address).catch((e: NodeJS.ErrnoException) => {
    if (e.code === 'ENOENT') return undefined;
    throw e;
  });
  if (existing && !existing.isSocket()) {
    throw new Error(
      `cannot serve ${what} on ${address}: it exists and is not a socket; remove it or choose another ${flag}`,
    );
  }
  if (existing) {
    // A socket left by an agent that was killed; a live agent on this node would be replaced by us.
    await unlink(address);
    log.info(`removed stale ${what} socket`, { path: address });
  }
  const open = holdSlots(server, slots);
  await new Promise<void>((resolve, reject) => {
    const onError = (e: NodeJS.ErrnoException) =>
      reject(
        new Error(
          `cannot serve ${what} on ${address}: ${e.code ?? e.message}; check ${flag} and that its directory is writable`,
          { cause: e },
        ),
      );
    server.once('error', onError);
    // bind() runs inside listen(): with this umask the socket is 0600 from its first moment.
    const umask = process.umask(0o177);
    try {
      server.listen(address, () => {
        server.off('error', onError);
        // Accept errors (EMFILE under fd pressure...) are logged, never fatal to the agent.
        server.on('error', (e) => log.error(`${what} socket failed`, { path: address, error: e.message }));
        resolve();
      });
    } finally {
      process.umask(umask);
    }
  });
  await chmod(address, 0o600);
  const ours = await stat(address);
  return async () => {
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const s of open) s.destroy();
    await closed;
    const now = await stat(address).catch(() => undefined);
    if (now && now.ino === ours.ino && now.dev === ours.dev) await unlink(address).catch(() => {});
  };
}

/**
 * Holds at most `slots.maxConnections` connections on `server` (see the top of this file): one
 * more closes the oldest that may go. Any net.Server (the HTTP servers too). Returns the set of
 * open connections, tracked from the first one on (one may arrive before listen's callback).
 */
export function holdSlots(server: net.Server, slots: Slots): Set<net.Socket> {
  const open = new Set<net.Socket>();
  server.on('connection', (socket: net.Socket) => {
    // A Set keeps insertion order: the first one that may go is the oldest such.
    while (open.size >= slots.maxConnections) {
      let victim: net.Socket | undefined;
      for (const s of open) {
        if (slots.unserved?.(s) !== true) {
          victim = s;
          break;
        }
      }
      if (victim === undefined) {
        slots.onReject?.(socket);
        socket.destroy();
        return;
      }
      open.delete(victim);
      slots.onEvict?.(victim);
      victim.destroy();
    }
    open.add(socket);
    socket.on('close', () => open.delete(socket));
  });
  return open;
}

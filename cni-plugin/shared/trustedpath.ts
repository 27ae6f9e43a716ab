// Whether a unix socket path between the agent and the plugin can be trusted (docs/security.md, "Security:
// the trust model", "Socket paths"): whoever can write a directory the kernel walks to reach the
// socket can move the socket (or a directory above it) aside and answer the root plugin in the
// agent's place, and the plugin then starts pods with no rules. The agent refuses such a path at
// start; the plugin checks again before each connection, so a socket put there later, or by
// someone else than the agent, is never talked to.
//
// Trusted users: root, and this process's own user when it is not root (the agent run
// unprivileged by `npm start`). Every directory walked must be a trusted user's and writable by no
// one else; an ancestor may instead be sticky (as /tmp): its entries can be renamed only by their
// owners, and the next one must be a trusted user's, and be there: one missing could be made by
// anyone between this check and the connect. The socket's own directory is never such a
// shared one. A link is followed only when it is a trusted user's (its directory was checked
// before, so no one else can swap it), and the walk goes on where it points, so the directories
// checked are the ones the kernel walks. Synchronous and a few lstat calls (about 20 us under
// Bun): the plugin runs this on every ADD, and loads no node:path for it.

import { lstatSync, readlinkSync, type Stats } from 'node:fs';

/** The kernel's own bound on links in one lookup (ELOOP past it). */
const MAX_LINKS = 40;

function trusted(uid: number): boolean {
  return uid === 0 || uid === process.geteuid?.();
}

function owners(): string {
  const me = process.geteuid?.() ?? 0;
  return me === 0 ? "root's" : `root's or uid ${me}'s`;
}

function mode(st: Stats): string {
  return `0${(st.mode & 0o7777).toString(8)}`;
}

/** Why `dir` (lstat `st`) lets someone else change its entries; null when it does not. */
function dirRefusal(dir: string, st: Stats, own: boolean): string | null {
  if (!st.isDirectory()) return `${dir} is not a directory`;
  if (!trusted(st.uid)) return `${dir} is not ${owners()} (owner uid ${st.uid}, mode ${mode(st)})`;
  if ((st.mode & 0o022) === 0) return null;
  if ((st.mode & 0o1000) === 0)
    return `${dir} is writable by a user other than root (mode ${mode(st)}, owner uid ${st.uid})`;
  return own
    ? `${dir} is a shared directory (sticky, writable by a user other than root, mode ${mode(st)}): the socket needs a directory of its own`
    : null;
}

function parts(p: string): string[] {
  return p.split('/').filter((c) => c !== '' && c !== '.');
}

const child = (dir: string, name: string) => (dir === '/' ? `/${name}` : `${dir}/${name}`);
const parent = (dir: string) => dir.slice(0, dir.lastIndexOf('/')) || '/';

/**
 * lstat of `next`, an entry of the checked dir `cur` (lstat `st`). When it is not there and `cur`
 * is shared (sticky, writable by others: dirRefusal let it pass), any user could make it between
 * this check and the caller's connect, so "not there" would trust what they make: refused (why).
 */
function lstatOrShared(next: string, cur: string, st: Stats): Stats | string {
  try {
    return lstatSync(next);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT' || (st.mode & 0o022) === 0) throw e;
    return `${next} does not exist, and ${cur} is a shared directory (mode ${mode(st)}): any user could make it there in root's place`;
  }
}

/**
 * Walks `dir` as the kernel does (links followed where they point), checking each directory.
 * Returns the real directory reached, or why it is refused. fs errors (ENOENT...) are thrown.
 */
function walk(dir: string): { readonly real: string } | { readonly refused: string } {
  const todo = parts(dir.startsWith('/') ? dir : `${process.cwd()}/${dir}`);
  let cur = '/';
  let st = lstatSync(cur);
  let links = 0;
  for (;;) {
    const refused = dirRefusal(cur, st, todo.length === 0);
    if (refused !== null) return { refused };
    const c = todo.shift();
    if (c === undefined) return { real: cur };
    if (c === '..') {
      cur = parent(cur);
      st = lstatSync(cur);
      continue;
    }
    const next = child(cur, c);
    const lst = lstatOrShared(next, cur, st);
    if (typeof lst === 'string') return { refused: lst };
    if (lst.isSymbolicLink()) {
      if (!trusted(lst.uid)) return { refused: `${next} is a link of uid ${lst.uid}, not ${owners()}` };
      if (++links > MAX_LINKS) return { refused: `${dir}: more than ${MAX_LINKS} links` };
      const target = readlinkSync(next);
      todo.unshift(...parts(target));
      if (target.startsWith('/')) {
        cur = '/';
        st = lstatSync(cur);
      }
      continue;
    }
    cur = next;
    st = lst;
  }
}

/**
 * The agent's check at start, for the directory it will serve a socket in: why a user other
 * than root (or the agent's own) could change what is found there, or null. Throws fs errors.
 */
export function untrustedDirChain(dir: string): string | null {
  const w = walk(dir);
  return 'refused' in w ? w.refused : null;
}

/**
 * The plugin's check before connecting to `file`: why it must not be talked to, or null when
 * it may be. Nothing there (ENOENT/ENOTDIR on the way) is null too, where only a trusted user
 * could make it: the connection then fails as "not there", which says nothing anyone else chose.
 */
export function socketRefusal(file: string): string | null {
  try {
    const slash = file.lastIndexOf('/');
    const w = walk(slash < 0 ? '.' : file.slice(0, slash) || '/');
    if ('refused' in w) return w.refused;
    const sock = child(w.real, file.slice(slash + 1));
    const st = lstatSync(sock);
    if (!st.isSocket()) return `${sock} is not a socket`;
    if (!trusted(st.uid)) return `${sock} is not ${owners()} (owner uid ${st.uid})`;
    return null;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    return `cannot check ${file}: ${code ?? (e as Error).message}`;
  }
}

/** What to do about a path the plugin refused, for its errors (`flag`: the agent's flag for it). */
export function fixTrust(flag: string): string {
  return (
    "make every directory above the socket root's and writable by root alone (the agent refuses to serve " +
    `in any other; see its log), or point ${flag} at such a path (docs/security.md "Socket paths")`
  );
}

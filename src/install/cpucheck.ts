// Whether the plugin executable we ship can run on this node's CPU, checked before it is
// installed (docs/design.md "Start-up time"). The plugin's runtime is a build choice
// (scripts/plugin-runtime.ts): a Bun-built executable needs x86-64 with SSE4.2 and dies with SIGILL
// on an older CPU, which would fail every pod start on the node (fail closed, but with no word of
// why). The agent runs on that same CPU, so it looks first and says so instead.
//
// Which runtime built the executable is read from the executable itself, so no record beside
// it can go stale or be left out of an image: `bun build --compile` puts the application in an
// ELF section named `.bun`; a Node SEA (which runs on any x86-64) has none. That takes three
// small reads (ELF header, section headers, section names), never the 100 MB file.

import { readFile } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import type { BigIntStats } from 'node:fs';
import { identity, openRegular } from './safefile.ts';

/** The ELF section Bun's compiled executables carry their application in. */
export const BUN_SECTION = '.bun';
/** The CPU flag a Bun-built executable needs (/proc/cpuinfo spelling). */
export const REQUIRED_FLAG = 'sse4_2';

async function readAt(fh: FileHandle, pos: number, len: number): Promise<Buffer> {
  const buf = Buffer.alloc(len);
  const { bytesRead } = await fh.read(buf, 0, len, pos);
  return buf.subarray(0, bytesRead);
}

/**
 * The names of an ELF64 little-endian file's sections; null when the file is no such ELF (a
 * script, a test's stand-in). Bounds are checked against the file size, so a short or hostile
 * file gives null or fewer names, never a huge read.
 */
export async function elfSectionNames(fh: FileHandle, size: number): Promise<string[] | null> {
  const h = await readAt(fh, 0, 64);
  // \x7fELF, ELFCLASS64, little-endian.
  if (h.length < 64 || h.readUInt32BE(0) !== 0x7f454c46 || h[4] !== 2 || h[5] !== 1) return null;
  const shoff = Number(h.readBigUInt64LE(0x28));
  const shentsize = h.readUInt16LE(0x3a);
  const shnum = h.readUInt16LE(0x3c);
  const shstrndx = h.readUInt16LE(0x3e);
  if (shentsize < 64 || shnum === 0 || shstrndx >= shnum || shoff + shnum * shentsize > size) return null;
  const table = await readAt(fh, shoff, shnum * shentsize);
  const entry = (i: number) => table.subarray(i * shentsize, (i + 1) * shentsize);
  const strtab = entry(shstrndx);
  const stroff = Number(strtab.readBigUInt64LE(0x18));
  const strsize = Math.min(Number(strtab.readBigUInt64LE(0x20)), 64 * 1024);
  if (stroff + strsize > size) return null;
  const names = await readAt(fh, stroff, strsize);
  const out: string[] = [];
  for (let i = 0; i < shnum; i++) {
    const at = entry(i).readUInt32LE(0);
    if (at >= names.length) continue;
    const end = names.indexOf(0, at);
    out.push(names.toString('latin1', at, end < 0 ? names.length : end));
  }
  return out;
}

/** Whether an open executable was built by `bun build --compile`. */
export async function builtByBun(fh: FileHandle, size: number): Promise<boolean> {
  return (await elfSectionNames(fh, size))?.includes(BUN_SECTION) ?? false;
}

/**
 * What /proc/cpuinfo says of `flag`: 'yes' when every processor lists it, 'no' when one does
 * not, 'unknown' when no processor lists flags at all (not x86: no Bun-built x86-64 binary runs
 * there anyway, so the answer is no).
 */
export function cpuinfoHasFlag(cpuinfo: string, flag: string): 'yes' | 'no' | 'unknown' {
  const lines = cpuinfo.split('\n').filter((l) => /^flags\s*:/.test(l));
  if (lines.length === 0) return 'unknown';
  return lines.every((l) =>
    l
      .slice(l.indexOf(':') + 1)
      .trim()
      .split(/\s+/)
      .includes(flag),
  )
    ? 'yes'
    : 'no';
}

// Verdicts by cpuinfo path and source identity: the check runs on every reconcile pass, but the
// CPU does not change under a running agent and the image's binary seldom does.
const verdicts = new Map<string, string | null>();

/**
 * Why the plugin at `src` (open as `fh`) must not be installed on this CPU, or null when it can.
 * A cpuinfo that cannot be read makes a Bun build uninstallable too: fail closed, with why.
 */
export async function unrunnableReason(
  src: string,
  fh: FileHandle,
  stat: BigIntStats,
  cpuinfoPath: string,
): Promise<string | null> {
  const key = `${cpuinfoPath}\0${identity(stat)}`;
  const known = verdicts.get(key);
  if (known !== undefined) return known;
  let why: string | null = null;
  if (await builtByBun(fh, Number(stat.size))) {
    const fix =
      'use an image built with MESH_PLUGIN_RUNTIME=node-sea ' + '(a Node single executable, which runs on any x86-64)';
    let has: 'yes' | 'no' | 'unknown' | Error;
    try {
      has = cpuinfoHasFlag(await readFile(cpuinfoPath, 'utf8'), REQUIRED_FLAG);
    } catch (e) {
      has = e as Error;
    }
    if (has instanceof Error) {
      // Not remembered: the next pass reads it again.
      return (
        `${src} was built with Bun, which needs a CPU with SSE4.2, and ${cpuinfoPath} cannot be read to tell ` +
        `(${has.message}); not installing it. Make ${cpuinfoPath} readable, or ${fix}`
      );
    }
    if (has !== 'yes') {
      const what = has === 'no' ? `lists no ${REQUIRED_FLAG} flag for at least one processor` : 'lists no CPU flags';
      why =
        `${src} was built with Bun, which needs a CPU with SSE4.2; ${cpuinfoPath} ${what}, ` +
        `so every pod start on this node would fail; not installing it: ${fix}`;
    }
  }
  verdicts.set(key, why);
  return why;
}

/**
 * The hook before the binaries are installed: throws when the plugin cannot run here, which the
 * pass reports as binaries_failed (not ready with this reason, mesh_cni_install_errors_total).
 */
export async function refuseUnrunnablePlugin(src: string, cpuinfoPath: string): Promise<void> {
  let opened;
  try {
    opened = await openRegular(src, { noFollow: true });
  } catch {
    return; // the install itself says what is wrong with the source
  }
  try {
    const why = await unrunnableReason(src, opened.fh, opened.stat, cpuinfoPath);
    if (why !== null) throw new Error(why);
  } finally {
    await opened.fh.close();
  }
}

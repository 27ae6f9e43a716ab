// The planner's view (plancontext.ts NetDirView) of the real net dir: every file read through
// safefile.ts (regular files only, non-blocking, capped), the config files that hold no entry of
// ours through the file cache (filecache.ts), records never through a link. Reads only.

import fs from 'node:fs/promises';
import path from 'node:path';
import { isConfigFile } from './cniconfig.ts';
import type { FileCache } from './filecache.ts';
import type { EntryFacts, FileFacts, NetDirView } from './plancontext.ts';
import { readRegularFileIfExists } from './safefile.ts';

export function netDirView(netDir: string, files: FileCache): NetDirView {
  const at = (name: string) => path.join(netDir, name);
  return {
    list: () => fs.readdir(netDir),
    read: async (name) => (await readRegularFileIfExists(at(name)))?.text ?? null,
    readRecord: (name) =>
      readRegularFileIfExists(at(name), { noFollow: true }).then(
        (r) => r?.text ?? null,
        () => null,
      ),
    readCached: (name) => files.read(at(name)),
    peekCached: (name) => files.peek(at(name)),
    warmCached: (names) => files.warm(names.map(at)),
    keepCached: (names) => files.keepOnly(new Set(names.map(at))),
    stat: async (name): Promise<FileFacts> => {
      const st = await fs.stat(at(name));
      return { mode: st.mode, uid: st.uid, gid: st.gid };
    },
    lstat: async (name): Promise<EntryFacts | null> => {
      const st = await fs.lstat(at(name)).catch(() => null);
      return (
        st && { isFile: st.isFile(), isDirectory: st.isDirectory(), isSymbolicLink: st.isSymbolicLink(), mode: st.mode }
      );
    },
    readlink: (name) => fs.readlink(at(name)),
    listDir: async (name) =>
      (await fs.readdir(at(name), { withFileTypes: true })).map((d) => ({
        name: d.name,
        isDirectory: d.isDirectory(),
      })),
    realpath: (name) => fs.realpath(at(name)).catch(() => null),
  };
}

/**
 * Config-file names in `dir` that are not valid UTF-8 (listed as bytes, as libcni sees them),
 * each escaped (`0\x80.conflist`); empty when the dir cannot be listed.
 */
export async function unspellableConfigNames(dir: string): Promise<string[]> {
  const raw = await fs.readdir(dir, { encoding: 'buffer' }).catch(() => [] as Buffer[]);
  return raw
    .filter((b) => !Buffer.from(b.toString('utf8')).equals(b) && isConfigFile(b.toString('latin1')))
    .sort(Buffer.compare)
    .map((b) =>
      [...b]
        .map((c) =>
          c >= 0x20 && c < 0x7f && c !== 0x5c ? String.fromCharCode(c) : `\\x${c.toString(16).padStart(2, '0')}`,
        )
        .join(''),
    );
}

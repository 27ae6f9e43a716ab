// The net dir as the runtime sees it (libcni, as CRI-O and containerd read it): the config files
// in byte order, the first one libcni would load. Tests ask which file that is and whether our
// entry is in it.

import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { isConfigFile, isOurs, libcniVerdict } from '../../src/install/cniconfig.ts';

export interface RuntimeView {
  /** The file the runtime would read; null when none loads. */
  readonly file: string | null;
  /** How many entries of ours it holds (plugins of type mesh-cni). */
  readonly entries: number;
  /** The plugin types of its chain, in order (a .conf is a chain of one). */
  readonly chain: readonly string[];
}

export function runtimeView(netDir: string): RuntimeView {
  let names: string[];
  try {
    names = readdirSync(netDir);
  } catch {
    return { file: null, entries: 0, chain: [] };
  }
  for (const name of names.filter(isConfigFile).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))) {
    let text: string;
    try {
      text = readFileSync(path.join(netDir, name), 'utf8');
    } catch {
      continue; // renamed away between the listing and the read, as the runtime may see it
    }
    if (!libcniVerdict(text, name).ok) continue;
    const value = JSON.parse(text) as { type?: string; plugins?: { type: string }[] };
    const plugins = value.plugins ?? [value as { type: string }];
    return { file: name, entries: plugins.filter((p) => isOurs(p as never)).length, chain: plugins.map((p) => p.type) };
  }
  return { file: null, entries: 0, chain: [] };
}

// The node's facts for the redirect backend (nfthost.ts decides from them), read once at start:
// the nft the agent runs, its version and JSON support, whether the kernel's nf_tables answers
// and which tables are there, and the legacy iptables tables. Every nft run goes through the
// agent's one runner (src/podnetns/program.ts), with a short limit: an nft that hangs or crashes
// is a node that cannot, said with what it did, never a start that waits.
//
// The agent runs with hostNetwork, so `nft list tables` and /proc/net are the node's netns; the
// nft itself is the one on the agent's PATH and the sbin dirs (in a container, its image's), as
// for iptables and ipset (src/hostnet/run.ts).

import { constants } from 'node:fs';
import { access, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { runProgram, type RunResult } from '../podnetns/program.ts';
import { parseNftVersion, parseTableList, type NftHostFacts } from './nfthost.ts';

export interface NftProbeOptions {
  /** Dirs searched for nft, in order: the agent's PATH, then the sbin dirs (program.ts withSbinDirs). */
  readonly dirs: readonly string[];
  /** /proc/net of the node's netns (the legacy iptables tables); default /proc/net. */
  readonly procNet?: string;
  /** Each nft run's limit, then SIGKILL; default 2 s (a listing of a busy node takes milliseconds). */
  readonly timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 2000;
/** A listing of tables is small; a node with thousands of tables still fits. */
const MAX_OUTPUT = 1 << 20;

/** The first file named `name` in `dirs` that is a regular file we may execute; relative dirs are skipped. */
async function findProgram(name: string, dirs: readonly string[]): Promise<string | null> {
  for (const dir of dirs) {
    if (!path.isAbsolute(dir)) continue;
    const file = path.join(dir, name);
    try {
      if (!(await stat(file)).isFile()) continue;
      await access(file, constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  return null;
}

/** What a failed run said, naming the command; null when it exited 0. */
function failure(r: RunResult, what: string): string | null {
  if (r.error !== null) return r.error;
  if (r.code === null) return `${what} was killed by a signal (it crashed)`;
  if (r.code === 0) return null;
  const said = firstLine(r.stderr) || firstLine(r.stdout) || 'nothing on stderr';
  return `${what} failed (exit ${r.code}): ${said}`;
}

function firstLine(text: string): string {
  return (text.split('\n').find((l) => l.trim() !== '') ?? '').trim().slice(0, 200);
}

/** `nft -j list tables` prints {"nftables": [...]}. */
function isNftJson(stdout: string): boolean {
  try {
    return Array.isArray((JSON.parse(stdout) as { nftables?: unknown }).nftables);
  } catch {
    return false;
  }
}

/** The kernel's legacy iptables tables, v4 and v6; null when neither file exists (no ip_tables in the kernel). */
async function legacyTables(procNet: string): Promise<string[] | null> {
  const read = (f: string) => readFile(path.join(procNet, f), 'utf8').catch(() => null);
  const files = await Promise.all([read('ip_tables_names'), read('ip6_tables_names')]);
  if (files.every((f) => f === null)) return null;
  const names = files.flatMap((f) => (f ?? '').split('\n').map((l) => l.trim()));
  return [...new Set(names.filter((n) => n !== ''))];
}

/** The node's facts; never throws: what failed is in the facts. */
export async function probeNftHost(o: NftProbeOptions): Promise<NftHostFacts> {
  const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const legacy = legacyTables(o.procNet ?? '/proc/net');
  const nft = await findProgram('nft', o.dirs);
  const notRun = { jsonError: null, tables: null, tablesError: null };
  if (nft === null) {
    const nftError = `no nft in ${o.dirs.join(', ')}`;
    return { nftPath: null, nftVersion: null, nftError, ...notRun, legacyTables: await legacy };
  }
  const run = async (args: readonly string[]) => {
    const what = `${nft} ${args.join(' ')}`;
    const r = await runProgram(nft, args, { timeoutMs, maxOutput: MAX_OUTPUT, what });
    return { r, error: failure(r, what) };
  };
  const v = await run(['--version']);
  const nftVersion = v.error === null ? parseNftVersion(v.r.stdout) : null;
  if (nftVersion === null) {
    const nftError = v.error ?? `${nft} --version printed no version: ${JSON.stringify(firstLine(v.r.stdout))}`;
    return { nftPath: nft, nftVersion: null, nftError, ...notRun, legacyTables: await legacy };
  }
  const [j, t] = await Promise.all([run(['-j', 'list', 'tables']), run(['list', 'tables'])]);
  return {
    nftPath: nft,
    nftVersion,
    nftError: null,
    jsonError: j.error ?? (isNftJson(j.r.stdout) ? null : `${nft} -j list tables printed no nftables JSON`),
    tables: t.error === null ? parseTableList(t.r.stdout) : null,
    tablesError: t.error,
    legacyTables: await legacy,
  };
}

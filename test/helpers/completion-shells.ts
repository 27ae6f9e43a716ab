// Asks real bash, zsh and fish what they would complete for a command line, with a completion
// script loaded: each shell runs in a child process with an empty environment and a temp home,
// bounded by a timeout so a hung shell fails the test instead of stalling it.

import { execFile } from 'node:child_process';
import { copyFile, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

export interface Completion {
  readonly word: string;
  /** What the shell shows next to the word; empty if nothing. */
  readonly description: string;
}

export interface ShellRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

const TIMEOUT_MS = 20_000;

/** Runs a program to completion; never rejects on a non-zero exit, only on a timeout. */
export function run(file: string, args: readonly string[], env: Record<string, string> = {}): Promise<ShellRun> {
  return new Promise((resolve, reject) => {
    execFile(
      file,
      [...args],
      {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
        timeout: TIMEOUT_MS,
        killSignal: 'SIGKILL',
        maxBuffer: 16 * 1024 * 1024,
      },
      (err, stdout, stderr) => {
        if (err && err.killed) {
          reject(new Error(`${file} ${args.join(' ')} did not finish within ${TIMEOUT_MS} ms; stderr: ${stderr}`));
          return;
        }
        const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

/** A temp dir that stands in for $HOME and the shells' config and data dirs; remove it with `rm`. */
export class ShellHome {
  readonly dir: string;
  private constructor(dir: string) {
    this.dir = dir;
  }

  static async create(): Promise<ShellHome> {
    return new ShellHome(await mkdtemp(path.join(os.tmpdir(), 'mcni-completion-')));
  }

  get env(): Record<string, string> {
    return {
      HOME: this.dir,
      ZDOTDIR: this.dir,
      XDG_CONFIG_HOME: path.join(this.dir, 'config'),
      XDG_DATA_HOME: path.join(this.dir, 'data'),
      XDG_CACHE_HOME: path.join(this.dir, 'cache'),
      TERM: 'dumb',
    };
  }

  async file(name: string, content: string): Promise<string> {
    const file = path.join(this.dir, name);
    await writeFile(file, content);
    return file;
  }

  async remove(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true });
  }
}

/**
 * The words bash makes of a line: split at blanks, then at the `=` and `:` of COMP_WORDBREAKS,
 * which become words of their own; a line ending in a blank completes an empty word.
 */
export function bashWords(line: string, wordbreaks = '=:'): string[] {
  const breaks = new RegExp(`([${wordbreaks.replace(/[\]\\^-]/g, '\\$&')}]+)`);
  const words = line
    .split(/\s+/)
    .filter((w) => w !== '')
    .flatMap((w) => (wordbreaks ? w.split(breaks) : [w]).filter((p) => p !== ''));
  if (/\s$/.test(line) || line === '') words.push('');
  return words;
}

const BASH_DRIVER = `
source "$1" || exit 3
shift
spec=$(complete -p "$1") || { echo "no completion registered for $1" >&2; exit 4; }
fn=\${spec#*-F }
fn=\${fn%% *}
COMP_WORDS=("$@")
COMP_CWORD=$(( $# - 1 ))
COMP_LINE=$MCNI_LINE
COMP_POINT=\${#COMP_LINE}
"$fn" "$1" "\${COMP_WORDS[COMP_CWORD]}" "\${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\\n' "\${COMPREPLY[@]}"
`;

/**
 * COMPREPLY of the script's completion function for the line, as bash would call it on TAB;
 * `wordbreaks` are the COMP_WORDBREAKS characters that matter here (users may remove `=`).
 */
export async function bashComplete(
  home: ShellHome,
  script: string,
  line: string,
  wordbreaks = '=:',
): Promise<string[]> {
  const r = await run(
    'bash',
    ['--norc', '--noprofile', '-c', BASH_DRIVER, 'bash', script, ...bashWords(line, wordbreaks)],
    { ...home.env, MCNI_LINE: line },
  );
  if (r.code !== 0) throw new Error(`bash completion of ${JSON.stringify(line)} failed (${r.code}): ${r.stderr}`);
  return r.stdout.split('\n').filter((w) => w !== '');
}

/** The fish `complete -C` answer for the line: what fish lists when TAB is pressed at its end. */
export async function fishComplete(home: ShellHome, script: string, line: string): Promise<Completion[]> {
  const r = await run(
    'fish',
    ['--no-config', '-c', 'source $argv[1]; or exit 3; complete -C $argv[2]', script, line],
    home.env,
  );
  if (r.code !== 0 || r.stderr !== '')
    throw new Error(`fish completion of ${JSON.stringify(line)} failed (${r.code}): ${r.stderr}`);
  return r.stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [word = '', description = ''] = l.split('\t');
      return { word, description };
    });
}

// Runs inside an interactive zsh on a pseudo-terminal: loads compinit and the script, then binds
// TAB to a widget that runs the real complete-word with compadd wrapped, so every match zsh would
// offer is printed between markers instead of being drawn as a menu.
const ZSH_CAPTURE = `
PS1='' RPS1='' PS2=''
[[ -n $MCNI_FPATH ]] && fpath=("$MCNI_FPATH" $fpath)
autoload -U compinit && compinit -u -d "$ZDOTDIR/.zcompdump"
source "$1" || print -r -- '<<LOADFAILED>>'
compadd() {
  # Calls that only collect matches (-O, -A, -D) are completion's own bookkeeping.
  if [[ \${@[1,(i)(-|--)]} == *-(O|A|D)\\ * ]]; then builtin compadd "$@"; return; fi
  local -a __hits __dscr
  if (( $@[(I)-d] )); then
    local __d=\${@[$(( \${@[(i)-d]} + 1 ))]}
    if [[ $__d == \\(* ]]; then eval "__dscr=$__d"; else __dscr=( "\${(@P)__d}" ); fi
  fi
  builtin compadd -A __hits -D __dscr "$@"
  local __i
  for (( __i = 1; __i <= $#__hits; __i++ )); do
    print -r -- "<<M>>$IPREFIX$__hits[__i]<<D>>$__dscr[__i]<<E>>"
  done
}
_mcni_capture() {
  print -r -- '<<BEGIN>>'
  zle complete-word
  print -r -- '<<END>>'
}
zle -N _mcni_capture
bindkey '^I' _mcni_capture
`;

const ZSH_DRIVER = `
zmodload zsh/zpty || exit 3
zpty mcni zsh -f -i
zpty -w mcni "source \${(q)1} \${(q)2}"
zpty -w -n mcni "$3"$'\\t'
zpty -r mcni out '*<<END>>*'
print -r -- "$out"
zpty -d mcni
`;

/**
 * What zsh offers on TAB at the end of the line, in a real interactive zsh (`zsh -f -i` on a
 * zpty) with compinit and the script loaded: sourced, or autoloaded from $fpath (then the
 * script's file name up to the first dot is the command name). Descriptions are zsh's display strings
 * (`--flag  -- text`), empty when it shows the bare word.
 */
export async function zshComplete(
  home: ShellHome,
  script: string,
  line: string,
  how: 'source' | 'fpath' = 'source',
): Promise<Completion[]> {
  const capture = await home.file('capture.zsh', ZSH_CAPTURE);
  let env = home.env;
  if (how === 'fpath') {
    // Installed as a file `_<command>` in $fpath, found by compinit through its #compdef line.
    const dir = path.join(home.dir, 'zsh-functions');
    await mkdir(dir, { recursive: true });
    await copyFile(script, path.join(dir, `_${path.basename(script).split('.')[0]}`));
    env = { ...env, MCNI_FPATH: dir };
  }
  const r = await run(
    'zsh',
    ['-f', '-c', ZSH_DRIVER, 'zsh', capture, how === 'fpath' ? '/dev/null' : script, line],
    env,
  );
  if (r.code !== 0) throw new Error(`zsh completion of ${JSON.stringify(line)} failed (${r.code}): ${r.stderr}`);
  if (r.stdout.includes('<<LOADFAILED>>')) throw new Error(`zsh could not load ${script}: ${r.stdout}`);
  const out: Completion[] = [];
  for (const m of r.stdout.matchAll(/<<M>>(.*?)<<D>>(.*?)<<E>>/g)) {
    const [, word = '', display = ''] = m;
    out.push({ word, description: display === word ? '' : display });
  }
  return out;
}

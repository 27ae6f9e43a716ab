// The completion scripts of `install-cni completion <shell>`, loaded into real bash, zsh and fish
// and asked what they complete. PowerShell is not packaged for Debian, so its script only gets
// its shape checked (completer registered, brackets balanced, flags and choices present).

import assert from 'node:assert/strict';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CLEANUP_MODES, FLAGS, LOG_LEVELS } from '../../src/config/flags.ts';
import { runBin } from '../helpers/cli.ts';
import { bashComplete, fishComplete, run, ShellHome, zshComplete } from '../helpers/completion-shells.ts';
import type { Completion } from '../helpers/completion-shells.ts';

const SHELLS = ['bash', 'zsh', 'fish', 'powershell'] as const;
type Shell = (typeof SHELLS)[number];

const ALL_LONG_FLAGS = [...FLAGS.map((f) => `--${f.name}`), '--help'];

let home: ShellHome;
/** Script files written from the CLI's output: `with` descriptions and `without`. */
const scripts = {} as Record<Shell, { with: string; without: string }>;
const texts = {} as Record<Shell, { with: string; without: string }>;

async function generate(shell: Shell, descriptions: boolean): Promise<string> {
  const r = await runBin('install-cni', ['completion', shell, ...(descriptions ? [] : ['--no-descriptions'])]);
  assert.equal(r.code, 0, `install-cni completion ${shell} failed: ${r.stderr}`);
  assert.equal(r.stderr, '');
  return r.stdout;
}

before(async () => {
  home = await ShellHome.create();
  await Promise.all(
    SHELLS.map(async (shell) => {
      const [withText, withoutText] = await Promise.all([generate(shell, true), generate(shell, false)]);
      texts[shell] = { with: withText, without: withoutText };
      scripts[shell] = {
        with: await home.file(`install-cni.${shell}`, withText),
        without: await home.file(`install-cni.nodesc.${shell}`, withoutText),
      };
    }),
  );
});

after(async () => {
  await home?.remove();
});

const sorted = (words: Iterable<string>): string[] => [...words].sort();
const wordsOf = (c: readonly Completion[]): string[] => sorted(new Set(c.map((x) => x.word)));
const descriptionOf = (c: readonly Completion[], word: string): string =>
  c.find((x) => x.word === word)?.description ?? '';

describe('install-cni completion', () => {
  it('rejects a shell it has no script for, as a usage error naming the choices', async () => {
    const r = await runBin('install-cni', ['completion', 'ksh']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /ksh/);
    assert.match(r.stderr, /bash, zsh, fish, powershell/);
    assert.equal(r.stdout, '');
  });
});

describe('bash completion', () => {
  const complete = (line: string, wordbreaks?: string): Promise<string[]> =>
    bashComplete(home, scripts.bash.with, line, wordbreaks);

  it('passes shellcheck', async () => {
    const r = await run('shellcheck', ['--shell=bash', '--severity=style', scripts.bash.with]);
    assert.equal(r.code, 0, r.stdout + r.stderr);
  });

  it('completes subcommands', async () => {
    assert.deepEqual(await complete('install-cni ver'), ['version']);
    assert.deepEqual(sorted(await complete('install-cni ')), ['completion', 'version']);
  });

  it('completes every root flag from the flag table, and by prefix', async () => {
    assert.deepEqual(sorted(await complete('install-cni --')), sorted(ALL_LONG_FLAGS));
    assert.deepEqual(sorted(await complete('install-cni --cni-n')), [
      '--cni-net-dir',
      '--cni-network-config',
      '--cni-network-config-file',
    ]);
  });

  it('completes flag values after a blank and after =', async () => {
    assert.deepEqual(await complete('install-cni --cleanup-on-exit '), [...CLEANUP_MODES]);
    assert.deepEqual(await complete('install-cni --cleanup-on-exit='), [...CLEANUP_MODES]);
    assert.deepEqual(await complete('install-cni --cleanup-on-exit=al'), ['always']);
    assert.deepEqual(await complete('install-cni --log-level '), [...LOG_LEVELS]);
    assert.deepEqual(await complete('install-cni --log-level=d'), ['debug']);
    // A user who took = out of COMP_WORDBREAKS gets the whole word back.
    assert.deepEqual(await complete('install-cni --cleanup-on-exit=n', ':'), ['--cleanup-on-exit=never']);
  });

  it('offers true/false for a boolean but reads a following flag or value as commander does', async () => {
    assert.deepEqual(await complete('install-cni --ambient-enabled '), ['true', 'false']);
    assert.deepEqual(await complete('install-cni --ambient-enabled --skip'), ['--skip-tls-verify']);
    assert.deepEqual(sorted(await complete('install-cni --ambient-enabled false ')), ['completion', 'version']);
    assert.deepEqual(sorted(await complete('install-cni --ambient-enabled=false ')), ['completion', 'version']);
  });

  it('skips flag values when finding the subcommand', async () => {
    assert.deepEqual(await complete('install-cni --cni-net-dir /tmp ver'), ['version']);
    assert.deepEqual(await complete('install-cni --cleanup-on-exit = never ver'), ['version']);
  });

  it('completes directories for directory flags', async () => {
    const base = path.join(home.dir, 'paths');
    await mkdir(path.join(base, 'net.d'), { recursive: true });
    await writeFile(path.join(base, 'net.conf'), '{}');
    assert.deepEqual(await complete(`install-cni --cni-net-dir ${base}/net`), [`${base}/net.d`]);
    assert.deepEqual(sorted(await complete(`install-cni --cni-network-config-file ${base}/net`)), [
      `${base}/net.conf`,
      `${base}/net.d`,
    ]);
  });

  it("completes the subcommands' flags, values and arguments", async () => {
    assert.deepEqual(sorted(await complete('install-cni completion ')), sorted(SHELLS));
    assert.deepEqual(await complete('install-cni completion bash '), []);
    assert.deepEqual(await complete('install-cni completion --no'), ['--no-descriptions']);
    assert.deepEqual(await complete('install-cni version -o '), ['json', 'yaml']);
    assert.deepEqual(await complete('install-cni version --output=y'), ['yaml']);
    assert.deepEqual(
      sorted(await complete('install-cni version -')),
      sorted(['-o', '--output', '-s', '--short', '-h', '--help']),
    );
  });

  it('has no descriptions to leave out', () => {
    assert.equal(texts.bash.without, texts.bash.with);
  });
});

describe('zsh completion', () => {
  const complete = (line: string, descriptions = true): Promise<Completion[]> =>
    zshComplete(home, descriptions ? scripts.zsh.with : scripts.zsh.without, line);

  it('parses, and registers with compdef when sourced after compinit', async () => {
    for (const script of [scripts.zsh.with, scripts.zsh.without]) {
      const syntax = await run('zsh', ['-n', script], home.env);
      assert.equal(syntax.code, 0, syntax.stderr);
      const r = await run(
        'zsh',
        [
          '-f',
          '-c',
          'autoload -U compinit && compinit -u -d "$ZDOTDIR/.zcompdump" && source "$1" && (( $+_comps[install-cni] )) && print -r -- $_comps[install-cni]',
          'zsh',
          script,
        ],
        home.env,
      );
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stderr, '');
      assert.equal(r.stdout.trim(), '_install_cni');
    }
  });

  it('completes subcommands with their descriptions', async () => {
    const c = await complete('install-cni ');
    assert.deepEqual(wordsOf(c), ['completion', 'version']);
    assert.match(descriptionOf(c, 'version'), /Prints build information/);
    assert.deepEqual(wordsOf(await complete('install-cni ver')), ['version']);
  });

  it('completes flags with their help text', async () => {
    const c = await complete('install-cni --cni-n');
    assert.deepEqual(wordsOf(c), ['--cni-net-dir', '--cni-network-config', '--cni-network-config-file']);
    assert.match(descriptionOf(c, '--cni-net-dir'), /The CNI net dir as the host sees it/);
    assert.deepEqual(wordsOf(await complete('install-cni --')), sorted(ALL_LONG_FLAGS));
  });

  it('completes flag values after a blank and after =', async () => {
    assert.deepEqual(wordsOf(await complete('install-cni --cleanup-on-exit ')), sorted(CLEANUP_MODES));
    assert.deepEqual(
      wordsOf(await complete('install-cni --cleanup-on-exit=')),
      sorted(CLEANUP_MODES.map((m) => `--cleanup-on-exit=${m}`)),
    );
    assert.deepEqual(wordsOf(await complete('install-cni --log-level ')), sorted(LOG_LEVELS));
    assert.deepEqual(wordsOf(await complete('install-cni --ambient-enabled=')), [
      '--ambient-enabled=false',
      '--ambient-enabled=true',
    ]);
  });

  it("completes the subcommands' arguments and flag values", async () => {
    assert.deepEqual(wordsOf(await complete('install-cni completion ')), sorted(SHELLS));
    assert.deepEqual(wordsOf(await complete('install-cni version -o ')), ['json', 'yaml']);
    assert.deepEqual(wordsOf(await complete('install-cni version --output=')), ['--output=json', '--output=yaml']);
  });

  it('leaves descriptions out with --no-descriptions', async () => {
    const subcommands = await complete('install-cni ', false);
    assert.deepEqual(wordsOf(subcommands), ['completion', 'version']);
    assert.deepEqual(
      subcommands.map((x) => x.description),
      ['', ''],
    );
    const flags = await complete('install-cni --cni-n', false);
    assert.deepEqual(wordsOf(flags), ['--cni-net-dir', '--cni-network-config', '--cni-network-config-file']);
    assert.ok(
      flags.every((x) => x.description === ''),
      JSON.stringify(flags),
    );
  });

  it('works autoloaded from $fpath as _install-cni', async () => {
    const c = await zshComplete(home, scripts.zsh.with, 'install-cni --cleanup-on-exit ', 'fpath');
    assert.deepEqual(wordsOf(c), sorted(CLEANUP_MODES));
  });
});

describe('fish completion', () => {
  const complete = (line: string, descriptions = true): Promise<Completion[]> =>
    fishComplete(home, descriptions ? scripts.fish.with : scripts.fish.without, line);

  it('parses', async () => {
    const r = await run('fish', ['--no-config', '--no-execute', scripts.fish.with], home.env);
    assert.equal(r.code, 0, r.stderr);
  });

  it('completes subcommands and flags with descriptions', async () => {
    const subcommands = await complete('install-cni ');
    assert.deepEqual(wordsOf(subcommands), ['completion', 'version']);
    assert.match(descriptionOf(subcommands, 'completion'), /Prints a shell completion script/);
    const flags = await complete('install-cni --cni-n');
    assert.deepEqual(wordsOf(flags), ['--cni-net-dir', '--cni-network-config', '--cni-network-config-file']);
    assert.match(descriptionOf(flags, '--cni-network-config'), /Template of our CNI plugin entry/);
    // A flag with values keeps its own description too (the values stay bare: see below).
    assert.match(descriptionOf(await complete('install-cni --cleanup'), '--cleanup-on-exit'), /On SIGTERM/);
    assert.match(descriptionOf(await complete('install-cni --log-l'), '--log-level'), /Log level of the CNI plugin/);
    assert.deepEqual(
      wordsOf(await complete('install-cni --')).filter((w) => !w.endsWith('=')),
      sorted(ALL_LONG_FLAGS),
    );
  });

  it('completes flag values, bare, after a blank and after =', async () => {
    for (const descriptions of [true, false]) {
      const values = await complete('install-cni --cleanup-on-exit ', descriptions);
      assert.deepEqual(
        values,
        sorted(CLEANUP_MODES).map((word) => ({ word, description: '' })),
      );
      assert.deepEqual(
        wordsOf(await complete('install-cni --cleanup-on-exit=', descriptions)),
        sorted(CLEANUP_MODES.map((m) => `--cleanup-on-exit=${m}`)),
      );
    }
    assert.deepEqual(wordsOf(await complete('install-cni --log-level ')), sorted(LOG_LEVELS));
  });

  it('offers true/false for a boolean but reads a following value as commander does', async () => {
    assert.deepEqual(wordsOf(await complete('install-cni --ambient-enabled ')), ['false', 'true']);
    assert.deepEqual(wordsOf(await complete('install-cni --ambient-enabled=')), [
      '--ambient-enabled=false',
      '--ambient-enabled=true',
    ]);
    assert.deepEqual(wordsOf(await complete('install-cni --ambient-enabled false ')), ['completion', 'version']);
    assert.deepEqual(wordsOf(await complete('install-cni --cni-net-dir /tmp ver')), ['version']);
  });

  it("completes the subcommands' arguments and flags", async () => {
    assert.deepEqual(wordsOf(await complete('install-cni completion ')), sorted(SHELLS));
    assert.deepEqual(await complete('install-cni completion bash '), []);
    assert.deepEqual(wordsOf(await complete('install-cni version -o ')), ['json', 'yaml']);
    // fish also offers `--short=` for a flag whose value is optional.
    assert.deepEqual(wordsOf(await complete('install-cni version --')), ['--help', '--output', '--short', '--short=']);
  });

  it('leaves descriptions out with --no-descriptions', async () => {
    const subcommands = await complete('install-cni ', false);
    assert.deepEqual(subcommands, [
      { word: 'completion', description: '' },
      { word: 'version', description: '' },
    ]);
    const flags = await complete('install-cni --cni-n', false);
    assert.deepEqual(wordsOf(flags), ['--cni-net-dir', '--cni-network-config', '--cni-network-config-file']);
    assert.ok(
      flags.every((x) => x.description === ''),
      JSON.stringify(flags),
    );
  });
});

describe('powershell completion (shape only: no PowerShell on Debian)', () => {
  /** The script without comments and single-quoted strings, where brackets must balance. */
  function code(script: string): string {
    return script
      .split('\n')
      .filter((l) => !l.trimStart().startsWith('#'))
      .join('\n')
      .replace(/'(?:[^']|'')*'/g, "''");
  }

  it('registers a native completer for install-cni with balanced brackets', () => {
    for (const script of [texts.powershell.with, texts.powershell.without]) {
      assert.match(script, /^Register-ArgumentCompleter -Native -CommandName 'install-cni' -ScriptBlock \{$/m);
      assert.match(script, /param\(\$wordToComplete, \$commandAst, \$cursorPosition\)/);
      const c = code(script);
      for (const [open, close] of [
        ['{', '}'],
        ['(', ')'],
        ['[', ']'],
      ] as const) {
        let depth = 0;
        for (const ch of c) {
          if (ch === open) depth++;
          if (ch === close) depth--;
          assert.ok(depth >= 0, `${close} without ${open}`);
        }
        assert.equal(depth, 0, `unbalanced ${open}${close}`);
      }
    }
  });

  it('holds every flag, subcommand and choice', () => {
    const s = texts.powershell.with;
    for (const flag of ALL_LONG_FLAGS) assert.ok(s.includes(`'${flag}'`), flag);
    assert.match(s, /Names = @\('--cleanup-on-exit'\); Value = 'required'; Choices = @\('auto', 'always', 'never'\)/);
    assert.match(s, /Names = @\('--ambient-enabled'\); Value = 'optional'; Choices = @\('true', 'false'\)/);
    assert.match(s, /Names = @\('-o', '--output'\); Value = 'required'; Choices = @\('json', 'yaml'\)/);
    assert.match(s, /Args = @\{ 0 = @\('bash', 'zsh', 'fish', 'powershell'\) \}/);
    assert.match(s, /'version' = 'Prints build information'/);
  });

  it('leaves descriptions out with --no-descriptions', () => {
    const s = texts.powershell.without;
    assert.doesNotMatch(s, /Description = '[^']/);
    assert.match(s, /'version' = ''; 'completion' = ''/);
    assert.match(texts.powershell.with, /Description = 'The CNI net dir as the host sees it/);
  });
});

// The install-cni command line: commander parses, src/config validates, and the typed settings
// go to the agent. Flags come from the one table in src/config/flags.ts.

import { Argument, Command, CommanderError, Help, Option } from 'commander';
import { stringify as toYaml } from 'yaml';
import { FLAG_GROUPS, FLAGS, type FlagGroup, type FlagSpec } from '../config/flags.ts';
import type { RawFlags } from '../config/settings.ts';
import { buildInfo } from '../monitoring/buildinfo.ts';

export interface ProgramHooks {
  /** Runs the agent with the raw flags of the root command. */
  run(flags: RawFlags): Promise<void> | void;
  /** Writes a completion script for the shell. */
  completion?(program: Command, shell: string, descriptions: boolean): string;
  /** Width of `--help` (see helpColumns); undefined: commander's (the terminal's, else 80). */
  readonly columns?: number | undefined;
}

/** Exit code for bad flags and settings: 2, as for any usage error. */
export const EXIT_USAGE = 2;

/**
 * The width `--help` wraps to: the terminal's when stdout is one, else COLUMNS (what a shell
 * exports, and what `COLUMNS=80 install-cni --help | less` asks for), else commander's 80.
 */
export function helpColumns(
  env: Readonly<Record<string, string | undefined>>,
  stdout: { readonly isTTY?: boolean; readonly columns?: number },
): number | undefined {
  if (stdout.isTTY && stdout.columns) return stdout.columns;
  const n = Number(env.COLUMNS);
  return Number.isInteger(n) && n > 0 ? n : undefined;
}

/** `--cni-net-dir <dir>`, `--orch-qps <int>`: what the value is, at a glance. */
function valueName(f: FlagSpec): string {
  // Booleans take an optional value so `--chained-cni-plugin=false` works as with Go's pflag.
  if (f.kind === 'bool') return '[bool]';
  if (f.path) return f.path === 'dir' ? '<dir>' : '<path>';
  return f.kind === 'string' ? '<value>' : `<${f.kind}>`;
}

const heading = (g: FlagGroup) => `${g[0]!.toUpperCase()}${g.slice(1)} flags:`;

/**
 * Commander's item layout, except where the flag names leave the help text too narrow a column
 * to wrap in (80 columns: the longest flag takes 50): then each flag on its line and its help
 * wrapped under it, so no line is wider than the terminal.
 */
function formatItem(this: Help, term: string, termWidth: number, description: string, helper: Help): string {
  const width = helper.helpWidth ?? 80;
  if (width - termWidth - 4 >= helper.minWidthToWrap || !description)
    return Help.prototype.formatItem.call(this, term, termWidth, description, helper);
  const indent = ' '.repeat(6);
  return `  ${term}\n${indent}${helper.boxWrap(description, width - indent.length).replaceAll('\n', `\n${indent}`)}`;
}

export function buildProgram(hooks: ProgramHooks): Command {
  const program = new Command('install-cni')
    .description('Installs the mesh-cni plugin on this node, keeps it in place, and repairs pods that raced it.')
    .allowExcessArguments(false)
    .showHelpAfterError('(run install-cni --help for the flags)')
    .configureHelp({ formatItem })
    .exitOverride();
  // Before the subcommands are made: they inherit the output configuration.
  const columns = hooks.columns;
  if (columns !== undefined)
    program.configureOutput({ getOutHelpWidth: () => columns, getErrHelpWidth: () => columns });
  const attribute = new Map<string, string>();
  // Commander shows groups in the order their first option was added.
  const grouped = FLAG_GROUPS.flatMap((g) => FLAGS.filter((f) => f.group === g));
  for (const f of grouped) {
    const env = f.env ? ` [env ${f.env}]` : '';
    const def = f.default !== undefined && f.default !== '' ? ` (default ${JSON.stringify(f.default)})` : '';
    const opt = new Option(`--${f.name} ${valueName(f)}`, f.help + env + def).helpGroup(heading(f.group));
    // Shown in help and offered by completion, but not checked here: settings checks every
    // value (flag or env) and reports all bad ones at once, where commander stops at the first.
    if (f.choices) opt.argChoices = [...f.choices];
    attribute.set(f.name, opt.attributeName());
    program.addOption(opt);
  }
  program.action(async () => {
    // Map commander's attribute names back to the table's names, so config sees what was typed.
    const opts = program.opts<Record<string, string | boolean | undefined>>();
    const raw: Record<string, string | boolean | undefined> = {};
    for (const f of FLAGS) raw[f.name] = opts[attribute.get(f.name)!];
    await hooks.run(raw);
  });

  program
    .command('version')
    .description('Prints build information.')
    .addOption(new Option('-o, --output <format>', 'output format').choices(['json', 'yaml']))
    .option('-s, --short [bool]', 'print only the version')
    .action((o: { output?: 'json' | 'yaml'; short?: string | boolean }) => {
      const info = buildInfo();
      const short = o.short === true || o.short === 'true';
      if (o.output === 'json')
        process.stdout.write(JSON.stringify(short ? { version: info.version } : info, null, 2) + '\n');
      else if (o.output === 'yaml') process.stdout.write(toYaml(short ? { version: info.version } : info));
      else if (short) process.stdout.write(`${info.version}\n`);
      else
        process.stdout.write(
          `version.BuildInfo{Version:"${info.version}", GitRevision:"${info.gitCommit}", GitTreeState:"${info.gitTreeState}", NodeVersion:"${info.nodeVersion}", Platform:"${info.platform}"}\n`,
        );
    });

  program
    .command('completion')
    .description('Prints a shell completion script.')
    // Declared as choices (not checked in the action) so the completion scripts offer them too;
    // commander rejects any other shell as a usage error.
    .addArgument(
      new Argument('<shell>', 'bash, zsh, fish or powershell').choices(['bash', 'zsh', 'fish', 'powershell']),
    )
    .option('--no-descriptions', 'leave out the descriptions of flags and commands')
    .action((shell: string, o: { descriptions: boolean }) => {
      if (!hooks.completion)
        throw new CommanderError(1, 'mesh.completion', 'completion is not available in this build');
      process.stdout.write(hooks.completion(program, shell, o.descriptions));
    });
  return program;
}

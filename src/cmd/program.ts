// The install-cni command line: commander parses, src/config validates, and the typed settings
// go to the agent. Flags come from the one table in src/config/flags.ts.

import { Argument, Command, CommanderError, Option } from 'commander';
import { stringify as toYaml } from 'yaml';
import { FLAGS } from '../config/flags.ts';
import type { RawFlags } from '../config/settings.ts';
import { buildInfo } from '../monitoring/buildinfo.ts';

export interface ProgramHooks {
  /** Runs the agent with the raw flags of the root command. */
  run(flags: RawFlags): Promise<void> | void;
  /** Writes a completion script for the shell. */
  completion?(program: Command, shell: string, descriptions: boolean): string;
}

/** Exit code for bad flags and settings: 2, as for any usage error. */
export const EXIT_USAGE = 2;

export function buildProgram(hooks: ProgramHooks): Command {
  const program = new Command('install-cni')
    .description('Installs the mesh-cni plugin on this node, keeps it in place, and repairs pods that raced it.')
    .allowExcessArguments(false)
    .showHelpAfterError('(run install-cni --help for the flags)')
    .exitOverride();
  const attribute = new Map<string, string>();
  for (const f of FLAGS) {
    const env = f.env ? ` [env ${f.env}]` : '';
    const def = f.default !== undefined && f.default !== '' ? ` (default ${JSON.stringify(f.default)})` : '';
    // Booleans take an optional value so `--chained-cni-plugin=false` works as with Go's pflag.
    const opt =
      f.kind === 'bool'
        ? new Option(`--${f.name} [bool]`, f.help + env + def)
        : new Option(`--${f.name} <value>`, f.help + env + def);
    if (f.choices) opt.choices(f.choices);
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

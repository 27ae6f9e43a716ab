// Entry point of install-cni: the only place that reads process.argv and process.env; both go
// through src/config into one frozen settings object.

import { CommanderError } from 'commander';
import { ConfigErrors } from '../config/parse.ts';
import { buildSettings } from '../config/settings.ts';
import { buildProgram, EXIT_USAGE, helpColumns } from './program.ts';
import { completionScript } from './completion.ts';
import { runAgent } from '../agent.ts';

export async function main(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  let exitCode = 0;
  const program = buildProgram({
    run: async (flags) => {
      const settings = buildSettings(flags, env);
      exitCode = await runAgent(settings);
    },
    completion: completionScript,
    columns: helpColumns(env, process.stdout),
  });
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return exitCode;
  } catch (e) {
    if (e instanceof ConfigErrors) {
      for (const err of e.errors) process.stderr.write(`install-cni: ${err.message}\n`);
      return EXIT_USAGE;
    }
    if (e instanceof CommanderError) {
      // Help and version exit 0; any usage error (commander already printed it) exits 2.
      if (e.exitCode === 0) return 0;
      if (e.code.startsWith('mesh.')) process.stderr.write(`install-cni: ${e.message}\n`);
      return EXIT_USAGE;
    }
    process.stderr.write(`install-cni: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    return 1;
  }
}

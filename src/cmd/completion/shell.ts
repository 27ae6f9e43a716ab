// Small helpers the generators share: walking the command tree and quoting for POSIX-like shells.

import type { CompletionCommand, CompletionOption } from './model.ts';

/** The command and all its subcommands, parents first. */
export function allCommands(root: CompletionCommand): CompletionCommand[] {
  return [root, ...root.commands.flatMap(allCommands)];
}

/** The names an option is typed as: `--output`, and `-o` when it has a short form. */
export function optionNames(o: CompletionOption): string[] {
  return o.short ? [o.short, o.long] : [o.long];
}

/** Single-quotes for bash and zsh, where only `'` needs care, written as `'\''` (fish differs: see fish.ts). */
export function sq(text: string): string {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

/** The words completed in place of argument `index` of `cmd` (subcommands only come first). */
export function positionalWords(cmd: CompletionCommand, index: number): string[] {
  const subcommands = index === 0 ? cmd.commands.map((c) => c.name) : [];
  return [...subcommands, ...(cmd.args[index]?.choices ?? [])];
}

/** The shell function names use the command name with anything but letters and digits as `_`. */
export function identifier(name: string): string {
  return name.replace(/[^A-Za-z0-9]/g, '_');
}

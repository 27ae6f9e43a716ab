// What the completion scripts complete, read once from the commander program: every shell's
// generator renders this tree, so the four scripts cannot disagree about flags or choices.

import type { Argument, Command, Option } from 'commander';
import { findFlag } from '../../config/flags.ts';

/** How an option's value is completed when it has no fixed choices. */
export type ValueHint = 'none' | 'file' | 'dir';

export interface CompletionOption {
  /** `--cni-net-dir`; every option we have has a long name. */
  readonly long: string;
  /** `-o`, or undefined. */
  readonly short: string | undefined;
  readonly description: string;
  /** `required`: `--x v` / `--x=v`; `optional`: commander's `[value]` (our booleans). */
  readonly value: 'none' | 'required' | 'optional';
  readonly choices: readonly string[];
  readonly hint: ValueHint;
}

export interface CompletionArgument {
  readonly name: string;
  readonly description: string;
  readonly choices: readonly string[];
}

export interface CompletionCommand {
  /** `['install-cni', 'version']`. */
  readonly path: readonly string[];
  readonly name: string;
  readonly description: string;
  readonly options: readonly CompletionOption[];
  readonly commands: readonly CompletionCommand[];
  readonly args: readonly CompletionArgument[];
}

/** Builds the tree; with `descriptions` false every description is empty, so renderers just skip empty ones. */
export function completionModel(program: Command, descriptions: boolean): CompletionCommand {
  return commandModel(program, [], descriptions);
}

function commandModel(cmd: Command, parent: readonly string[], descriptions: boolean): CompletionCommand {
  const path = [...parent, cmd.name()];
  const help = cmd.createHelp();
  return {
    path,
    name: cmd.name(),
    description: descriptions ? summary(cmd.description()) : '',
    options: help
      .visibleOptions(cmd)
      .filter((o) => o.long !== undefined)
      .map((o) => optionModel(o, descriptions)),
    commands: help.visibleCommands(cmd).map((c) => commandModel(c, path, descriptions)),
    args: cmd.registeredArguments.map((a) => argumentModel(a, descriptions)),
  };
}

function optionModel(o: Option, descriptions: boolean): CompletionOption {
  const long = o.long!;
  // Root flags come from the flag table; its help is the description without commander's
  // "[env X] (default Y)" suffix, which is noise in a completion menu.
  const flag = findFlag(long.slice(2));
  const text = flag?.help ?? o.description;
  return {
    long,
    short: o.short,
    description: descriptions ? summary(text) : '',
    value: o.required ? 'required' : o.optional ? 'optional' : 'none',
    // Our booleans are declared `--flag [bool]`: commander takes `--flag=false` and `--flag false`.
    choices: o.argChoices ?? (o.flags.endsWith('[bool]') ? ['true', 'false'] : []),
    hint: flag?.path ?? 'none',
  };
}

function argumentModel(a: Argument, descriptions: boolean): CompletionArgument {
  return { name: a.name(), description: descriptions ? summary(a.description) : '', choices: a.argChoices ?? [] };
}

/** First sentence, without the final period and on one line: menus show one line per item. */
export function summary(text: string): string {
  const oneLine = text.replace(/\s+/g, ' ').trim();
  const end = oneLine.search(/\.(\s|$)/);
  return end === -1 ? oneLine : oneLine.slice(0, end);
}

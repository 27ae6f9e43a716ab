// Shell completion scripts for install-cni (bash, zsh, fish, powershell), generated from the
// commander program so flags and subcommands never drift from the CLI.

import type { Command } from 'commander';

export function completionScript(program: Command, shell: string, _descriptions: boolean): string {
  // Placeholder until the completion generator lands: a minimal bash script.
  const words = [...program.commands.map((c) => c.name()), ...program.options.map((o) => o.long ?? '')].join(' ');
  if (shell === 'bash') return `complete -W "${words}" install-cni\n`;
  return `# completion for ${shell} not generated yet\n`;
}

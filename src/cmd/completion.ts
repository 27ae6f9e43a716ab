// Shell completion scripts for install-cni (bash, zsh, fish, powershell), generated from the
// commander program so flags and subcommands never drift from the CLI.

import type { Command } from 'commander';
import { bashScript } from './completion/bash.ts';
import { fishScript } from './completion/fish.ts';
import { completionModel } from './completion/model.ts';
import { powershellScript } from './completion/powershell.ts';
import { zshScript } from './completion/zsh.ts';

export function completionScript(program: Command, shell: string, descriptions: boolean): string {
  const root = completionModel(program, descriptions);
  switch (shell) {
    case 'bash':
      return bashScript(root);
    case 'zsh':
      return zshScript(root);
    case 'fish':
      return fishScript(root);
    case 'powershell':
      return powershellScript(root);
    default:
      throw new Error(
        `no completion script for shell ${JSON.stringify(shell)}: expected bash, zsh, fish or powershell`,
      );
  }
}

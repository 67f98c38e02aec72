import type { Command } from 'commander';

export function registerRecipeCommands(_program: Command): void {}

import type { Command } from 'commander';

export function registerEvalCommands(_program: Command): void {}

import type { Command } from 'commander';

export function registerAgentCommands(_program: Command): void {}

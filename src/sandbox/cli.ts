import type { Command } from 'commander';

export function registerSandboxCommands(_program: Command): void {}

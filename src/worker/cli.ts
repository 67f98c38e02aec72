import type { Command } from 'commander';

export function registerWorkerCommands(_program: Command): void {}

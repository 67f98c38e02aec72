import type { Command } from 'commander';

export function registerRewardCommands(_program: Command): void {}

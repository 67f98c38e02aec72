import type { Command } from 'commander';

export function registerChatCommands(_program: Command): void {}

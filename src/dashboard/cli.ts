import type { Command } from 'commander';

export function registerDashboardCommands(_program: Command): void {}

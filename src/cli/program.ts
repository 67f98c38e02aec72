import { Command } from 'commander';
import { registerAgentCommands } from '../agent/cli.js';
import { registerChatCommands } from '../chat/cli.js';
import { registerDashboardCommands } from '../dashboard/cli.js';
import { registerDataCommands } from '../data/cli.js';
import { registerServeCommand } from '../engines/cli.js';
import { registerEvalCommands } from '../eval/cli.js';
import { registerRecipeCommands } from '../recipe/cli.js';
import { registerRewardCommands } from '../reward/cli.js';
import { registerSandboxCommands } from '../sandbox/cli.js';
import { registerTokenizerCommands } from '../tokenizer/cli.js';
import { registerWorkerCommands } from '../worker/cli.js';
import { registerEnvCommand } from './env.js';

/**
 * The whole `rstar2` command tree, not yet parsed. Each subsystem owns its commands in its own cli.ts and
 * registers them cheaply: what an action needs is imported when it runs, so `--help` and a parse error cost
 * little more than commander itself (bench/cli-startup.ts).
 */
export function buildProgram(): Command {
  const program = new Command('rstar2')
    .description('rStar2-Agent: agentic reasoning with a Python tool — sandbox, rollout, GRPO-RoC, eval')
    // a hint, not the whole help: a long option list would scroll the error line away
    .showHelpAfterError("(run with --help for the command's options)")
    .enablePositionalOptions();
  registerSandboxCommands(program);
  registerWorkerCommands(program);
  registerTokenizerCommands(program);
  registerRewardCommands(program);
  registerDataCommands(program);
  registerAgentCommands(program);
  registerRecipeCommands(program);
  registerEvalCommands(program);
  registerChatCommands(program);
  registerServeCommand(program);
  registerDashboardCommands(program);
  registerEnvCommand(program);
  return program;
}

import { Command } from 'commander';
import { registerAgentCommands } from '../agent/cli.js';
import { registerChatCommands } from '../chat/cli.js';
import { registerDashboardCommands } from '../dashboard/cli.js';
import { registerDataCommands } from '../data/cli.js';
import { registerEvalCommands } from '../eval/cli.js';
import { registerRecipeCommands } from '../recipe/cli.js';
import { registerRewardCommands } from '../reward/cli.js';
import { registerSandboxCommands } from '../sandbox/cli.js';
import { registerTokenizerCommands } from '../tokenizer/cli.js';
import { registerWorkerCommands } from '../worker/cli.js';

// Each subsystem owns its commands in its own cli.ts; this file only assembles them.
const program = new Command('rstar2')
  .description('rStar2-Agent: agentic reasoning with a Python tool — sandbox, rollout, GRPO-RoC, eval')
  .showHelpAfterError()
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
registerDashboardCommands(program);

program.parseAsync(process.argv).catch((e: unknown) => {
  const err = e as Error;
  console.error(`rstar2: ${err.message}`);
  if (process.env.RSTAR2_DEBUG) console.error(err.stack);
  process.exit(1);
});

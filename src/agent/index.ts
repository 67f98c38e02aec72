export { type BatchingOptions, BatchingRunner } from './batching.js';
export {
  type AgentOptions,
  type AgentTemplate,
  defaultPythonExecutor,
  type RolloutOptions,
  type RolloutProblem,
  runRollouts,
  runTrajectory,
  streamRollouts,
  type ToolExecutor,
  type ToolOutcome,
  type TurnBoundary,
} from './loop.js';
export { loadProblems, toRolloutProblem } from './problems.js';
export { openRolloutStack, type RolloutStack, type StackOptions } from './stack.js';
export { agentTemplate, type TemplateAdapterOptions } from './template.js';

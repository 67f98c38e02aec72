export {
  loadRecipe,
  parseRecipe,
  type Recipe,
  RecipeSchema,
  type RlStageConfig,
  type SftStageConfig,
} from './config.js';
export { FakePolicy } from './fake.js';
export { plotRuns } from './plot.js';
export { EmbeddedPolicy, type EmbeddedPolicyOptions } from './policy.js';
export {
  generateProblems,
  sftExamples,
  TASK_KINDS,
  type TaskKind,
  type TaskProblem,
} from './tasks.js';
export {
  type Heartbeat,
  type Policy,
  type RewardFn,
  type RolloutRequest,
  type RunState,
  readState,
  type ScoredItem,
  Trainer,
} from './trainer.js';

export { EmbeddedBackend, type EmbeddedBackendOptions } from './backend.js';
export {
  loadRecipe,
  parseRecipe,
  type Recipe,
  RecipeSchema,
  type RlStageConfig,
  type SftStageConfig,
} from './config.js';
export { FakeBackend } from './fake.js';
export { plotRuns } from './plot.js';
export {
  generateProblems,
  sftExamples,
  TASK_KINDS,
  type TaskKind,
  type TaskProblem,
} from './tasks.js';
export {
  type PolicyBackend,
  type RewardFn,
  type RolloutRequest,
  type RunState,
  readState,
  type ScoredItem,
  Trainer,
} from './trainer.js';

export { PolicyWorker, runNodeRanks } from './client.js';
export { type InitModelOptions, initModelDir } from './init-model.js';
export { checkLaunch, type LaunchOptions, parseMaster, rankEnvs } from './launch.js';
export { parameterCount, plan } from './plan.js';
export { MODEL_PRESETS, type ModelPreset } from './presets.js';
export { PROTOCOL_VERSION } from './protocol.js';
export type {
  EngineLoad,
  FinishReason,
  GenerateResult,
  LogprobsOptions,
  LogprobsResult,
  ModelConfig,
  ModelInfo,
  SamplingParams,
  SaveOptions,
  TrainBatch,
  TrainOptions,
  TrainSequence,
  TrainStats,
  WeightGroup,
  WeightMeta,
  WorkerStartOptions,
} from './types.js';
export {
  COMPILE_MODES,
  LOSS_AGGS,
  MODEL_IMPLS,
  type ModelImpl,
  PRECISIONS,
  type Precision,
  TrainOptionsSchema,
} from './types.js';

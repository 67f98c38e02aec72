export { fitEngineModel, leastSquares, nonNegativeLeastSquares, parseSamples } from './calibrate.js';
export { EmbeddedEngine, type EmbeddedOptions, type EngineWorker } from './embedded.js';
export { BACKENDS, type Backend, type RemoteEngineOptions, remoteEngine } from './factory.js';
export { FakeEngine, type FakeEngineOptions, type FakeReply, type FakeResponder } from './fake.js';
export { HttpClient, HttpError, type HttpOptions } from './http.js';
export { LlamaCppEngine, type LlamaCppOptions } from './llamacpp.js';
export { LengthModel, Overcommit } from './predict.js';
export {
  AUTO_PREDICT_MIN_KV,
  KvLedger,
  type Lease,
  ROUTING_POLICIES,
  type RolloutStats,
  type RoutingPolicy,
  Scheduler,
  type SchedulerOptions,
} from './scheduler.js';
export { SGLangEngine, type SGLangOptions } from './sglang.js';
export {
  DEFAULT_SAMPLING,
  type Engine,
  type EngineLoad,
  type EngineReport,
  type FinishReason,
  type GenerateResult,
  type SamplingParams,
  type WeightGroup,
  type WeightMeta,
  type WeightSyncEngine,
} from './types.js';
export { VllmEngine, type VllmOptions } from './vllm.js';

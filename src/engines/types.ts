// The one interface every inference engine implements (embedded torch worker, SGLang, vLLM,
// llama.cpp, and fakes in tests). Token-in / token-out: callers never pass text.

import type {
  EngineLoad,
  FinishReason,
  GenerateResult,
  SamplingParams,
  WeightGroup,
  WeightMeta,
} from '../worker/index.js';

// What one generate call takes and returns is the worker's record (worker/types.ts); every engine speaks it.
export type { EngineLoad, FinishReason, GenerateResult, SamplingParams, WeightGroup, WeightMeta };

/** Kinds of served engine (`sglang+http://…`, or `--backend` for a plain URL); engines/factory.ts opens them. */
export type Backend = 'sglang' | 'vllm' | 'llamacpp';
export const BACKENDS: Backend[] = ['sglang', 'vllm', 'llamacpp'];

export interface Engine {
  readonly name: string;
  generate(inputIds: number[], sampling: SamplingParams, signal?: AbortSignal): Promise<GenerateResult>;
  load(): Promise<EngineLoad>;
  close(): Promise<void>;
}

export const DEFAULT_SAMPLING: SamplingParams = {
  temperature: 1.0,
  topP: 1.0,
  topK: -1,
  maxNewTokens: 1024,
  stopTokenIds: [],
  stopStrings: [],
};

/** What a served engine says about itself, read once (`rstar2 train --dry-run`, bench/engine-probe.ts). */
export interface EngineReport {
  version?: string; // as the server reports it
  dtype?: string; // torch dtype name of the served weights, where the server says ('bfloat16')
  /** What its sampled tokens' logprobs are: vLLM's --logprobs-mode as read (raw_logprobs, processed_logprobs, …);
   *  SGLang's are after temperature, which cannot be read back. Undefined where it cannot be read. */
  logprobsMode?: string;
  seeds: boolean; // whether a request's seed makes its sample reproducible
  maxTemperature?: number; // the highest temperature it takes, where it has one
  kv: EngineLoad;
  notes: string[]; // what could not be read or falls short, one sentence each
}

/** Optional hooks an engine may implement; callers check for presence before using them. */
export interface WeightSyncEngine extends Engine {
  /** The server's base URL (weight sync's reachability rule reads its host). */
  readonly url?: string;
  /** Load new weights from a checkpoint directory the engine can read (SGLang, vLLM reload). */
  updateWeightsFromDisk?(path: string, version?: string): Promise<void>;
  /** Ranks this engine adds to a weight-update group; rejects when it cannot join one. */
  weightGroupRanks?(): Promise<number>;
  /** Joins `g` as ranks rankOffset.. (answers once the whole group has joined). */
  initWeightsUpdateGroup?(g: WeightGroup, rankOffset: number): Promise<void>;
  /** Receives one bucket of a broadcast, `meta`, from rank 0, which sends at the same time; `last` marks the
   *  update's last bucket (the weight version is set and cached prefixes dropped after it). */
  updateWeightsFromDistributed?(
    meta: WeightMeta,
    groupName: string,
    opts?: { version?: string; last?: boolean },
  ): Promise<void>;
  /** Version, logprobs, seeds, KV pool; rejects when the server is older than the oldest rstar2 supports. */
  describe?(): Promise<EngineReport>;
}

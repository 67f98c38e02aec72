// The one interface every inference backend implements (embedded torch worker, SGLang, vLLM,
// llama.cpp, and fakes in tests). Token-in / token-out: callers never pass text.

/** Kinds of served engine (`sglang+http://…`, or `--backend` for a plain URL); engines/factory.ts opens them. */
export type Backend = 'sglang' | 'vllm' | 'llamacpp';
export const BACKENDS: Backend[] = ['sglang', 'vllm', 'llamacpp'];

export interface SamplingParams {
  temperature: number; // 0 = greedy
  topP: number; // 1 = off
  topK: number; // -1 = off
  maxNewTokens: number;
  stopTokenIds: number[]; // generation ends after emitting one of these (it is included in outputIds)
  stopStrings: string[]; // generation ends once the decoded output contains one (included in outputIds)
  seed?: number;
  /** Generate all maxNewTokens: the model's end-of-sequence token does not end it (SGLang, vLLM), so a timing probe
   *  (bench/engine-probe.ts) knows how many steps it ran. */
  ignoreEos?: boolean;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

export interface GenerateResult {
  outputIds: number[];
  logprobs: number[]; // sampling logprob of each output id, same length as outputIds
  finishReason: FinishReason;
  error?: string; // set when finishReason is 'error'
  cachedTokens?: number; // input tokens the engine served from its prefix cache (SGLang meta_info.cached_tokens)
  retractions?: number; // times the engine retracted this request (KV overflow), where reported
}

export interface EngineLoad {
  capacityTokens: number; // KV-cache token capacity
  usedTokens?: number; // live usage where the backend reports it
  running?: number;
  queued?: number;
  /** Tokens per KV block (vLLM block_size, SGLang page_size): the engine caches whole blocks only. */
  blockTokens?: number;
}

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

/** A process group the trainer's rank 0 (rank 0) and every engine rank (1..worldSize-1) join for broadcasts. */
export interface WeightGroup {
  masterAddress: string; // the trainer's address as the engines reach it; it listens on masterPort
  masterPort: number;
  worldSize: number;
  groupName: string;
  backend: 'nccl' | 'gloo'; // gloo: CPU engines and the tests
  timeoutS?: number; // the join's timeout, and every collective's without bucketTimeoutS (default 600)
  /** How long one bucket of an update may take (each collective's timeout, where the engine takes one): a push that
   *  stalls part-way fails this soon, not after the join's long wait. */
  bucketTimeoutS?: number;
}

/** The tensors one broadcast carries, in order: Hugging Face names, torch dtype names, shapes. */
export interface WeightMeta {
  names: string[];
  dtypes: string[];
  shapes: number[][];
}

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

/** Optional hooks a backend may implement; callers check for presence before using them. */
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

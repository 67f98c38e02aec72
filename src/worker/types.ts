import { z } from 'zod';

// What one generate call takes and returns: the embedded worker's protocol, and the record every engine speaks
// (engines/types.ts re-exports it).
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

// Hugging Face `config.json` keys of a Qwen2/Qwen3-family decoder (extra keys pass through untouched).
export interface ModelConfig {
  model_type?: 'qwen2' | 'qwen3' | string;
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  head_dim?: number;
  max_position_embeddings?: number;
  rope_theta?: number;
  rms_norm_eps?: number;
  tie_word_embeddings?: boolean;
  attention_bias?: boolean;
  bos_token_id?: number;
  eos_token_id?: number | number[];
  [key: string]: unknown;
}

export const MODEL_IMPLS = ['native', 'transformers'] as const;
export type ModelImpl = (typeof MODEL_IMPLS)[number];

export const PRECISIONS = ['fp32', 'bf16-mixed', 'bf16'] as const;
// 'bf16-mixed': bf16 autocast over fp32 weights and AdamW state; 'bf16': weights and AdamW state in bf16.
export type Precision = (typeof PRECISIONS)[number];

// model.compile: 'auto' compiles the decoder layer's pieces and the log-prob slices on CUDA (torch.compile), 'on'
// on any device, 'off' never; where compiling fails the worker says so once and runs uncompiled.
export const COMPILE_MODES = ['auto', 'on', 'off'] as const;
export type CompileMode = (typeof COMPILE_MODES)[number];

export const LOSS_AGGS = ['token-mean', 'micro-mean-batch', 'micro-mean-nominal'] as const;
export type LossAgg = (typeof LOSS_AGGS)[number];

export interface WorkerStartOptions {
  python?: string; // default: findPython() (RSTAR2_PYTHON, else the project venv .venv, else /usr/bin/python3)
  threads?: number; // torch intra-op threads per rank (default 2)
  precision?: Precision; // default 'fp32'. Each rank runs on its local GPU (LOCAL_RANK) when CUDA is present.
  // How model directories load: 'native' (default): the built-in Qwen2/Qwen3 model; 'transformers':
  // AutoModelForCausalLM, for other architectures (needs the transformers package; trains and scores only).
  modelImpl?: ModelImpl;
  compile?: CompileMode; // default: RSTAR2_COMPILE, else 'auto'
  ranks?: number; // torch.distributed ranks on this node, torchrun's --nproc-per-node (default 1)
  nnodes?: number; // nodes in the job (default 1); the others run theirs with runNodeRanks / --node-rank
  nodeRank?: number; // 0 for the client's node
  master?: string; // ADDR:PORT of rank 0's rendezvous; needed with nnodes > 1
  // 'ddp': a replica per rank, gradients all-reduced (gloo on CPU, NCCL on GPUs). 'fsdp': parameters,
  // gradients and optimizer state sharded (FSDP2 on torch ≥ 2.4, FSDP1 on 2.2–2.3; refused on older torch).
  sharding?: 'ddp' | 'fsdp';
  offloadOptimizer?: boolean; // fsdp: FSDP's CPU offload (shards, gradients and the optimizer step on CPU)
  env?: Record<string, string>;
  // Kill and report a call that has not answered after this long (0 = no limit). A hung worker (e.g. a stuck
  // collective) then rejects the call instead of hanging the caller; the next call restarts it.
  callTimeoutMs?: number;
}

export interface ModelInfo {
  config: ModelConfig;
  params: number;
  dir?: string; // the checkpoint directory it came from, if loaded
  restoredOptimizer?: boolean;
  step: number; // optimizer steps taken: 0 after init, optimizer.pt's count after a load (0 without one)
  device: string; // 'cpu', 'cuda:0', …
  precision: Precision;
  compiled?: 'on' | 'off' | 'unavailable'; // what model.compile decided on this worker
}

/** One training sequence. Every per-token array is aligned with `ids`. */
export interface TrainSequence {
  ids: number[];
  // 1 = this token is trained (predicted from its prefix); 0 = prompt / tool output / padding.
  // mask[0] must be 0: the first token has no prefix to predict it from.
  mask: number[];
  advantage?: number; // required for loss 'grpo' (one scalar per sequence, GRPO outcome advantage)
  // Sampling-time logprob of ids[t] given ids[<t] (entry 0 unused). Absent: ratio = 1 (on-policy).
  oldLogprobs?: number[];
}

export interface TrainBatch {
  loss: 'grpo' | 'sft';
  sequences: TrainSequence[];
}

// The train step's options, each default written here once; the client parses what a caller gives (a partial set)
// into the full set it sends the worker (test/worker/train-keys.test.ts holds it to the keys policy.py reads).
// Range checks on the memory options stay in the worker, which names them.
export const TrainOptionsSchema = z.object({
  lr: z.number().min(0), // the learning rate of this optimizer step, the whole schedule applied (src/rl/schedule.ts)
  weightDecay: z.number().default(0.01), // AdamW decoupled weight decay
  betas: z.tuple([z.number(), z.number()]).default([0.9, 0.999]),
  eps: z.number().default(1e-8), // AdamW eps
  gradClip: z.number().default(1.0), // max global grad norm; 0 = off
  clipLow: z.number().default(0.2), // PPO ratio lower clip eps
  clipHigh: z.number().default(0.28), // PPO ratio upper clip eps (clip-higher)
  dualClip: z.number().default(3.0), // dual-clip constant c for negative advantages
  microBatchTokens: z.number().int().default(8192), // per-rank micro-batch budget in padded tokens
  // Pack micro-batches to at most this many tokens with no padding (attention kept inside each sequence),
  // instead of padded length-grouped ones; microBatchTokens is then unused. Same loss and gradients.
  maxTokensPerMicroBatch: z.number().nullable().default(null),
  gradientCheckpointing: z.boolean().default(false), // recompute each decoder layer in backward
  // tokens per lm_head + log-softmax slice; null: 128 MiB of fp32 logits, 30 MiB on a CPU
  logitsChunkTokens: z.number().nullable().default(null),
  // 'token-mean': exact mean over every mask=1 token of the global batch (independent of micro-batching
  // and rank count). 'micro-mean-batch': each micro-batch's token-mean times its sequences / the batch's.
  // 'micro-mean-nominal': times its sequences / nominalSeqs, verl's dynamic-bsz scaling (docs/DECISIONS.md).
  // A string here: the worker names a bad one (and the old name 'verl').
  lossAgg: z.string().default('token-mean'),
  // 'micro-mean-nominal': the batch's nominal size in sequences (verl's ppo_mini_batch_size × n)
  nominalSeqs: z.number().nullable().default(null),
  // Off by default, as in the paper (verl users reach for them): KL(π ‖ π_ref) per trained token, estimated from
  // the sampled tokens (k1 = log π - log π_ref; k3 = r - log r - 1, r = π_ref/π, verl's low_var_kl), times klCoef;
  // refLogprobs is one list per sequence aligned with its ids, as oldLogprobs. entropyCoef subtracts that times the
  // policy's entropy (its gradient estimated from the sampled token).
  klCoef: z.number().default(0),
  klEstimator: z.string().default('k3'),
  refLogprobs: z.array(z.array(z.number())).nullable().default(null),
  entropyCoef: z.number().default(0),
});

/** What a caller gives: lr, and any of the rest. */
export type TrainOptions = Omit<z.input<typeof TrainOptionsSchema>, 'lossAgg' | 'klEstimator'> & {
  lossAgg?: LossAgg;
  klEstimator?: 'k1' | 'k3';
  // Linear warmup over the worker's first optimizer steps (rl/schedule.ts warmupLr, 0 = none): the client scales
  // lr by it on the step count the worker reports, and sends the result as lr; this key is not sent.
  warmupSteps?: number;
};

/** What the worker receives: every key. */
export type WorkerTrainOptions = z.output<typeof TrainOptionsSchema>;

export interface TrainStats {
  loss: number;
  gradNorm: number; // global grad norm before clipping
  clipFrac: number; // fraction of trained tokens where the clipped branch was taken (grpo)
  entropy: number; // mean policy entropy over trained tokens
  kl?: number; // mean KL estimate over trained tokens, when klCoef > 0
  tokens: number; // non-padding tokens processed (all ranks)
  trainedTokens: number; // mask=1 tokens
  paddedTokens: number; // tokens the forward passes computed, padding included (all ranks); packed: = tokens
  tokensPerS: number;
  lr: number; // learning rate applied in this step
  step: number; // optimizer steps completed (after this one)
  microBatches: number; // forward/backward passes each rank ran (every rank runs as many as the busiest)
  timeS: number;
}

export interface LogprobsOptions {
  temperature?: number; // logits are divided by this before log-softmax (default 1)
  microBatchTokens?: number; // default 8192
  logitsChunkTokens?: number; // as in TrainOptions
}

/** Per sequence, aligned with ids: logprobs[t] = log p(ids[t] | ids[<t]); entry 0 is 0. */
export interface LogprobsResult {
  logprobs: number[];
  entropy: number[]; // entropy of the predictive distribution at t (entry 0 is 0)
  argmax: boolean[]; // ids[t] is the most likely token at t: teacher-forced greedy agreement (entry 0 false)
}

export interface SaveOptions {
  optimizer?: boolean; // also write optimizer.pt (optimizer, step, RNG states) for exact resume
  // Hugging Face sharded layout (model-0000i-of-0000n.safetensors + model.safetensors.index.json):
  // `shards` files exactly (balanced by bytes, whole tensors), or a new file whenever one would pass
  // `maxShardBytes` (HF's max_shard_size rule). Neither, or a plan of one file: model.safetensors.
  shards?: number;
  maxShardBytes?: number;
}

import type { ModelConfig } from './types.js';

// `rstar2 plan`: memory per rank of training a Qwen2/Qwen3 config, for each precision × sharding, with and
// without activation savings. Estimates for choosing a layout, not measurements (docs/DECISIONS.md).

export type Config = ModelConfig & Record<string, unknown>;

function dims(c: Config) {
  const h = c.hidden_size;
  const heads = c.num_attention_heads;
  const hd = (c.head_dim as number | undefined) ?? h / heads;
  const qwen3 = c.model_type === 'qwen3';
  return {
    h,
    q: heads * hd, // width of the query projection
    kv: (c.num_key_value_heads ?? heads) * hd,
    hd,
    qwen3,
    bias: (c.attention_bias as boolean | undefined) ?? !qwen3,
  };
}

/** Parameters of one decoder layer and of the rest (embeddings, head, final norm), as the worker builds them. */
export function parameterParts(c: Config): { layer: number; rest: number } {
  const { h, q, kv, hd, qwen3, bias } = dims(c);
  const attn = h * q + 2 * h * kv + q * h + (bias ? q + 2 * kv : 0);
  const layer = attn + 3 * h * c.intermediate_size + 2 * h + (qwen3 ? 2 * hd : 0);
  return { layer, rest: c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h };
}

export function parameterCount(c: Config): number {
  const { layer, rest } = parameterParts(c);
  return c.num_hidden_layers * layer + rest;
}

export const PRECISIONS = ['fp32', 'bf16-mixed', 'bf16'] as const;
export const SHARDINGS = ['ddp', 'fsdp', 'fsdp-offload'] as const;
export type Precision = (typeof PRECISIONS)[number];
export type PlanSharding = (typeof SHARDINGS)[number];

// Bytes per parameter (ZeRO's accounting). bf16-mixed: bf16 weights and gradients, fp32 master weights and
// AdamW moments (the optimizer's 12). bf16: everything in bf16, moments included. `act`: what the matrix
// products keep; `residual`: the residual stream and the norms' weights (fp32 under bf16-mixed's autocast).
const BYTES: Record<
  Precision,
  { weights: number; grads: number; optimizer: number; act: number; residual: number }
> = {
  fp32: { weights: 4, grads: 4, optimizer: 8, act: 4, residual: 4 },
  'bf16-mixed': { weights: 2, grads: 2, optimizer: 12, act: 2, residual: 4 },
  bf16: { weights: 2, grads: 2, optimizer: 4, act: 2, residual: 2 },
};

/** The worker's log-prob slices on a GPU when `logitsChunkTokens` is unset: 1 GiB of fp32 logits (model.py). */
export const workerLogprobChunk = (vocab: number) => Math.max(1, Math.floor(2 ** 30 / (4 * vocab)));

export interface PlanInput {
  config: Config;
  gpus: number;
  gpuMemGiB: number;
  maxTokens: number; // tokens in one micro-batch on one rank
  logprobChunk?: number; // tokens per log-prob slice (default: the worker's)
}

export interface Activations {
  full: number; // every layer's saved tensors
  ckpt: number; // per-layer checkpointing: every layer's input, one layer's saved tensors while it is recomputed
}

/**
 * Activation bytes of one micro-batch as the worker trains it on a GPU, model.compile on (its default there; log-
 * probs always in slices). Per token, a layer keeps each RMSNorm's input in the residual dtype (the compiled
 * backward recomputes the normalised values); q, the kv heads repeated to q's width for SDPA, and the attention
 * output (4q, fused attention: no T×T scores); Qwen3's q/k-norm inputs (q + kv); and three of the MLP's gate, up,
 * silu(gate) and product (3 × intermediate). The head keeps the final norm's tensors; its backward holds one
 * slice of logits (compute dtype, fp32 and their softmax or log-softmax) and the lm_head's gradient in fp32.
 * Checked against the peaks an H200 measured (docs/DECISIONS.md: `rstar2 plan` accounting); uncompiled, the
 * modules keep more (each norm's fp32 input and normalised values, all four MLP tensors).
 */
export function activationBytes(
  c: Config,
  precision: Precision,
  tokens: number,
  chunk?: number,
): Activations {
  const { h, q, kv, qwen3 } = dims(c);
  const { act: a, residual: r } = BYTES[precision];
  const norm = (4 + r + a) * h;
  const perLayer = (2 * r * h + (4 * q + (qwen3 ? q + kv : 0) + 3 * c.intermediate_size) * a) * tokens;
  const slice = Math.min(chunk ?? workerLogprobChunk(c.vocab_size), tokens);
  const head = norm * tokens + (a === 4 ? 8 : a + 8) * c.vocab_size * slice + 4 * c.vocab_size * h;
  const L = c.num_hidden_layers;
  return { full: L * perLayer + head, ckpt: L * h * r * tokens + perLayer + head };
}

export interface PlanRow {
  precision: Precision;
  sharding: PlanSharding;
  weights: number; // bytes on each GPU
  grads: number;
  optimizer: number;
  workingSet: number; // FSDP: the all-gathered weights and gradients of the units in flight
  state: number; // the four above
  cpu: number; // bytes each rank keeps in host memory (offload)
  total: Activations; // state + activations
  fits: Record<keyof Activations, boolean>;
}

/** Usable share of a GPU's memory: the CUDA context, NCCL buffers and allocator fragmentation take the rest. */
export const USABLE = 0.9;

export function plan(input: PlanInput): PlanRow[] {
  const { config: c, gpus, gpuMemGiB, maxTokens } = input;
  for (const [k, v] of Object.entries({ gpus, gpuMemGiB, maxTokens }))
    if (!(Number.isFinite(v) && v > 0)) throw new Error(`plan: ${k} must be a positive number, got ${v}`);
  const P = parameterCount(c);
  const { layer, rest } = parameterParts(c);
  const budget = gpuMemGiB * 2 ** 30 * USABLE;
  const rows: PlanRow[] = [];
  for (const precision of PRECISIONS) {
    const b = BYTES[precision];
    const act = activationBytes(c, precision, maxTokens, input.logprobChunk);
    for (const sharding of SHARDINGS) {
      const shard = sharding === 'ddp' ? 1 : gpus;
      let weights = (P * b.weights) / shard;
      let grads = (P * b.grads) / shard;
      let optimizer = (P * b.optimizer) / shard;
      // the root unit (embeddings, head) stays gathered through the forward; layers two at a time (prefetch)
      const workingSet = sharding === 'ddp' ? 0 : (rest + 2 * layer) * (b.weights + b.grads);
      let cpu = 0;
      if (sharding === 'fsdp-offload') {
        cpu = weights + grads + optimizer;
        weights = grads = optimizer = 0;
      }
      const state = weights + grads + optimizer + workingSet;
      const total = { full: state + act.full, ckpt: state + act.ckpt };
      rows.push({
        precision,
        sharding,
        weights,
        grads,
        optimizer,
        workingSet,
        state,
        cpu,
        total,
        fits: { full: total.full <= budget, ckpt: total.ckpt <= budget },
      });
    }
  }
  return rows;
}

/** One DDP rank's estimated bytes for `tokens`-token micro-batches, with or without per-layer checkpointing: the
 * number to hold against a measured peak (torch.cuda.max_memory_allocated). */
export function rankBytes(
  config: Config,
  precision: Precision,
  tokens: number,
  checkpointing: boolean,
): number {
  const row = plan({ config, gpus: 1, gpuMemGiB: 1, maxTokens: tokens }).find(
    (r) => r.precision === precision && r.sharding === 'ddp',
  )!;
  return checkpointing ? row.total.ckpt : row.total.full;
}

const gib = (bytes: number, width = 7) => (bytes / 2 ** 30).toFixed(1).padStart(width);

export function formatPlan(input: PlanInput): string[] {
  const c = input.config;
  const chunk = input.logprobChunk ?? workerLogprobChunk(c.vocab_size);
  const rows = plan({ ...input, logprobChunk: chunk });
  const out = [
    `${c.model_type ?? 'qwen2'}: ${(parameterCount(c) / 1e9).toFixed(2)}B parameters; ${input.gpus} GPU(s) × ${input.gpuMemGiB} GiB ` +
      `(${USABLE * 100}% usable); ${input.maxTokens} tokens per micro-batch per rank; log-probs in slices of ${chunk} tokens`,
    '',
    'activations per micro-batch, GiB   no checkpointing  per-layer checkpointing',
  ];
  for (const p of PRECISIONS) {
    const a = activationBytes(c, p, input.maxTokens, chunk);
    out.push(`  ${p.padEnd(32)} ${gib(a.full, 16)} ${gib(a.ckpt, 23)}`);
  }
  out.push(
    '',
    'per rank, GiB (ok = fits)     weights   grads   optim gathered   state |  no ckpt       ckpt |   host',
  );
  const cell = (v: number, ok: boolean) => `${gib(v, 7)} ${ok ? 'ok' : '--'}`;
  for (const r of rows) {
    out.push(
      `  ${r.precision.padEnd(11)} ${r.sharding.padEnd(13)} ${gib(r.weights)} ${gib(r.grads)} ${gib(r.optimizer)} ` +
        `${gib(r.workingSet, 8)} ${gib(r.state)} | ${cell(r.total.full, r.fits.full)} ${cell(r.total.ckpt, r.fits.ckpt)} ` +
        `| ${gib(r.cpu, 6)}`,
    );
  }
  const fit = rows.filter((r) => r.fits.ckpt);
  out.push(
    '',
    fit.length === 0
      ? 'nothing fits: more GPUs, fewer tokens per micro-batch (--max-tokens-per-micro-batch) or a smaller model'
      : `fits with per-layer checkpointing: ${fit.map((r) => `${r.precision}/${r.sharding}`).join(', ')}`,
    'fsdp-offload keeps shards, gradients and AdamW on the host ("host"); estimates (docs/DECISIONS.md)',
  );
  return out;
}

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  activationBytes,
  type Precision,
  parameterCount,
  plan,
  rankBytes,
  workerLogprobChunk,
} from '../../src/worker/plan.js';
import { QWEN3_14B } from './helpers.js';

const q14 = QWEN3_14B;

// by hand: embeddings + head 2 × 151936 × 5120 = 1,555,824,640; a layer = q 5120² + k,v 2 × 5120 × 1024 +
// o 5120² + MLP 3 × 5120 × 17408 + 2 norms × 5120 + q/k norms 2 × 128 = 330,311,936; final norm 5120
const P = 1_555_824_640 + 40 * 330_311_936 + 5120;
const GiB = 2 ** 30;

test('Qwen3-14B: parameter count, state per rank and activations match the hand count', () => {
  assert.equal(P, 14_768_307_200);
  assert.equal(parameterCount(q14), P);
  const rows = plan({ config: q14, gpus: 8, gpuMemGiB: 80, maxTokens: 8192 });
  const row = (p: string, s: string) => rows.find((r) => r.precision === p && r.sharding === s)!;
  assert.equal(rows.length, 9);

  const ddp32 = row('fp32', 'ddp');
  assert.deepEqual([ddp32.weights, ddp32.grads, ddp32.optimizer, ddp32.workingSet], [4 * P, 4 * P, 8 * P, 0]);
  // bf16-mixed FSDP over 8: 16 bytes a parameter sharded, plus the gathered root (embeddings + head + final
  // norm: 1,555,829,760) and two layers, weights and gradients in bf16 (2 + 2 bytes)
  const fsdp = row('bf16-mixed', 'fsdp');
  assert.equal(fsdp.weights + fsdp.grads + fsdp.optimizer, 2 * P);
  assert.equal(fsdp.workingSet, (1_555_829_760 + 2 * 330_311_936) * 4);
  const off = row('bf16-mixed', 'fsdp-offload');
  assert.deepEqual([off.weights, off.grads, off.optimizer, off.cpu], [0, 0, 0, 2 * P]);
  assert.equal(row('bf16', 'ddp').state, 8 * P);

  // activations, bf16-mixed, 8192 tokens, per token and layer: each RMSNorm's input in fp32 (the residual dtype
  // under autocast): 2 × 4 × 5120 bytes; the rest in bf16: q, the kv heads repeated to q's width (two), the
  // attention output: 4·5120, the q/k-norm inputs 5120 + 1024, three MLP tensors 3·17408: 78,848 values. The
  // head: its norm (fp32 input, fp32 normalised, bf16: 10 × 5120 bytes), one 1024-token slice of logits
  // ((2 + 8) bytes × 151936) and the lm_head's fp32 gradient (4 × 151936 × 5120).
  const T = 8192;
  const norm = 10 * 5120;
  const layer = (2 * 4 * 5120 + 78_848 * 2) * T;
  const head = norm * T + 10 * 151_936 * 1024 + 4 * 151_936 * 5120;
  const a = activationBytes(q14, 'bf16-mixed', T, 1024);
  assert.equal(layer, 198_656 * T);
  assert.equal(a.full, 40 * layer + head);
  assert.equal(a.ckpt, 40 * 5120 * 4 * T + layer + head); // the layer inputs are the fp32 residual stream
  // fp32: everything 4 bytes, the logits already fp32 (logits + log-softmax = 8 bytes a vocabulary entry)
  const a32 = activationBytes(q14, 'fp32', T, 1024);
  const norm32 = 12 * 5120;
  assert.equal(
    a32.full,
    40 * (2 * 4 * 5120 + 78_848 * 4) * T + norm32 * T + 8 * 151_936 * 1024 + 4 * 151_936 * 5120,
  );
  // without a chunk the worker's own: 1 GiB of fp32 logits, 1,766 tokens at this vocabulary
  assert.equal(workerLogprobChunk(151_936), 1766);
  assert.equal(activationBytes(q14, 'bf16-mixed', T).full - a.full, 10 * 151_936 * (1766 - 1024));

  // what fits on 8 × 80 GiB at 90 %: a 14.8B replica never does (bf16 DDP state alone is 110 GiB);
  // bf16-mixed FSDP fits only with checkpointing (every layer's activations are 85 GiB)
  assert.ok(rows.filter((r) => r.sharding === 'ddp').every((r) => !r.fits.ckpt));
  assert.deepEqual(fsdp.fits, { full: false, ckpt: true });
  const fsdpCkpt = plan({ config: q14, gpus: 8, gpuMemGiB: 80, maxTokens: T, logprobChunk: 1024 }).find(
    (r) => r.precision === 'bf16-mixed' && r.sharding === 'fsdp',
  )!;
  assert.ok(Math.abs(fsdpCkpt.total.ckpt / GiB - (2 * P + fsdp.workingSet + a.ckpt) / GiB) < 1e-9);
  assert.ok(fsdp.total.ckpt <= 0.9 * 80 * GiB && fsdp.total.full > 0.9 * 80 * GiB);
});

test('rstar2 plan reads config.json, prints the table and names bad input', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-plan-'));
  try {
    mkdirSync(join(dir, 'q14'));
    writeFileSync(join(dir, 'q14', 'config.json'), JSON.stringify(q14));
    const run = (...args: string[]) =>
      spawnSync(process.execPath, ['bin/rstar2.js', 'plan', ...args], { encoding: 'utf8' });
    const ok = run(
      '--model',
      join(dir, 'q14'),
      '--gpus',
      '8',
      '--gpu-mem',
      '80',
      '--max-tokens-per-micro-batch',
      '8192',
    );
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /qwen3: 14\.77B parameters; 8 GPU\(s\) × 80 GiB/);
    assert.match(ok.stdout, /fp32 +ddp +55\.0 +55\.0 +110\.0 +0\.0 +220\.1 \|/);
    assert.match(ok.stdout, /fits with per-layer checkpointing: .*bf16-mixed\/fsdp/);
    assert.match(ok.stdout, /log-probs in slices of 1766 tokens/);
    const bad = run(
      '--model',
      join(dir, 'q14'),
      '--gpus',
      'x',
      '--gpu-mem',
      '80',
      '--max-tokens-per-micro-batch',
      '8192',
    );
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /option '--gpus <n>' argument 'x' is invalid. Expected a positive integer./);
    const none = run(
      '--model',
      join(dir, 'nope'),
      '--gpus',
      '1',
      '--gpu-mem',
      '80',
      '--max-tokens-per-micro-batch',
      '1',
    );
    assert.match(none.stderr, /--model: cannot read .*nope\/config.json/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// Peaks measured on an H200 (2026-11-27, torch 2.11, model.compile on, log-prob slices of 1 GiB of fp32 logits;
// torch.cuda.max_memory_allocated, one rank, random weights; python python/bench/train_bench.py):
// [config, precision, tokens in the largest micro-batch, per-layer checkpointing, GiB]. The single sequences
// trained unpacked, the GRPO batch packed to 16K with varlen attention. The 3B point was not used to shape the
// accounting (fitted on the 0.5B ones): it checks it.
const QWEN25_05B = {
  model_type: 'qwen2',
  vocab_size: 151936,
  hidden_size: 896,
  intermediate_size: 4864,
  num_hidden_layers: 24,
  num_attention_heads: 14,
  num_key_value_heads: 2,
  tie_word_embeddings: true,
};
const QWEN25_3B = {
  ...QWEN25_05B,
  hidden_size: 2048,
  intermediate_size: 11008,
  num_hidden_layers: 36,
  num_attention_heads: 16,
};
const H200_PEAKS: [typeof QWEN25_05B, Precision, number, boolean, number][] = [
  [QWEN25_05B, 'bf16', 8192, false, 13.9],
  [QWEN25_05B, 'bf16', 16322, true, 7.6],
  [QWEN25_05B, 'bf16-mixed', 8192, false, 18.7],
  [QWEN25_3B, 'bf16', 8192, false, 51.2],
];

test('the plan for one rank lands within 10 % of the peaks an H200 measured', () => {
  for (const [config, precision, tokens, ckpt, measured] of H200_PEAKS) {
    const est = rankBytes(config, precision, tokens, ckpt) / GiB;
    assert.ok(
      Math.abs(est / measured - 1) <= 0.1,
      `${precision} ${tokens}${ckpt ? ' ckpt' : ''}: ${est} vs ${measured}`,
    );
  }
});

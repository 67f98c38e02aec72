import type { ModelConfig, SamplingParams } from '../../src/worker/index.js';

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

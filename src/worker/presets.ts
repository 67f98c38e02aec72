import type { ModelConfig } from './types.js';

export type ModelPreset = 'tiny' | 'small';

// Qwen2-style configs for models trained from scratch on CPU. vocab_size is replaced by the tokenizer's
// size when `model init` builds one.
const base = {
  model_type: 'qwen2',
  architectures: ['Qwen2ForCausalLM'],
  hidden_act: 'silu',
  max_position_embeddings: 4096,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: true,
  torch_dtype: 'float32',
} as const;

export const MODEL_PRESETS: Record<ModelPreset, ModelConfig> = {
  // ≈0.85M parameters at vocab 512
  tiny: {
    ...base,
    vocab_size: 512,
    hidden_size: 128,
    intermediate_size: 384,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
  },
  // ≈4.9M parameters at vocab 512
  small: {
    ...base,
    vocab_size: 512,
    hidden_size: 256,
    intermediate_size: 768,
    num_hidden_layers: 6,
    num_attention_heads: 8,
    num_key_value_heads: 4,
  },
};

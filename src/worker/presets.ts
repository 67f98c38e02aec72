import type { ModelConfig } from './types.js';

export type ModelPreset = 'tiny' | 'small' | 'tiny-qwen3';

// Qwen-family configs for models trained from scratch on CPU. vocab_size is replaced by the tokenizer's
// size (`model init`, the recipe's embedded policy).
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
  // A stand-in for a real Qwen3 checkpoint (no weights can be downloaded here): Qwen3-0.6B's config keys
  // (qk-norm, no attention bias, explicit head_dim, tied head) at a tiny width. With Qwen3's tokenizer
  // (151,669 ids) the embedding is 9.7M of its ≈9.8M parameters.
  'tiny-qwen3': {
    model_type: 'qwen3',
    architectures: ['Qwen3ForCausalLM'],
    hidden_act: 'silu',
    max_position_embeddings: 40960,
    rope_theta: 1000000,
    rope_scaling: null,
    rms_norm_eps: 1e-6,
    attention_bias: false,
    attention_dropout: 0.0,
    use_sliding_window: false,
    sliding_window: null,
    tie_word_embeddings: true,
    torch_dtype: 'float32',
    vocab_size: 151669,
    hidden_size: 64,
    intermediate_size: 192,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
  },
};

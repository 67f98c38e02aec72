import { failure, HttpClient, type HttpOptions } from './http.js';
import type { Engine, EngineLoad, FinishReason, GenerateResult, SamplingParams } from './types.js';

// llama.cpp llama-server /completion with a token-array prompt, return_tokens and n_probs. Its
// default sampler chain (top_k 40, top_p 0.95, min_p 0.05, repeat penalty) is not plain ancestral
// sampling, so every knob is sent explicitly. Stop token ids are not an API field: the model's
// end-of-generation tokens stop it, and stopStrings go through `stop`.

interface LlamaResponse {
  tokens?: number[];
  completion_probabilities?: { id: number; logprob?: number }[];
  stop_type?: string;
  stop?: boolean;
}

export interface LlamaCppOptions extends HttpOptions {
  capacityTokens?: number; // overrides slots × n_ctx from /slots
}

export class LlamaCppEngine implements Engine {
  readonly name: string;
  private readonly http: HttpClient;
  private readonly capacity?: number;

  constructor(url: string, opts: LlamaCppOptions = {}) {
    this.http = new HttpClient(url, opts);
    this.name = `llamacpp:${this.http.base}`;
    this.capacity = opts.capacityTokens;
  }

  async generate(inputIds: number[], s: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    const body = {
      prompt: inputIds,
      n_predict: s.maxNewTokens,
      temperature: s.temperature,
      top_p: s.topP,
      top_k: Math.max(s.topK, 0),
      min_p: 0,
      repeat_penalty: 1,
      stop: s.stopStrings,
      n_probs: 1,
      return_tokens: true,
      cache_prompt: true,
      ...(s.seed === undefined ? {} : { seed: s.seed }),
    };
    try {
      return parseLlama(await this.http.json<LlamaResponse>('POST', '/completion', body, signal));
    } catch (e) {
      return failure(e);
    }
  }

  async load(): Promise<EngineLoad> {
    const slots = await this.http.json<{ n_ctx?: number; is_processing?: boolean }[]>('GET', '/slots');
    if (!Array.isArray(slots)) throw new Error(`${this.name}: /slots did not return a list`);
    const cap = this.capacity ?? slots.reduce((a, s) => a + (s.n_ctx ?? 0), 0);
    const running = slots.filter((s) => s.is_processing).length;
    return { capacityTokens: cap, running, queued: 0 };
  }

  async close(): Promise<void> {}
}

export function parseLlama(r: LlamaResponse): GenerateResult {
  const ids = r.tokens ?? r.completion_probabilities?.map((p) => p.id);
  if (!ids)
    return { outputIds: [], logprobs: [], finishReason: 'error', error: 'llama.cpp response lacks tokens' };
  const probs = r.completion_probabilities ?? [];
  if (probs.length !== ids.length || probs.some((p) => typeof p.logprob !== 'number')) {
    return {
      outputIds: ids,
      logprobs: [],
      finishReason: 'error',
      error: `llama.cpp returned ${probs.length} logprobs for ${ids.length} tokens (server too old for n_probs logprob?)`,
    };
  }
  const st = r.stop_type;
  const finishReason: FinishReason = st === 'limit' ? 'length' : st === 'none' ? 'abort' : 'stop';
  const out: GenerateResult = {
    outputIds: ids,
    logprobs: probs.map((p) => p.logprob as number),
    finishReason,
  };
  if (finishReason === 'abort') out.error = 'generation ended before a stop condition';
  return out;
}

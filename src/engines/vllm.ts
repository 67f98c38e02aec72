import { failure, HttpClient, HttpError, type HttpOptions, promValue } from './http.js';
import { groupRequest } from './sglang.js';
import type {
  EngineLoad,
  FinishReason,
  GenerateResult,
  SamplingParams,
  WeightGroup,
  WeightMeta,
  WeightSyncEngine,
} from './types.js';

// vLLM OpenAI-compatible /v1/completions with a token-array prompt. Ids come from
// choices[0].token_ids (return_token_ids, newer builds) or from "token_id:N" logprob tokens
// (return_tokens_as_token_ids, older builds). Capacity comes from /metrics.

interface VllmChoice {
  token_ids?: number[];
  finish_reason?: string | null;
  logprobs?: { tokens?: string[]; token_logprobs?: (number | null)[] } | null;
}

export interface VllmOptions extends HttpOptions {
  model?: string; // served model name; default: first of /v1/models
  capacityTokens?: number; // overrides num_gpu_blocks × block_size from /metrics
}

/** How vLLM must be started for broadcast sync (python/rstar2_worker/vllm_ext.py on its PYTHONPATH). */
export const VLLM_EXTENSION = 'rstar2_worker.vllm_ext.WeightSyncExtension';

export class VllmEngine implements WeightSyncEngine {
  readonly name: string;
  readonly url: string;
  private readonly http: HttpClient;
  private readonly once: HttpClient; // group calls are never repeated (see SGLangEngine)
  private model?: string;
  private capacity?: number;

  constructor(url: string, opts: VllmOptions = {}) {
    this.http = new HttpClient(url, opts);
    this.once = new HttpClient(url, { ...opts, retries: 0 });
    this.url = this.http.base;
    this.name = `vllm:${this.http.base}`;
    this.model = opts.model;
    this.capacity = opts.capacityTokens;
  }

  private async modelName(signal?: AbortSignal): Promise<string> {
    if (!this.model) {
      const r = await this.http.json<{ data?: { id: string }[] }>('GET', '/v1/models', undefined, signal);
      const id = r.data?.[0]?.id;
      if (!id) throw new Error(`${this.name}: /v1/models lists no model`);
      this.model = id;
    }
    return this.model;
  }

  async generate(inputIds: number[], s: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    try {
      const body = {
        model: await this.modelName(signal),
        prompt: inputIds,
        max_tokens: s.maxNewTokens,
        temperature: s.temperature,
        top_p: s.topP,
        top_k: s.topK,
        min_p: 0,
        stop_token_ids: s.stopTokenIds,
        stop: s.stopStrings,
        include_stop_str_in_output: true,
        skip_special_tokens: false,
        logprobs: 0, // logprob of the sampled token only
        return_token_ids: true,
        return_tokens_as_token_ids: true,
        ...(s.seed === undefined ? {} : { seed: s.seed }),
      };
      const r = await this.http.json<{
        choices?: VllmChoice[];
        usage?: { prompt_tokens_details?: { cached_tokens?: number } | null };
      }>('POST', '/v1/completions', body, signal);
      const out = parseVllm(r.choices?.[0]);
      // prefix-cache hits, reported with --enable-prompt-tokens-details
      const cached = r.usage?.prompt_tokens_details?.cached_tokens;
      if (typeof cached === 'number') out.cachedTokens = cached;
      return out;
    } catch (e) {
      return failure(e);
    }
  }

  async load(): Promise<EngineLoad> {
    const text = await this.http.text('/metrics');
    if (this.capacity === undefined) {
      const info = promValue(text, 'vllm:cache_config_info');
      const blocks = Number(info?.labels.num_gpu_blocks);
      const size = Number(info?.labels.block_size);
      if (!(blocks > 0 && size > 0)) {
        throw new Error(
          `${this.name}: /metrics lacks vllm:cache_config_info num_gpu_blocks/block_size; set capacityTokens`,
        );
      }
      this.capacity = blocks * size;
    }
    const usage = promValue(text, 'vllm:kv_cache_usage_perc') ?? promValue(text, 'vllm:gpu_cache_usage_perc');
    const load: EngineLoad = { capacityTokens: this.capacity };
    if (usage) load.usedTokens = Math.round(usage.value * this.capacity);
    const running = promValue(text, 'vllm:num_requests_running');
    const waiting = promValue(text, 'vllm:num_requests_waiting');
    if (running) load.running = running.value;
    if (waiting) load.queued = waiting.value;
    return load;
  }

  /** Re-reads weights from the path the server was started with (dev-mode /collective_rpc). */
  async updateWeightsFromDisk(_path: string): Promise<void> {
    await this.http.json('POST', '/collective_rpc', { method: 'reload_weights' });
  }

  /** One rank per vLLM worker, answered by the worker extension (absent: vLLM was started without it). */
  async weightGroupRanks(): Promise<number> {
    let r: { results?: unknown[] };
    try {
      r = await this.http.json('POST', '/collective_rpc', { method: 'rstar2_weight_sync_ranks' });
    } catch (e) {
      throw new Error(
        `${this.name}: no weight-sync extension (start vLLM with VLLM_SERVER_DEV_MODE=1 and ` +
          `--worker-extension-cls ${VLLM_EXTENSION}, python/ on PYTHONPATH): ${(e as Error).message}`,
      );
    }
    if (!Array.isArray(r.results) || r.results.length === 0)
      throw new Error(`${this.name}: /collective_rpc answered no workers`);
    return r.results.length;
  }

  // the extension takes one JSON string: /collective_rpc passes arguments on as they come
  private async rpc(method: string, arg: unknown): Promise<void> {
    await this.once.post('/collective_rpc', { method, args: [JSON.stringify(arg)] });
  }

  async initWeightsUpdateGroup(g: WeightGroup, rankOffset: number): Promise<void> {
    await this.rpc('init_weight_update_group', groupRequest(g, rankOffset));
  }

  async updateWeightsFromDistributed(meta: WeightMeta, groupName: string): Promise<void> {
    await this.rpc('update_weights_from_distributed', { ...meta, group_name: groupName });
    // cached prefixes hold the old weights' KV; older builds without the route have no prefix cache to drop
    try {
      await this.http.post('/reset_prefix_cache', {});
    } catch (e) {
      if (!(e instanceof HttpError && e.status === 404)) throw e;
    }
  }

  async abortAll(): Promise<void> {
    await this.http.json('POST', '/abort_requests', {});
  }

  async close(): Promise<void> {}
}

export function parseVllm(c: VllmChoice | undefined): GenerateResult {
  if (!c)
    return { outputIds: [], logprobs: [], finishReason: 'error', error: 'vLLM response has no choices' };
  let ids = c.token_ids;
  if (!ids && c.logprobs?.tokens) {
    ids = c.logprobs.tokens.map((t) => Number(t.startsWith('token_id:') ? t.slice(9) : Number.NaN));
    if (ids.some((x) => !Number.isInteger(x))) ids = undefined;
  }
  if (!ids) {
    return {
      outputIds: [],
      logprobs: [],
      finishReason: 'error',
      error: 'vLLM response has neither token_ids nor token_id:N logprob tokens',
    };
  }
  const lps = c.logprobs?.token_logprobs ?? [];
  if (lps.length !== ids.length || lps.some((x) => typeof x !== 'number')) {
    return {
      outputIds: ids,
      logprobs: [],
      finishReason: 'error',
      error: `vLLM returned ${lps.length} logprobs for ${ids.length} tokens`,
    };
  }
  const f = c.finish_reason;
  const finishReason: FinishReason = f === 'length' ? 'length' : f === 'abort' ? 'abort' : 'stop';
  const out: GenerateResult = { outputIds: ids, logprobs: lps as number[], finishReason };
  if (finishReason === 'abort') out.error = 'aborted by server';
  return out;
}

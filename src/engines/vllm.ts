import { existsSync, realpathSync } from 'node:fs';
import { resolve } from 'node:path';
import {
  ContextCap,
  type ContextLimit,
  failure,
  getIfServed,
  HttpClient,
  HttpError,
  type HttpOptions,
  outOfContext,
  promValues,
} from './http.js';
import { groupRequest, NO_PENALTIES } from './sglang.js';
import type {
  EngineLoad,
  EngineReport,
  FinishReason,
  GenerateResult,
  SamplingParams,
  WeightGroup,
  WeightMeta,
  WeightSyncEngine,
} from './types.js';
import { checkVersion } from './version.js';

// vLLM OpenAI-compatible /v1/completions with a token-array prompt. Ids come from
// choices[0].token_ids (return_token_ids, newer builds) or from "token_id:N" logprob tokens
// (return_tokens_as_token_ids, older builds). Capacity comes from /metrics.

// CompletionResponseChoice as vLLM's model_dump() writes it: fields not asked for are null
interface VllmChoice {
  token_ids?: number[] | null;
  finish_reason?: string | null;
  logprobs?: { tokens?: string[]; token_logprobs?: (number | null)[] } | null;
}

export interface VllmOptions extends HttpOptions {
  model?: string; // served model name; default: first of /v1/models
  capacityTokens?: number; // overrides num_gpu_blocks × block_size from /metrics
  log?: (line: string) => void; // default: stderr
}

/** How vLLM must be started for broadcast sync (python/rstar2_worker/vllm_ext.py on its PYTHONPATH). */
export const VLLM_EXTENSION = 'rstar2_worker.vllm_ext.WeightSyncExtension';

/** vLLM's SamplingParams refuse a temperature above 2 with HTTP 400, as OpenAI's API does (PR 44965, first in
 *  v0.24.0); held on every version, since a run that passes on an older server would fail on a current one. */
export const VLLM_MAX_TEMPERATURE = 2;

/** --logprobs-mode values whose numbers are the sampled distribution's logprobs at any temperature. */
const PROCESSED = 'processed_logprobs';

interface VllmInfo {
  version?: string;
  /** vllm_config as /server_info?config_format=json gives it (dev mode only, v0.11.0 on); undefined otherwise */
  config?: { model_config?: { dtype?: unknown; logprobs_mode?: unknown } };
  /** str(VllmConfig), what /server_info gives before v0.11.0 (it takes no config_format): it names the dtype
   *  ('dtype=torch.bfloat16') but not the logprobs mode */
  text?: string;
}

export class VllmEngine implements WeightSyncEngine {
  readonly name: string;
  readonly url: string;
  private readonly http: HttpClient;
  private readonly once: HttpClient; // group calls are never repeated (see SGLangEngine)
  private model?: string;
  private capacity?: number;
  private block?: number;
  private readonly cap: ContextCap;
  private info?: Promise<VllmInfo>;
  private readonly notes: string[] = [];
  private readonly log: (line: string) => void;

  constructor(url: string, opts: VllmOptions = {}) {
    this.http = new HttpClient(url, opts);
    this.once = new HttpClient(url, { ...opts, retries: 0 });
    this.url = this.http.base;
    this.name = `vllm:${this.http.base}`;
    this.model = opts.model;
    this.capacity = opts.capacityTokens;
    this.log = opts.log ?? ((l) => console.error(l));
    this.cap = new ContextCap(this.name, () => this.contextLimit(), this.log);
  }

  /**
   * The version (/version, always served) and the engine's config (/server_info?config_format=json, served only
   * with VLLM_SERVER_DEV_MODE=1, which weight sync needs anyway), read once. The version is checked here, so a
   * server older than rstar2 supports fails its first use with why; a read that fails is tried again.
   */
  serverInfo(): Promise<VllmInfo> {
    this.info ??= (async () => {
      const v = await getIfServed<{ version?: string }>(this.http, '/version');
      const note = checkVersion(this.name, 'vllm', v?.version);
      if (note) {
        this.notes.push(note);
        this.log(`warning: ${note}`);
      }
      const s = await getIfServed<{ vllm_config?: unknown }>(this.http, '/server_info?config_format=json');
      const c = s?.vllm_config;
      return {
        ...(v?.version ? { version: v.version } : {}),
        ...(c && typeof c === 'object' ? { config: c as VllmInfo['config'] } : {}),
        ...(typeof c === 'string' ? { text: c } : {}),
      };
    })().catch((e) => {
      if (e instanceof HttpError) this.info = undefined;
      throw e;
    });
    return this.info;
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

  // vLLM refuses prompt + max_tokens > max_model_len, and max_tokens < 1 (its serving layer's _validate_input and
  // SamplingParams); /v1/models' card of the served model carries max_model_len, a LoRA adapter's card does not
  // (serving_models.py) and names its base model as `parent`, whose context it shares
  private async contextLimit(): Promise<ContextLimit | undefined> {
    await this.serverInfo(); // every first request meets the version check
    type Card = { id?: string; parent?: string | null; max_model_len?: unknown };
    const cards = (await getIfServed<{ data?: Card[] }>(this.http, '/v1/models'))?.data ?? [];
    const card = cards.find((m) => m.id === this.model) ?? cards[0];
    const tokens = card?.max_model_len ?? cards.find((m) => m.id === card?.parent)?.max_model_len;
    return typeof tokens === 'number' && tokens > 0 ? { tokens, spare: 0 } : undefined;
  }

  async generate(inputIds: number[], s: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    if (s.temperature > VLLM_MAX_TEMPERATURE)
      return failure(
        new Error(
          `${this.name}: temperature ${s.temperature} is above ${VLLM_MAX_TEMPERATURE}, which vLLM refuses ` +
            '(HTTP 400 for every request)',
        ),
      );
    try {
      const maxNew = await this.cap.fit(inputIds.length, s.maxNewTokens, signal);
      if (maxNew === 0) return outOfContext();
      const body = {
        model: await this.modelName(signal),
        prompt: inputIds,
        max_tokens: maxNew,
        temperature: s.temperature,
        top_p: s.topP,
        top_k: s.topK,
        min_p: 0,
        ...NO_PENALTIES,
        stop_token_ids: s.stopTokenIds,
        stop: s.stopStrings,
        include_stop_str_in_output: true,
        skip_special_tokens: false,
        logprobs: 0, // logprob of the sampled token only
        return_token_ids: true,
        return_tokens_as_token_ids: true,
        ...(s.seed === undefined ? {} : { seed: s.seed }),
        ...(s.ignoreEos ? { ignore_eos: true } : {}),
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

  /** The model's context as the server publishes it (undefined where it does not), read once. */
  context(): Promise<ContextLimit | undefined> {
    return this.cap.limit();
  }

  async load(): Promise<EngineLoad> {
    const text = await this.http.text('/metrics');
    // under data parallelism every engine core reports its own sample, labelled engine="N"
    const engines = promValues(text, 'vllm:cache_config_info');
    if (this.block === undefined) {
      const size = Number(engines[0]?.labels.block_size);
      if (size > 0) this.block = size;
    }
    if (this.capacity === undefined) {
      const blocks = engines.map((e) => Number(e.labels.num_gpu_blocks));
      if (!(blocks.length > 0 && blocks.every((b) => b > 0) && this.block)) {
        throw new Error(
          `${this.name}: /metrics lacks vllm:cache_config_info num_gpu_blocks/block_size; set capacityTokens`,
        );
      }
      this.capacity = blocks.reduce((a, b) => a + b, 0) * this.block;
    }
    let usage = promValues(text, 'vllm:kv_cache_usage_perc');
    if (!usage.length) usage = promValues(text, 'vllm:gpu_cache_usage_perc');
    const load: EngineLoad = { capacityTokens: this.capacity, blockTokens: this.block };
    // each core's share of the pool is the same, so the mean fraction is the whole pool's
    if (usage.length)
      load.usedTokens = Math.round((usage.reduce((a, u) => a + u.value, 0) / usage.length) * this.capacity);
    const running = promValues(text, 'vllm:num_requests_running');
    const waiting = promValues(text, 'vllm:num_requests_waiting');
    if (running.length) load.running = running.reduce((a, x) => a + x.value, 0);
    if (waiting.length) load.queued = waiting.reduce((a, x) => a + x.value, 0);
    return load;
  }

  /**
   * Re-reads weights from the path the server was started with (dev-mode /collective_rpc), which must be `path`:
   * vLLM's reload takes no path, so a server started on another directory would reload its old weights and the
   * run would go on training against a policy that never changes. Refused then, naming both.
   */
  async updateWeightsFromDisk(path: string): Promise<void> {
    const root = await this.modelRoot();
    if (!samePath(root, path))
      throw new Error(
        `${this.name}: serves ${root}, not the sync directory ${path}: vLLM reloads the directory it was started ` +
          `with, so it would serve its old weights. Start it with --model ${path} (a copy of the model at first)`,
      );
    await this.http.json('POST', '/collective_rpc', { method: 'reload_weights' });
    await this.resetPrefixCache();
  }

  /** The directory the served model was loaded from: /v1/models' `root` of its card (vLLM's --model). */
  async modelRoot(): Promise<string> {
    type Card = { id?: string; root?: string | null };
    const cards = (await this.http.json<{ data?: Card[] }>('GET', '/v1/models')).data ?? [];
    const name = this.model ?? cards[0]?.id;
    const root = cards.find((c) => c.id === name)?.root;
    if (typeof root !== 'string' || root === '')
      throw new Error(
        `${this.name}: /v1/models gives no root for ${name}: cannot tell what its reload reads`,
      );
    return root;
  }

  // Cached prefixes hold the old weights' KV; builds without the route have no prefix cache to drop. vLLM does
  // not reset while requests run (it answers as if it had): weights change only between rollouts here.
  private async resetPrefixCache(): Promise<void> {
    try {
      await this.http.post('/reset_prefix_cache', {});
    } catch (e) {
      if (!(e instanceof HttpError && e.status === 404)) throw e;
    }
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
    // under data parallelism /collective_rpc answers for the first engine core only, while every core's
    // workers would join: the group's size would be wrong
    const cores = promValues(await this.http.text('/metrics'), 'vllm:cache_config_info').length;
    if (cores > 1)
      throw new Error(
        `${this.name}: ${cores} data-parallel engine cores: broadcast sync covers tensor parallel only`,
      );
    return r.results.length;
  }

  // the extension takes one JSON string: /collective_rpc passes arguments on as they come
  private async rpc(method: string, arg: unknown): Promise<void> {
    await this.once.post('/collective_rpc', { method, args: [JSON.stringify(arg)] });
  }

  // the extension's group waits timeout_s for the other ranks (600 s when not sent), and op_timeout_s (else the
  // same) in each collective
  async initWeightsUpdateGroup(g: WeightGroup, rankOffset: number): Promise<void> {
    await this.rpc('init_weight_update_group', {
      ...groupRequest(g, rankOffset),
      timeout_s: g.timeoutS ?? 600,
      ...(g.bucketTimeoutS ? { op_timeout_s: g.bucketTimeoutS } : {}),
    });
  }

  /** One bucket; the extension loads tensor by tensor, and cached prefixes are dropped after the last. */
  async updateWeightsFromDistributed(
    meta: WeightMeta,
    groupName: string,
    opts: { version?: string; last?: boolean } = {},
  ): Promise<void> {
    await this.rpc('update_weights_from_distributed', { ...meta, group_name: groupName });
    if (opts.last ?? true) await this.resetPrefixCache();
  }

  async describe(): Promise<EngineReport> {
    const info = await this.serverInfo();
    const kv = await this.load();
    const m = info.config?.model_config;
    const notes = [...this.notes];
    const mode = typeof m?.logprobs_mode === 'string' ? m.logprobs_mode : undefined;
    if (info.text !== undefined)
      notes.push(
        `${this.name}: its /server_info gives no config_format=json (vLLM before 0.11.0): its --logprobs-mode ` +
          'cannot be read',
      );
    else if (!info.config)
      notes.push(
        `${this.name}: no /server_info (VLLM_SERVER_DEV_MODE=1 serves it): its --logprobs-mode cannot be read`,
      );
    else if (mode !== PROCESSED)
      notes.push(
        `${this.name}: --logprobs-mode ${mode}: its logprobs are not the sampled distribution's unless temperature ` +
          `is 1 and top-p/top-k are off (start it with --logprobs-mode ${PROCESSED})`,
      );
    // the JSON dump writes a torch.dtype as its str(): 'torch.bfloat16'; the text form has 'dtype=torch.bfloat16'
    const raw = typeof m?.dtype === 'string' ? m.dtype : /(?:^|, )dtype=([\w.]+)/.exec(info.text ?? '')?.[1];
    const dtype = raw?.replace(/^torch\./, '');
    return {
      ...(info.version ? { version: info.version } : {}),
      ...(dtype ? { dtype } : {}),
      ...(mode ? { logprobsMode: mode } : {}),
      seeds: true, // a seeded request samples with its own generator
      maxTemperature: VLLM_MAX_TEMPERATURE,
      kv,
      notes,
    };
  }

  async close(): Promise<void> {}
}

/** Whether two directory paths name the same place: as written, resolved, or through their symlinks. */
function samePath(a: string, b: string): boolean {
  const real = (p: string) => (existsSync(p) ? realpathSync(p) : resolve(p));
  return resolve(a) === resolve(b) || real(a) === real(b);
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

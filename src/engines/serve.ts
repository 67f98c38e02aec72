import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import {
  type ChatMessage,
  ChatTemplate,
  parseToolCalls,
  Tokenizer,
  type ToolSpec,
} from '../tokenizer/index.js';
import { baseUrl, httpGuard, isLoopback, requestTarget, sendRefusal } from '../util/http-guard.js';
import { readJson } from '../util/jsonl.js';
import { PolicyWorker, type WorkerStartOptions } from '../worker/index.js';
import { EmbeddedEngine } from './embedded.js';
import type { GenerateResult, SamplingParams, WeightMeta } from './types.js';

// `rstar2 serve`: the built-in engine (python/rstar2_worker/engine/engine.py, through one policy worker) behind SGLang's
// native HTTP API, the part src/engines/sglang.ts drives, so `--engines sglang+URL` trains and evaluates on it
// unchanged, and behind OpenAI's completions and chat routes for other clients. Bodies follow SGLang's
// io_struct.py (GenerateReqInput, UpdateWeightFromDiskReqInput, InitWeightsUpdateGroupReqInput,
// UpdateWeightsFromDistributedReqInput) and OpenAI's API; what the engine cannot do (streaming, constrained
// decoding, penalties, input logprobs) is refused with 400 and its name, never ignored.
//
// Weight updates are atomic where SGLang's are not: buckets of a broadcast are held until the one with
// flush_cache (the last; SGLang's default, so a single-call update commits at once), then swapped in together,
// the prefix cache dropped and the version set; a bucket that fails drops what was held and the old weights serve
// on. A disk update builds the new model whole before it replaces the old one.

export interface ServeOptions {
  model: string; // a Hugging Face model directory (config.json, safetensors, tokenizer.json)
  host?: string; // default 127.0.0.1
  port?: number; // default 30000; 0 = any free port
  /** Name in /v1/models and the OpenAI routes (default: the directory's base name). */
  servedName?: string;
  /** How long a broadcast bucket's receive may wait for the trainer's send, in seconds (default 60). */
  bucketTimeoutS?: number;
  token?: string; // require 'Authorization: Bearer <token>'
  worker?: WorkerStartOptions;
  log?: (line: string) => void;
}

export interface Served {
  url: string;
  close(): Promise<void>;
}

/** What the server reports as its build: `engine` tells rstar2's SGLang client it is this server, not SGLang. */
export const SERVE_ENGINE = 'rstar2';

class ClientError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}
const bad = (message: string, status = 400) => new ClientError(status, message);

const MAX_BODY = 64 << 20;
// the config keys that fix the weights' shapes: an update from disk must keep them
const SHAPE_KEYS = [
  'model_type',
  'vocab_size',
  'hidden_size',
  'intermediate_size',
  'num_hidden_layers',
  'num_attention_heads',
  'num_key_value_heads',
  'head_dim',
  'tie_word_embeddings',
];

// SamplingParams' keywords (python/sglang/srt/sampling/sampling_params.py, main), each either served or refused
// unless it has the value that means "off"
const SGLANG_OFF: Record<string, unknown> = {
  min_p: 0,
  frequency_penalty: 0,
  presence_penalty: 0,
  repetition_penalty: 1,
  min_new_tokens: 0,
  n: 1,
  json_schema: null,
  regex: null,
  ebnf: null,
  structural_tag: null,
  logit_bias: null,
  stop_regex: null,
};
const SGLANG_SERVED = new Set([
  'max_new_tokens',
  'temperature',
  'top_p',
  'top_k',
  'stop',
  'stop_token_ids',
  'ignore_eos',
  'skip_special_tokens',
  'spaces_between_special_tokens',
  'no_stop_trim',
  'sampling_seed',
  'custom_params',
  'stream_interval',
]);

type Json = Record<string, unknown>;

function isObject(x: unknown): x is Json {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function tokenList(x: unknown, what: string, vocab: number): number[] {
  if (!Array.isArray(x) || x.length === 0) throw bad(`${what} must be a non-empty list of token ids`);
  for (const [i, t] of x.entries())
    if (!Number.isInteger(t) || t < 0 || t >= vocab)
      throw bad(`${what}[${i}] = ${JSON.stringify(t)} is not a token id of this model (0 to ${vocab - 1})`);
  return x as number[];
}

function numberIn(o: Json, key: string, def: number, ok: (x: number) => boolean, range: string): number {
  const v = o[key];
  if (v === undefined || v === null) return def;
  if (typeof v !== 'number' || !Number.isFinite(v) || !ok(v))
    throw bad(`${key} must be ${range}, got ${JSON.stringify(v)}`);
  return v;
}

function stopList(x: unknown, what: string): string[] {
  if (x === undefined || x === null) return [];
  if (typeof x === 'string') return x ? [x] : [];
  if (Array.isArray(x) && x.every((s) => typeof s === 'string')) return x.filter(Boolean) as string[];
  throw bad(`${what} must be a string or a list of strings`);
}

/** Ids that end generation unless ignore_eos: the model's eos_token_id (config.json and generation_config.json). */
function eosIds(dir: string): number[] {
  const out = new Set<number>();
  for (const f of ['config.json', 'generation_config.json']) {
    const p = join(dir, f);
    if (!existsSync(p)) continue;
    const e = readJson<Json>(p).eos_token_id;
    for (const id of Array.isArray(e) ? e : [e]) if (Number.isInteger(id)) out.add(id as number);
  }
  return [...out];
}

function readConfig(dir: string): Json {
  const p = join(dir, 'config.json');
  if (!existsSync(p)) throw new Error(`${dir}: no config.json (a Hugging Face model directory is needed)`);
  const cfg = readJson<Json>(p);
  if (typeof cfg !== 'object' || cfg === null || Array.isArray(cfg))
    throw new Error(`${p}: not a model config (a JSON object)`);
  return cfg;
}

interface Limits {
  capacity: number; // KV tokens in the pool
  block: number;
  maxLen: number; // prompt + new tokens of one request
}

interface Ran {
  result: GenerateResult;
  /** The stop token or string that ended it, where one did. */
  matched?: number | string;
  promptTokens: number;
  ms: number;
}

/** What the server needs of its policy worker (a stand-in in unit tests). */
export type ServeWorker = Pick<
  PolicyWorker,
  | 'generate'
  | 'engineLoad'
  | 'load'
  | 'flushCache'
  | 'joinWeightGroupAsEngine'
  | 'receiveWeights'
  | 'info'
  | 'restarts'
>;

export class ServeEngine {
  private version = 'default';
  private modelPath: string;
  private config: Json;
  private readonly tokenizer?: Tokenizer;
  private template?: ChatTemplate;
  private readonly eos: number[];
  private limits?: Limits;
  private group?: string; // the joined weight-update group
  private held = 0; // tensors of buckets received and not yet committed
  private restarts = 0; // the worker's, when the served weights were last set
  readonly name: string;
  readonly stats = { requests: 0, promptTokens: 0, generatedTokens: 0, cachedTokens: 0, updates: 0 };
  private readonly engine: EmbeddedEngine;

  constructor(
    private readonly worker: ServeWorker,
    dir: string,
    private readonly opts: Pick<ServeOptions, 'servedName' | 'bucketTimeoutS' | 'log'> & {
      precision?: string;
    } = {},
  ) {
    this.modelPath = resolve(dir);
    this.config = readConfig(dir);
    this.eos = eosIds(dir);
    this.name = opts.servedName ?? (this.modelPath.split('/').pop() || 'model');
    if (existsSync(join(dir, 'tokenizer.json'))) this.tokenizer = Tokenizer.load(dir);
    this.engine = new EmbeddedEngine(worker);
  }

  private get vocab(): number {
    return Number(this.config.vocab_size);
  }

  private tok(): Tokenizer {
    if (!this.tokenizer)
      throw bad(`${this.modelPath} has no tokenizer.json: send token ids (input_ids, or a prompt of ids)`);
    return this.tokenizer;
  }

  async engineLimits(): Promise<Limits> {
    if (!this.limits) {
      const l = await this.worker.engineLoad();
      this.limits = {
        capacity: l.capacityTokens,
        block: l.blockTokens,
        maxLen: l.maxLen ?? l.capacityTokens,
      };
    }
    return this.limits;
  }

  // ---- generation ------------------------------------------------------------------------------

  /** One prompt to its end; refuses what the engine would (too long, ids outside the vocabulary) with 400. */
  async run(ids: number[], s: SamplingParams, signal?: AbortSignal): Promise<Ran> {
    const { maxLen } = await this.engineLimits();
    if (ids.length >= maxLen)
      throw bad(
        `The input (${ids.length} tokens) is longer than the model's context length (${maxLen} tokens).`,
      );
    if (ids.length + s.maxNewTokens > maxLen)
      throw bad(
        `Requested token count exceeds the model's maximum context length of ${maxLen} tokens: ${ids.length} ` +
          `input tokens and ${s.maxNewTokens} for the completion. Reduce max_new_tokens to at most ${maxLen - ids.length}.`,
      );
    const t0 = Date.now();
    const result = await this.engine.generate(ids, s, signal);
    this.restarted();
    if (result.finishReason === 'error') throw new Error(result.error ?? 'the engine failed');
    this.stats.requests++;
    this.stats.promptTokens += ids.length;
    this.stats.generatedTokens += result.outputIds.length;
    this.stats.cachedTokens += result.cachedTokens ?? 0;
    const last = result.outputIds.at(-1);
    let matched: number | string | undefined;
    if (result.finishReason === 'stop' && last !== undefined) {
      if (s.stopTokenIds.includes(last)) matched = last;
      else if (this.tokenizer) {
        const text = this.tokenizer.decode(result.outputIds);
        matched = s.stopStrings.find((x) => text.includes(x));
      }
    }
    return { result, matched, promptTokens: ids.length, ms: Date.now() - t0 };
  }

  /** A worker that died was restarted on the directory last loaded: broadcast weights are gone with it, so the
   *  version says so and the group is left, and a trainer's next push fails and resends its own through disk. */
  private restarted(): void {
    if (this.worker.restarts === this.restarts) return;
    this.restarts = this.worker.restarts;
    this.version = 'default';
    this.group = undefined;
    this.held = 0;
    this.opts.log?.(`warning: rstar2 serve: the worker restarted and serves ${this.modelPath} again`);
  }

  /** The generated text: special tokens skipped unless asked, the stop token or string cut unless `keepStop`. */
  text(r: Ran, skipSpecial: boolean, keepStop: boolean): string {
    if (!this.tokenizer) return '';
    const ids = r.result.outputIds;
    const cutToken = !keepStop && typeof r.matched === 'number';
    let text = this.tokenizer.decode(cutToken ? ids.slice(0, -1) : ids, { skipSpecial });
    if (!keepStop && typeof r.matched === 'string') {
      const at = text.indexOf(r.matched);
      if (at >= 0) text = text.slice(0, at);
    }
    return text;
  }

  private stopIds(extra: number[], ignoreEos: boolean): number[] {
    return [...new Set([...extra, ...(ignoreEos ? [] : this.eos)])];
  }

  /** SGLang's sampling_params as the engine's, each key served or refused. */
  nativeSampling(sp: unknown): SamplingParams & { skipSpecial: boolean; keepStop: boolean } {
    if (sp === undefined || sp === null) sp = {};
    if (!isObject(sp)) throw bad('sampling_params must be an object');
    for (const [k, v] of Object.entries(sp)) {
      if (SGLANG_SERVED.has(k)) continue;
      if (!(k in SGLANG_OFF)) throw bad(`sampling_params.${k} is not a sampling parameter`);
      if (v !== undefined && v !== null && v !== SGLANG_OFF[k])
        throw bad(
          `sampling_params.${k} = ${JSON.stringify(v)} is not served by rstar2 serve (only ${SGLANG_OFF[k]})`,
        );
    }
    const stopIds = sp.stop_token_ids ?? [];
    if (!Array.isArray(stopIds) || !stopIds.every((x) => Number.isInteger(x)))
      throw bad('sampling_params.stop_token_ids must be a list of token ids');
    const seed = sp.sampling_seed;
    if (seed !== undefined && seed !== null && !Number.isInteger(seed))
      throw bad(`sampling_params.sampling_seed must be an integer, got ${JSON.stringify(seed)}`);
    const topK = numberIn(
      sp,
      'top_k',
      -1,
      (x) => Number.isInteger(x) && (x === -1 || x >= 1),
      '-1 (off) or ≥ 1',
    );
    const stopStrings = stopList(sp.stop, 'sampling_params.stop');
    if (stopStrings.length) this.tok();
    return {
      maxNewTokens: numberIn(
        sp,
        'max_new_tokens',
        128,
        (x) => Number.isInteger(x) && x >= 0,
        'an integer ≥ 0',
      ),
      temperature: numberIn(sp, 'temperature', 1, (x) => x >= 0, '≥ 0'),
      topP: numberIn(sp, 'top_p', 1, (x) => x > 0 && x <= 1, 'in (0, 1]'),
      topK: topK >= 1 << 30 ? -1 : topK,
      stopTokenIds: this.stopIds(stopIds as number[], sp.ignore_eos === true),
      stopStrings,
      ...(typeof seed === 'number' ? { seed } : {}),
      ...(sp.ignore_eos === true ? { ignoreEos: true } : {}),
      skipSpecial: sp.skip_special_tokens !== false,
      keepStop: sp.no_stop_trim === true,
    };
  }

  /** POST /generate (GenerateReqInput): input_ids or text, one prompt or a list, answered alike. */
  async generate(body: Json, signal: AbortSignal): Promise<unknown> {
    if (body.stream === true) throw bad('stream is not served by rstar2 serve: send stream false');
    for (const k of ['image_data', 'audio_data', 'input_embeds', 'lora_path'])
      if (body[k] !== undefined && body[k] !== null) throw bad(`${k} is not served by rstar2 serve`);
    const topN = body.top_logprobs_num ?? 0;
    if (topN !== 0) throw bad("top_logprobs_num is not served (only the sampled tokens' logprobs): send 0");
    const start = body.logprob_start_len ?? -1;
    if (body.return_logprob === true && start !== -1)
      throw bad('logprob_start_len other than -1 (input logprobs) is not served: send -1');
    let prompts: number[][];
    let single: boolean;
    const ids = body.input_ids;
    if (ids !== undefined && body.text !== undefined) throw bad('send either input_ids or text, not both');
    if (ids !== undefined) {
      single = !Array.isArray(ids) || !Array.isArray(ids[0]);
      prompts = (single ? [ids] : (ids as unknown[])).map((p, i) =>
        tokenList(p, single ? 'input_ids' : `input_ids[${i}]`, this.vocab),
      );
    } else if (typeof body.text === 'string' || Array.isArray(body.text)) {
      single = typeof body.text === 'string';
      const texts = single ? [body.text as string] : (body.text as unknown[]);
      prompts = texts.map((t, i) => {
        if (typeof t !== 'string') throw bad(`text[${i}] must be a string`);
        return tokenList(this.tok().encode(t), single ? 'text' : `text[${i}]`, this.vocab);
      });
    } else throw bad('send input_ids (a list of token ids, or a list of them) or text');
    if (prompts.length === 0) throw bad('input_ids is an empty batch');
    const each = Array.isArray(body.sampling_params)
      ? body.sampling_params
      : prompts.map(() => body.sampling_params);
    if (each.length !== prompts.length)
      throw bad(`sampling_params has ${each.length} entries for ${prompts.length} prompts`);
    const sps = each.map((sp) => this.nativeSampling(sp));
    const logprobs = body.return_logprob === true;
    const withText = body.return_text_in_logprobs === true;
    const out = await Promise.all(
      prompts.map(async (p, i) => {
        const s = sps[i];
        const r = await this.run(p, s, signal);
        const res = r.result;
        const fr =
          res.finishReason === 'length'
            ? { type: 'length', length: res.outputIds.length }
            : res.finishReason === 'abort'
              ? { type: 'abort', message: res.error ?? 'aborted' }
              : { type: 'stop', matched: r.matched ?? null };
        return {
          text: this.text(r, s.skipSpecial, s.keepStop),
          output_ids: res.outputIds,
          meta_info: {
            id: typeof body.rid === 'string' ? body.rid : randomUUID().replaceAll('-', ''),
            finish_reason: fr,
            prompt_tokens: p.length,
            completion_tokens: res.outputIds.length,
            cached_tokens: res.cachedTokens ?? 0,
            total_retractions: res.retractions ?? 0, // times a full KV pool put it back in the queue
            weight_version: this.version,
            e2e_latency: r.ms / 1000,
            ...(logprobs
              ? {
                  input_token_logprobs: [],
                  output_token_logprobs: res.outputIds.map((id, j) => [
                    res.logprobs[j],
                    id,
                    withText && this.tokenizer ? this.tokenizer.decode([id]) : null,
                  ]),
                }
              : {}),
          },
        };
      }),
    );
    return single ? out[0] : out;
  }

  // ---- what the server says about itself -------------------------------------------------------

  async serverInfo(): Promise<Json> {
    const l = await this.engineLimits();
    this.restarted();
    return {
      engine: SERVE_ENGINE,
      version: packageVersion(),
      model_path: this.modelPath,
      tokenizer_path: this.tokenizer ? this.modelPath : null,
      served_model_name: this.name,
      dtype: this.dtype(),
      context_length: l.maxLen,
      max_total_num_tokens: l.capacity,
      max_req_input_len: l.maxLen - 1,
      page_size: l.block,
      tp_size: 1,
      dp_size: 1,
      pp_size: 1,
      // a seeded row draws the same tokens in any batch (sampler.py), as SGLang's deterministic mode
      enable_deterministic_inference: true,
      speculative_algorithm: null,
      weight_version: this.version,
      device: this.worker.info?.device ?? 'unknown',
    };
  }

  /** The served weights' dtype: bf16 stores them in bf16, fp32 and bf16-mixed in fp32. */
  private dtype(): string {
    return this.opts.precision === 'bf16' ? 'bfloat16' : 'float32';
  }

  modelInfo(): Json {
    this.restarted();
    return {
      model_path: this.modelPath,
      tokenizer_path: this.tokenizer ? this.modelPath : null,
      is_generation: true,
      preferred_sampling_params: null,
      weight_version: this.version,
      has_image_understanding: false,
      has_audio_understanding: false,
      model_type: this.config.model_type ?? null,
      architectures: this.config.architectures ?? null,
    };
  }

  get weightVersion(): string {
    this.restarted();
    return this.version;
  }

  setWeightVersion(v: unknown): void {
    if (typeof v !== 'string' || v === '') throw bad('new_version must be a non-empty string');
    this.version = v;
  }

  /** One row per DP rank, as SGLang's /get_load (num_reqs counts the waiting ones too). */
  async getLoad(): Promise<Json[]> {
    const l = await this.worker.engineLoad();
    return [
      {
        dp_rank: 0,
        num_reqs: l.running + l.queued,
        num_waiting_reqs: l.queued,
        num_tokens: l.usedTokens,
        num_pending_tokens: 0,
        ts_tic: Date.now() / 1000,
      },
    ];
  }

  /** SGLang's /v1/loads with include=core: each rank's LoadSnapshot. */
  async loads(): Promise<Json> {
    const l = await this.worker.engineLoad();
    return {
      timestamp: new Date().toISOString(),
      version: packageVersion(),
      loads: [
        {
          timestamp: Date.now() / 1000,
          dp_rank: 0,
          num_running_reqs: l.running,
          num_waiting_reqs: l.queued,
          num_used_tokens: l.usedTokens,
          num_total_tokens: l.usedTokens,
          max_total_num_tokens: l.capacityTokens,
          token_usage: l.capacityTokens ? l.usedTokens / l.capacityTokens : 0,
          cache_hit_rate:
            l.prefillTokens + l.cachedTokens ? l.cachedTokens / (l.prefillTokens + l.cachedTokens) : 0,
        },
      ],
    };
  }

  async metrics(): Promise<string> {
    const l = await this.worker.engineLoad();
    const label = `{model_name="${this.name.replace(/["\\\n]/g, '_')}"}`;
    const lines: string[] = [];
    const put = (name: string, type: 'gauge' | 'counter', help: string, value: number) =>
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, `${name}${label} ${value}`);
    put('sglang:num_running_reqs', 'gauge', 'Requests running.', l.running);
    put('sglang:num_queue_reqs', 'gauge', 'Requests waiting.', l.queued);
    put('sglang:num_used_tokens', 'gauge', 'KV cache tokens in use.', l.usedTokens);
    put('sglang:max_total_num_tokens', 'gauge', 'KV cache tokens in all.', l.capacityTokens);
    put(
      'sglang:token_usage',
      'gauge',
      'Share of the KV cache in use.',
      l.capacityTokens ? l.usedTokens / l.capacityTokens : 0,
    );
    put('sglang:num_requests_total', 'counter', 'Requests answered.', this.stats.requests);
    put(
      'sglang:prompt_tokens_total',
      'counter',
      'Prompt tokens of answered requests.',
      this.stats.promptTokens,
    );
    put('sglang:generation_tokens_total', 'counter', 'Tokens generated.', this.stats.generatedTokens);
    put(
      'sglang:cached_tokens_total',
      'counter',
      'Prompt tokens served from the prefix cache.',
      this.stats.cachedTokens,
    );
    put('rstar2:decode_steps_total', 'counter', 'Decode steps since the weights were loaded.', l.decodeSteps);
    put(
      'rstar2:retractions_total',
      'counter',
      'Rows retracted on a full KV pool since the weights were loaded.',
      l.retractions,
    );
    put('rstar2:weight_updates_total', 'counter', 'Weight updates applied.', this.stats.updates);
    return `${lines.join('\n')}\n`;
  }

  async flushCache(): Promise<void> {
    try {
      await this.worker.flushCache();
    } catch (e) {
      throw bad(`Cache not flushed: ${(e as Error).message.replace(/^worker: flush_cache: /, '')}`);
    }
  }

  // ---- weights -----------------------------------------------------------------------------------

  /** POST /update_weights_from_disk: the directory's weights replace the served ones whole, or not at all. */
  async updateFromDisk(body: Json): Promise<Json> {
    const path = body.model_path;
    if (typeof path !== 'string' || path === '')
      throw bad('model_path must be the directory of the new weights');
    if (body.load_format !== undefined && body.load_format !== null && body.load_format !== 'auto')
      throw bad(`load_format ${JSON.stringify(body.load_format)} is not served (only auto: safetensors)`);
    const version = body.weight_version;
    if (version !== undefined && version !== null && typeof version !== 'string')
      throw bad('weight_version must be a string');
    if (!existsSync(path) || !statSync(path).isDirectory())
      throw bad(`model_path ${path}: no such directory`);
    let cfg: Json;
    try {
      cfg = readConfig(path);
    } catch (e) {
      throw bad((e as Error).message);
    }
    const differs = SHAPE_KEYS.find((k) => JSON.stringify(cfg[k]) !== JSON.stringify(this.config[k]));
    if (differs)
      throw bad(
        `${path}: config.json ${differs} is ${JSON.stringify(cfg[differs])}, the served model's ${JSON.stringify(this.config[differs])}: ` +
          "an update must keep the model's shapes (start another server for another model)",
      );
    try {
      await this.worker.load(path); // after the running requests; the old model serves until the new one is whole
    } catch (e) {
      throw bad(`Failed to update weights from ${path}: ${(e as Error).message}; the old weights serve on`);
    }
    this.modelPath = resolve(path);
    this.restarts = this.worker.restarts; // loaded after any restart
    this.config = cfg;
    if (typeof version === 'string') this.version = version;
    this.held = 0;
    this.stats.updates++;
    this.opts.log?.(`rstar2 serve: weights ${this.version} loaded from ${path}`);
    return { success: true, message: 'Succeeded to update model weights.', num_paused_requests: 0 };
  }

  /** POST /init_weights_update_group: joins the trainer's group as ranks rank_offset.. (one here). */
  async initGroup(body: Json): Promise<Json> {
    const {
      master_address: addr,
      master_port: port,
      rank_offset: rank,
      world_size: world,
      group_name: name,
    } = body;
    const backend = body.backend ?? 'nccl';
    if (typeof addr !== 'string' || addr === '') throw bad("master_address must be the trainer's address");
    if (!Number.isInteger(port) || (port as number) < 1 || (port as number) > 65535)
      throw bad(`master_port must be a TCP port, got ${JSON.stringify(port)}`);
    if (!Number.isInteger(world) || (world as number) < 2)
      throw bad(`world_size must be ≥ 2, got ${JSON.stringify(world)}`);
    if (!Number.isInteger(rank) || (rank as number) < 1 || (rank as number) >= (world as number))
      throw bad(`rank_offset must be in 1..world_size-1, got ${JSON.stringify(rank)}`);
    if (typeof name !== 'string' || name === '') throw bad('group_name must be a non-empty string');
    if (backend !== 'nccl' && backend !== 'gloo')
      throw bad(`backend must be nccl or gloo, got ${JSON.stringify(backend)}`);
    try {
      await this.worker.joinWeightGroupAsEngine(
        {
          masterAddress: addr,
          masterPort: port as number,
          worldSize: world as number,
          groupName: name,
          backend,
          timeoutS: this.opts.bucketTimeoutS ?? 60,
        },
        rank as number,
      );
    } catch (e) {
      this.group = undefined;
      throw bad(`Failed to initialize the weight update group: ${(e as Error).message}`);
    }
    this.group = name;
    this.held = 0;
    return { success: true, message: 'Succeeded to initialize custom process group.' };
  }

  /** POST /update_weights_from_distributed: one bucket; flush_cache (default true) commits every held bucket. */
  async updateFromDistributed(body: Json): Promise<Json> {
    this.restarted();
    const { names, dtypes, shapes } = body;
    const n = Array.isArray(names) ? names.length : -1;
    if (n < 1 || !(names as unknown[]).every((x) => typeof x === 'string'))
      throw bad('names must be a non-empty list of weight names');
    if (!Array.isArray(dtypes) || dtypes.length !== n || !dtypes.every((x) => typeof x === 'string'))
      throw bad(`dtypes must be a list of ${n} torch dtype names`);
    if (
      !Array.isArray(shapes) ||
      shapes.length !== n ||
      !shapes.every((s) => Array.isArray(s) && s.every((d) => Number.isInteger(d) && d >= 0))
    )
      throw bad(`shapes must be a list of ${n} shapes`);
    const group = body.group_name ?? this.group;
    if (typeof group !== 'string' || group !== this.group)
      throw bad(
        `no weight update group ${JSON.stringify(group)} joined: call /init_weights_update_group first`,
      );
    const version = body.weight_version;
    if (version !== undefined && version !== null && typeof version !== 'string')
      throw bad('weight_version must be a string');
    const commit = body.flush_cache !== false;
    const meta: WeightMeta = {
      names: names as string[],
      dtypes: dtypes as string[],
      shapes: shapes as number[][],
    };
    try {
      await this.worker.receiveWeights(meta, group, commit);
    } catch (e) {
      const lost = this.held;
      this.held = 0;
      this.group = undefined; // the worker left the group: its stream is out of step
      throw bad(
        `Failed to update parameter online: ${(e as Error).message}. The old weights serve on` +
          `${lost ? ` (${lost} tensors received before it were dropped)` : ''}; join a new group to update again`,
      );
    }
    if (!commit) {
      this.held += n;
      return { success: true, message: `Held ${n} tensors until the update's last bucket (flush_cache).` };
    }
    if (typeof version === 'string') this.version = version;
    this.held = 0;
    this.stats.updates++;
    return { success: true, message: 'Succeeded to update parameter online.' };
  }

  // ---- OpenAI ------------------------------------------------------------------------------------

  models(): Json {
    return {
      object: 'list',
      data: [
        {
          id: this.name,
          object: 'model',
          created: Math.floor(Date.now() / 1000),
          owned_by: 'rstar2',
          root: this.modelPath,
          max_model_len: this.limits?.maxLen ?? null,
        },
      ],
    };
  }

  private checkModel(body: Json): void {
    const m = body.model;
    if (m !== undefined && m !== null && m !== this.name)
      throw bad(`The model \`${String(m)}\` does not exist: this server serves ${this.name}`, 404);
  }

  /** OpenAI's sampling fields, refused where the engine has no such thing. */
  private openaiSampling(body: Json, maxDefault: number): SamplingParams & { n: number } {
    if (body.stream === true) throw bad('stream is not served by rstar2 serve: send stream false');
    for (const [k, off] of [
      ['frequency_penalty', 0],
      ['presence_penalty', 0],
      ['repetition_penalty', 1],
      ['min_p', 0],
      ['best_of', 1],
      ['logit_bias', null],
      ['suffix', null],
      ['response_format', null],
      ['guided_json', null],
      ['guided_regex', null],
    ] as [string, unknown][]) {
      const v = body[k];
      const text = k === 'response_format' && isObject(v) && v.type === 'text';
      if (v !== undefined && v !== null && v !== off && !text)
        throw bad(`${k} = ${JSON.stringify(v)} is not served by rstar2 serve`);
    }
    const max = body.max_completion_tokens ?? body.max_tokens;
    const stopIds = body.stop_token_ids ?? [];
    if (!Array.isArray(stopIds) || !stopIds.every((x) => Number.isInteger(x)))
      throw bad('stop_token_ids must be a list of token ids');
    const seed = body.seed;
    if (seed !== undefined && seed !== null && !Number.isInteger(seed))
      throw bad(`seed must be an integer, got ${JSON.stringify(seed)}`);
    const stopStrings = stopList(body.stop, 'stop');
    if (stopStrings.length) this.tok();
    const tokenizerStops = this.tokenizer?.stopIds ?? [];
    return {
      maxNewTokens:
        max === undefined || max === null
          ? maxDefault
          : numberIn(
              { max_tokens: max },
              'max_tokens',
              0,
              (x) => Number.isInteger(x) && x >= 1,
              'an integer ≥ 1',
            ),
      temperature: numberIn(body, 'temperature', 1, (x) => x >= 0 && x <= 2, 'in [0, 2]'),
      topP: numberIn(body, 'top_p', 1, (x) => x > 0 && x <= 1, 'in (0, 1]'),
      topK: numberIn(
        body,
        'top_k',
        -1,
        (x) => Number.isInteger(x) && (x === -1 || x >= 1),
        '-1 (off) or ≥ 1',
      ),
      stopTokenIds: this.stopIds([...(stopIds as number[]), ...tokenizerStops], body.ignore_eos === true),
      stopStrings,
      ...(typeof seed === 'number' ? { seed } : {}),
      n: numberIn(body, 'n', 1, (x) => Number.isInteger(x) && x >= 1 && x <= 64, 'an integer in 1..64'),
    };
  }

  /** Sample i of n: its own seed where the request has one, so the n samples differ. */
  private nth(s: SamplingParams, i: number): SamplingParams {
    return s.seed === undefined || i === 0 ? s : { ...s, seed: s.seed + i };
  }

  private finish(r: Ran): string {
    return r.result.finishReason === 'length'
      ? 'length'
      : r.result.finishReason === 'abort'
        ? 'abort'
        : 'stop';
  }

  private usage(rs: Ran[], prompts: number[]): Json {
    const prompt = prompts.reduce((a, b) => a + b, 0);
    const completion = rs.reduce((a, r) => a + r.result.outputIds.length, 0);
    const cached = rs.reduce((a, r) => a + (r.result.cachedTokens ?? 0), 0);
    return {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      prompt_tokens_details: { cached_tokens: cached },
    };
  }

  /** POST /v1/completions: a prompt as text or ids, or a list of either. */
  async completions(body: Json, signal: AbortSignal): Promise<Json> {
    this.checkModel(body);
    if (body.echo === true) throw bad('echo is not served by rstar2 serve (no prompt logprobs)');
    const lp = body.logprobs;
    if (lp !== undefined && lp !== null && lp !== 0)
      throw bad(
        'logprobs other than 0 (the sampled token alone) is not served: the engine returns no alternatives',
      );
    const s = this.openaiSampling(body, 16);
    const p = body.prompt;
    let prompts: number[][];
    if (typeof p === 'string') prompts = [this.tok().encode(p)];
    else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'number'))
      prompts = [p as number[]];
    else if (Array.isArray(p) && p.length > 0)
      prompts = p.map((x, i) =>
        typeof x === 'string' ? this.tok().encode(x) : tokenList(x, `prompt[${i}]`, this.vocab),
      );
    else throw bad('prompt must be a string, a list of token ids, or a non-empty list of either');
    for (const [i, x] of prompts.entries())
      tokenList(x, prompts.length > 1 ? `prompt[${i}]` : 'prompt', this.vocab);
    const keepStop = body.include_stop_str_in_output === true;
    const skipSpecial = body.skip_special_tokens !== false;
    const jobs = prompts.flatMap((ids) =>
      Array.from({ length: s.n }, (_, i) => ({ ids, s: this.nth(s, i) })),
    );
    const rs = await Promise.all(jobs.map((j) => this.run(j.ids, j.s, signal)));
    return {
      id: `cmpl-${randomUUID().replaceAll('-', '')}`,
      object: 'text_completion',
      created: Math.floor(Date.now() / 1000),
      model: this.name,
      choices: rs.map((r, index) => {
        const pieces = r.result.outputIds.map((id) => this.tokenizer?.decode([id]) ?? `token_id:${id}`);
        return {
          index,
          text: this.text(r, skipSpecial, keepStop),
          logprobs:
            lp === 0
              ? {
                  tokens: pieces,
                  token_logprobs: r.result.logprobs,
                  top_logprobs: pieces.map((t, i) => ({ [t]: r.result.logprobs[i] })),
                  text_offset: pieces.map((_, i) => pieces.slice(0, i).join('').length),
                }
              : null,
          finish_reason: this.finish(r),
          token_ids: r.result.outputIds,
        };
      }),
      usage: this.usage(
        rs,
        jobs.map((j) => j.ids.length),
      ),
    };
  }

  /** POST /v1/chat/completions: rendered with the model's chat template; tools become tool_calls. */
  async chat(body: Json, signal: AbortSignal): Promise<Json> {
    this.checkModel(body);
    const tok = this.tok();
    if (!this.template) {
      try {
        this.template = ChatTemplate.fromTokenizer(tok);
      } catch (e) {
        throw bad(`${(e as Error).message}: send /v1/completions with the prompt rendered`);
      }
    }
    if (body.logprobs === true && (body.top_logprobs ?? 0) !== 0)
      throw bad('top_logprobs other than 0 is not served: the engine returns no alternatives');
    const messages = chatMessages(body.messages);
    const choice = body.tool_choice ?? 'auto';
    if (choice !== 'auto' && choice !== 'none')
      throw bad(`tool_choice ${JSON.stringify(choice)} is not served (auto or none: the model chooses)`);
    const tools = choice === 'none' ? undefined : chatTools(body.tools);
    const kwargs = body.chat_template_kwargs ?? {};
    if (!isObject(kwargs)) throw bad('chat_template_kwargs must be an object');
    let ids: number[];
    try {
      ids = this.template.promptIds(tok, messages, tools, kwargs);
    } catch (e) {
      throw bad(`messages do not render with the model's chat template: ${(e as Error).message}`);
    }
    tokenList(ids, 'the rendered prompt', this.vocab);
    const s = this.openaiSampling(body, Math.max(1, (await this.engineLimits()).maxLen - ids.length));
    const rs = await Promise.all(
      Array.from({ length: s.n }, (_, i) => this.run(ids, this.nth(s, i), signal)),
    );
    return {
      id: `chatcmpl-${randomUUID().replaceAll('-', '')}`,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: this.name,
      choices: rs.map((r, index) => {
        const text = this.text(r, true, false);
        const calls = tools ? parseToolCalls(text).filter((c) => !c.parseError) : [];
        const message = calls.length
          ? {
              role: 'assistant',
              content: text.slice(0, text.indexOf('<tool_call>')).trim() || null,
              tool_calls: calls.map((c) => ({
                id: `call_${randomUUID().replaceAll('-', '').slice(0, 24)}`,
                type: 'function',
                function: { name: c.name, arguments: c.arguments },
              })),
            }
          : { role: 'assistant', content: text };
        return {
          index,
          message,
          logprobs:
            body.logprobs === true
              ? {
                  content: r.result.outputIds.map((id, i) => ({
                    token: tok.decode([id]),
                    logprob: r.result.logprobs[i],
                    top_logprobs: [],
                  })),
                }
              : null,
          finish_reason: calls.length ? 'tool_calls' : this.finish(r),
        };
      }),
      usage: this.usage(
        rs,
        rs.map(() => ids.length),
      ),
    };
  }
}

/** OpenAI messages as the template's: text parts joined, tool-call arguments as objects. */
function chatMessages(x: unknown): ChatMessage[] {
  if (!Array.isArray(x) || x.length === 0) throw bad('messages must be a non-empty list');
  return x.map((m, i) => {
    if (!isObject(m)) throw bad(`messages[${i}] must be an object`);
    const role = m.role === 'developer' ? 'system' : m.role;
    if (!['system', 'user', 'assistant', 'tool'].includes(role as string))
      throw bad(`messages[${i}].role must be system, user, assistant or tool, got ${JSON.stringify(m.role)}`);
    let content = m.content ?? '';
    if (Array.isArray(content))
      content = content
        .map((p, j) => {
          if (!isObject(p) || p.type !== 'text' || typeof p.text !== 'string')
            throw bad(`messages[${i}].content[${j}]: only text parts are served`);
          return p.text;
        })
        .join('');
    if (typeof content !== 'string')
      throw bad(`messages[${i}].content must be a string or a list of text parts`);
    const out: ChatMessage = { role: role as ChatMessage['role'], content };
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw bad(`messages[${i}].tool_calls must be a list`);
      out.tool_calls = m.tool_calls.map((c, j) => {
        const f = isObject(c) ? c.function : undefined;
        if (!isObject(f) || typeof f.name !== 'string')
          throw bad(
            `messages[${i}].tool_calls[${j}] must be {type: 'function', function: {name, arguments}}`,
          );
        let args = f.arguments ?? {};
        if (typeof args === 'string')
          try {
            args = JSON.parse(args);
          } catch {
            throw bad(`messages[${i}].tool_calls[${j}].function.arguments is not JSON`);
          }
        return { type: 'function', function: { name: f.name, arguments: args as Record<string, unknown> } };
      });
    }
    return out;
  });
}

function chatTools(x: unknown): ToolSpec[] | undefined {
  if (x === undefined || x === null) return undefined;
  if (!Array.isArray(x)) throw bad('tools must be a list');
  for (const [i, t] of x.entries())
    if (!isObject(t) || t.type !== 'function' || !isObject(t.function) || typeof t.function.name !== 'string')
      throw bad(`tools[${i}] must be {type: 'function', function: {name, description, parameters}}`);
  return x.length ? (x as ToolSpec[]) : undefined;
}

let version: string | undefined;
function packageVersion(): string {
  version ??= (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as Json)
    .version as string;
  return version;
}

function readBody(req: IncomingMessage): Promise<Json> {
  return new Promise((res, rej) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY) {
        rej(bad(`the body is over ${MAX_BODY >> 20} MiB`, 413));
        req.destroy();
      } else chunks.push(c);
    });
    req.on('error', rej);
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      if (text.trim() === '') return res({});
      try {
        const o = JSON.parse(text);
        if (!isObject(o)) return rej(bad('the body must be a JSON object'));
        res(o);
      } catch (e) {
        rej(bad(`the body is not JSON: ${(e as Error).message}`));
      }
    });
  });
}

type Route = (body: Json, signal: AbortSignal, url: URL) => Promise<unknown>;

/** Starts the worker, loads the model and listens; `close` stops both. */
export async function serve(opts: ServeOptions): Promise<Served> {
  const host = opts.host ?? '127.0.0.1';
  const log = opts.log ?? ((l: string) => console.error(l));
  const dir = opts.model;
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new Error(`--model ${dir}: no such directory`);
  readConfig(dir);
  if (!isLoopback(host) && !opts.token)
    log(
      `warning: rstar2 serve on ${host} without --token: anyone who reaches it can generate and replace its weights`,
    );
  const worker = await PolicyWorker.start({ threads: 2, ...opts.worker });
  let server: ReturnType<typeof createServer> | undefined;
  try {
    await worker.load(dir);
    const e = new ServeEngine(worker, dir, { ...opts, precision: opts.worker?.precision });
    const limits = await e.engineLimits(); // builds the KV pool now, not on the first request
    const flush: Route = async () => {
      await e.flushCache();
      return 'Cache flushed.\n';
    };
    const routes: Record<string, { GET?: Route; POST?: Route }> = {
      '/health': { GET: async () => '' },
      '/health_generate': {
        GET: async (_b, signal) => {
          await e.run([0], { ...NO_STOP, maxNewTokens: 1 }, signal);
          return '';
        },
      },
      '/generate': { POST: (b, s) => e.generate(b, s) },
      '/server_info': { GET: () => e.serverInfo() },
      '/get_server_info': { GET: () => e.serverInfo() },
      '/get_model_info': { GET: async () => e.modelInfo() },
      '/model_info': { GET: async () => e.modelInfo() },
      '/get_load': { GET: () => e.getLoad() },
      '/v1/loads': { GET: () => e.loads() },
      '/flush_cache': { GET: flush, POST: flush },
      '/get_weight_version': { GET: async () => ({ weight_version: e.weightVersion }) },
      '/update_weight_version': {
        POST: async (b) => {
          e.setWeightVersion(b.new_version);
          return { success: true, message: `weight version set to ${e.weightVersion}` };
        },
      },
      '/update_weights_from_disk': { POST: (b) => e.updateFromDisk(b) },
      '/init_weights_update_group': { POST: (b) => e.initGroup(b) },
      '/update_weights_from_distributed': { POST: (b) => e.updateFromDistributed(b) },
      '/v1/models': { GET: async () => e.models() },
      '/v1/completions': { POST: (b, s) => e.completions(b, s) },
      '/v1/chat/completions': { POST: (b, s) => e.chat(b, s) },
      '/metrics': { GET: () => e.metrics() },
    };
    const guard = httpGuard({ host, token: opts.token, open: (p) => p === '/health' });
    const openai = (path: string) => path.startsWith('/v1/') && path !== '/v1/loads';
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const url = requestTarget(req.url ?? '/');
      if (!url) return answer(res, 400, { object: 'error', message: 'bad request target', code: 400 });
      const refusal = guard(req, url);
      if (refusal) return sendRefusal(res, refusal);
      const route = routes[url.pathname];
      const fn = route?.[req.method as 'GET' | 'POST'];
      const fail = (status: number, message: string) =>
        answer(
          res,
          status,
          openai(url.pathname)
            ? {
                error: {
                  message,
                  type: status >= 500 ? 'InternalServerError' : 'BadRequestError',
                  param: null,
                  code: status,
                },
              }
            : {
                object: 'error',
                message,
                type: status >= 500 ? 'InternalServerError' : 'BadRequestError',
                param: null,
                code: status,
              },
        );
      if (!route)
        return fail(404, `no route ${url.pathname} (rstar2 serve: SGLang's native routes and OpenAI's /v1)`);
      if (!fn) return fail(405, `${req.method} ${url.pathname}: use ${Object.keys(route).join(' or ')}`);
      // a client that goes away stops its rows between decode steps
      const gone = new AbortController();
      res.on('close', () => {
        if (!res.writableFinished) gone.abort();
      });
      (req.method === 'POST' ? readBody(req) : Promise.resolve({}))
        .then((body) => fn(body, gone.signal, url))
        .then(
          (out) => {
            if (typeof out === 'string') {
              res.writeHead(200, {
                'content-type': url.pathname === '/metrics' ? 'text/plain; version=0.0.4' : 'text/plain',
              });
              res.end(out);
            } else answer(res, 200, out);
          },
          (err: Error) => {
            if (err instanceof ClientError) return fail(err.status, err.message);
            log(`rstar2 serve: ${req.method} ${url.pathname}: ${err.message}`);
            fail(500, err.message);
          },
        );
    });
    const srv = server;
    await new Promise<void>((res, rej) => {
      srv.once('error', rej);
      srv.listen(opts.port ?? 30000, host, () => res());
    });
    const url = baseUrl(host, (srv.address() as AddressInfo).port);
    log(
      `rstar2 serve: ${e.name} at ${url} (KV pool ${limits.capacity} tokens, context ${limits.maxLen}, ` +
        `${worker.info?.device ?? 'unknown device'})`,
    );
    return {
      url,
      close: async () => {
        srv.closeAllConnections();
        await new Promise<void>((r) => srv.close(() => r()));
        await worker.close();
      },
    };
  } catch (err) {
    server?.close();
    await worker.close();
    throw err;
  }
}

const NO_STOP: SamplingParams = {
  temperature: 0,
  topP: 1,
  topK: -1,
  maxNewTokens: 1,
  stopTokenIds: [],
  stopStrings: [],
};

function answer(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

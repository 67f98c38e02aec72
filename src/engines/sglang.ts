import {
  ContextCap,
  type ContextLimit,
  failure,
  getIfServed,
  HttpClient,
  HttpError,
  type HttpOptions,
  outOfContext,
} from './http.js';
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

// SGLang native API, token-in/token-out: POST /generate with input_ids and return_logprob; the
// sampled ids and logprobs come from meta_info.output_token_logprobs ([logprob, id, text] triples).

interface SGLangResponse {
  output_ids?: number[];
  meta_info?: {
    output_token_logprobs?: [number, number, string | null][];
    finish_reason?: { type?: string; message?: string } | null;
    cached_tokens?: number;
    total_retractions?: number; // older builds: num_retractions
    num_retractions?: number;
  };
}

export interface SGLangOptions extends HttpOptions {
  capacityTokens?: number; // overrides max_total_num_tokens from /get_server_info
  log?: (line: string) => void; // default: stderr
}

export class SGLangEngine implements WeightSyncEngine {
  readonly name: string;
  readonly url: string;
  private readonly http: HttpClient;
  // group calls are never repeated: a second join or receive would wait for a trainer that sends once
  private readonly once: HttpClient;
  private capacity?: number;
  private page?: number; // tokens per KV page (page_size), read with the capacity
  private readonly cap: ContextCap;
  private info?: Promise<Record<string, unknown>>;
  private noLoads = false; // /v1/loads answered 404 (before 0.5.8): /get_load from then on
  private readonly notes: string[] = [];
  private readonly log: (line: string) => void;
  private seedWarned = false;

  constructor(url: string, opts: SGLangOptions = {}) {
    this.http = new HttpClient(url, opts);
    this.once = new HttpClient(url, { ...opts, retries: 0 });
    this.url = this.http.base;
    this.name = `sglang:${this.http.base}`;
    this.capacity = opts.capacityTokens;
    this.log = opts.log ?? ((l) => console.error(l));
    this.cap = new ContextCap(this.name, () => this.contextLimit(), this.log);
  }

  /**
   * The server's arguments and scheduler info, with `version` and `enable_deterministic_inference` at its top
   * level, read once: /server_info (0.5.6 on; /get_server_info is deprecated from then), else /get_server_info.
   * The version is checked here, so a server older than rstar2 supports fails its first use with why; a read that
   * fails is tried again on the next use.
   */
  serverInfo(): Promise<Record<string, unknown>> {
    this.info ??= (async () => {
      const info =
        (await getIfServed<Record<string, unknown>>(this.http, '/server_info')) ??
        (await getIfServed<Record<string, unknown>>(this.http, '/get_server_info'));
      if (!info) throw new Error(`${this.name}: serves neither /server_info nor /get_server_info`);
      // `rstar2 serve` (engines/serve.ts) reports its own version, not SGLang's, and serves what this client sends
      const note = info.engine === 'rstar2' ? undefined : checkVersion(this.name, 'sglang', info.version);
      if (note) {
        this.notes.push(note);
        this.log(`warning: ${note}`);
      }
      return info;
    })().catch((e) => {
      if (e instanceof HttpError) this.info = undefined; // the server's answer, not its version: ask again
      throw e;
    });
    return this.info;
  }

  async generate(inputIds: number[], s: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    try {
      const maxNew = await this.cap.fit(inputIds.length, s.maxNewTokens, signal);
      if (maxNew === 0) return outOfContext();
      if (s.seed !== undefined && !this.seedWarned && !seedsHonoured(await this.serverInfo())) {
        this.seedWarned = true;
        this.log(`warning: ${SEEDS_IGNORED(this.name)}`);
      }
      const body = {
        input_ids: inputIds,
        sampling_params: {
          max_new_tokens: maxNew,
          temperature: s.temperature,
          top_p: s.topP,
          top_k: s.topK,
          min_p: 0,
          ...NO_PENALTIES,
          stop_token_ids: s.stopTokenIds,
          stop: s.stopStrings,
          no_stop_trim: true, // keep the stop token: the trajectory must hold the exact sampled ids
          skip_special_tokens: false,
          ...(s.seed === undefined ? {} : { sampling_seed: s.seed }),
          ...(s.ignoreEos ? { ignore_eos: true } : {}),
        },
        return_logprob: true,
        logprob_start_len: -1,
      };
      const r = await this.http.json<SGLangResponse>('POST', '/generate', body, signal);
      return parseSGLang(r);
    } catch (e) {
      return failure(e);
    }
  }

  // The context is /v1/models' max_model_len (the model's, or --context-length); builds without it publish only
  // /get_server_info's context_length, which is null unless --context-length was given. The tokenizer refuses
  // prompt + max_new_tokens >= context (older builds; newer ones only >), hence one token spare, as verl keeps; the
  // scheduler refuses a prompt of max_req_input_len (context or KV pool − 6) or more.
  private async contextLimit(): Promise<ContextLimit | undefined> {
    const info = await this.serverInfo();
    const models = await getIfServed<{ data?: { max_model_len?: unknown }[] }>(this.http, '/v1/models');
    const tokens = positive(models?.data?.[0]?.max_model_len) ?? positive(info.context_length);
    if (tokens === undefined) return undefined;
    const maxInput = positive(findKey(info, 'max_req_input_len'));
    return { tokens, spare: 1 + draftReserve(info), ...(maxInput === undefined ? {} : { maxInput }) };
  }

  /** The model's context as the server publishes it (undefined where it does not), read once. */
  context(): Promise<ContextLimit | undefined> {
    return this.cap.limit();
  }

  async load(): Promise<EngineLoad> {
    if (this.capacity === undefined || this.page === undefined) {
      // also with capacityTokens given: the page size still decides what a prefix miss is
      const info = await this.serverInfo();
      const page = findKey(info, 'page_size');
      this.page = typeof page === 'number' && page > 1 ? page : 1;
      if (this.capacity === undefined) {
        const cap = findKey(info, 'max_total_num_tokens');
        if (typeof cap !== 'number')
          throw new Error(`${this.name}: its server info has no max_total_num_tokens`);
        const dp = findKey(info, 'dp_size');
        // under data parallelism the server reports rank 0's pool; each rank has one of its own
        this.capacity = cap * (typeof dp === 'number' && dp > 1 ? dp : 1);
      }
    }
    const load: EngineLoad = { capacityTokens: this.capacity, blockTokens: this.page };
    // 0.5.8 on: /v1/loads, one entry per DP rank (/get_load is deprecated there)
    if (!this.noLoads)
      try {
        const r = await this.http.json<{ loads?: Record<string, number>[] }>('GET', '/v1/loads?include=core');
        if (Array.isArray(r.loads) && r.loads.length > 0) {
          load.usedTokens = sum(r.loads, 'num_used_tokens');
          load.running = sum(r.loads, 'num_running_reqs');
          load.queued = sum(r.loads, 'num_waiting_reqs');
          return load;
        }
      } catch (e) {
        // an engine that does not answer must fail the poll, so the scheduler can move its trajectories
        if (!(e instanceof HttpError && e.status === 404)) throw e;
        this.noLoads = true;
      }
    // /get_load: from 0.5.3rc0 a list with a row per DP rank, {dp_rank, num_reqs (running and waiting),
    // num_waiting_reqs, num_tokens (KV tokens in use plus the waiting requests' input tokens)}; before it {load},
    // rank 0's tokens alone (tokenizer_manager.get_load)
    let r: unknown;
    try {
      r = await this.http.json<unknown>('GET', '/get_load');
    } catch (e) {
      if (e instanceof HttpError && e.status === 404) return load; // capacity alone still drives placement
      throw e;
    }
    if (Array.isArray(r)) {
      const rs = r as Record<string, number>[];
      load.usedTokens = sum(rs, 'num_tokens');
      load.running = Math.max(0, sum(rs, 'num_reqs') - sum(rs, 'num_waiting_reqs'));
      load.queued = sum(rs, 'num_waiting_reqs');
    } else if (r && typeof (r as { load?: unknown }).load === 'number')
      load.usedTokens = (r as { load: number }).load;
    return load;
  }

  async updateWeightsFromDisk(path: string, version?: string): Promise<void> {
    const r = await this.http.json<{ success?: boolean; message?: string }>(
      'POST',
      '/update_weights_from_disk',
      {
        model_path: path,
        ...(version ? { weight_version: version } : {}),
      },
    );
    if (r.success === false) throw new Error(`${this.name}: update_weights_from_disk failed: ${r.message}`);
  }

  /** Its tensor-parallel ranks; refuses data/pipeline parallel servers (their ranks are not 1 per TP rank). */
  async weightGroupRanks(): Promise<number> {
    const info = await this.serverInfo();
    const tp = findKey(info, 'tp_size');
    const dp = findKey(info, 'dp_size');
    const pp = findKey(info, 'pp_size');
    if (typeof tp !== 'number' || tp < 1) throw new Error(`${this.name}: its server info has no tp_size`);
    if ((typeof dp === 'number' && dp > 1) || (typeof pp === 'number' && pp > 1))
      throw new Error(
        `${this.name}: dp_size ${dp} / pp_size ${pp}: broadcast sync covers tensor parallel only`,
      );
    return tp;
  }

  async initWeightsUpdateGroup(g: WeightGroup, rankOffset: number): Promise<void> {
    const r = await this.once.json<{ success?: boolean; message?: string }>(
      'POST',
      '/init_weights_update_group',
      groupRequest(g, rankOffset),
    );
    if (r.success === false) throw new Error(`${this.name}: init_weights_update_group failed: ${r.message}`);
  }

  /** One bucket: SGLang allocates every tensor of a call on the GPU before loading any, so a call is sized to fit
   *  beside the KV pool (weight-sync.ts); the version and the cache flush go with the last. */
  async updateWeightsFromDistributed(
    meta: WeightMeta,
    groupName: string,
    opts: { version?: string; last?: boolean } = {},
  ): Promise<void> {
    const last = opts.last ?? true;
    const r = await this.once.json<{ success?: boolean; message?: string }>(
      'POST',
      '/update_weights_from_distributed',
      {
        names: meta.names,
        dtypes: meta.dtypes,
        shapes: meta.shapes,
        group_name: groupName,
        flush_cache: last, // cached prefixes hold the old weights' KV
        ...(opts.version && last ? { weight_version: opts.version } : {}),
      },
    );
    if (r.success === false)
      throw new Error(`${this.name}: update_weights_from_distributed failed: ${r.message}`);
  }

  async describe(): Promise<EngineReport> {
    const info = await this.serverInfo();
    const kv = await this.load();
    const seeds = seedsHonoured(info);
    const dtype = SGLANG_DTYPES[String(info.dtype)];
    const notes = [...this.notes];
    if (!seeds) notes.push(SEEDS_IGNORED(this.name));
    if (!dtype) notes.push(`${this.name}: --dtype ${info.dtype}: the model's config.json decides its dtype`);
    return {
      ...(typeof info.version === 'string' ? { version: info.version } : {}),
      ...(dtype ? { dtype } : {}),
      logprobsMode: 'after temperature',
      seeds,
      kv,
      notes,
    };
  }

  async close(): Promise<void> {}
}

// SGLang's --dtype choices (server_args.py); 'auto' takes the model's, which the server does not report
const SGLANG_DTYPES: Record<string, string> = {
  half: 'float16',
  float16: 'float16',
  bfloat16: 'bfloat16',
  float: 'float32',
  float32: 'float32',
};

/** sampling_seed is read only by the seeded sampler of --enable-deterministic-inference (PR 10678). */
function seedsHonoured(info: Record<string, unknown>): boolean {
  return info.enable_deterministic_inference === true;
}

const SEEDS_IGNORED = (name: string) =>
  `${name} ignores sampling_seed (started without --enable-deterministic-inference): seeded rollouts and ` +
  'evals are not reproducible on it';

/** Sent with every request on both engines: a server that takes defaults from the model's
 *  generation_config.json (vLLM's --generation-config auto, the default; SGLang's model sampling defaults)
 *  would otherwise sample with, say, repetition_penalty 1.05, a distribution the trainer never scores. */
export const NO_PENALTIES = { repetition_penalty: 1, frequency_penalty: 0, presence_penalty: 0 };

/** SGLang's /init_weights_update_group body; our vLLM worker extension takes the same fields. */
export function groupRequest(g: WeightGroup, rankOffset: number) {
  return {
    master_address: g.masterAddress,
    master_port: g.masterPort,
    rank_offset: rankOffset,
    world_size: g.worldSize,
    group_name: g.groupName,
    backend: g.backend,
  };
}

export function parseSGLang(r: SGLangResponse): GenerateResult {
  const lp = r.meta_info?.output_token_logprobs;
  if (!Array.isArray(lp)) {
    return {
      outputIds: [],
      logprobs: [],
      finishReason: 'error',
      error: 'SGLang response lacks meta_info.output_token_logprobs',
    };
  }
  const outputIds = lp.map((t) => t[1]);
  // a missing logprob would read as probability 1 downstream; fail loudly instead
  if (lp.some((t) => typeof t[0] !== 'number')) {
    return { outputIds, logprobs: [], finishReason: 'error', error: 'SGLang returned a null logprob' };
  }
  const fr = r.meta_info?.finish_reason;
  const type = fr?.type ?? 'stop';
  const finishReason: FinishReason = type === 'length' ? 'length' : type === 'abort' ? 'abort' : 'stop';
  const out: GenerateResult = { outputIds, logprobs: lp.map((t) => t[0]), finishReason };
  const m = r.meta_info;
  if (typeof m?.cached_tokens === 'number') out.cachedTokens = m.cached_tokens;
  const retractions = m?.total_retractions ?? m?.num_retractions;
  if (typeof retractions === 'number' && retractions > 0) out.retractions = retractions;
  if (finishReason === 'abort') out.error = fr?.message ?? 'aborted by server';
  return out;
}

// Speculative decoding counts draft tokens into the prompt: SGLang's tokenizer adds speculative_num_draft_tokens
// (older builds) or EAGLE's topk × steps (newer ones); the larger of the two fits either.
function draftReserve(info: Record<string, unknown>): number {
  const algo = info.speculative_algorithm;
  if (typeof algo !== 'string' || algo === '' || algo.toUpperCase() === 'NONE') return 0;
  const n = (k: string) => positive(info[k]) ?? 0;
  return Math.max(
    n('speculative_num_draft_tokens'),
    n('speculative_eagle_topk') * n('speculative_num_steps'),
  );
}

function positive(x: unknown): number | undefined {
  return typeof x === 'number' && x > 0 ? x : undefined;
}

function findKey(o: unknown, key: string): unknown {
  if (o === null || typeof o !== 'object') return undefined;
  const rec = o as Record<string, unknown>;
  if (key in rec) return rec[key];
  for (const v of Object.values(rec)) {
    const f = findKey(Array.isArray(v) ? v[0] : v, key);
    if (f !== undefined) return f;
  }
  return undefined;
}

function sum(xs: Record<string, number>[], k: string): number {
  return xs.reduce((a, x) => a + (Number(x[k]) || 0), 0);
}

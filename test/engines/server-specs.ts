// What the fake servers (fake-servers.ts) hold each request and answer to: SGLang's and vLLM's published request
// and response models and routes, per version. Each field names where it was read: the upstream file at a release
// tag (with the tag's commit) or at a main-branch commit (github.com/sgl-project/sglang,
// github.com/vllm-project/vllm). The rstar2 side of each (what the clients send) is never the source of a field.
//
// Read with git from mirrors of forks that carry upstream's history and tags unchanged (the upstream repositories
// are too large to mirror here): SGLang's tags from Fridge003/sglang (tags through v0.5.10, 2026-04), SGLang's main
// from mmangkad-dev/sglang (main at 9be3044b, 2026-08-16, no tags), vLLM's tags and main from deepinfra/vllm (tags
// through v0.25.1, main at 2bd89576, 2026-07-15). "First in tag X" is `git tag --contains <commit>` there.

export interface ServerSpec {
  api: 'sglang' | 'vllm';
  label: string;
  /** What the build reports: SGLang's server info `version`, vLLM's /version. */
  version: string;
  /** SGLang: the server-info routes it serves (any other answers 404). */
  infoRoutes?: readonly ('/server_info' | '/get_server_info')[];
  /** SGLang: the load routes it serves (any other answers 404). */
  loadRoutes?: readonly ('/v1/loads' | '/get_load')[];
  /** SGLang: what /get_load answers: {load} (before v0.5.3rc0), one GetLoadReqOutput row per DP rank (v0.5.3rc0 to
   *  v0.5.10), or main's shim over /v1/loads (rows with num_pending_tokens). */
  getLoad?: 'load' | 'rows' | 'shim';
  /** SGLang: SamplingParams' keywords; a request with any other key in sampling_params is an HTTP 500. */
  samplingKeys?: readonly string[];
  /** SGLang: the required fields of UpdateWeightsFromDistributedReqInput (a missing one is an HTTP 400). */
  weightFields?: readonly string[];
  /** vLLM: the highest temperature its SamplingParams take (none: no bound). */
  maxTemperature?: number;
  /** vLLM: routes served only with VLLM_SERVER_DEV_MODE=1. */
  devRoutes?: readonly string[];
  /** vLLM: /server_info's vllm_config: str(VllmConfig) only ('text', before v0.11.0), or a JSON dump with
   *  ?config_format=json ('json'), with vllm_env and system_env beside it ('json+env', v0.16.0 on). */
  serverInfo?: 'text' | 'json' | 'json+env';
  sources: Record<string, string>;
}

const SG = 'sgl-project/sglang';
const VL = 'vllm-project/vllm';
const SG_MAIN = `${SG} main @ 9be3044b9cbe191d21675c857dd79f62b02b6ca0 (2026-08-16)`;
const SG_053 = `${SG} v0.5.3 (a4a3d8239365d2fc16e2dc707605373ea3f35ded)`;
const SG_048 = `${SG} v0.4.8 (7c3a12c0002e33fed1e72f4157e74a64a998f251)`;
const VL_MAIN = `${VL} main @ 2bd8957627bfb5668c46f2bc359bef47d371270c (2026-07-15)`;
const VL_0110 = `${VL} v0.11.0 (b8b302cde434df8c9289a2b465406b47ebab1c2d)`;
const VL_0102 = `${VL} v0.10.2 (01efc7ef781391e744ed08c3292817a773d654e6)`;

// python/sglang/srt/sampling/sampling_params.py, SamplingParams: built as SamplingParams(**sampling_params) in
// tokenizer_manager.py, so any other key is a TypeError, which /generate does not catch (it catches ValueError
// only): HTTP 500. v0.4.8 and v0.5.3: a class whose __init__ takes these keywords; main: a msgspec Struct
// (kw_only) with the same API fields, whose constructor raises the same TypeError.
const SGLANG_048_SAMPLING = [
  'max_new_tokens',
  'stop',
  'stop_token_ids',
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'frequency_penalty',
  'presence_penalty',
  'repetition_penalty',
  'min_new_tokens',
  'n',
  'json_schema',
  'regex',
  'ebnf',
  'structural_tag',
  'ignore_eos',
  'skip_special_tokens',
  'spaces_between_special_tokens',
  'no_stop_trim',
  'custom_params',
  'stream_interval',
  'logit_bias',
] as const;
// sampling_seed: PR 10678 (e2ac7888b8cb1fd6c33a7ec58d27a5f5b5b24e0c), first in v0.5.3rc2
const SGLANG_053_SAMPLING = [...SGLANG_048_SAMPLING, 'sampling_seed'] as const;
// stop_regex: PR 10635 (47c606d3dc19d3aaa06f841e1801e6947e04c0c0), first in v0.5.3.post2
const SGLANG_MAIN_SAMPLING = [...SGLANG_053_SAMPLING, 'stop_regex'] as const;

const SAMPLING_FILE = 'python/sglang/srt/sampling/sampling_params.py';
const WEIGHT_FILE = 'python/sglang/srt/managers/io_struct.py, UpdateWeightsFromDistributedReqInput';
const SEEDS =
  'python/sglang/srt/sampling/sampling_batch_info.py: sampling_seed reaches the sampler only when the server runs ' +
  '--enable-deterministic-inference (a ServerArgs field, so a top-level key of the server info)';

/** SGLang 2026 main: both server-info routes (/get_server_info deprecated, answering as /server_info) and both
 *  load routes (/get_load deprecated, a shim over /v1/loads). */
export const SGLANG_MAIN: ServerSpec = {
  api: 'sglang',
  label: 'SGLang main (2026-08)',
  version: '0.5.12.dev20260509+g096ad02b0',
  infoRoutes: ['/server_info', '/get_server_info'],
  loadRoutes: ['/v1/loads', '/get_load'],
  getLoad: 'shim',
  samplingKeys: SGLANG_MAIN_SAMPLING,
  weightFields: ['names', 'dtypes', 'shapes'],
  sources: {
    samplingKeys: `${SG_MAIN} ${SAMPLING_FILE}; tokenizer_manager.py: self.sampling_params_class(**sampling_kwargs)`,
    weightFields:
      `${SG_MAIN} ${WEIGHT_FILE}: names, dtypes, shapes required; group_name, flush_cache, ` +
      'abort_all_requests, weight_version, load_format, torch_empty_cache optional',
    infoRoutes:
      `${SG_MAIN} python/sglang/srt/entrypoints/http_server.py: /server_info = server_args (asdict) + ` +
      'scheduler_info + startup_time + internal_states + version + kv_events; /get_server_info logs a deprecation ' +
      'and returns server_info(); /server_info first in v0.5.6 (7ae368efde14f0b2abe769a5fbb99b8154b2a9b7)',
    loadRoutes:
      `${SG_MAIN} python/sglang/srt/entrypoints/v1_loads.py: /v1/loads = {timestamp, version, accelerator, ` +
      "num_accelerators, loads}; with ?include=core each load is LoadSnapshot's flat fields " +
      '(python/sglang/srt/managers/load_snapshot.py: timestamp, dp_rank, num_running_reqs, num_waiting_reqs, ' +
      'num_waiting_uncached_tokens, num_used_tokens, num_total_tokens, num_active_tokens, max_total_num_tokens, ' +
      'max_running_requests, token_usage, gen_throughput, cache_hit_rate, utilization, ' +
      'total_prefill_uncached_tokens, total_prefill_busy_us, decode_moments), one per DP rank. /v1/loads is PR ' +
      '16976 (b3a3f5132075a7241995db55f30d62a854d8d532), first in v0.5.8, where it was {timestamp, version, ' +
      'dp_rank_count, loads, aggregate} and a load had dp_rank, num_running_reqs, num_waiting_reqs, ' +
      'num_used_tokens, max_total_num_tokens, token_usage, gen_throughput, cache_hit_rate, utilization, ' +
      'max_running_requests, num_total_reqs. http_server.py /get_load: [{dp_rank, num_reqs (running + waiting), ' +
      'num_waiting_reqs, num_tokens (= num_total_tokens), num_pending_tokens, ts_tic}]',
    seeds: `${SG_MAIN} ${SEEDS}`,
    version:
      `${SG_MAIN} python/sglang/version.py reads setuptools-scm's _version.py (python/pyproject.toml: ` +
      "fallback_version '0.0.0.dev0' without git metadata), since v0.5.7; a nightly build of main reports " +
      "'<next>.dev<date>+g<sha>', this one as docs/cookbook/autoregressive/Poolside/Laguna-XS.2.mdx pins it",
  },
};

/** SGLang v0.5.3: /get_server_info only, load only at /get_load (one row per DP rank). */
export const SGLANG_05: ServerSpec = {
  api: 'sglang',
  label: 'SGLang 0.5.3',
  version: '0.5.3',
  infoRoutes: ['/get_server_info'],
  loadRoutes: ['/get_load'],
  getLoad: 'rows',
  samplingKeys: SGLANG_053_SAMPLING,
  weightFields: ['names', 'dtypes', 'shapes'],
  sources: {
    infoRoutes:
      `${SG_053} python/sglang/srt/entrypoints/http_server.py: /get_server_info = server_args (asdict) + ` +
      'scheduler_info + internal_states + version; no /server_info, no /v1/loads',
    loadRoutes:
      `${SG_053} http_server.py /get_load returns tokenizer_communicator_mixin.get_load: a list of ` +
      'GetLoadReqOutput (io_struct.py: rid from BaseReq, dp_rank, num_reqs, num_waiting_reqs, num_tokens), one per ' +
      'DP rank; scheduler.py get_load: num_reqs = running + waiting, num_tokens = KV tokens in use + the waiting ' +
      "requests' input tokens. The list replaced {load} in v0.5.3rc0; v0.5.7 adds ts_tic",
    samplingKeys: `${SG_053} ${SAMPLING_FILE}, SamplingParams.__init__ (no stop_regex before v0.5.3.post2)`,
    weightFields: `${SG_053} ${WEIGHT_FILE}: names, dtypes, shapes; group_name, flush_cache, abort_all_requests, weight_version`,
    seeds: `${SG_053} ${SEEDS}; server_args.py enable_deterministic_inference: bool = False`,
  },
};

/** SGLang before the plural weight update (v0.4.9) and sampling_seed (v0.5.3rc2). */
export const SGLANG_OLD: ServerSpec = {
  api: 'sglang',
  label: 'SGLang 0.4.8',
  version: '0.4.8',
  infoRoutes: ['/get_server_info'],
  loadRoutes: ['/get_load'],
  getLoad: 'load',
  samplingKeys: SGLANG_048_SAMPLING,
  weightFields: ['name', 'dtype', 'shape'],
  sources: {
    weightFields:
      `${SG_048} ${WEIGHT_FILE}(name, dtype, shape); names/dtypes/shapes are PR 7292 ` +
      '(0626f678de6d58e38378f05511f6200cdc67e70c), first in v0.4.9',
    samplingKeys: `${SG_048} ${SAMPLING_FILE}, SamplingParams.__init__: no sampling_seed`,
    loadRoutes: `${SG_048} python/sglang/srt/managers/tokenizer_manager.py get_load: {"load": internal_state[0]["load"]}`,
    infoRoutes: `${SG_048} python/sglang/srt/entrypoints/http_server.py: /get_server_info with version`,
  },
};

const COMPLETION = 'CompletionRequest (logprobs: int | None, return_tokens_as_token_ids, return_token_ids)';
const RESPONSE =
  'CompletionResponseChoice (token_ids and prompt_token_ids None unless return_token_ids; logprobs None unless ' +
  'logprobs is set, then CompletionLogProbs {text_offset, token_logprobs, tokens, top_logprobs}, tokens as ' +
  "'token_id:N' with return_tokens_as_token_ids), serialized with model_dump(): unasked fields are null, not absent";
const EXTRA = 'OpenAIBaseModel: extra="allow", unknown keys are logged as ignored';

/** vLLM 2026 main: temperature above 2 refused (HTTP 400). */
export const VLLM_MAIN: ServerSpec = {
  api: 'vllm',
  label: 'vLLM main (2026-07)',
  version: '0.25.1.dev169+g2bd895762',
  maxTemperature: 2,
  devRoutes: ['/server_info', '/collective_rpc', '/reset_prefix_cache'],
  serverInfo: 'json+env',
  sources: {
    request:
      `${VL_MAIN} vllm/entrypoints/openai/completion/protocol.py ${COMPLETION}; ${RESPONSE} ` +
      `(completion/serving.py, completion/api_router.py); engine/protocol.py ${EXTRA}`,
    maxTemperature:
      `${VL_MAIN} vllm/sampling_params.py _verify_args: temperature > 2.0 is a VLLMValidationError ` +
      "'temperature must be in [0, 2], got {t}.' (serve/utils/error_response.py: HTTP 400 BadRequestError, param " +
      'temperature); PR 44965 (ebb0a71ad0b2e2a09ed76b14338465f6b121ebfd, merged 2026-06-15), first in v0.24.0',
    devRoutes:
      `${VL_MAIN} vllm/entrypoints/openai/api_server.py registers vllm/entrypoints/serve/dev/ ` +
      '(server_info, rpc: /collective_rpc, cache: /reset_prefix_cache) only if VLLM_SERVER_DEV_MODE',
    serverInfo:
      `${VL_MAIN} vllm/entrypoints/serve/dev/server_info/api_router.py: {vllm_config: str(config), or with ` +
      '?config_format=json its pydantic dump (fallback=str: dtype as "torch.bfloat16"), vllm_env, system_env}',
    logprobsMode: `${VL_MAIN} vllm/config/model.py ModelConfig.logprobs_mode, default "raw_logprobs"`,
    version:
      `${VL_MAIN}: vllm/version.py reads setuptools-scm's _version.py; main is v0.25.0-169-g2bd895762, which ` +
      "setuptools-scm writes as this (setup.py may add '.precompiled' or '.cuNNN'); an untagged checkout " +
      "reports '0.1.devN+g<sha>', a tree without _version.py 'dev'",
  },
};

/** vLLM v0.11.0: the first release whose /server_info takes config_format=json; no temperature bound. */
export const VLLM_RELEASE: ServerSpec = {
  api: 'vllm',
  label: 'vLLM 0.11.0',
  version: '0.11.0',
  devRoutes: ['/server_info', '/collective_rpc', '/reset_prefix_cache'],
  serverInfo: 'json',
  sources: {
    request: `${VL_0110} vllm/entrypoints/openai/protocol.py ${COMPLETION}; ${RESPONSE} (serving_completion.py, api_server.py); ${EXTRA}`,
    maxTemperature: `${VL_0110} vllm/sampling_params.py _verify_args: temperature >= 0 only`,
    devRoutes:
      `${VL_0110} vllm/entrypoints/openai/api_server.py: /server_info, /reset_prefix_cache, /collective_rpc ` +
      '(and /sleep, /wake_up, /is_sleeping) under `if envs.VLLM_SERVER_DEV_MODE`',
    serverInfo:
      `${VL_0110} api_server.py show_server_info: {vllm_config} only, str(config) or with config_format=json ` +
      'PydanticVllmConfig.dump_python(mode="json", fallback=str)',
    logprobsMode: `${VL_0110} vllm/config/model.py ModelConfig.logprobs_mode, default "raw_logprobs"`,
  },
};

/** vLLM v0.10.2, the oldest rstar2 supports: /server_info gives str(VllmConfig) only, without logprobs_mode. */
export const VLLM_0102: ServerSpec = {
  api: 'vllm',
  label: 'vLLM 0.10.2',
  version: '0.10.2',
  devRoutes: ['/server_info', '/collective_rpc', '/reset_prefix_cache'],
  serverInfo: 'text',
  sources: {
    request:
      `${VL_0102} vllm/entrypoints/openai/protocol.py ${COMPLETION}; return_token_ids is PR 22587 ` +
      '(24f4d1a224ef1da6cb3878628c39ad09de480c98), first in v0.10.2rc1',
    serverInfo:
      `${VL_0102} vllm/entrypoints/openai/api_server.py show_server_info: {"vllm_config": str(vllm_config)}, no ` +
      'config_format (it is first in v0.11.0); vllm/config/__init__.py VllmConfig.__str__ has "dtype=torch.…" and ' +
      '"max_seq_len=…" but not logprobs_mode',
  },
};

// What the fake servers (fake-servers.ts) hold each request and answer to: SGLang's and vLLM's published request
// and response models and routes, per version. Each field names where it was read: the upstream file at the
// commit it was read at (github.com/sgl-project/sglang, github.com/vllm-project/vllm), or the pull request that
// made it. The rstar2 side of each (what the clients send) is never the source of a field here.
//
// The versions a build reports are as the release or build writes them; the 'main' specs stand for the 2026 main
// branches as read at the commits below.

export interface ServerSpec {
  api: 'sglang' | 'vllm';
  label: string;
  version: string;
  /** SGLang: where its server info is served (the other route answers 404). */
  infoRoute?: '/server_info' | '/get_server_info';
  /** SGLang: where its load is served (the other route answers 404). */
  loadRoute?: '/v1/loads' | '/get_load';
  /** SGLang: SamplingParams' fields; a request with any other key in sampling_params is an HTTP 500. */
  samplingKeys?: readonly string[];
  /** SGLang: the required fields of UpdateWeightsFromDistributedReqInput. */
  weightFields?: readonly string[];
  /** vLLM: the highest temperature its SamplingParams take (none: no bound). */
  maxTemperature?: number;
  /** vLLM: routes served only with VLLM_SERVER_DEV_MODE=1. */
  devRoutes?: readonly string[];
  sources: Record<string, string>;
}

const SG = 'sgl-project/sglang';
const VL = 'vllm-project/vllm';

// python/sglang/srt/sampling/sampling_params.py, class SamplingParams (a msgspec Struct, kw_only): built from the
// request's sampling_params dict as keywords, so any other key is a TypeError that /generate does not catch
const SGLANG_SAMPLING = [
  'max_new_tokens',
  'stop',
  'stop_token_ids',
  'stop_regex',
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
  'sampling_seed',
] as const;

const SAMPLING_SRC = `${SG} python/sglang/srt/sampling/sampling_params.py @ 00c17cafcb9e289d5ca97c50e44ada54e4fd5b03`;

/** SGLang 2026 main: /server_info (its docs list it; /get_server_info is deprecated there) and /v1/loads. */
export const SGLANG_MAIN: ServerSpec = {
  api: 'sglang',
  label: 'SGLang main (2026)',
  version: '0.5.9',
  infoRoute: '/server_info',
  loadRoute: '/v1/loads',
  samplingKeys: SGLANG_SAMPLING,
  weightFields: ['names', 'dtypes', 'shapes'],
  sources: {
    samplingKeys: SAMPLING_SRC,
    weightFields:
      `${SG} python/sglang/srt/managers/io_struct.py, UpdateWeightsFromDistributedReqInput (main): names, dtypes, ` +
      'shapes; group_name, flush_cache, abort_all_requests, weight_version, load_format, torch_empty_cache',
    infoRoute:
      'docs.sglang.io/docs/basic_usage/native_api.md (2026): /server_info in the list of native APIs',
    loadRoute:
      '/v1/loads?include=core, one entry per DP rank (num_running_reqs, num_waiting_reqs, num_used_tokens), as ' +
      'read for rstar2 commit 2e1f32c; not re-read at a pinned commit',
    version: 'illustrative: the fake stands for main as read at the commits here, not for one tagged version',
  },
};

/** SGLang 0.5.x from 0.5.3 on: /get_server_info with its version, load only at /get_load. */
export const SGLANG_05: ServerSpec = {
  api: 'sglang',
  label: 'SGLang 0.5.3',
  version: '0.5.3',
  infoRoute: '/get_server_info',
  loadRoute: '/get_load',
  samplingKeys: SGLANG_SAMPLING,
  weightFields: ['names', 'dtypes', 'shapes'],
  sources: {
    infoRoute:
      `${SG} python/sglang/srt/entrypoints/http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d: ` +
      '/get_server_info = server_args + scheduler_info + internal_states + version; no /server_info, no /v1/loads',
    loadRoute: `${SG} python/sglang/srt/managers/tokenizer_manager.py (0.5.x), get_load: {"load": internal_state[0]["load"]}`,
    samplingKeys:
      `the keys rstar2 sends are all in ${SAMPLING_SRC}; sampling_seed arrived with deterministic sampling ` +
      '(PR 10678, merged 2025-09-20, in 0.5.3)',
    weightFields: `${SG} python/sglang/srt/managers/io_struct.py (0.5.x): names, dtypes, shapes`,
  },
};

/** SGLang before 0.5.3: no sampling_seed, and update_weights_from_distributed takes one tensor per call. */
export const SGLANG_OLD: ServerSpec = {
  api: 'sglang',
  label: 'SGLang 0.4.9',
  version: '0.4.9',
  infoRoute: '/get_server_info',
  loadRoute: '/get_load',
  samplingKeys: SGLANG_SAMPLING.filter((k) => k !== 'sampling_seed' && k !== 'stop_regex'),
  weightFields: ['name', 'dtype', 'shape'],
  sources: {
    weightFields: `${SG} python/sglang/srt/managers/io_struct.py (0.4.x): UpdateWeightsFromDistributedReqInput(name, dtype, shape)`,
    samplingKeys: 'before PR 10678 SamplingParams.__init__ had no sampling_seed keyword',
  },
};

// vllm/entrypoints/openai/completion/protocol.py, CompletionRequest: logprobs (int | None), return_token_ids,
// return_tokens_as_token_ids; extra keys are ignored with a warning (OpenAIBaseModel)
const COMPLETION_SRC = `${VL} vllm/entrypoints/openai/completion/protocol.py @ d5dba2d7b0ab9b98096560c69db7126b54b14d79`;
const DEV_ROUTES = ['/server_info', '/collective_rpc', '/reset_prefix_cache'] as const;
const DEV_SRC =
  `${VL} vllm/entrypoints/serve/instrumentator/server_info.py (main): attach_router returns unless ` +
  'VLLM_SERVER_DEV_MODE; /server_info?config_format=json is {vllm_config (pydantic dump, torch dtypes as str), ' +
  'vllm_env, system_env}; /collective_rpc and /reset_prefix_cache are dev routes too';

/** vLLM 2026 main: temperature above 2 refused (HTTP 400). */
export const VLLM_MAIN: ServerSpec = {
  api: 'vllm',
  label: 'vLLM main (2026)',
  version: '0.24.1.dev45+g1a2b3c4',
  maxTemperature: 2,
  devRoutes: DEV_ROUTES,
  sources: {
    request: COMPLETION_SRC,
    maxTemperature:
      `${VL} PR 44965 (merged 2026-06-09): SamplingParams._verify_args takes 0 <= temperature <= 2, a ` +
      'VLLMValidationError (HTTP 400) otherwise',
    devRoutes: DEV_SRC,
    logprobsMode: `${VL} vllm/config/model.py: LogprobsMode, default raw_logprobs`,
    version: 'illustrative: a main build reports a .dev version past the last tag',
  },
};

/** A vLLM release before the temperature bound, with the same routes. */
export const VLLM_RELEASE: ServerSpec = {
  api: 'vllm',
  label: 'vLLM 0.11.0',
  version: '0.11.0',
  devRoutes: DEV_ROUTES,
  sources: {
    request:
      `${COMPLETION_SRC}, the fields as main has them; this release is not re-read at a pinned commit (its ` +
      'CompletionRequest lived in vllm/entrypoints/openai/protocol.py)',
    maxTemperature:
      'none: before PR 44965 SamplingParams checked only temperature >= 0 (vllm/sampling_params.py)',
    devRoutes: DEV_SRC,
  },
};

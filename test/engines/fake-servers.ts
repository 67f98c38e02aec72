import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { type ServerSpec, SGLANG_MAIN, VLLM_MAIN } from './server-specs.js';

// Small fake servers that speak each backend's API, held to the servers' published request and response models
// per version (server-specs.ts: routes, fields, refusals, each with its source). `mode` lets a test inject: slow
// responses, 5xx, dropped connections and server-side aborts.

export type Mode = 'ok' | 'slow' | '503' | 'drop' | 'abort' | '400';
export type Api = 'sglang' | 'vllm' | 'llamacpp';

export interface Fake {
  url: string;
  modes: Mode[]; // consumed one per generate request; 'ok' when empty
  requests: { path: string; body: Record<string, unknown> }[];
  /** What the load endpoints report in all: SGLang /v1/loads and vLLM /metrics, split 2:1 over 2 data-parallel
   *  ranks (engine cores) when dp is 2; each rank has half of the 123,456 (SGLang) or 16,000 (vLLM) KV tokens. */
  load: { used: number; running: number; waiting: number };
  dp: 1 | 2;
  dead: boolean; // drop every connection, load endpoints included
  cached?: number; // cached prompt tokens to report (SGLang meta_info.cached_tokens, vLLM usage.prompt_tokens_details)
  /** Weight-update group: a python rank (python/tests/fake_engine_rank.py) joins and receives; each update lands in a file. */
  received: string[]; // safetensors files, one per update, in order
  failInit?: boolean; // answer init_weights_update_group with HTTP 400 and success: false (without joining)
  /** The model's context in tokens (default 32,768), published where the real servers publish it (SGLang: /v1/models
   *  max_model_len, /get_server_info max_req_input_len; vLLM: /v1/models max_model_len) unless `publishesContext` is
   *  false (an older build), and enforced on every generate request with the real servers' status and message. */
  context: number;
  publishesContext: boolean;
  lora?: string; // vLLM: a LoRA adapter served under this name, listed in /v1/models after the base model
  draftTokens?: number; // SGLang speculative decoding: draft tokens its tokenizer counts into the prompt
  /** Which server and version this fake is (default: the 2026 main of each): its routes and refusals. */
  spec: ServerSpec;
  /** SGLang: started with --enable-deterministic-inference (only then is sampling_seed honoured); default false. */
  deterministic: boolean;
  /** SGLang: its --dtype server argument (default 'auto': the model's own, not reported). */
  dtypeArg: string;
  /** SGLang: GPU memory beside the KV pool for an update's tensors, all allocated before any is loaded. */
  freeBytes?: number;
  /** vLLM: started with VLLM_SERVER_DEV_MODE=1 (default true: weight sync needs it). */
  devMode: boolean;
  /** vLLM: --logprobs-mode (default raw_logprobs, vLLM's own default) and the served dtype. */
  logprobsMode: string;
  dtype: string;
  /** What the fake model samples for a prompt, before the request's max new tokens cut it; default OUT, or with
   *  a sampling_seed on a deterministic SGLang (only there is it honoured) ids drawn from the seed and the prompt. */
  sample?: (inputIds: number[]) => number[];
  /** vLLM: the --model directory, /v1/models' root; reload_weights reads its model.safetensors (default
   *  'tiny-model', which holds none: a reload fails as vLLM's does on a missing file). */
  modelPath: string;
  /** sha256 of each model.safetensors a reload read (SGLang: update_weights_from_disk; vLLM: reload_weights). */
  reloads: string[];
  /** Generate as a batching engine with these step times, on timers; unset: every request is answered at once. */
  timing?: StepTiming;
  close(): Promise<void>;
}

/** One step of a batching engine: stepMs + kvMs × the decoding requests' resident tokens + seqMs × their number,
 *  plus prefillMs + prefillPerTokenMs × prompt tokens when the step admits requests (their prefill). */
export interface StepTiming {
  stepMs: number;
  kvMs: number;
  seqMs: number;
  prefillMs: number;
  prefillPerTokenMs: number;
  admitPerStep?: number; // requests a step may prefill (default: all waiting), as a chunked prefill spreads them
}

// Requests that arrive join at the next step, whose prefill gives their first token; each later step gives every
// running request one more. A step ends at the previous one's end plus its own time, however late its timer fires,
// so the lateness of timers on a loaded machine does not add up over a run.
function batchingEngine(timing: () => StepTiming) {
  type Req = { tokens: number; left: number; done: () => void };
  let running: Req[] = [];
  const waiting: Req[] = [];
  let end = 0; // when the current step ends (performance.now()); 0 while idle
  const step = () => {
    const t = timing();
    const fresh = waiting.splice(0, t.admitPerStep ?? waiting.length);
    let ms = t.stepMs + t.kvMs * running.reduce((a, r) => a + r.tokens, 0) + t.seqMs * running.length;
    if (fresh.length) ms += t.prefillMs + t.prefillPerTokenMs * fresh.reduce((a, r) => a + r.tokens, 0);
    end += ms;
    setTimeout(() => {
      running.push(...fresh);
      for (const r of running) {
        r.tokens++;
        if (--r.left === 0) r.done();
      }
      running = running.filter((r) => r.left > 0);
      if (running.length || waiting.length) step();
      else end = 0;
    }, end - performance.now());
  };
  return (promptTokens: number, newTokens: number, done: () => void) => {
    if (newTokens === 0) return done();
    waiting.push({ tokens: promptTokens, left: newTokens, done });
    if (end === 0) {
      end = performance.now();
      step();
    }
  };
}

// One engine rank in a real process group (gloo), started on the first init request.
class GroupRank {
  private readonly child: ChildProcess;
  private readonly replies: ((line: string) => void)[] = [];

  constructor() {
    this.child = spawn(findPython(), [join(PYTHON_DIR, 'tests', 'fake_engine_rank.py')], {
      env: { ...process.env, PYTHONPATH: PYTHON_DIR },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    createInterface({ input: this.child.stdout! }).on('line', (l) => this.replies.shift()?.(l));
  }

  ask(req: Record<string, unknown>): Promise<Record<string, unknown>> {
    return new Promise((res) => {
      this.replies.push((l) => res(JSON.parse(l)));
      this.child.stdin?.write(`${JSON.stringify(req)}\n`);
    });
  }

  close(): void {
    this.child.kill('SIGKILL');
  }
}

export const OUT = [11, 12, 13];

/** A deterministic SGLang's sample for a seed: reproducible, and another seed draws other ids. */
export function seededSample(seed: number, input: number[]): number[] {
  let h = (seed * 2654435761 + input.length) >>> 0;
  return OUT.map(() => {
    h = (h * 1103515245 + 12345) >>> 0;
    return 20 + (h % 200);
  });
}
export const LPS = [-0.1, -0.2, -0.3];

function generateBody(
  api: Api,
  mode: Mode,
  ids: number[],
  cut: boolean,
  cached?: number,
  body: Record<string, unknown> = {},
): unknown {
  if (mode === 'abort') ids = ids.slice(0, 1);
  const lps = ids.map((_, i) => LPS[i] ?? -0.5);
  if (api === 'sglang') {
    return {
      text: 'abc',
      output_ids: ids,
      meta_info: {
        ...(cached === undefined ? {} : { cached_tokens: cached }),
        output_token_logprobs: ids.map((id, i) => [lps[i], id, null]),
        finish_reason:
          mode === 'abort'
            ? { type: 'abort', message: 'Abort in waiting queue' }
            : cut
              ? { type: 'length', length: ids.length }
              : { type: 'stop', matched: ids.at(-1) },
      },
    };
  }
  if (api === 'vllm') {
    // CompletionResponse as model_dump() writes it (server-specs.ts): nothing that was not asked for, every unasked
    // field null: token_ids and prompt_token_ids only with return_token_ids, logprobs only with logprobs (an int),
    // their tokens as token_id:N only with return_tokens_as_token_ids (else the decoded text); top_logprobs holds
    // the sampled token and the `logprobs` best ones (logprobs 0: the sampled token alone)
    const tokens = ids.map((i) => (body.return_tokens_as_token_ids ? `token_id:${i}` : `<${i}>`));
    const logprobs =
      typeof body.logprobs === 'number'
        ? {
            text_offset: tokens.map((_, i) => tokens.slice(0, i).join('').length),
            token_logprobs: lps,
            tokens,
            top_logprobs: tokens.map((t, i) => ({ [t]: lps[i] })),
          }
        : null;
    const prompt = body.prompt as number[];
    return {
      id: 'cmpl-fake',
      object: 'text_completion',
      created: 0,
      model: body.model,
      choices: [
        {
          index: 0,
          text: 'abc',
          logprobs,
          finish_reason: mode === 'abort' ? 'abort' : cut ? 'length' : 'stop',
          stop_reason: null,
          token_ids: body.return_token_ids ? ids : null,
          prompt_logprobs: null,
          prompt_token_ids: body.return_token_ids ? prompt : null,
        },
      ],
      service_tier: null,
      system_fingerprint: null,
      usage: {
        prompt_tokens: prompt.length,
        total_tokens: prompt.length + ids.length,
        completion_tokens: ids.length,
        prompt_tokens_details: cached === undefined ? null : { cached_tokens: cached },
      },
      kv_transfer_params: null,
    };
  }
  return {
    content: 'abc',
    tokens: ids,
    stop: true,
    stop_type: mode === 'abort' ? 'none' : cut ? 'limit' : 'eos',
    completion_probabilities: ids.map((id, i) => ({ id, token: 'x', logprob: lps[i], bytes: [] })),
  };
}

// SGLang's checks, in the order a request meets them (tokenizer_manager._validate_one_request, then the scheduler's
// validate_input_length), as HTTP 400 {error: {message}}. The total check is older builds' (>=; newer ones refuse
// only >). max_req_len is min(context − 1, KV pool − 1); the scheduler takes prompts below max_req_len − 5 and
// silently clamps max_new_tokens to max_req_len − prompt − 1.
function sglangCheck(f: Fake, prompt: number, maxNew: number): { refusal?: string; maxNew: number } {
  const ctx = f.context;
  const input = prompt + (f.draftTokens ?? 0);
  if (input >= ctx)
    return {
      refusal: `The input (${input} tokens) is longer than the model's context length (${ctx} tokens).`,
      maxNew,
    };
  if (input + maxNew >= ctx) {
    const refusal =
      `Requested token count exceeds the model's maximum context length of ${ctx} tokens. You requested a total ` +
      `of ${input + maxNew} tokens: ${input} tokens from the input messages and ${maxNew} tokens for the ` +
      'completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.';
    return { refusal, maxNew };
  }
  const maxReqLen = Math.min(ctx - 1, SGLANG_POOL / f.dp - 1);
  if (prompt >= maxReqLen - 5) {
    const refusal =
      `Input length (${prompt} tokens) exceeds the maximum allowed length (${maxReqLen - 5} tokens). ` +
      'Use a shorter input or enable --allow-auto-truncate.';
    return { refusal, maxNew };
  }
  return { maxNew: Math.min(maxNew, maxReqLen - prompt - 1) };
}

// vLLM's serving layer (_validate_input) and SamplingParams, as HTTP 400 {error: {message, type, param, code}}.
function vllmRefusal(f: Fake, prompt: number, maxTokens: number): string | undefined {
  if (maxTokens < 1) return `max_tokens must be at least 1, got ${maxTokens}.`;
  if (prompt + maxTokens > f.context)
    return (
      `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ` +
      `${f.context} tokens and your request has ${prompt} input tokens (${maxTokens} > ${f.context} - ${prompt}).`
    );
  return undefined;
}

const SGLANG_POOL = 123456;

export const GEN_PATH: Record<Api, string> = {
  sglang: '/generate',
  vllm: '/v1/completions',
  llamacpp: '/completion',
};

export async function fakeServer(api: Api, spec?: ServerSpec, port = 0): Promise<Fake> {
  const f: Partial<Fake> &
    Pick<
      Fake,
      | 'modes'
      | 'requests'
      | 'load'
      | 'dp'
      | 'dead'
      | 'received'
      | 'context'
      | 'publishesContext'
      | 'spec'
      | 'deterministic'
      | 'dtypeArg'
      | 'devMode'
      | 'logprobsMode'
      | 'dtype'
      | 'modelPath'
      | 'reloads'
    > = {
    modes: [],
    requests: [],
    load: { used: 1500, running: 3, waiting: 1 },
    dp: 1,
    dead: false,
    received: [],
    context: 32768,
    publishesContext: true,
    spec: spec ?? (api === 'vllm' ? VLLM_MAIN : SGLANG_MAIN),
    deterministic: false,
    dtypeArg: 'auto',
    devMode: true,
    logprobsMode: 'raw_logprobs',
    dtype: 'bfloat16',
    modelPath: 'tiny-model',
    reloads: [],
  };
  const enqueue = batchingEngine(() => f.timing as StepTiming);
  let rank: GroupRank | undefined;
  let outDir: string | undefined;
  // SGLang's /init_weights_update_group and /update_weights_from_distributed bodies (vLLM: the same fields
  // as the extension's one JSON argument), answered as SGLang does: {success, message}, HTTP 400 on failure
  const group = async (op: 'init' | 'update', body: Record<string, unknown>) => {
    if (op === 'init' && f.failInit) return { success: false, message: 'init failed (test)' };
    rank ??= new GroupRank();
    if (op === 'init') return rank.ask({ op, ...body });
    outDir ??= mkdtempSync(join(tmpdir(), 'rstar2-fake-engine-'));
    const out = join(outDir, `update-${f.received.length + 1}.safetensors`);
    const free = api === 'sglang' && f.freeBytes !== undefined ? { free_bytes: f.freeBytes } : {};
    const r = await rank.ask({ op, ...body, out, ...free });
    if (r.success) f.received.push(out);
    return r;
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      if (f.dead) return req.socket.destroy();
      const body = raw ? (JSON.parse(raw) as Record<string, unknown>) : {};
      const path = req.url ?? '';
      f.requests.push({ path, body });
      const json = (code: number, o: unknown) => {
        res.writeHead(code, { 'content-type': 'application/json' });
        res.end(JSON.stringify(o));
      };
      const route = path.split('?')[0];
      const sp = f.spec;
      // routes another version serves and this one does not, as each answers them: SGLang's HTTPException handler
      // writes its ErrorResponse, vLLM leaves FastAPI's own
      const absent =
        (api === 'sglang' &&
          ((['/server_info', '/get_server_info'].includes(route) &&
            !(sp.infoRoutes ?? []).includes(route as '/server_info')) ||
            (['/v1/loads', '/get_load'].includes(route) &&
              !(sp.loadRoutes ?? []).includes(route as '/get_load')))) ||
        (api === 'vllm' && !f.devMode && (sp.devRoutes ?? []).includes(route));
      if (absent)
        return api === 'sglang'
          ? json(404, { object: 'error', message: 'Not Found', type: '404', param: null, code: 404 })
          : json(404, { detail: 'Not Found' });
      if (path === GEN_PATH[api] && api === 'sglang') {
        // SamplingParams(**sampling_params): an unknown keyword is a TypeError, which /generate does not catch
        const unknown = Object.keys((body.sampling_params as object) ?? {}).filter(
          (k) => !(sp.samplingKeys ?? []).includes(k),
        );
        if (unknown.length) {
          res.writeHead(500, { 'content-type': 'text/plain' });
          return res.end('Internal Server Error');
        }
      }
      if (path === GEN_PATH[api] && api === 'vllm' && sp.maxTemperature !== undefined) {
        const t = Number(body.temperature ?? 1);
        if (t > sp.maxTemperature)
          return json(400, {
            error: {
              message: `temperature must be in [0, ${sp.maxTemperature}], got ${t}.`,
              type: 'BadRequestError',
              param: 'temperature',
              code: 400,
            },
          });
      }
      if (path === GEN_PATH[api]) {
        const mode = f.modes.shift() ?? 'ok';
        if (mode === 'drop') return req.socket.destroy();
        if (mode === '503') return json(503, { error: 'overloaded' });
        if (mode === '400') return json(400, { error: 'bad request: input too long' });
        const input = (api === 'sglang' ? body.input_ids : body.prompt) as number[];
        let maxNew = Number(
          api === 'sglang'
            ? (body.sampling_params as Record<string, unknown>).max_new_tokens
            : api === 'vllm'
              ? body.max_tokens
              : body.n_predict,
        );
        if (api === 'sglang') {
          const c = sglangCheck(f as Fake, input.length, maxNew);
          if (c.refusal) return json(400, { error: { message: c.refusal } });
          maxNew = c.maxNew;
        }
        const refusal = api === 'vllm' ? vllmRefusal(f as Fake, input.length, maxNew) : undefined;
        if (refusal)
          return json(400, {
            error: { message: refusal, type: 'BadRequestError', param: 'max_tokens', code: 400 },
          });
        // SGLang reads sampling_seed only under --enable-deterministic-inference: then the seed decides the sample
        const seed =
          api === 'sglang' ? (body.sampling_params as Record<string, unknown>).sampling_seed : undefined;
        const sampled =
          f.sample?.(input) ??
          (typeof seed === 'number' && f.deterministic ? seededSample(seed, input) : OUT);
        // ignore_eos: the model goes on past its own end, up to max new tokens
        const ignoreEos =
          (api === 'sglang'
            ? (body.sampling_params as Record<string, unknown>).ignore_eos
            : body.ignore_eos) === true;
        const ids = ignoreEos
          ? Array.from({ length: maxNew }, (_, i) => sampled[i] ?? 7)
          : sampled.slice(0, maxNew);
        const cut = ignoreEos || ids.length < sampled.length;
        const reply = () => json(200, generateBody(api, mode, ids, cut, f.cached, body));
        if (f.timing) return enqueue(input.length, ids.length, reply);
        return void (mode === 'slow' ? setTimeout(reply, 400) : reply());
      }
      // with 2 ranks: 2/3 of each count on rank 0, the rest on rank 1, all waiting on rank 0
      const share = (k: number, rank: number) => {
        if (f.dp === 1) return k;
        const first = Math.round((k * 2) / 3);
        return rank === 0 ? first : k - first;
      };
      const ranks = Array.from({ length: f.dp }, (_, r) => r);
      if (api === 'sglang' && (sp.infoRoutes ?? []).includes(route as '/server_info')) {
        // as the DP controller answers: rank 0's pool, not the sum
        const maxReqLen = Math.min(f.context - 1, SGLANG_POOL / f.dp - 1);
        return json(200, {
          version: sp.version,
          dtype: f.dtypeArg,
          // a ServerArgs field from v0.5.3rc2, with sampling_seed
          ...((sp.samplingKeys ?? []).includes('sampling_seed')
            ? { enable_deterministic_inference: f.deterministic }
            : {}),
          mem_fraction_static: 0.88,
          model_path: 'x',
          context_length: null, // the --context-length server arg, unset
          max_total_num_tokens: SGLANG_POOL / f.dp,
          ...(f.publishesContext ? { max_req_input_len: maxReqLen - 5 } : {}),
          ...(f.draftTokens
            ? { speculative_algorithm: 'EAGLE', speculative_num_draft_tokens: f.draftTokens }
            : { speculative_algorithm: null }),
          tp_size: 1,
          dp_size: f.dp,
          page_size: 16,
          internal_states: [{ load: 0 }],
        });
      }
      if (path === '/v1/models') {
        const id = api === 'sglang' ? 'x' : 'tiny-model';
        const card = {
          id,
          object: 'model',
          root: api === 'vllm' ? f.modelPath : id,
          ...(f.publishesContext ? { max_model_len: f.context } : {}),
        };
        // vLLM's card of a LoRA adapter carries no max_model_len and names the base model as its parent
        const lora = f.lora ? [{ id: f.lora, object: 'model', root: '/adapters/a', parent: id }] : [];
        return json(200, { object: 'list', data: [card, ...lora] });
      }
      if (api === 'sglang' && route === '/get_load') {
        const { used, running, waiting } = f.load;
        // before 0.5.3rc0 (tokenizer_manager.get_load): {load} of rank 0 alone
        if (sp.getLoad === 'load') return json(200, { load: share(used, 0) });
        // 0.5.3rc0 to 0.5.10: a GetLoadReqOutput per DP rank, num_reqs counting the waiting ones too; main's shim
        // over /v1/loads has the same rows with num_pending_tokens and ts_tic
        return json(
          200,
          ranks.map((r) => {
            const w = r === 0 ? waiting : 0;
            const row = {
              dp_rank: r,
              num_reqs: share(running, r) + w,
              num_waiting_reqs: w,
              num_tokens: share(used, r),
            };
            return sp.getLoad === 'shim'
              ? { ...row, num_pending_tokens: 0, ts_tic: 1.5 }
              : { rid: null, ...row };
          }),
        );
      }
      if (api === 'sglang' && route === '/v1/loads') {
        const { used, running, waiting } = f.load;
        // main (v1_loads.py, load_snapshot.py): with include=core, each rank's flat fields only
        return json(200, {
          timestamp: '2026-08-16T00:00:00+00:00',
          version: sp.version,
          accelerator: 'NVIDIA H100 80GB HBM3',
          num_accelerators: 1,
          loads: ranks.map((r) => {
            const w = r === 0 ? waiting : 0;
            const tokens = share(used, r);
            return {
              timestamp: 1.5,
              dp_rank: r,
              num_running_reqs: share(running, r),
              num_waiting_reqs: w,
              num_waiting_uncached_tokens: 0,
              num_used_tokens: tokens,
              num_total_tokens: tokens,
              num_active_tokens: tokens,
              max_total_num_tokens: SGLANG_POOL / f.dp,
              max_running_requests: 1024,
              token_usage: tokens / (SGLANG_POOL / f.dp),
              gen_throughput: 0,
              cache_hit_rate: 0,
              utilization: 0,
              total_prefill_uncached_tokens: 0,
              total_prefill_busy_us: 0,
              decode_moments: null,
            };
          }),
        });
      }
      if (api === 'sglang' && path === '/update_weights_from_disk') {
        // SGLang loads the directory's weights (model_runner.update_weights_from_disk), answering 400 when it cannot
        const dir = String(body.model_path ?? '');
        const file = join(dir, 'model.safetensors');
        if (!existsSync(join(dir, 'config.json')) || !existsSync(file))
          return json(400, {
            success: false,
            message: `Failed to get weights iterator: ${dir} (repository not found).`,
            num_paused_requests: 0,
          });
        f.reloads.push(createHash('sha256').update(readFileSync(file)).digest('hex'));
        return json(200, {
          success: true,
          message: 'Succeeded to update model weights.',
          num_paused_requests: 0,
        });
      }
      if (api === 'vllm' && path === '/metrics') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        // one sample per engine core, each core with its own pool (vLLM V1 under data parallelism)
        const blocks = 1000 / f.dp;
        return res.end(
          [
            '# HELP vllm:cache_config_info info',
            ...ranks.map(
              (r) => `vllm:cache_config_info{block_size="16",engine="${r}",num_gpu_blocks="${blocks}"} 1.0`,
            ),
            ...ranks.map(
              (r) =>
                `vllm:kv_cache_usage_perc{engine="${r}",model_name="tiny-model"} ${share(f.load.used, r) / (blocks * 16)}`,
            ),
            ...ranks.map(
              (r) =>
                `vllm:num_requests_running{engine="${r}",model_name="tiny-model"} ${share(f.load.running, r)}.0`,
            ),
            ...ranks.map(
              (r) =>
                `vllm:num_requests_waiting{engine="${r}",model_name="tiny-model"} ${r === 0 ? f.load.waiting : 0}.0`,
            ),
          ].join('\n'),
        );
      }
      if (api === 'sglang' && path === '/init_weights_update_group')
        return void group('init', body).then((r) => json(r.success ? 200 : 400, r));
      if (api === 'sglang' && path === '/update_weights_from_distributed') {
        const missing = (sp.weightFields ?? []).filter((k) => !(k in body));
        if (missing.length)
          return json(400, { object: 'error', message: `missing fields: ${missing.join(', ')}`, code: 400 });
        return void group('update', body).then((r) => json(r.success ? 200 : 400, r));
      }
      if (api === 'vllm' && route === '/version') return json(200, { version: sp.version });
      if (api === 'vllm' && route === '/server_info') {
        // the pydantic JSON dump (fallback=str writes a torch.dtype as 'torch.bfloat16'), or str(VllmConfig),
        // which names the dtype and context but not the logprobs mode; before 0.11.0 only the text
        const model_config = {
          model: 'tiny-model',
          dtype: `torch.${f.dtype}`,
          logprobs_mode: f.logprobsMode,
          max_model_len: f.context,
        };
        const asJson =
          sp.serverInfo !== 'text' && new URL(path, 'http://x').searchParams.get('config_format') === 'json';
        const text =
          `model='tiny-model', speculative_config=None, tokenizer='tiny-model', skip_tokenizer_init=False, ` +
          `dtype=torch.${f.dtype}, max_seq_len=${f.context}, tensor_parallel_size=1, seed=0`;
        return json(200, {
          vllm_config: asJson ? { model_config } : text,
          ...(sp.serverInfo === 'json+env' ? { vllm_env: {}, system_env: {} } : {}),
        });
      }
      if (api === 'vllm' && path === '/collective_rpc') {
        const arg = () => JSON.parse((body.args as string[])[0]) as Record<string, unknown>;
        // a worker method that raises comes back from vLLM as HTTP 500
        const rpc = (op: 'init' | 'update') =>
          void group(op, arg()).then((r) => (r.success ? json(200, { results: [r] }) : json(500, r)));
        if (body.method === 'rstar2_weight_sync_ranks') return json(200, { results: [{ rank: 0 }] });
        if (body.method === 'init_weight_update_group') return rpc('init');
        if (body.method === 'update_weights_from_distributed') return rpc('update');
        if (body.method === 'reload_weights') {
          // every worker reloads the --model directory (its model_config), taking no path
          const file = join(f.modelPath, 'model.safetensors');
          if (!existsSync(file))
            return json(500, { error: `FileNotFoundError: no safetensors weights in ${f.modelPath}` });
          f.reloads.push(createHash('sha256').update(readFileSync(file)).digest('hex'));
          return json(200, { results: [null] });
        }
        return json(400, { error: `the fake vLLM has no worker method ${String(body.method)}` });
      }
      if (api === 'vllm' && path === '/reset_prefix_cache') {
        res.writeHead(200);
        return res.end();
      }
      // the liveness route both serve, an empty 200 once the engine is up (SGLang http_server.py, vLLM's serve
      // routers); bench/live-engines.sh waits on it
      if (api !== 'llamacpp' && route === '/health') {
        res.writeHead(200);
        return res.end();
      }
      if (api === 'llamacpp' && path === '/slots') {
        return json(200, [
          { id: 0, n_ctx: 4096, is_processing: true },
          { id: 1, n_ctx: 4096, is_processing: false },
        ]);
      }
      json(404, { error: `no route ${path}` });
    });
  });
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
  f.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  f.close = () =>
    new Promise<void>((r) => {
      rank?.close();
      server.closeAllConnections();
      server.close(() => r());
    });
  return f as Fake;
}

// Engine probe: measures a running SGLang or vLLM server through our own engine clients and writes the samples
// that bench/scheduler-sim.ts --calibrate reads (src/engines/calibrate.ts): one {batch, kv, ms} line per decode
// point, one {tokens, ms} line per prefill, each also naming the engine and the point (the fit ignores those).
//
// Decode step: B concurrent requests, each a fresh random prompt of c token ids (fresh every time, so no prefix
// cache serves any of it), temperature 1 as rollouts sample, ignore_eos so each generates exactly N tokens: once
// with N1 new tokens, once with N2 (--steps). The step is the slope (wall(N2) − wall(N1)) / (N2 − N1), which
// cancels the prefill and the HTTP overheads, at kv = B × (c + (N1 + N2) / 2) resident tokens; each wall is the
// median of --reps. The slope is the whole batch's step only if every request is prefilled before the first has
// N1 tokens: an engine that decodes while it prefills (vLLM's chunked prefill) needs N1 above the steps its
// prefill of B × c tokens takes; a point whose N1 answers came back spread over more than N1 steps did not, and is
// left out and named. A batch above the server's running-request limit (SGLang --max-running-requests, vLLM
// --max-num-seqs) queues: keep B under it. A point whose B × (c + N2) tokens would not fit the KV pool is skipped
// and named. Measure an idle engine: other traffic shares its steps.
// Prefill: one request of a fresh T-token prompt and 1 new token, median wall of --reps. The token comes from the
// prefill pass itself; the HTTP round trip and sampling are in the wall too, and the fit puts them in the base.
//
// Run: npx tsx bench/engine-probe.ts --engine sglang+http://host:30000 (or vllm+URL) [--batches 16,64,256]
//        [--contexts 512,2048,8192] [--prefills 512,2048,8192] [--steps 32,96] [--reps 3]
//        [--vocab-range 1000,30000] [--out engine-samples.jsonl]
// Prints the fitted constants and the scheduler-sim command that uses them, with --comm-ms 0: a whole
// tensor-parallel engine's step includes its all-reduce.
// First it prints what the server says about itself (version, dtype, logprobs mode, whether seeds hold, KV pool)
// and whether the trainer could broadcast weights to it; with --model DIR (the model the run trains) also what each
// sync would send: tensors, bytes in weightSync.dtype (--sync-dtype, default auto) and update calls of at most
// --bucket-mib.
import { appendFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fitEngineModel, parseSamples } from '../src/engines/calibrate.js';
import { remoteEngine } from '../src/engines/factory.js';
import { type ContextLimit, room } from '../src/engines/http.js';
import type { SGLangEngine } from '../src/engines/sglang.js';
import { DEFAULT_SAMPLING, type EngineLoad } from '../src/engines/types.js';
import type { VllmEngine } from '../src/engines/vllm.js';
import { reportLine } from '../src/recipe/engine-check.js';
import {
  broadcastPlan,
  modelWeights,
  resolveSyncDtype,
  SYNC_DTYPES,
  syncPlan,
} from '../src/recipe/weight-sync.js';
import { benchArgs, median } from './args.js';

const { values: args } = benchArgs(import.meta.url, {
  options: {
    engine: { type: 'string' },
    batches: { type: 'string', default: '16,64,256' },
    contexts: { type: 'string', default: '512,2048,8192' },
    prefills: { type: 'string', default: '512,2048,8192' },
    steps: { type: 'string', default: '32,96' },
    reps: { type: 'string', default: '3' },
    'vocab-range': { type: 'string', default: '1000,30000' },
    out: { type: 'string', default: 'engine-samples.jsonl' },
    model: { type: 'string' },
    'sync-dtype': { type: 'string', default: 'auto' },
    'bucket-mib': { type: 'string', default: '512' },
  },
});

function refuse(message: string): never {
  console.error(`engine-probe: ${message}`);
  process.exit(2);
}

function ints(flag: keyof typeof args, min: number): number[] {
  const xs = String(args[flag]).split(',').map(Number);
  if (!xs.every((x) => Number.isInteger(x) && x >= min))
    refuse(`--${flag}: integers ≥ ${min} separated by commas, not '${args[flag]}'`);
  return xs;
}

const batches = ints('batches', 1);
const contexts = ints('contexts', 1);
const prefills = ints('prefills', 1);
const [n1, n2, ...moreSteps] = ints('steps', 1);
if (n2 === undefined || moreSteps.length > 0 || n2 <= n1)
  refuse(`--steps: two new-token counts N1,N2 with N1 < N2, not '${args.steps}'`);
const [reps] = ints('reps', 1);
const [vocabLo, vocabHi, ...moreVocab] = ints('vocab-range', 0);
if (vocabHi === undefined || moreVocab.length > 0 || vocabHi <= vocabLo)
  refuse(`--vocab-range: LO,HI token ids with LO < HI, not '${args['vocab-range']}'`);
const spec = args.engine ?? refuse('--engine sglang+URL or vllm+URL is required');
if (!/^(sglang|vllm)\+/.test(spec))
  refuse(`--engine '${spec}': the probe measures SGLang or vLLM servers (sglang+URL, vllm+URL)`);
const out = args.out as string;
const syncSetting = args['sync-dtype'] as (typeof SYNC_DTYPES)[number];
if (!SYNC_DTYPES.includes(syncSetting))
  refuse(`--sync-dtype: one of ${SYNC_DTYPES.join(', ')}, not '${syncSetting}'`);
const [bucketMiB] = ints('bucket-mib', 1);
const modelDir = args.model as string | undefined;
if (modelDir && !existsSync(join(modelDir, 'config.json'))) refuse(`--model ${modelDir}: no config.json`);

// no retries: a repeated request would add its first attempt's time to the wall
let engine: SGLangEngine | VllmEngine;
try {
  engine = remoteEngine(spec, { retries: 0 }) as SGLangEngine | VllmEngine;
} catch (e) {
  refuse((e as Error).message);
}
let load: EngineLoad;
let limit: ContextLimit | undefined;
try {
  const report = await engine.describe();
  console.log(reportLine(engine.name, report));
  for (const n of report.notes) console.log(`  ${n}`);
  load = report.kv;
  limit = await engine.context();
  const config = modelDir ? JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8')) : undefined;
  const dtype = resolveSyncDtype(syncSetting, config, [report.dtype]);
  const plan = await broadcastPlan([engine], 'nccl', dtype);
  let sync = 'ranks' in plan ? `broadcast to its ${plan.ranks[0]} rank(s) in ${dtype}` : `disk (${plan.why})`;
  if (config && 'ranks' in plan) {
    const p = syncPlan(modelWeights(config, dtype, modelDir), bucketMiB * 2 ** 20);
    const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
    sync += `: ${p.tensors} tensors, ${mib(p.bytes)}, ${p.buckets} update call(s) of at most ${bucketMiB} MiB (largest ${mib(p.largestBucket)})`;
  }
  console.log(`weight sync: ${sync}`);
} catch (e) {
  refuse(`cannot read the server at ${engine.url}: ${(e as Error).message}`);
}
const capacity = load.capacityTokens;
const block = load.blockTokens ?? 1; // the pool holds whole blocks
const kvNeed = (batch: number, tokens: number) => batch * Math.ceil(tokens / block) * block;

const contextText = limit
  ? `context ${limit.tokens} tokens${limit.maxInput === undefined ? '' : ` (prompts under ${limit.maxInput})`}`
  : 'context not published';
for (const c of contexts)
  if (room(limit, c, n2) < n2)
    refuse(`--contexts ${c}: ${c} + ${n2} new tokens do not fit the model's ${contextText} at ${engine.url}`);
for (const t of prefills)
  if (room(limit, t, 1) < 1)
    refuse(`--prefills ${t}: ${t} + 1 new token do not fit the model's ${contextText} at ${engine.url}`);

const sampling = { ...DEFAULT_SAMPLING, ignoreEos: true };
const prompt = (tokens: number) =>
  Array.from({ length: tokens }, () => vocabLo + Math.floor(Math.random() * (vocabHi - vocabLo)));

/** `batch` concurrent requests of fresh `context`-token prompts, each generating exactly `n` tokens: the wall
 *  ms, and the ms between the first request's answer and the last's. */
async function run(batch: number, context: number, n: number): Promise<{ ms: number; spread: number }> {
  const prompts = Array.from({ length: batch }, () => prompt(context));
  const t0 = performance.now();
  const ends: number[] = [];
  const rs = await Promise.all(
    prompts.map((p) =>
      engine.generate(p, { ...sampling, maxNewTokens: n }).then((r) => {
        ends.push(performance.now());
        return r;
      }),
    ),
  );
  for (const r of rs) {
    if (r.error) refuse(`${engine.name}: ${r.error}`);
    if (r.outputIds.length !== n)
      refuse(
        `${engine.name} generated ${r.outputIds.length} tokens, asked for ${n}: does it honour ignore_eos?`,
      );
  }
  return { ms: ends[ends.length - 1] - t0, spread: ends[ends.length - 1] - ends[0] };
}

const record = (o: Record<string, number | string>) => appendFileSync(out, `${JSON.stringify(o)}\n`);
writeFileSync(out, '');
console.log(
  `engine-probe: ${engine.name}, KV pool ${capacity} tokens (blocks of ${block}), ${contextText}; ` +
    `decode steps = (wall(${n2}) − wall(${n1})) / ${n2 - n1} over B concurrent fresh prompts; ` +
    `prefill = wall of 1 request with 1 new token (its HTTP round trip and sampling included); medians of ${reps}; → ${out}`,
);
if (load.running || load.queued)
  console.log(`warning: the engine is not idle (${load.running ?? 0} running, ${load.queued ?? 0} queued)`);
await run(1, 16, 2); // first request: connections, model name

const skipped: string[] = [];
const misread: string[] = [];
for (const b of batches) {
  for (const c of contexts) {
    const need = kvNeed(b, c + n2);
    if (need > capacity) {
      skipped.push(`batch ${b} × context ${c} (${need} KV tokens)`);
      continue;
    }
    const r1: { ms: number; spread: number }[] = [];
    const w2: number[] = [];
    for (let r = 0; r < reps; r++) {
      r1.push(await run(b, c, n1));
      w2.push((await run(b, c, n2)).ms);
    }
    const ms = (median(w2) - median(r1.map((r) => r.ms))) / (n2 - n1);
    const kv = Math.round(b * (c + (n1 + n2) / 2));
    const point = `batch ${b} × context ${c}`;
    // answers spread over more than N1 steps: the first request finished before the last was prefilled (an engine
    // that decodes while it prefills, as vLLM's chunked prefill does), so the slope read a smaller batch than B
    const spread = median(r1.map((r) => r.spread));
    if (!(ms > 0) || spread > n1 * ms) {
      misread.push(point);
      console.log(
        `${point}: left out, ${ms > 0 ? `answers spread over ${(spread / ms).toFixed(0)} steps, more than N1` : 'no slope'}`,
      );
      continue;
    }
    record({ batch: b, kv, ms, engine: spec, context: c, n1, n2 });
    console.log(`${point}: ${ms.toFixed(3)} ms per step at ${kv} KV tokens`);
  }
}
if (skipped.length) console.log(`skipped, over the KV pool of ${capacity} tokens: ${skipped.join(', ')}`);
if (misread.length)
  console.log(
    `left out, not measured at their whole batch: ${misread.join(', ')}; a larger N1 (--steps) measures them ` +
      '(vLLM chunk-prefills B × c tokens in ≈ B × c ÷ max_num_batched_tokens steps, decoding the while)',
  );

for (const t of prefills) {
  if (kvNeed(1, t + 1) > capacity) {
    console.log(`prefill ${t}: skipped, over the KV pool of ${capacity} tokens`);
    continue;
  }
  const ws: number[] = [];
  for (let r = 0; r < reps; r++) ws.push((await run(1, t, 1)).ms);
  record({ tokens: t, ms: median(ws), engine: spec });
  console.log(`prefill ${t} tokens: ${median(ws).toFixed(2)} ms`);
}
await engine.close();

// fitted from the file as written: what --calibrate will read
const { steps, prefills: pre } = parseSamples(readFileSync(out, 'utf8'));
try {
  const m = fitEngineModel(steps, pre);
  const misfit = Math.max(
    ...steps.map((s) => Math.abs(m.stepBaseMs + m.kvMsPerToken * s.kv + m.seqMs * s.batch - s.ms) / s.ms),
  );
  console.log(
    `fit: step ${m.stepBaseMs.toFixed(3)} ms + ${(m.kvMsPerToken * 1e6).toFixed(2)} ns/KV token + ` +
      `${(m.seqMs * 1000).toFixed(2)} µs/seq (within ${(misfit * 100).toFixed(1)} % of every decode point); ` +
      `prefill ${m.prefillBaseMs.toFixed(3)} ms + ${(m.prefillMsPerToken * 1000).toFixed(3)} µs/token`,
  );
  console.log(
    `simulate with them: npx tsx bench/scheduler-sim.ts --calibrate ${out} --comm-ms 0 ` +
      `(a --regime whose engine count and KV pool are like yours; this engine's pool: ${capacity} tokens)`,
  );
} catch (e) {
  console.log(
    `no fit: ${(e as Error).message} (it needs ≥ 3 decode points varying in batch and KV, ≥ 2 prefills)`,
  );
}

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type AgentTemplate, agentTemplate } from '../agent/index.js';
import { type SftRenderer, sftRenderer, toolUse, unservedToolsWarning } from '../data/index.js';
import type { WeightSyncEngine } from '../engines/index.js';
import { SandboxPool } from '../sandbox/index.js';
import { ChatTemplate, type Tokenizer, tokenizerFromFiles } from '../tokenizer/index.js';
import { readJson } from '../util/jsonl.js';
import { MODEL_PRESETS, type ModelConfig, parameterCount, plan } from '../worker/index.js';
import { type Recipe, type RlStageConfig, recipeTool, recipeTools, type SftStageConfig } from './config.js';
import { rowFilters, sectionExamples, sectionProblems } from './data.js';
import { checkEngines, reportLine } from './engine-check.js';
import { recipeTokenizerFiles } from './policy.js';
import {
  broadcastPlan,
  modelWeights,
  resolveSyncDtype,
  syncPlan,
  type WeightSyncMode,
} from './weight-sync.js';

// `rstar2 train --dry-run`: everything a run needs is opened and checked, nothing is trained. Each problem found
// is an error that names the file, row and field, so a long run does not die on it an hour in.

export { parameterCount };

export interface DryRunOptions {
  engines?: WeightSyncEngine[];
  weightSync?: WeightSyncMode;
  insecureSandbox?: boolean;
  log?: (line: string) => void;
}

const gb = (bytes: number) => `${(bytes / 2 ** 30).toFixed(bytes < 2 ** 30 ? 3 : 1)} GiB`;

/** Memory per rank as the recipe's model section trains it: `rstar2 plan`'s accounting (worker/plan.ts) for its
 *  precision, sharding, ranks, micro-batch tokens and checkpointing. */
export function memoryPlan(c: ModelConfig & Record<string, unknown>, m: Recipe['model']): string[] {
  const p = parameterCount(c);
  const sharding = m.sharding === 'ddp' ? 'ddp' : m.offloadOptimizer ? 'fsdp-offload' : 'fsdp';
  // padded micro-batches have no fixed size; 8192 tokens stands for one
  const tokens = m.maxTokensPerMicroBatch ?? 8192;
  const row = plan({ config: c, gpus: m.nprocPerNode, gpuMemGiB: 1, maxTokens: tokens }).find(
    (r) => r.precision === m.precision && r.sharding === sharding,
  )!;
  const total = m.gradientCheckpointing ? row.total.ckpt : row.total.full;
  return [
    `model: ${c.model_type}, ${(p / 1e6).toFixed(2)}M parameters, vocab ${c.vocab_size}`,
    `  per rank (${m.precision}, ${sharding} over ${m.nprocPerNode}): weights ${gb(row.weights)} + gradients ${gb(row.grads)} + ` +
      `AdamW state ${gb(row.optimizer)}${row.workingSet ? ` + gathered ${gb(row.workingSet)}` : ''}${row.cpu ? ` (host: ${gb(row.cpu)})` : ''}`,
    `  in all, with the activations of a ${tokens}-token micro-batch${m.maxTokensPerMicroBatch ? '' : ' (padded: its size depends on the data)'}` +
      `${m.gradientCheckpointing ? ', checkpointed per layer' : ''}: ${gb(total)} (\`rstar2 plan\` compares layouts)`,
  ];
}

export async function dryRun(recipe: Recipe, opts: DryRunOptions = {}): Promise<void> {
  const log = opts.log ?? ((l: string) => console.log(l));
  const dirConfig = checkModelDir(recipe, log);
  const tokenizer = tokenizerFromFiles(await recipeTokenizerFiles(recipe));
  const t = recipe.tokenizer.template;
  const chat = t === 'model' ? ChatTemplate.fromTokenizer(tokenizer) : ChatTemplate.named(t);
  const tools = recipeTools(recipe);
  const prompts: Prompts = {
    tokenizer,
    template: agentTemplate(tokenizer, { chat, tools }),
    sft: sftRenderer({
      rl: chat,
      tokenizer,
      rolloutTools: tools,
      toolCallStyle: recipe.tokenizer.toolCallStyle,
    }),
  };
  log(
    `tokenizer: vocab ${tokenizer.vocabSize}${recipe.model.path ? ' (from the model directory)' : ` (${recipe.tokenizer.kind}, preset)`}; template ${t}`,
  );
  const config =
    dirConfig ?? ({ ...MODEL_PRESETS[recipe.model.preset], vocab_size: tokenizer.vocabSize } as ConfigJson);
  for (const l of memoryPlan(config, recipe.model)) log(l);
  await checkData(recipe, prompts, log);
  await checkEngineSync(recipe, opts, config, log);
  await checkSandbox(recipe, opts.insecureSandbox, log);
  log('dry run ok: nothing was trained');
}

/** A model's config.json: the fields the worker reads and any others. */
type ConfigJson = ModelConfig & Record<string, unknown>;

/** model.path's config.json and weights, held to what the worker's load accepts; null for a preset. */
function checkModelDir(recipe: Recipe, log: (l: string) => void): ConfigJson | null {
  const dir = recipe.model.path;
  if (!dir) {
    log(`model: a fresh '${recipe.model.preset}' preset (set model.path=DIR to start from a checkpoint)`);
    return null;
  }
  const cfg = join(dir, 'config.json');
  if (!existsSync(cfg)) throw new Error(`model.path ${dir}: no config.json`);
  const config: ConfigJson = readJson(cfg);
  if (typeof config !== 'object' || config === null || Array.isArray(config))
    throw new Error(`${cfg}: not a model config (a JSON object)`);
  // the worker's own check (policy.py, load), made here so that a dry run does not pass what the run refuses
  const type = config.model_type === undefined ? 'qwen2' : config.model_type;
  if (recipe.model.backend === 'native' && type !== 'qwen2' && type !== 'qwen3')
    throw new Error(
      `${cfg}: model_type '${type}' is not supported by the built-in model (qwen2, qwen3); ` +
        "model.backend 'transformers' loads it with transformers' AutoModelForCausalLM",
    );
  const weights = ['model.safetensors', 'model.safetensors.index.json'].filter((f) =>
    existsSync(join(dir, f)),
  );
  if (weights.length === 0)
    throw new Error(`model.path ${dir}: no weights (model.safetensors or model.safetensors.index.json)`);
  const index = join(dir, 'model.safetensors.index.json');
  if (existsSync(index)) {
    const shards = new Set(
      Object.values(JSON.parse(readFileSync(index, 'utf8')).weight_map as Record<string, string>),
    );
    for (const s of shards)
      if (!existsSync(join(dir, s))) throw new Error(`${index}: names ${s}, which is missing`);
  }
  log(`model: ${dir}`);
  return config;
}

/** How the run turns data into tokens: the tokenizer, the rollout prompt template, the SFT renderer. */
interface Prompts {
  tokenizer: Tokenizer;
  template: AgentTemplate;
  sft: SftRenderer;
}

/** Every stage's rows after each row filter, and its first prompt as the model will see it. */
async function checkData(recipe: Recipe, prompts: Prompts, log: (l: string) => void): Promise<void> {
  if (recipe.eval.files) {
    const ev = await sectionProblems(recipe.eval);
    log(`eval: ${Math.min(ev.length, recipe.eval.n)} problems from ${recipe.eval.files.join(', ')}`);
  } else log(`eval: ${recipe.eval.n} generated problems`);
  for (const st of recipe.stages) {
    if (st.type === 'sft') await checkSftData(recipe, st, prompts.sft, log);
    else if (!st.data.files)
      log(
        `[${st.name}] rl: generated problems (${st.data.kinds.join(', ')}, levels ${st.data.levels.join(', ')})`,
      );
    else await checkRlData(recipe, st, prompts, log);
  }
}

async function checkSftData(
  recipe: Recipe,
  st: SftStageConfig,
  sft: SftRenderer,
  log: (l: string) => void,
): Promise<void> {
  const files = st.data.files;
  if (!files) {
    log(`[${st.name}] sft: ${st.demos} generated demos`);
    return;
  }
  const exs = await sectionExamples(files, st.data.limit);
  // every example rendered as the stage trains it, so a row no template can take fails here, not hours in
  for (const [i, ex] of exs.entries()) {
    try {
      sft.pieces(ex, st.template);
    } catch (e) {
      throw new Error(`[${st.name}] SFT example ${i} of ${files.join(', ')}: ${(e as Error).message}`);
    }
  }
  const first = sft.sequence(exs[0], st.template);
  const trained = first.mask.filter((m) => m === 1).length;
  log(
    `[${st.name}] sft: ${exs.length} chat examples, template ${st.template}; the first ${first.ids.length} tokens, ${trained} trained`,
  );
  const tool = recipeTool(recipe);
  const warning = recipe.tool.enabled ? unservedToolsWarning(toolUse(exs), tool.function.name) : null;
  if (warning) log(`[${st.name}] warning: ${warning}`);
}

async function checkRlData(
  recipe: Recipe,
  st: RlStageConfig,
  { tokenizer, template }: Prompts,
  log: (l: string) => void,
): Promise<void> {
  const all = await sectionProblems(st.data);
  const counts = [`${all.length} rows`];
  const pool = rowFilters(
    all,
    st.data,
    (q) => template.promptIds(q).length,
    (r) => {
      counts.push(`${r.reason}: -${r.dropped} -> ${r.kept.length}`);
    },
  );
  if (pool.length === 0)
    throw new Error(`[${st.name}] no problems left after the row filters (${counts.join('; ')})`);
  log(
    `[${st.name}] rl: ${counts.join('; ')}${st.data.filter === 'unsolved' ? "; then the policy's 'unsolved' pass" : ''}`,
  );
  let ids: number[];
  try {
    ids = template.promptIds(pool[0].question);
  } catch (e) {
    throw new Error(
      `template ${recipe.tokenizer.template} cannot be encoded by this tokenizer: ${(e as Error).message}`,
    );
  }
  log(`[${st.name}] first prompt ${ids.length} tokens: ${JSON.stringify(tokenizer.decode(ids))}`);
}

/** What each engine says about itself, the recipe held to it (as a run holds it), and the weight-sync plan. */
async function checkEngineSync(
  recipe: Recipe,
  opts: DryRunOptions,
  config: ConfigJson,
  log: (l: string) => void,
): Promise<void> {
  const engines = opts.engines ?? [];
  const reports = await checkEngines(engines, recipe, log);
  for (const e of engines) {
    const r = reports.get(e);
    if (r) {
      log(reportLine(e.name, r));
      for (const n of r.notes) log(`  ${n}`);
      continue;
    }
    try {
      const l = await e.load();
      log(`engine ${e.name}: up (${JSON.stringify(l)})`);
    } catch (err) {
      throw new Error(`engine ${e.name} does not answer: ${(err as Error).message}`);
    }
  }
  if (engines.length === 0) return;
  const dtype = resolveSyncDtype(
    recipe.weightSync.dtype,
    config,
    engines.map((e) => reports.get(e)?.dtype),
  );
  const plan = await broadcastPlan(engines, opts.weightSync ?? 'auto', dtype);
  const bucket = recipe.weightSync.bucketMiB * 2 ** 20;
  const p = syncPlan(modelWeights(config, dtype, recipe.model.path), bucket);
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  log(
    'ranks' in plan
      ? `weight sync: nccl broadcast to ${plan.ranks.reduce((a, b) => a + b, 0)} engine rank(s), disk if it fails: ` +
          `${p.tensors} tensors, ${mib(p.bytes)} as ${dtype}, in ${p.buckets} update call(s) of at most ` +
          `${recipe.weightSync.bucketMiB} MiB (largest ${mib(p.largestBucket)}; SGLang holds one call at a time ` +
          'beside its KV pool)'
      : `weight sync: disk (${plan.why})`,
  );
}

/** One call through a one-slot pool started as the run's is: isolation, preload, limits and demotion said. */
async function checkSandbox(recipe: Recipe, insecure: boolean | undefined, log: (l: string) => void) {
  const { preload, demoteAfterMs, memoryMb } = recipe.sandbox;
  const pool = await SandboxPool.start({
    slots: 1,
    isolation: insecure ? 'none' : undefined,
    preload,
    demoteAfterMs,
    memoryMb,
  });
  try {
    const r = await pool.run({ code: 'print(6*7)', timeoutMs: recipe.sandbox.timeoutMs });
    if (r.status !== 'ok' || r.stdout.trim() !== '42')
      throw new Error(`the sandbox does not run code: ${r.status} ${r.stderr.slice(0, 300)}`);
    const failed = pool.info.preloadFailed;
    if (failed.length) throw new Error(`sandbox.preload: preload failed: ${failed.join('; ')}`);
    const loaded = preload.length
      ? `; preloaded ${preload.join(', ')}, zygote ${pool.info.zygoteMb} MiB`
      : '';
    // what the pool does, not what the recipe asked: no per-slot uids or no CAP_SYS_NICE turn it off
    const on = pool.info.demoteAfterMs;
    const demote = on
      ? `; computing calls past ${on} ms demoted${pool.info.demoteSession ? ' with their session' : ''}`
      : `; no demotion${demoteAfterMs ? ' (it needs root with CAP_SYS_NICE)' : ''}`;
    const how = { none: 'NOT isolated', bwrap: 'bubblewrap', landlock: 'Landlock + seccomp, no namespaces' };
    const limits =
      pool.info.limits === 'polling' ? 'memory polled' : `memory and processes held by ${pool.info.limits}`;
    log(`sandbox: ok (${how[pool.info.isolation]}, ${memoryMb} MiB a call, ${limits}${loaded}${demote})`);
  } finally {
    await pool.close();
  }
}

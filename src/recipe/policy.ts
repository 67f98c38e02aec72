import { existsSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { openRolloutStack, type RolloutStack, runRollouts, toRolloutProblem } from '../agent/index.js';
import {
  type ChatExample,
  loadChatExamples,
  loadProblems,
  type SftRenderer,
  type SftTemplate,
  sftRenderer,
  sftTexts,
} from '../data/index.js';
import { EmbeddedEngine, type RolloutStats, type WeightSyncEngine } from '../engines/index.js';
import type { Trajectory } from '../rl/index.js';
import type { CodeRunner } from '../sandbox/index.js';
import {
  buildCharTokenizer,
  ChatTemplate,
  savedChatTemplates,
  saveTokenizer,
  type TemplateName,
  type Tokenizer,
  type TokenizerFiles,
  tokenizerFromFiles,
  trainBpeTokenizer,
} from '../tokenizer/index.js';
import { readJson } from '../util/jsonl.js';
import {
  type LaunchOptions,
  MODEL_PRESETS,
  type ModelConfig,
  PolicyWorker,
  type TrainOptions,
  type TrainSequence,
  type TrainStats,
  type WorkerStartOptions,
} from '../worker/index.js';
import { type Recipe, recipeTools } from './config.js';
import { checkEngines } from './engine-check.js';
import type { HeldoutScore, Policy, RolloutRequest, ScoredItem } from './trainer.js';
import { BroadcastSync, resolveSyncDtype, type SyncDtype, type WeightSyncOptions } from './weight-sync.js';

// The embedded policy: one torch worker both generates (through the agent loop and the KV-budget scheduler)
// and trains, so weights are shared and "sync" is free. Tool calls run in the isolated sandbox pool.
// With remote engines (SGLang, vLLM) the worker only trains; after an RL update (and before a rollout that
// follows any other weight change) the weights are broadcast to every engine (weight-sync.ts), or written to
// `syncDir` and every engine is told to load them from there.

export interface EmbeddedPolicyOptions {
  /** Run tool code without bubblewrap (development only; the pool warns). */
  insecureSandbox?: boolean;
  runner?: CodeRunner; // overrides the sandbox pool (tests)
  log?: (line: string) => void;
  /** Rollout engines that are not this process (they must implement updateWeightsFromDisk). */
  engines?: WeightSyncEngine[];
  /** Where synced weights are written (a HF model directory every engine can read); required with engines. */
  syncDir?: string;
  /** Broadcast sync (`auto` by default): when it is used, and the group's address and backend. */
  weightSync?: WeightSyncOptions;
  /** Rank layout of the policy worker (`rstar2 train --nproc-per-node/--nnodes/--master`); overrides the recipe's. */
  launch?: LaunchOptions;
}

/**
 * tokenizer.json and tokenizer_config.json of a model directory, copied into every checkpoint as they are, with the
 * chat template a chat_template.jinja beside them holds (transformers 5 saves it there only, and reads it first).
 */
function readTokenizerFiles(dir: string): TokenizerFiles {
  const read = (name: string, required: boolean) => {
    const p = join(dir, name);
    if (!existsSync(p)) {
      if (required)
        throw new Error(`model.path ${dir}: no ${name} (the tokenizer comes from the model directory)`);
      return {};
    }
    try {
      return JSON.parse(readFileSync(p, 'utf8'));
    } catch (e) {
      throw new Error(`model.path ${p}: not valid JSON: ${(e as Error).message}`);
    }
  };
  if (!existsSync(dir)) throw new Error(`model.path ${dir}: no such directory`);
  const config = read('tokenizer_config.json', false);
  const saved = savedChatTemplates(dir);
  if (saved !== undefined) config.chat_template = saved;
  return { tokenizerJson: read('tokenizer.json', true), config };
}

/**
 * The text a preset's BPE tokenizer is trained on: every data file the recipe names (SFT turns as rendered,
 * questions and answers), read in order, so the same recipe always builds the same tokenizer.
 */
async function recipeCorpus(recipe: Recipe): Promise<string[]> {
  // the template's own text too (system prompt, tool list), which every prompt carries
  const t = recipe.tokenizer.template;
  const out: string[] = [
    ChatTemplate.named(t === 'model' ? 'rstar2' : t).render([{ role: 'user', content: '' }], {
      tools: recipeTools(recipe),
      addGenerationPrompt: true,
    }),
  ];
  const problems = async (files: string[]) => {
    for (const f of files) for (const p of await loadProblems(f)) out.push(p.question, p.answer ?? '');
  };
  for (const st of recipe.stages) {
    if (!st.data.files)
      throw new Error(
        `tokenizer.kind 'bpe' is trained on the recipe's data files, and stage ${st.name} has none (data.files)`,
      );
    if (st.type === 'rl') await problems(st.data.files);
    else
      for (const f of st.data.files)
        for (const ex of await loadChatExamples(f)) out.push(...sftTexts(ex, recipe.tokenizer.toolCallStyle));
  }
  if (recipe.eval.files) await problems(recipe.eval.files);
  return out;
}

/** The recipe's tokenizer: a model directory's own; the built-in builders are only for presets. */
export async function recipeTokenizerFiles(recipe: Recipe): Promise<TokenizerFiles> {
  const dir = recipe.model.path;
  const template = recipe.tokenizer.template;
  if (!dir && template === 'model')
    throw new Error("tokenizer.template 'model' needs model.path (a model directory with its own template)");
  const tpl = template as TemplateName;
  if (dir) return readTokenizerFiles(dir);
  return recipe.tokenizer.kind === 'bpe'
    ? trainBpeTokenizer(await recipeCorpus(recipe), recipe.tokenizer.vocabSize, { template: tpl })
    : buildCharTokenizer({ template: tpl });
}

/** How the recipe's model section starts worker ranks: node 0's and every other node's ranks alike. */
export function workerStartOptions(m: Recipe['model']): WorkerStartOptions {
  return {
    threads: m.threads,
    precision: m.precision,
    modelImpl: m.backend,
    compile: m.compile,
    ranks: m.nprocPerNode,
    sharding: m.sharding,
    offloadOptimizer: m.offloadOptimizer,
  };
}

interface RemoteSync {
  engines: WeightSyncEngine[];
  broadcast: BroadcastSync;
  dir: string;
  version: number;
  dirty: boolean;
}

/**
 * Whether the assistant turns that answer a tool output are greedy-exact: the turns are the runs of trained tokens
 * (tool turns are masked); the first turn of a multi-turn example is a free choice (answer or call, which call),
 * every later one has one right continuation (the fix after an error, the stdout copied into the answer). A one-turn
 * example is scored on its only turn. `firstTrained` false: the first turn has weight 0, so every run is a later turn.
 */
export function answersExact(mask: number[], argmax: boolean[], firstTrained = true): boolean {
  const turns: boolean[] = [];
  for (const [t, m] of mask.entries()) {
    if (m === 0) continue;
    if (t === 0 || mask[t - 1] === 0) turns.push(true);
    turns[turns.length - 1] &&= argmax[t];
  }
  return (firstTrained && turns.length > 1 ? turns.slice(1) : turns).every(Boolean);
}

/** Remote engines a run trains with must take new weights, and need a directory for a disk sync. */
function checkTrainingEngines(engines: WeightSyncEngine[], opts: EmbeddedPolicyOptions): void {
  if (engines.length === 0) return;
  if (!opts.syncDir) throw new Error('training with remote engines needs a syncDir for the weights');
  const fixed = engines.filter((e) => !e.updateWeightsFromDisk);
  if (fixed.length > 0)
    throw new Error(
      `engine ${fixed[0].name} cannot load new weights (no update endpoint); train with sglang or vllm engines`,
    );
}

/** Served engines held to the recipe before anything starts, and the dtype the worker sends them weights in. */
async function engineSyncDtype(
  recipe: Recipe,
  engines: WeightSyncEngine[],
  log: (line: string) => void,
): Promise<SyncDtype> {
  const dir = recipe.model.path;
  const reports = engines.length > 0 ? await checkEngines(engines, recipe, log) : null;
  return resolveSyncDtype(
    recipe.weightSync.dtype,
    // a bad config.json is named here; a missing one is the worker's load to report, naming the directory
    dir && existsSync(join(dir, 'config.json')) ? readJson(join(dir, 'config.json')) : {},
    engines.map((e) => reports?.get(e)?.dtype),
  );
}

/** The model directory's weights, or a preset initialised from the seed (returned, for a gate's re-init). */
async function loadPolicy(
  worker: PolicyWorker,
  recipe: Recipe,
  tokenizer: Tokenizer,
): Promise<ModelConfig | null> {
  if (recipe.model.path) {
    await worker.load(recipe.model.path);
    return null;
  }
  const preset = {
    ...MODEL_PRESETS[recipe.model.preset],
    vocab_size: tokenizer.vocabSize,
    bos_token_id: tokenizer.pad,
    eos_token_id: tokenizer.imEnd,
  };
  await worker.init(preset, recipe.seed);
  return preset;
}

/**
 * The agent loop's engines, template and sandbox. Embedded: the worker both generates and trains, so weights are
 * shared and "sync" is free. Remote: the worker only trains and the engines are sent each update.
 */
function openStack(
  recipe: Recipe,
  worker: PolicyWorker,
  engines: WeightSyncEngine[],
  tokenizer: Tokenizer,
  opts: EmbeddedPolicyOptions,
): Promise<RolloutStack> {
  const template = recipe.tokenizer.template;
  return openRolloutStack({
    engines: engines.length > 0 ? engines : [new EmbeddedEngine(worker)],
    tokenizer,
    template: template === 'model' ? 'tokenizer' : template,
    tools: recipeTools(recipe),
    sandbox: opts.runner ?? 'embedded',
    sandboxOptions: {
      slots: recipe.sandbox.workers,
      timeoutMs: recipe.sandbox.timeoutMs,
      memoryMb: recipe.sandbox.memoryMb,
      preload: recipe.sandbox.preload,
      demoteAfterMs: recipe.sandbox.demoteAfterMs,
      isolation: opts.insecureSandbox ? 'none' : undefined,
      log: opts.log,
    },
    scheduler: engines.length > 0 ? { log: opts.log } : { pollMs: 0 },
  });
}

export class EmbeddedPolicy implements Policy {
  private rolloutStats?: RolloutStats;
  /** How a reference-policy worker starts (a KL loss): one rank, the recipe's precision. */
  private refStart: WorkerStartOptions = {};
  /** That worker, started at the first reference logprobs, and the weights it holds. */
  private ref?: { worker: PolicyWorker; dir: string };
  private constructor(
    private readonly worker: PolicyWorker,
    private readonly files: TokenizerFiles,
    private readonly stack: RolloutStack,
    private readonly sft: SftRenderer,
    private readonly remote: RemoteSync | null,
    private readonly memory: Pick<TrainOptions, 'gradientCheckpointing' | 'maxTokensPerMicroBatch'>,
    /** The config a preset model was initialised from (null when loaded from a directory). */
    private readonly preset: ModelConfig | null,
  ) {}

  /** The recipe's model directory (with its tokenizer) or a fresh preset, on the one rollout stack. */
  static async create(recipe: Recipe, opts: EmbeddedPolicyOptions = {}): Promise<EmbeddedPolicy> {
    const engines = opts.engines ?? [];
    checkTrainingEngines(engines, opts);
    const files = await recipeTokenizerFiles(recipe);
    const tokenizer = tokenizerFromFiles(files);
    const syncDtype = await engineSyncDtype(recipe, engines, opts.log ?? ((l) => console.error(l)));
    const worker = await PolicyWorker.start({
      ...workerStartOptions(recipe.model),
      ...opts.launch,
      ...(engines.length > 0 ? { env: { RSTAR2_WEIGHT_SYNC_DTYPE: syncDtype } } : {}),
    });
    const w = worker.info;
    // which torch and device a run trains on is the first thing to check on a GPU machine
    if (w)
      (opts.log ?? console.error)(
        `worker: torch ${w.torch} on ${w.device}, ${w.world} rank${w.world > 1 ? 's' : ''}`,
      );
    try {
      const preset = await loadPolicy(worker, recipe, tokenizer);
      const stack = await openStack(recipe, worker, engines, tokenizer, opts);
      const broadcast = new BroadcastSync(worker, engines, {
        log: opts.log,
        // NCCL needs the trainer's weights on a GPU; from a CPU trainer (CPU engines, `rstar2 serve` on a laptop,
        // the CI) the same broadcast runs over gloo instead of falling back to disk
        backend: w && !w.device.startsWith('cuda') ? 'gloo' : 'nccl',
        dtype: syncDtype,
        bucketBytes: recipe.weightSync.bucketMiB * 2 ** 20,
        ...opts.weightSync,
      });
      // dirty from the start: an engine serves whatever it was started with, so the first rollout of a run pushes
      // the trainer's weights to it (issue 52 item 3), by broadcast or disk like every later sync
      const remote =
        engines.length > 0
          ? { engines, broadcast, dir: opts.syncDir as string, version: 0, dirty: true }
          : null;
      const { gradientCheckpointing, maxTokensPerMicroBatch } = recipe.model;
      const policy = new EmbeddedPolicy(
        worker,
        files,
        stack,
        sftRenderer({
          rl: stack.chat,
          tokenizer,
          rolloutTools: recipeTools(recipe),
          toolCallStyle: recipe.tokenizer.toolCallStyle,
        }),
        remote,
        { gradientCheckpointing, maxTokensPerMicroBatch: maxTokensPerMicroBatch ?? undefined },
        preset,
      );
      const m = recipe.model;
      policy.refStart = { ...workerStartOptions(m), ranks: 1, sharding: 'ddp', offloadOptimizer: false };
      return policy;
    } catch (e) {
      await worker.close();
      throw e;
    }
  }

  /** Remote engines: pushes the weights when they changed since the last push (embedded: shared, nothing to do). */
  async syncWeights(): Promise<void> {
    if (this.remote?.dirty) await this.pushWeights(this.remote);
  }

  /** Broadcasts the current weights, or writes them to the sync dir (swapped in whole) for every engine to load. */
  private async pushWeights(r: RemoteSync): Promise<void> {
    const version = `v${++r.version}`;
    if (await r.broadcast.push(version)) {
      r.dirty = false;
      return;
    }
    const tmp = `${r.dir}.${version}.tmp`;
    rmSync(tmp, { recursive: true, force: true });
    await this.worker.save(tmp, { optimizer: false });
    saveTokenizer(this.files, tmp);
    // vLLM reloads from the path it was started with, so the directory name stays; the old copy moves aside
    // first because rename() cannot replace a non-empty directory
    const old = `${r.dir}.old`;
    rmSync(old, { recursive: true, force: true });
    if (existsSync(r.dir)) renameSync(r.dir, old);
    renameSync(tmp, r.dir);
    rmSync(old, { recursive: true, force: true });
    await Promise.all(r.engines.map((e) => e.updateWeightsFromDisk?.(r.dir, version)));
    r.dirty = false;
  }

  async rollout(req: RolloutRequest, onDone?: (done: number, total: number) => void): Promise<Trajectory[]> {
    // the RL step syncs after its update; this covers the other changes (SFT steps, a load, a re-init) and a
    // run's first rollout, whose engines serve whatever they were started with
    await this.syncWeights();
    return runRollouts({
      problems: req.problems.map(toRolloutProblem),
      n: req.n,
      scheduler: this.stack.scheduler,
      template: this.stack.template,
      runner: this.stack.runner,
      maxTurns: req.maxTurns,
      maxResponseTokens: req.maxResponseTokens,
      sampling: { temperature: req.temperature, topP: req.topP ?? 1 },
      onProgress: onDone ? (d, t) => onDone(d, t) : undefined,
      onRolloutStats: (st) => {
        this.rolloutStats = st;
      },
    });
  }

  lastRolloutStats(): RolloutStats | undefined {
    return this.rolloutStats;
  }

  promptTokens(question: string): number {
    return this.stack.template.promptIds(question).length;
  }

  sftTokens(example: ChatExample, template: SftTemplate = 'rl'): number {
    return this.sftSequences([example], template)[0].ids.length;
  }

  private encode(text: string): number[] {
    return this.stack.tokenizer.encode(text, { addSpecialTokens: false });
  }

  /**
   * Chat examples as token ids and loss masks (data/sft.ts): with 'rl', as the rollouts of this template produce
   * them, token for token; with 'model' or 'qwen', each conversation rendered whole, every assistant turn trained.
   */
  private sftSequences(examples: ChatExample[], template: SftTemplate = 'rl'): TrainSequence[] {
    return examples.map((ex, i) => {
      try {
        return this.sft.sequence(ex, template);
      } catch (e) {
        throw new Error(`SFT example ${i}: ${(e as Error).message}`);
      }
    });
  }

  async sftStep(examples: ChatExample[], opts: TrainOptions, template?: SftTemplate): Promise<TrainStats> {
    const sequences = this.sftSequences(examples, template);
    return this.trained(this.worker.trainStep({ loss: 'sft', sequences }, { ...opts, ...this.memory }));
  }

  async sftHeldout(examples: ChatExample[], template?: SftTemplate): Promise<HeldoutScore> {
    const seqs = this.sftSequences(examples, template);
    const scored = await this.worker.logprobs(seqs.map((s) => s.ids));
    let sum = 0;
    let count = 0;
    let exact = 0;
    for (const [i, { logprobs, argmax }] of scored.entries()) {
      const mask = seqs[i].mask;
      for (const [t, m] of mask.entries()) {
        if (m === 0) continue;
        sum -= logprobs[t];
        count++;
      }
      const first = examples[i].messages.find((m) => m.role === 'assistant');
      if (answersExact(mask, argmax, first?.weight !== 0)) exact++;
    }
    return { loss: sum / Math.max(1, count), exact: exact / Math.max(1, seqs.length) };
  }

  private async trained(step: Promise<TrainStats>): Promise<TrainStats> {
    const stats = await step;
    if (this.remote) this.remote.dirty = true;
    return stats;
  }

  async grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats> {
    const sequences: TrainSequence[] = items.map(({ trajectory: t, advantage, oldLogprobs }) => ({
      ids: [...t.promptIds, ...t.responseIds],
      mask: [...t.promptIds.map(() => 0), ...t.responseMask],
      advantage,
      oldLogprobs: [...t.promptIds.map(() => 0), ...(oldLogprobs ?? t.responseLogprobs)],
    }));
    // aligned with each sequence's ids, as the old logprobs are
    const refLogprobs = opts.klCoef
      ? items.map(({ trajectory: t, refLogprobs: r }) => [...t.promptIds.map(() => 0), ...(r ?? [])])
      : undefined;
    return this.trained(
      this.worker.trainStep(
        { loss: 'grpo', sequences },
        { ...opts, ...this.memory, ...(refLogprobs ? { refLogprobs } : {}) },
      ),
    );
  }

  async saveWeights(dir: string): Promise<void> {
    await this.worker.save(dir, { optimizer: false });
    saveTokenizer(this.files, dir);
  }

  /** On a second worker holding the reference weights (verl's ref worker), so the trained one keeps its own. */
  async referenceLogprobs(dir: string, trajectories: Trajectory[]): Promise<number[][]> {
    if (!this.ref) this.ref = { worker: await PolicyWorker.start(this.refStart), dir: '' };
    if (this.ref.dir !== dir) {
      await this.ref.worker.load(dir);
      this.ref.dir = dir;
    }
    const out = await this.ref.worker.logprobs(trajectories.map((t) => [...t.promptIds, ...t.responseIds]));
    return out.map((r, i) => r.logprobs.slice(trajectories[i].promptIds.length));
  }

  async recomputeLogprobs(trajectories: Trajectory[], temperature: number): Promise<number[][]> {
    const out = await this.worker.logprobs(
      trajectories.map((t) => [...t.promptIds, ...t.responseIds]),
      { temperature },
    );
    return out.map((r, i) => r.logprobs.slice(trajectories[i].promptIds.length));
  }

  async resetOptimizer(): Promise<void> {
    await this.worker.resetOptimizer();
  }

  async reinit(seed: number): Promise<void> {
    if (!this.preset) throw new Error('only a model initialised from a preset can be re-initialised');
    await this.worker.init(this.preset, seed); // new weights, no optimizer state, step 0
    if (this.remote) this.remote.dirty = true;
  }

  async save(dir: string): Promise<void> {
    await this.worker.save(dir, { optimizer: true });
    saveTokenizer(this.files, dir);
  }

  async load(dir: string): Promise<void> {
    await this.worker.load(dir);
    if (this.remote) this.remote.dirty = true;
  }

  async close(): Promise<void> {
    await this.stack.close();
    await this.worker.close();
    await this.ref?.worker.close();
  }
}

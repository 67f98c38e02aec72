import { existsSync, renameSync, rmSync } from 'node:fs';
import type { AgentTemplate } from '../agent/loop.js';
import { runRollouts } from '../agent/loop.js';
import { agentTemplate } from '../agent/template.js';
import type { Trajectory } from '../agent/trajectory.js';
import { EmbeddedEngine } from '../engines/embedded.js';
import { Scheduler } from '../engines/scheduler.js';
import type { WeightSyncEngine } from '../engines/types.js';
import { SandboxPool } from '../sandbox/pool.js';
import type { CodeRunner } from '../sandbox/types.js';
import {
  buildCharTokenizer,
  ChatTemplate,
  saveTokenizer,
  type Tokenizer,
  type TokenizerFiles,
  tokenizerFromFiles,
} from '../tokenizer/index.js';
import { PolicyWorker } from '../worker/client.js';
import { MODEL_PRESETS } from '../worker/presets.js';
import type { TrainOptions, TrainSequence, TrainStats } from '../worker/types.js';
import type { Recipe } from './config.js';
import type { SftDemo } from './tasks.js';
import type { PolicyBackend, RolloutRequest, ScoredItem } from './trainer.js';

// The embedded backend: one torch worker both generates (through the agent loop and the KV-budget scheduler)
// and trains, so weights are shared and "sync" is free. Tool calls run in the isolated sandbox pool.
// With remote engines (SGLang, vLLM) the worker only trains; before a rollout that follows a weight change
// the weights are written to `syncDir` and every engine is told to load them from there.

export interface EmbeddedBackendOptions {
  /** Run tool code without bubblewrap (development only; the pool warns). */
  insecureSandbox?: boolean;
  runner?: CodeRunner; // overrides the sandbox pool (tests)
  log?: (line: string) => void;
  /** Rollout engines that are not this process (they must implement updateWeightsFromDisk). */
  engines?: WeightSyncEngine[];
  /** Where synced weights are written (a HF model directory every engine can read); required with engines. */
  syncDir?: string;
}

interface RemoteSync {
  engines: WeightSyncEngine[];
  dir: string;
  version: number;
  dirty: boolean;
}

export class EmbeddedBackend implements PolicyBackend {
  private constructor(
    private readonly worker: PolicyWorker,
    private readonly tokenizer: Tokenizer,
    private readonly files: TokenizerFiles,
    private readonly template: AgentTemplate,
    private readonly scheduler: Scheduler,
    private readonly runner: CodeRunner,
    private readonly ownsRunner: boolean,
    private readonly remote: RemoteSync | null,
  ) {}

  /** A fresh model from the recipe's preset (or `recipe.model.init`), a char tokenizer and a sandbox pool. */
  static async create(recipe: Recipe, opts: EmbeddedBackendOptions = {}): Promise<EmbeddedBackend> {
    const engines = opts.engines ?? [];
    if (engines.length > 0) {
      if (!opts.syncDir) throw new Error('training with remote engines needs a syncDir for the weights');
      const fixed = engines.filter((e) => !e.updateWeightsFromDisk);
      if (fixed.length > 0)
        throw new Error(
          `engine ${fixed[0].name} cannot load new weights (no update endpoint); train with sglang or vllm engines`,
        );
    }
    const files = buildCharTokenizer({ template: recipe.tokenizer.template });
    const tokenizer = tokenizerFromFiles(files);
    const worker = await PolicyWorker.start({ threads: recipe.model.threads });
    let runner: CodeRunner | undefined;
    try {
      if (recipe.model.init) {
        if (!existsSync(recipe.model.init))
          throw new Error(`model.init: no checkpoint at ${recipe.model.init}`);
        await worker.load(recipe.model.init);
      } else {
        const preset = MODEL_PRESETS[recipe.model.preset];
        await worker.init(
          {
            ...preset,
            vocab_size: tokenizer.vocabSize,
            bos_token_id: tokenizer.pad,
            eos_token_id: tokenizer.imEnd,
          },
          recipe.seed,
        );
      }
      runner =
        opts.runner ??
        (await SandboxPool.start({
          slots: recipe.sandbox.workers,
          timeoutMs: recipe.sandbox.timeoutMs,
          isolation: opts.insecureSandbox ? 'none' : 'bwrap',
          log: opts.log,
        }));
      const template = agentTemplate(tokenizer, { chat: ChatTemplate.named(recipe.tokenizer.template) });
      const remote =
        engines.length > 0 ? { engines, dir: opts.syncDir as string, version: 0, dirty: true } : null;
      const scheduler = remote
        ? await Scheduler.create(engines)
        : await Scheduler.create([new EmbeddedEngine(worker)], { pollMs: 0 });
      return new EmbeddedBackend(worker, tokenizer, files, template, scheduler, runner, !opts.runner, remote);
    } catch (e) {
      await worker.close();
      if (runner && !opts.runner) await runner.close();
      throw e;
    }
  }

  /** Writes the current weights to the sync dir (swapped in whole) and has every engine load them. */
  private async syncWeights(r: RemoteSync): Promise<void> {
    const version = `v${++r.version}`;
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
    if (this.remote?.dirty) await this.syncWeights(this.remote);
    return runRollouts({
      problems: req.problems.map((p) => ({ id: p.id, question: p.question, gold: p.answer })),
      n: req.n,
      scheduler: this.scheduler,
      template: this.template,
      runner: this.runner,
      maxTurns: req.maxTurns,
      maxResponseTokens: req.maxResponseTokens,
      sampling: { temperature: req.temperature },
      onProgress: onDone ? (d, t) => onDone(d, t) : undefined,
    });
  }

  private encode(text: string): number[] {
    return this.tokenizer.encode(text, { addSpecialTokens: false });
  }

  async sftStep(demos: SftDemo[], opts: TrainOptions): Promise<TrainStats> {
    const sequences: TrainSequence[] = demos.map((d) => {
      const ids = this.template.promptIds(d.question);
      const mask = ids.map(() => 0);
      for (const s of d.segments) {
        const seg = this.encode(s.text);
        ids.push(...seg);
        mask.push(...seg.map(() => (s.train ? 1 : 0)));
      }
      return { ids, mask };
    });
    return this.trained(this.worker.trainStep({ loss: 'sft', sequences }, opts));
  }

  private async trained(step: Promise<TrainStats>): Promise<TrainStats> {
    const stats = await step;
    if (this.remote) this.remote.dirty = true;
    return stats;
  }

  async grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats> {
    const sequences: TrainSequence[] = items.map(({ trajectory: t, advantage }) => ({
      ids: [...t.promptIds, ...t.responseIds],
      mask: [...t.promptIds.map(() => 0), ...t.responseMask],
      advantage,
      oldLogprobs: [...t.promptIds.map(() => 0), ...t.responseLogprobs],
    }));
    return this.trained(this.worker.trainStep({ loss: 'grpo', sequences }, opts));
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
    await this.scheduler.close();
    await this.worker.close();
    if (this.ownsRunner) await this.runner.close();
  }
}

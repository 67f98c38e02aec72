import { existsSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { FilterResult, Problem } from '../data/index.js';
import {
  failureOf,
  miniBatchPlan,
  type PenaltyOptions,
  penaltyOptions,
  type RocConfig,
  type SelectionResult,
  sandboxFaultOf,
  selectAndScore,
  stageLr,
  type Trajectory,
} from '../rl/index.js';
import { appendJsonl, readJsonlTolerant, writeAtomic } from '../util/jsonl.js';
import { Rng, seedFor } from '../util/rng.js';
import type { TrainStats } from '../worker/index.js';
import type { RlStageConfig } from './config.js';
import { drawable, EpochSampler, rowFilters, sectionProblems, weightedSample } from './data.js';
import { gainWarning } from './health.js';
import { type RlMetrics, rlMetrics } from './metrics.js';
import { mean, pad, readState, type StageHost, stageBar } from './stage.js';
import type { ScoredItem } from './trainer.js';

// An RL stage as the paper's step: rollout → score → select (reject equal rewards, RoC, advantages) → old and
// reference logprobs → update → sync the weights to the rollout engines → record. Each phase is one method below;
// the prompt pool (with its difficulty filter), the prompt sampler and the KL reference are set up once per stage.

const MAX_REDRAWS = 8;

/** One rollout of a step's prompts, scored and selected. */
interface Draw {
  problems: Problem[];
  trajectories: Trajectory[];
  /** Per problem, the trajectories kept for selection (engine and sandbox failures out). */
  groups: Trajectory[][];
  sel: SelectionResult;
  failures: string[];
  timeouts: number;
  /** Date.now() after the rollout and after scoring. */
  t1: number;
  t2: number;
}

export async function runRl(
  host: StageHost,
  stageIndex: number,
  stage: RlStageConfig,
  start: number,
): Promise<void> {
  const pool = await rlPool(host, stage);
  const prompts = promptPicker(host, stage, pool, start);
  const reference = await referencePolicy(host, stage, start);
  if (start === 0 && host.recipe.eval.atStart) await host.evaluate(stage.name, 0);
  await new RlStage(host, stageIndex, stage, prompts, reference).run(start);
}

class RlStage {
  private readonly roc: RocConfig;
  private readonly penalty: PenaltyOptions;
  /** Samples per prompt: the group, oversampled when RoC down-samples it. */
  private readonly n: number;

  constructor(
    private readonly host: StageHost,
    private readonly stageIndex: number,
    private readonly stage: RlStageConfig,
    private readonly prompts: (step: number, attempt: number) => Problem[],
    /** The KL loss's reference weights (a directory), null without one. */
    private readonly reference: string | null,
  ) {
    this.roc = { ...stage.roc, downSampleToN: stage.groupSize };
    this.penalty = penaltyOptions(stage.roc);
    this.n = this.roc.doDownSampling
      ? Math.max(stage.groupSize, Math.round(stage.groupSize * stage.oversample))
      : stage.groupSize;
  }

  async run(start: number): Promise<void> {
    const { stage, host } = this;
    const bar = stageBar(host, `${stage.name}${this.roc.doDownSampling ? ' (RoC)' : ''}`, stage, start);
    for (let step = start + 1; step <= stage.steps; step++) {
      const t0 = Date.now();
      const { draw, redraws, timeouts } = await this.draw(step); // rollout → score → select
      const items: ScoredItem[] = draw.sel.kept.map((k) => ({
        trajectory: draw.groups[k.group][k.index],
        advantage: k.advantage,
      }));
      host.beat('update');
      await this.logprobs(items);
      const stats = await this.update(items, step);
      // the next rollout (or eval) samples from the updated policy; the push is timed with the update
      if (stats.length > 0) await host.policy.syncWeights?.();
      const metrics = this.record(step, draw, items, stats, { redraws, timeouts, t0, t3: Date.now() });
      bar.set(
        step,
        `reward=${metrics.reward_mean.toFixed(2)} acc=${metrics.accuracy.toFixed(2)} tools=${metrics.tool_calls_mean.toFixed(2)}`,
      );
      await this.endStep(step);
    }
    bar.finish();
  }

  /**
   * The step's draw: its prompts rolled out, scored and selected. With emptyStep 'redraw' (the reference) a draw
   * whose groups are all rejected does not count: new prompts are drawn, up to MAX_REDRAWS times.
   */
  private async draw(step: number): Promise<{ draw: Draw; redraws: number; timeouts: number }> {
    const once = async (attempt: number): Promise<Draw> => {
      const problems = this.prompts(step, attempt);
      const trajectories = await this.rollout(problems, step, attempt);
      const t1 = Date.now();
      const { groups, penalties, failures, timeouts } = await this.score(problems, trajectories, step);
      const t2 = Date.now();
      const sel = this.select(groups, penalties, step, attempt);
      return { problems, trajectories, groups, sel, failures, timeouts, t1, t2 };
    };
    let draw = await once(0);
    let redraws = 0;
    let timeouts = draw.timeouts;
    while (this.stage.emptyStep === 'redraw' && draw.sel.kept.length === 0 && redraws < MAX_REDRAWS) {
      draw = await once(++redraws);
      timeouts += draw.timeouts;
    }
    return { draw, redraws, timeouts };
  }

  /** n trajectories per prompt from the rollout engines, seeded by step and attempt. */
  private async rollout(problems: Problem[], step: number, attempt: number): Promise<Trajectory[]> {
    const { stage } = this;
    this.host.beat('rollout', stage.name, step);
    const trajectories = await this.host.policy.rollout({
      problems,
      n: this.n,
      maxResponseTokens: stage.maxResponseTokens,
      maxTurns: stage.maxTurns,
      temperature: stage.temperature,
      topP: stage.topP,
      seed: seedFor(this.host.recipe.seed, stage.name, step, 'rollout', ...(attempt > 0 ? [attempt] : [])),
    });
    const ids = new Set(problems.map((p) => p.id));
    for (const t of trajectories)
      if (!ids.has(t.promptId))
        throw new Error(`rollout returned a trajectory for unknown prompt ${t.promptId}`);
    return trajectories;
  }

  /** Rewards every trajectory against its gold answer and groups them by prompt for selection. */
  private async score(problems: Problem[], trajectories: Trajectory[], step: number) {
    this.host.beat('reward');
    const scores = await this.host.score(trajectories, problems, `${this.stage.name} step ${step}`);
    const byId = new Map(problems.map((p, i) => [p.id, i]));
    const groups: Trajectory[][] = problems.map(() => []);
    const failures: string[] = [];
    for (const [j, t] of trajectories.entries()) {
      const g = byId.get(t.promptId) as number;
      const r = scores[j];
      Object.assign(t, { gold: problems[g].answer, reward: r.reward, correct: r.correct });
      t.verify = { extracted: r.extracted, matchedBy: r.matchedBy };
      // an engine or sandbox failure is not the policy's doing: as a negative it would be trained against
      // (sandboxFaults 'keep' trains on a sandbox fault's text as the reference does; an engine error is always out)
      const why = failureOf(t);
      const kept = why === undefined || (this.stage.sandboxFaults === 'keep' && why === sandboxFaultOf(t));
      if (kept) groups[g].push(t);
      else failures.push(why);
    }
    return {
      groups,
      // a reward module's own penalty, added to RoC's
      penalties: new Map(trajectories.map((t, j) => [t, scores[j].penalty])),
      failures,
      timeouts: scores.filter((r) => r.timedOut).length,
    };
  }

  /** Reject-equal-reward, RoC down-sampling and advantages (src/rl/), seeded by step and attempt. */
  private select(
    groups: Trajectory[][],
    penalties: Map<Trajectory, number | undefined>,
    step: number,
    attempt: number,
  ): SelectionResult {
    return selectAndScore(
      groups.map((g) => g.map((t) => ({ ...t, reward: t.reward ?? 0, penalty: penalties.get(t) }))),
      this.roc,
      this.penalty,
      new Rng(
        seedFor(this.host.recipe.seed, this.stage.name, step, 'roc', ...(attempt > 0 ? [attempt] : [])),
      ),
    );
  }

  /** The ratio's denominator recomputed under the current weights (oldLogprobs 'recompute'), and π_ref's (KL). */
  private async logprobs(items: ScoredItem[]): Promise<void> {
    const { stage, reference } = this;
    const policy = this.host.policy;
    if (items.length === 0) return;
    const trajectories = items.map((it) => it.trajectory);
    if (stage.oldLogprobs === 'recompute') {
      if (!policy.recomputeLogprobs)
        throw new Error(`stage ${stage.name}: oldLogprobs 'recompute' needs a policy that computes logprobs`);
      const old = await policy.recomputeLogprobs(trajectories, stage.temperature);
      for (const [i, it] of items.entries()) it.oldLogprobs = old[i];
    }
    if (reference) {
      const refs = await policy.referenceLogprobs!(reference, trajectories);
      for (const [i, it] of items.entries()) it.refLogprobs = refs[i];
    }
  }

  /** The optimizer steps: several mini-batches activate the clipped ratio; epochs pass over them again. */
  private async update(items: ScoredItem[], step: number): Promise<TrainStats[]> {
    const { stage, reference } = this;
    const stats: TrainStats[] = [];
    const plan = miniBatchPlan(items.length, { ...stage, samplesPerPrompt: this.n });
    const opts = {
      lr: stageLr(stage, step),
      warmupSteps: stage.warmupSteps,
      clipLow: stage.clipLow,
      clipHigh: stage.clipHigh,
      lossAgg: stage.lossAgg,
      ...(plan.nominalSeqs !== undefined ? { nominalSeqs: plan.nominalSeqs } : {}),
      ...(reference ? { klCoef: stage.kl.coef, klEstimator: stage.kl.estimator } : {}),
      ...(stage.entropyCoef > 0 ? { entropyCoef: stage.entropyCoef } : {}),
    };
    for (let epoch = 0; epoch < stage.epochs; epoch++)
      for (let j = 0; j < items.length; j += plan.size)
        stats.push(await this.host.policy.grpoStep(items.slice(j, j + plan.size), { ...opts }));
    return stats;
  }

  /** metrics.jsonl's record (with health warnings attached) and the step's trajectories file. */
  private record(
    step: number,
    draw: Draw,
    items: ScoredItem[],
    stats: TrainStats[],
    at: { redraws: number; timeouts: number; t0: number; t3: number },
  ): RlMetrics {
    const { host, stage } = this;
    const all = draw.trajectories;
    const metrics = rlMetrics({
      stage: stage.name,
      step,
      trajectories: all,
      answered: draw.groups.flat(),
      failures: draw.failures,
      timeouts: at.timeouts,
      roc: draw.sel.metrics,
      stats,
      kl: this.reference !== null,
      redraws: at.redraws,
      rollout: host.policy.lastRolloutStats?.(),
      times: [at.t0, draw.t1, draw.t2, at.t3],
    });
    host.warn(
      host.health.rlStep({
        stage: stage.name,
        step,
        rewardMean: metrics.reward_mean,
        groups: draw.problems.length,
        groupsKept: draw.sel.metrics.groups_kept,
        groupsAllCorrect: draw.sel.metrics.groups_rejected_all_correct,
        toolCalls: all.reduce((a, t) => a + t.numToolCalls, 0),
        toolErrors: all.reduce((a, t) => a + t.numToolErrors, 0),
        loss: stats.length > 0 ? mean(stats.map((s) => s.loss)) : undefined,
        trajectories: all.length,
        failed: draw.failures.length,
        failure: draw.failures[0],
      }),
      metrics,
    );
    const kept = new Map(items.map((it) => [it.trajectory, it.advantage]));
    writeAtomic(
      join(host.runDir, 'trajectories', `${stage.name}-step-${pad(step)}.jsonl`),
      all
        .map((t) => JSON.stringify({ ...t, kept: kept.has(t), advantage: kept.get(t) ?? null }) + '\n')
        .join(''),
    );
    host.record(metrics);
    host.progressed();
    return metrics;
  }

  /** Evals at their steps (and the stage's gain at its end), checkpoints, and a stop asked for. */
  private async endStep(step: number): Promise<void> {
    const { host, stage } = this;
    if ((stage.evalEvery > 0 && step % stage.evalEvery === 0) || step === stage.steps)
      await host.evaluate(stage.name, step);
    if (step === stage.steps) {
      const evals = readJsonlTolerant<{ stage: string; accuracy: number }>(
        join(host.runDir, 'evals.jsonl'),
      ).filter((r) => r.stage === stage.name);
      if (evals.length > 1)
        host.warn(gainWarning(stage.name, evals[0].accuracy, evals[evals.length - 1].accuracy));
    }
    if (step % stage.checkpointEvery === 0 || step === stage.steps)
      await host.checkpoint(this.stageIndex, stage, step);
    await host.stopPoint(this.stageIndex, stage, step);
  }
}

/**
 * A step's prompts, draw after draw (its first, then its redraws): the epoch sampler's next ones, counted in
 * host.draws so a resume goes on from there, or ('independent') a fresh sample seeded by step and attempt.
 */
function promptPicker(host: StageHost, stage: RlStageConfig, pool: Problem[], start: number) {
  const { weights } = stage.data;
  if (stage.sampler === 'independent')
    return (step: number, attempt: number) => {
      const again = attempt > 0 ? [attempt] : [];
      const rng = new Rng(seedFor(host.recipe.seed, stage.name, step, 'prompts', ...again));
      return weightedSample(pool, weights, stage.promptsPerStep, rng);
    };
  const seed = seedFor(host.recipe.seed, stage.name, 'prompts');
  const sampler = new EpochSampler(pool, weights, stage.promptsPerStep, seed);
  host.draws.count = start === 0 ? 0 : resumedDraws(host, stage, start);
  return () => sampler.draw(host.draws.count++);
}

/**
 * How many prompt draws the stage made up to `step`: what the checkpoint resumed from says, else (a run directory
 * from before promptDraws was saved) a draw per step plus its redraws, from metrics.jsonl.
 */
function resumedDraws(host: StageHost, stage: RlStageConfig, step: number): number {
  const s = readState(host.runDir);
  if (s?.stage === stage.name && s.step === step && s.promptDraws !== undefined) return s.promptDraws;
  return readJsonlTolerant<{ stage: string; step: number; redraws?: number }>(
    join(host.runDir, 'metrics.jsonl'),
  )
    .filter((r) => r.stage === stage.name && r.step <= step)
    .reduce((a, r) => a + 1 + (r.redraws ?? 0), 0);
}

/**
 * A stage's KL reference (kl.coef > 0): the weights saved under `reference/` when it started ('stage') or when the
 * run's first RL stage did ('initial', verl's reference policy); null without a KL loss.
 */
async function referencePolicy(host: StageHost, stage: RlStageConfig, start: number): Promise<string | null> {
  const { policy, runDir } = host;
  const rl = host.recipe.stages.filter((s): s is RlStageConfig => s.type === 'rl');
  const save = async (name: string) => {
    const dir = join(runDir, 'reference', name);
    rmSync(`${dir}.tmp`, { recursive: true, force: true });
    await (policy.saveWeights ?? policy.save).call(policy, `${dir}.tmp`);
    rmSync(dir, { recursive: true, force: true });
    renameSync(`${dir}.tmp`, dir);
  };
  if (start === 0 && rl[0] === stage && rl.some((s) => s.kl.coef > 0 && s.kl.reference === 'initial'))
    await save('initial');
  if (stage.kl.coef === 0) return null;
  const name = stage.kl.reference === 'initial' ? 'initial' : stage.name;
  if (start === 0 && stage.kl.reference === 'stage') await save(name);
  const dir = join(runDir, 'reference', name);
  if (!existsSync(dir))
    throw new Error(
      `stage ${stage.name}: kl needs the reference weights in ${dir}, saved when ${name === 'initial' ? "the run's first RL stage" : 'the stage'} starts; this run went past that without them`,
    );
  if (!policy.referenceLogprobs)
    throw new Error(`stage ${stage.name}: kl.coef > 0 needs a policy that computes reference logprobs`);
  return dir;
}

function filtered<T>(host: StageHost, stage: string, r: FilterResult<T>): T[] {
  if (r.dropped > 0) host.log(`[${stage}] dropped ${r.dropped} problems: ${r.reason}`);
  return r.kept;
}

/**
 * The stage's prompt pool: its files (or generated problems) after the row filters, then with filter
 * 'unsolved' only problems the current policy does not solve in every one of `filterSamples` samples (the
 * paper's difficulty filter). The policy pass goes in chunks whose counts are appended to
 * `filter-<stage>.jsonl`, so an interrupted pass resumes where it stopped; the final pool is cached.
 */
async function rlPool(host: StageHost, stage: RlStageConfig): Promise<Problem[]> {
  const pool = await rlPoolCached(host, stage);
  // a step draws distinct prompts: fewer than promptsPerStep would silently shrink every step
  const n = drawable(pool, stage.data.weights);
  if (n < stage.promptsPerStep)
    throw new Error(
      `stage ${stage.name}: promptsPerStep is ${stage.promptsPerStep}, but its data leave ${n} problems ` +
        `after the filters; lower it (--set stages.${stage.name}.promptsPerStep=${n}, which --resume ` +
        `also takes before the stage starts) or give it more data`,
    );
  return pool;
}

async function rlPoolCached(host: StageHost, stage: RlStageConfig): Promise<Problem[]> {
  const path = join(host.runDir, `pool-${stage.name}.json`);
  if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8')) as Problem[];
  const d = stage.data;
  const repeats = { dropped: 0 };
  let pool: Problem[] = d.files
    ? await sectionProblems(d, repeats)
    : await host.generatedProblems(stage.name, {
        seed: seedFor(d.seed, stage.name),
        n: d.filter === 'all' ? 2000 : d.filterPool,
        split: 'train',
        levels: d.levels,
        kinds: d.kinds,
      });
  if (repeats.dropped > 0)
    host.log(`[${stage.name}] dropped ${repeats.dropped} problems while reading: duplicate question`);
  const count = host.policy.promptTokens?.bind(host.policy) ?? ((q: string) => q.length);
  pool = rowFilters(pool, d, count, (r) => filtered(host, stage.name, r));
  if (pool.length === 0) throw new Error(`stage ${stage.name}: no problems left after the data filters`);
  if (d.filter === 'unsolved') {
    const screened = d.files
      ? new Rng(seedFor(d.seed, stage.name)).sample(pool, Math.min(d.filterPool, pool.length))
      : pool;
    const solved = await solvedCounts(host, stage, screened);
    pool = filtered(host, stage.name, {
      kept: screened.filter((p) => (solved.get(p.id) ?? 0) < d.filterSamples),
      dropped: screened.filter((p) => (solved.get(p.id) ?? 0) >= d.filterSamples).length,
      reason: `solved in all ${d.filterSamples} samples by the current policy (filter 'unsolved')`,
    });
    host.log(`[${stage.name}] filter 'unsolved': ${pool.length}/${screened.length} problems kept`);
    if (pool.length === 0) throw new Error(`stage ${stage.name}: the 'unsolved' filter left no problems`);
  }
  writeAtomic(path, JSON.stringify(pool));
  return pool;
}

/** Correct samples per problem under the current policy, resumable through `filter-<stage>.jsonl`. */
async function solvedCounts(
  host: StageHost,
  stage: RlStageConfig,
  problems: Problem[],
): Promise<Map<string, number>> {
  const file = join(host.runDir, `filter-${stage.name}.jsonl`);
  const solved = new Map<string, number>();
  for (const r of readJsonlTolerant<{ id: string; solved: number }>(file)) solved.set(r.id, r.solved);
  const todo = problems.filter((p) => !solved.has(p.id));
  if (solved.size > 0)
    host.log(`[${stage.name}] filter pass resumed: ${solved.size} problems already screened`);
  const chunk = Math.max(1, stage.promptsPerStep);
  for (let i = 0; i < todo.length; i += chunk) {
    const part = todo.slice(i, i + chunk);
    host.beat('filter', stage.name, 0);
    const trajs = await host.policy.rollout({
      problems: part,
      n: stage.data.filterSamples,
      maxResponseTokens: stage.maxResponseTokens,
      maxTurns: stage.maxTurns,
      temperature: stage.temperature,
      topP: stage.topP,
      seed: seedFor(host.recipe.seed, stage.name, 'filter', i),
    });
    const counts = new Map(part.map((p) => [p.id, 0]));
    const scores = await host.score(trajs, part, `${stage.name} filter`);
    for (const [j, t] of trajs.entries())
      if (scores[j].correct) counts.set(t.promptId, (counts.get(t.promptId) ?? 0) + 1);
    appendJsonl(
      file,
      [...counts].map(([id, n]) => ({ id, solved: n })),
    );
    for (const [id, n] of counts) solved.set(id, n);
    host.progressed();
  }
  return solved;
}

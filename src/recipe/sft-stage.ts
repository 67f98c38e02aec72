import { join } from 'node:path';
import type { ChatExample } from '../data/index.js';
import { stageLr } from '../rl/index.js';
import { readJsonlTolerant } from '../util/jsonl.js';
import { Rng, seedFor } from '../util/rng.js';
import type { TrainStats } from '../worker/index.js';
import type { SftStageConfig } from './config.js';
import { drawable, EpochSampler, sectionExamples, weightedPicker } from './data.js';
import { describeGate, gatePassed, gateWarning, type HealthWarning, sftLossWarning } from './health.js';
import { round, type StageHost, stageBar } from './stage.js';
import { generateProblems, sftExamples, toolCalls } from './tasks.js';
import type { HeldoutScore } from './trainer.js';

// An SFT stage: batches of chat examples, one optimizer step each, and (with a gate) held-out checks that end
// the stage early, restart a model trained from scratch, or send it back to its best check at the cap.

type Gate = NonNullable<SftStageConfig['gate']>;

/**
 * Trains an SFT stage from step `start`; returns the step of the best check the stage is to go back to (a gate
 * with restoreBest not reached by the cap), else null.
 */
export async function runSft(
  host: StageHost,
  stageIndex: number,
  stage: SftStageConfig,
  start: number,
): Promise<number | null> {
  const { demos, heldout } = splitHeldout(stage, await sftData(host, stage));
  const gate = stage.gate ? new SftGate(host, stageIndex, stage, stage.gate, heldout) : null;
  if (gate && start > 0) gate.resume(start);
  const bar = stageBar(host, stage.name, stage, start);
  const batchOf = sftBatches(host, stage, demos);
  for (let step = start + 1; step <= stage.steps; step++) {
    const t0 = Date.now();
    const batch = batchOf(step);
    host.beat('sft', stage.name, step);
    const lr = stageLr(stage, step);
    const st = await host.policy.sftStep(batch, { lr, warmupSteps: stage.warmupSteps }, stage.template);
    const record = sftRecord(stage, step, st, demos.length, t0);
    const warnings = sftLossWarning(stage.name, step, st.loss);
    const check = gate ? await gate.check(step, record, warnings) : { passed: false, checkpoint: false };
    host.warn(warnings, record);
    host.record(record);
    host.progressed();
    bar.set(step, `loss=${st.loss.toFixed(3)}`);
    if (check.passed) {
      bar.finish();
      host.log(
        `[gate] ${stage.name}: held-out loss ${record.heldout_loss}, exact ${record.heldout_exact} at step ${step} (${describeGate(stage.gate as Gate)}); stage done`,
      );
      await host.checkpoint(stageIndex, stage, step, true);
      return null;
    }
    if (step % stage.checkpointEvery === 0 || step === stage.steps || check.checkpoint)
      await host.checkpoint(stageIndex, stage, step);
    await host.stopPoint(stageIndex, stage, step);
  }
  bar.finish();
  return gate?.restoreStep() ?? null;
}

function sftRecord(
  stage: SftStageConfig,
  step: number,
  st: TrainStats,
  examples: number,
  t0: number,
): Record<string, unknown> {
  return {
    stage: stage.name,
    step,
    time: new Date().toISOString(),
    loss: round(st.loss),
    grad_norm: round(st.gradNorm),
    lr: st.lr,
    epoch: round((step * stage.batchSize) / examples, 3), // passes over the training examples, as HF logs it
    tokens_per_s: Math.round(st.tokensPerS),
    time_update_s: round((Date.now() - t0) / 1000, 3),
  };
}

/** The gate's held-out examples (the last `gate.heldout`, those with enough tool calls) and the rest to train on. */
function splitHeldout(stage: SftStageConfig, all: ChatExample[]) {
  const gate = stage.gate;
  if (!gate) return { demos: all, heldout: [] };
  if (gate.heldout >= all.length)
    throw new Error(
      `stage ${stage.name}: gate.heldout ${gate.heldout} leaves no examples of ${all.length} to train on`,
    );
  const least = gate.on === 'tool' ? 1 : gate.on === 'retry' ? 2 : 0;
  const heldout = all.slice(all.length - gate.heldout).filter((ex) => toolCalls(ex) >= least);
  if (heldout.length === 0)
    throw new Error(
      `stage ${stage.name}: none of the ${gate.heldout} held-out examples calls a tool ${least > 1 ? 'more than once ' : ''}(gate.on: ${gate.on})`,
    );
  return { demos: all.slice(0, all.length - gate.heldout), heldout };
}

const fresh = (): HeldoutScore => ({ loss: Number.POSITIVE_INFINITY, exact: 0 });

/** The gate's checks: the best so far, restarts of a model that does not learn, the step to go back to. */
class SftGate {
  // best and bestStep cover the checks since the last (re)start: a restart forgets the abandoned weights
  private best = fresh();
  private bestStep = 0; // the step of the best check by the gate's own measure (exact if it has one)
  private since = 0; // the step of the last restart
  private restarts = 0;

  constructor(
    private readonly host: StageHost,
    stageIndex: number,
    private readonly stage: SftStageConfig,
    private readonly gate: Gate,
    private readonly heldout: ChatExample[],
  ) {
    if (gate.restart && (stageIndex !== 0 || host.recipe.model.path || !host.policy.reinit))
      throw new Error(
        `stage ${stage.name}: gate.restart re-initialises the model, so it is only for the first stage of a recipe that trains a preset from scratch`,
      );
  }

  // with an exact gate, equal exact (e.g. 0 at every check) falls back to the loss, not to the earliest check
  private better(a: HeldoutScore, b: HeldoutScore): boolean {
    return this.gate.exact != null
      ? a.exact > b.exact || (a.exact === b.exact && a.loss < b.loss)
      : a.loss < b.loss;
  }

  /** Notes a check's score; whether it is the best since the last (re)start. */
  private note(step: number, score: HeldoutScore): boolean {
    const improved = this.better(score, this.best);
    if (improved) this.bestStep = step;
    this.best = { loss: Math.min(this.best.loss, score.loss), exact: Math.max(this.best.exact, score.exact) };
    return improved;
  }

  private restarted(step: number, restarts: number): void {
    [this.best, this.bestStep, this.since, this.restarts] = [fresh(), 0, step, restarts];
  }

  /** A resumed stage picks up the checks it made before (metrics.jsonl is cut back to the checkpoint). */
  resume(start: number): void {
    const done = readJsonlTolerant<{
      stage: string;
      step: number;
      heldout_loss?: number;
      heldout_exact?: number;
      restart?: number;
    }>(join(this.host.runDir, 'metrics.jsonl'));
    for (const r of done)
      if (r.stage === this.stage.name && r.step <= start && r.heldout_loss !== undefined) {
        this.note(r.step, { loss: r.heldout_loss, exact: r.heldout_exact ?? 0 });
        if (r.restart !== undefined) this.restarted(r.step, r.restart);
      }
  }

  /**
   * The check due at this step, if one is: its score goes into the step's record; whether the gate passed, and
   * whether this step needs a checkpoint of its own (the best weights to go back to, or a restart's).
   */
  async check(
    step: number,
    record: Record<string, unknown>,
    warnings: HealthWarning[],
  ): Promise<{ passed: boolean; checkpoint: boolean }> {
    const { gate, stage } = this;
    if (step % gate.every !== 0 && step !== stage.steps) return { passed: false, checkpoint: false };
    this.host.beat('heldout');
    const score = await this.host.policy.sftHeldout(this.heldout, stage.template);
    record.heldout_loss = round(score.loss);
    record.heldout_exact = round(score.exact);
    const improved = this.note(step, score);
    const passed = gatePassed(gate, score);
    if (passed) record.gate = 'reached';
    else if (step === stage.steps) {
      warnings.push(gateWarning(stage.name, step, this.best, gate));
      // the weights the run goes on from, for whoever forks or reads it later
      const back = this.restoreStep();
      if (back !== null) record.restored = back;
    }
    // the best weights must exist on disk if the stage is to go back to them at its cap
    let checkpoint = Boolean(gate.restoreBest) && improved && !passed && step < stage.steps;
    if (!passed && (await this.restart(step, record))) checkpoint = true; // a resume must not go back
    return { passed, checkpoint };
  }

  /** Re-initialises a model whose held-out loss stays above gate.restart.loss; whether it did. */
  private async restart(step: number, record: Record<string, unknown>): Promise<boolean> {
    const restart = this.gate.restart;
    const due =
      restart &&
      this.best.loss > restart.loss &&
      step - this.since >= restart.within &&
      this.restarts < restart.max &&
      step < this.stage.steps;
    if (!due) return false;
    const n = this.restarts + 1;
    const seed = seedFor(this.host.recipe.seed, this.stage.name, 'restart', n);
    this.host.log(
      `[gate] ${this.stage.name}: held-out loss ${round(this.best.loss)} after ${step - this.since} steps, not at or below ${restart.loss}; re-initialising the model (restart ${n} of ${restart.max}, seed ${seed})`,
    );
    await this.host.policy.reinit?.(seed); // present: checked when the stage started
    record.restart = n;
    this.restarted(step, n);
    return true;
  }

  /** The best check's step when the stage is to go back to it at its cap (restoreBest), else null. */
  restoreStep(): number | null {
    const s = this.bestStep;
    return this.gate.restoreBest && s > 0 && s < this.stage.steps ? s : null;
  }
}

/** An SFT stage's chat examples: its files, or demos generated from the task family into the run dir. */
export async function sftData(host: StageHost, stage: SftStageConfig): Promise<ChatExample[]> {
  const d = stage.data;
  const files = d.files ?? [
    host.generated(stage.name, () => {
      const problems = generateProblems({
        seed: d.seed,
        n: stage.demos,
        split: 'train',
        levels: d.levels,
        kinds: d.kinds,
      });
      return sftExamples(problems, stage.demoMix, seedFor(host.recipe.seed, stage.name, 'demos'), {
        echo: stage.echo,
        trainFailedCalls: stage.trainFailedCalls,
      });
    }),
  ];
  const all = await sectionExamples(files, d.limit, d.files ? d.weights : null);
  const count = host.policy.sftTokens?.bind(host.policy);
  if (stage.maxTokens === null || !count) return all;
  const kept = all.filter((ex) => count(ex, stage.template) <= stage.maxTokens!);
  if (kept.length < all.length)
    host.log(
      `[${stage.name}] dropped ${all.length - kept.length} of ${all.length} examples: longer than maxTokens ${stage.maxTokens}`,
    );
  if (kept.length === 0)
    throw new Error(`stage ${stage.name}: every example is longer than maxTokens ${stage.maxTokens} tokens`);
  return kept;
}

/**
 * Step s's examples (s from 1): the epoch sampler's draw s - 1, or (sampler 'independent') draws with replacement
 * seeded by the step. Either depends only on s, so a resumed stage goes on exactly.
 */
export function sftBatches(
  host: StageHost,
  stage: SftStageConfig,
  demos: ChatExample[],
): (step: number) => ChatExample[] {
  const weights = stage.data.files ? stage.data.weights : null;
  if (stage.sampler === 'independent') {
    const pick = weightedPicker(demos, weights);
    return (step) => {
      const rng = new Rng(seedFor(host.recipe.seed, stage.name, step, 'batch'));
      return Array.from({ length: stage.batchSize }, () => pick(rng));
    };
  }
  const n = drawable(demos, weights);
  if (n < stage.batchSize)
    throw new Error(
      `stage ${stage.name}: batchSize ${stage.batchSize} is more than the ${n} training examples, and sampler 'epoch' draws a step's examples without replacement: lower batchSize or set sampler: independent`,
    );
  const sampler = new EpochSampler(
    demos,
    weights,
    stage.batchSize,
    seedFor(host.recipe.seed, stage.name, 'sft'),
  );
  return (step) => sampler.draw(step - 1);
}

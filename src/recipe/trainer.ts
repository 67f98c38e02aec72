import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, hostname } from 'node:os';
import { join } from 'node:path';
import { type ChatExample, loadProblems, type Problem, type SftTemplate } from '../data/index.js';
import type { RolloutStats } from '../engines/index.js';
import { type Scored, VerifierPool } from '../reward/index.js';
import { failureOf, type Trajectory } from '../rl/index.js';
import { appendJsonl, readJsonlTolerant, writeAtomic } from '../util/jsonl.js';
import { pidNamespace } from '../util/lock.js';
import { seedFor } from '../util/rng.js';
import type { TrainOptions, TrainStats } from '../worker/index.js';
import type { Recipe, Stage } from './config.js';
import { sectionProblems } from './data.js';
import { failuresWarning, Health, HealthError, type HealthWarning, stallWarning } from './health.js';
import { openRunLog, type RunLog } from './loggers.js';
import { runRl } from './rl-stage.js';
import { runSft } from './sft-stage.js';
import { mean, pad, type RunState, readState, round, type StageHost } from './stage.js';
import { generateProblems, type ProblemSpec } from './tasks.js';

export { type RunState, readState } from './stage.js';

// The training loop over a recipe's stages, writing the run directory of docs/RUN_DIR.md: stage order, resume,
// fork and checkpoints here; each stage's own loop in sft-stage.ts and rl-stage.ts. The policy, its engines and
// the sandbox sit behind Policy, so the loop is the same for the embedded torch worker, remote engines,
// and the fakes in tests.

export interface RolloutRequest {
  problems: Problem[]; // every one with an answer
  n: number;
  maxResponseTokens: number;
  maxTurns: number;
  temperature: number;
  /** Nucleus sampling; absent or 1 = off. */
  topP?: number;
  seed: number;
}

export interface ScoredItem {
  trajectory: Trajectory;
  advantage: number;
  /** The ratio's denominator when the trainer recomputed it (oldLogprobs: recompute); else the engine's. */
  oldLogprobs?: number[];
  /** Response-token logprobs under the reference policy (a stage with kl.coef > 0). */
  refLogprobs?: number[];
}

export interface HeldoutScore {
  /** Mean loss per trained token. */
  loss: number;
  /** Fraction of examples whose assistant turns after the first (a one-turn example: that turn) are the model's
   * greedy choice at every token, given the true prefix: for a tool demo, whether the model copies the tool's
   * result into its answer exactly; for a retry, whether it also writes the fixed call. */
  exact: number;
}

export interface Policy {
  /** n trajectories per problem, in problem order then sample order; `promptId` is the problem id. */
  rollout(req: RolloutRequest, onDone?: (done: number, total: number) => void): Promise<Trajectory[]>;
  /** One optimizer step on chat examples, loss on the assistant tokens (tool turns masked, as in RL). */
  sftStep(examples: ChatExample[], opts: TrainOptions, template?: SftTemplate): Promise<TrainStats>;
  /** Scores held-out examples without training (the SFT gate's check). */
  sftHeldout(examples: ChatExample[], template?: SftTemplate): Promise<HeldoutScore>;
  /** One optimizer step on these trajectories (the rollout engines get the new weights at syncWeights). */
  grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats>;
  /**
   * Pushes weights changed since the last push to the rollout engines; nothing to do where they share the
   * trainer's weights. The RL step calls it after its update; a rollout still pushes what another change (an SFT
   * step, a load, a re-init) left unsynced, so it never samples from stale weights.
   */
  syncWeights?(): Promise<void>;
  /** What the last rollout cost on the engines (makespan, tail, re-prefilled tokens, idle share). */
  lastRolloutStats?(): RolloutStats | undefined;
  /** Response-token logprobs of these trajectories under the current weights (oldLogprobs: recompute). */
  recomputeLogprobs?(trajectories: Trajectory[], temperature: number): Promise<number[][]>;
  /** The weights alone, without the optimizer (a KL loss's reference policy). */
  saveWeights?(dir: string): Promise<void>;
  /** Response-token logprobs (temperature 1, as the update's) under the weights saved in `dir` (kl's π_ref). */
  referenceLogprobs?(dir: string, trajectories: Trajectory[]): Promise<number[][]>;
  /** A fresh optimizer and step count (a stage with optimizer: fresh). */
  resetOptimizer?(): Promise<void>;
  /** New random weights from this seed and a fresh optimizer (an SFT gate's restart). */
  reinit?(seed: number): Promise<void>;
  /** Prompt length in tokens (the maxPromptTokens filter); absent = question characters. */
  promptTokens?(question: string): number;
  /** Tokens an SFT example renders to (the stage's maxTokens); without it, no example is dropped for length. */
  sftTokens?(example: ChatExample, template?: SftTemplate): number;
  /** Model, tokenizer and optimizer state (for exact resume). */
  save(dir: string): Promise<void>;
  load(dir: string): Promise<void>;
  close(): Promise<void>;
}

/** Scores one trajectory against its gold answer (default: reward/'s VerifierPool with the recipe's profile). */
export type RewardFn = (t: Trajectory, gold: string, problem: Problem) => Promise<Scored>;

export interface TrainerOptions {
  reward?: RewardFn;
  log?: (line: string) => void;
  progress?: boolean;
  /** How often heartbeat.json is rewritten (and the stall check made) besides at each phase change; default 30 s. */
  heartbeatMs?: number;
}

/** `heartbeat.json` (docs/RUN_DIR.md): where a live run is, rewritten at each phase and every 30 s. */
export interface Heartbeat {
  time: string;
  pid: number;
  host: string;
  ns: string; // pid namespace: a pid can be checked only from the same host and namespace
  stage: string | null;
  step: number; // the step being worked on (0: before the stage's first)
  /** starting, sft, heldout, filter, rollout, reward, update, eval, checkpoint; at the end done, stopped or failed */
  phase: string;
  progress: string; // when the last step (or eval, or filter chunk) finished, or the run started
  stallMinutes: number;
  stopping?: true; // a signal asked it to stop after this step
}

/** Thrown by `run` when `requestStop` stopped it at a step's end; `state` is what `--resume` goes on from. */
export class Stopped extends Error {
  constructor(readonly state: RunState | null) {
    super(state ? `stopped after ${state.stage} step ${state.step}` : 'stopped before any checkpoint');
  }
}

/** The prompt draws a checkpoint's RL stage had made (its trainer_state.json); none for SFT or older checkpoints. */
function promptDrawsAt(dir: string): Pick<RunState, 'promptDraws'> {
  const p = join(dir, 'trainer_state.json');
  const n = existsSync(p) ? (JSON.parse(readFileSync(p, 'utf8')) as RunState).promptDraws : undefined;
  return n === undefined ? {} : { promptDraws: n };
}

/**
 * Starts a new run directory from a checkpoint of another run (e.g. an ablation branching after SFT): copies
 * the checkpoint, writes the new config and a state.json pointing at it, so `run(true)` continues from there.
 * The source run's records up to the checkpoint are copied too, so the new run's files are complete.
 */
export function forkRun(srcDir: string, checkpoint: string, dstDir: string, recipe: Recipe): RunState {
  const m = /^(.+)-step-(\d+)$/.exec(checkpoint);
  const src = join(srcDir, 'checkpoints', checkpoint);
  if (!m || !existsSync(src)) throw new Error(`--fork: no checkpoint ${checkpoint} in ${srcDir}/checkpoints`);
  const stageIndex = recipe.stages.findIndex((s) => s.name === m[1]);
  if (stageIndex < 0) throw new Error(`--fork: checkpoint stage "${m[1]}" is not a stage of the recipe`);
  if (existsSync(join(dstDir, 'state.json'))) throw new Error(`--fork: ${dstDir} already holds a run`);
  mkdirSync(join(dstDir, 'checkpoints'), { recursive: true });
  mkdirSync(join(dstDir, 'trajectories'), { recursive: true });
  cpSync(src, join(dstDir, 'checkpoints', checkpoint), { recursive: true });
  for (const f of ['metrics.jsonl', 'evals.jsonl']) {
    if (existsSync(join(srcDir, f))) cpSync(join(srcDir, f), join(dstDir, f));
  }
  for (const f of readdirSync(join(srcDir, 'trajectories'))) {
    cpSync(join(srcDir, 'trajectories', f), join(dstDir, 'trajectories', f));
  }
  // a KL loss's reference weights, saved when a stage started: a fork inside that stage needs them
  if (existsSync(join(srcDir, 'reference')))
    cpSync(join(srcDir, 'reference'), join(dstDir, 'reference'), { recursive: true });
  writeFileSync(join(dstDir, 'config.json'), JSON.stringify(recipe, null, 2) + '\n');
  const step = Number(m[2]);
  const state: RunState = {
    stageIndex,
    stage: m[1],
    step,
    checkpoint: join('checkpoints', checkpoint),
    time: new Date().toISOString(),
    ...promptDrawsAt(src),
  };
  // a fork goes on from exactly these weights, as the source did from them: a stage that ended at this checkpoint
  // (its gate reached, or the best check a capped stage went back to) is not trained further, and from a capped
  // stage's last checkpoint it does not go back to a best check
  const ended = readJsonlTolerant<{ stage: string; step: number; gate?: string; restored?: number }>(
    join(srcDir, 'metrics.jsonl'),
  ).some((r) => r.stage === m[1] && ((r.step === step && r.gate === 'reached') || r.restored === step));
  if (step >= recipe.stages[stageIndex].steps || ended) state.stageDone = true;
  writeAtomic(join(dstDir, 'state.json'), JSON.stringify(state, null, 2) + '\n');
  return state;
}

// Reward checks take milliseconds; two threads keep up with a step's trajectories and leave the cores to
// the policy worker and the sandbox.
const REWARD_THREADS = Math.min(2, availableParallelism());

export class Trainer {
  private pool?: VerifierPool;
  private readonly log: (line: string) => void;
  private testSet: Problem[] = [];
  private readonly health: Health;
  private unhealthy: HealthWarning[] = [];
  private runLog?: RunLog;
  /** Every warning of this session, for the closing summary. */
  readonly warnings: HealthWarning[] = [];
  private stopAsked = false;
  /** The current RL stage's prompt draws so far, saved with each of its checkpoints. */
  private readonly draws = { count: 0 };
  /** What the stage loops (sft-stage.ts, rl-stage.ts) use of the trainer. */
  private readonly host: StageHost;
  private hb: Heartbeat;
  private stallWarned = false;

  constructor(
    private readonly recipe: Recipe,
    private readonly runDir: string,
    private readonly policy: Policy,
    private readonly opts: TrainerOptions = {},
  ) {
    this.log = opts.log ?? ((l) => process.stderr.write(`${l}\n`));
    this.health = new Health(recipe.health.zeroRewardSteps);
    const now = new Date().toISOString();
    this.hb = {
      time: now,
      pid: process.pid,
      host: hostname(),
      ns: pidNamespace(),
      stage: null,
      step: 0,
      phase: 'starting',
      progress: now,
      stallMinutes: recipe.health.stallMinutes,
    };
    this.host = {
      recipe,
      runDir,
      policy,
      health: this.health,
      draws: this.draws,
      progress: opts.progress ?? true,
      log: (line) => this.log(line),
      beat: (phase, stage, step) => this.beat(phase, stage, step),
      progressed: () => this.progressed(),
      warn: (warnings, record) => this.warn(warnings, record),
      record: (metrics) => {
        appendJsonl(join(this.runDir, 'metrics.jsonl'), [metrics]);
        this.runLog?.record('metrics', metrics);
      },
      score: (trajs, problems, at) => this.score(trajs, problems, at),
      evaluate: (stage, step) => this.evaluate(stage, step),
      checkpoint: (i, stage, step, done) => this.checkpoint(i, stage, step, done),
      stopPoint: (i, stage, step) => this.stopPoint(i, stage, step),
      generated: (name, rows, again) => this.generated(name, rows, again),
      generatedProblems: (name, spec, again) => this.generatedProblems(name, spec, again),
    };
  }

  /** Stops at the next safe point: the end of the current step, with a checkpoint there (`run` throws Stopped). */
  requestStop(): void {
    this.stopAsked = true;
    this.hb.stopping = true;
    this.beat();
  }

  private beat(phase?: string, stage?: string, step?: number): void {
    if (phase) this.hb.phase = phase;
    if (stage !== undefined) this.hb.stage = stage;
    if (step !== undefined) this.hb.step = step;
    this.hb.time = new Date().toISOString();
    writeAtomic(join(this.runDir, 'heartbeat.json'), JSON.stringify(this.hb) + '\n');
  }

  /** A step, eval or filter chunk finished: the stall clock starts again. */
  private progressed(): void {
    this.hb.progress = new Date().toISOString();
    this.stallWarned = false;
  }

  private checkStall(): void {
    const minutes = (Date.now() - Date.parse(this.hb.progress)) / 60_000;
    if (this.stallWarned || minutes < this.hb.stallMinutes) return;
    this.stallWarned = true;
    const at = this.hb.stage ? `${this.hb.stage} step ${this.hb.step}` : 'start';
    this.warn([stallWarning(at, this.hb.phase, minutes)]);
  }

  /** The end of a step: with a stop asked, a checkpoint here (unless the step made one) and Stopped. */
  private async stopPoint(stageIndex: number, stage: Stage, step: number): Promise<void> {
    const last = stageIndex === this.recipe.stages.length - 1 && step === stage.steps;
    if (!this.stopAsked || last) return;
    const s = readState(this.runDir);
    if (s?.stage !== stage.name || s.step !== step) await this.checkpoint(stageIndex, stage, step);
    throw new Stopped(readState(this.runDir));
  }

  /**
   * The built-in task generator writes its rows to `data/<name>.jsonl` in the run directory once, and they are
   * read back through data/'s loaders like any dataset: generated and file data take one path.
   */
  private generated(name: string, rows: () => unknown[], again = false): string {
    const file = join(this.runDir, 'data', `${name}.jsonl`);
    if (again || !existsSync(file)) {
      mkdirSync(join(this.runDir, 'data'), { recursive: true });
      writeAtomic(
        file,
        rows()
          .map((r) => JSON.stringify(r) + '\n')
          .join(''),
      );
    }
    return file;
  }

  private async generatedProblems(name: string, spec: ProblemSpec, again = false): Promise<Problem[]> {
    const file = this.generated(name, () => generateProblems(spec), again);
    return loadProblems(file, { layout: 'plain', requireAnswer: true });
  }

  private async loadTestSet(): Promise<void> {
    const e = this.recipe.eval;
    this.testSet = e.files
      ? (await sectionProblems(e)).slice(0, e.n)
      : // written again at every start: the same rows unless a resume changed the eval settings
        await this.generatedProblems(
          'eval',
          { seed: e.seed, n: e.n, split: 'test', levels: e.levels, kinds: e.kinds },
          true,
        );
  }

  private stageIndexOf(name: string): number {
    return this.recipe.stages.findIndex((s) => s.name === name);
  }

  /** Drops every record written after the last checkpoint, so resumed steps are not counted twice. */
  private truncateAfter(state: RunState | null): void {
    const after = (stage: string, step: number) => {
      if (!state) return true;
      const i = this.stageIndexOf(stage);
      return i > state.stageIndex || (i === state.stageIndex && step > state.step);
    };
    for (const f of ['metrics.jsonl', 'evals.jsonl']) {
      const p = join(this.runDir, f);
      if (!existsSync(p)) continue;
      const keep = readJsonlTolerant<{ stage: string; step: number }>(p).filter(
        (r) => !after(r.stage, r.step),
      );
      writeAtomic(p, keep.map((r) => JSON.stringify(r) + '\n').join(''));
    }
    for (const sub of ['trajectories', 'checkpoints']) {
      const dir = join(this.runDir, sub);
      if (!existsSync(dir)) continue;
      for (const name of readdirSync(dir)) {
        const m = /^(.+)-step-(\d+)(\.jsonl)?$/.exec(name);
        if (m && after(m[1], Number(m[2]))) rmSync(join(dir, name), { recursive: true, force: true });
      }
    }
  }

  /** Trains the recipe's stages into the run directory; `resume` goes on from its state.json. */
  async run(resume = false): Promise<{ evals: { stage: string; step: number; accuracy: number }[] }> {
    mkdirSync(join(this.runDir, 'trajectories'), { recursive: true });
    mkdirSync(join(this.runDir, 'checkpoints'), { recursive: true });
    this.beat('starting');
    const timer = setInterval(() => {
      this.beat();
      this.checkStall();
    }, this.opts.heartbeatMs ?? 30_000).unref();
    let final = 'failed';
    try {
      const evals = await this.stages(resume);
      final = 'done';
      return { evals };
    } catch (e) {
      if (e instanceof Stopped) final = 'stopped';
      throw e;
    } finally {
      clearInterval(timer);
      this.beat(final);
    }
  }

  private async stages(resume: boolean): Promise<{ stage: string; step: number; accuracy: number }[]> {
    let state: RunState | null = null;
    if (resume) {
      state = readState(this.runDir);
      if (state) {
        await this.policy.load(join(this.runDir, state.checkpoint));
        this.log(`resuming ${this.runDir} after ${state.stage} step ${state.step} (${state.checkpoint})`);
      } else this.log(`no state.json in ${this.runDir}: starting from the beginning`);
    } else {
      writeFileSync(join(this.runDir, 'config.json'), JSON.stringify(this.recipe, null, 2) + '\n');
    }
    this.truncateAfter(state);
    await this.loadTestSet();
    this.runLog = openRunLog(this.recipe.logger, this.recipe.stages, this.runDir, state);
    // a check that hangs (a parser gone exponential) is cut at the deadline and its worker thread replaced,
    // where one on this thread would stop the run for good
    if (!this.opts.reward)
      this.pool = new VerifierPool({
        size: REWARD_THREADS,
        defaults: {
          profile: this.recipe.reward.profile,
          timeoutMs: this.recipe.reward.timeoutMs,
          ...(this.recipe.reward.module ? { module: this.recipe.reward.module } : {}),
        },
      });
    try {
      for (let i = state?.stageIndex ?? 0; i < this.recipe.stages.length; i++) {
        const stage = this.recipe.stages[i];
        const start = state && i === state.stageIndex ? state.step : 0;
        // done, or a stage switched off with steps: 0; a capped stage that was to go back to its best check
        // and was killed before it did still does
        const capped = stage.type === 'sft' && stage.gate?.restoreBest;
        if (start >= stage.steps && !capped) continue;
        if (state?.stageDone && i === state.stageIndex) continue;
        if (this.stopAsked) throw new Stopped(readState(this.runDir)); // every stage ends on a checkpoint
        this.beat('starting', stage.name, start);
        this.health.resetStage();
        if (start === 0 && i > 0 && stage.optimizer === 'fresh') {
          if (!this.policy.resetOptimizer)
            throw new Error(`stage ${stage.name}: this policy cannot reset its optimizer`);
          await this.policy.resetOptimizer();
        }
        if (stage.type === 'rl') await runRl(this.host, i, stage, start);
        else {
          const best = await runSft(this.host, i, stage, start);
          if (best !== null) await this.restoreBest(i, stage, best);
        }
      }
    } finally {
      this.runLog.close();
      this.runLog = undefined;
      await this.pool?.close();
      this.pool = undefined;
    }
    return readJsonlTolerant<{ stage: string; step: number; accuracy: number }>(
      join(this.runDir, 'evals.jsonl'),
    );
  }

  /** Reports warnings (terminal + the record they are attached to); strict health stops at the next checkpoint. */
  private warn(warnings: HealthWarning[], record?: Record<string, unknown>): void {
    if (warnings.length === 0) return;
    for (const w of warnings) this.log(`WARNING [health] ${w.message}`);
    this.warnings.push(...warnings);
    if (record) record.health = warnings;
    if (this.recipe.health.strict) this.unhealthy.push(...warnings);
  }

  /** Scores trajectories in parallel; a check that ran out of time or failed is a 0 that is said, not hidden. */
  private async score(trajs: Trajectory[], problems: Problem[], at: string): Promise<Scored[]> {
    const byId = new Map(problems.map((p) => [p.id, p]));
    const reward: RewardFn =
      this.opts.reward ?? ((t, g, p) => (this.pool as VerifierPool).score(t, g, undefined, p));
    const out = await Promise.all(
      trajs.map((t) => {
        const p = byId.get(t.promptId);
        if (!p) throw new Error(`rollout returned a trajectory for unknown prompt ${t.promptId}`);
        return reward(t, p.answer ?? '', p);
      }),
    );
    for (const [i, r] of out.entries())
      if (r.timedOut || r.errored)
        this.log(
          `[reward] ${at}: check of a ${trajs[i].promptId} sample ${r.timedOut ? 'timed out' : 'failed'}, reward 0 (${r.reason})`,
        );
    return out;
  }

  private async checkpoint(stageIndex: number, stage: Stage, step: number, stageDone = false): Promise<void> {
    const rel = join('checkpoints', `${stage.name}-step-${pad(step)}`);
    const dir = join(this.runDir, rel);
    rmSync(dir, { recursive: true, force: true });
    this.beat('checkpoint');
    await this.policy.save(dir);
    const draws = stage.type === 'rl' ? { promptDraws: this.draws.count } : {};
    writeFileSync(
      join(dir, 'trainer_state.json'),
      JSON.stringify({ stage: stage.name, stageIndex, step, seed: this.recipe.seed, ...draws }) + '\n',
    );
    const state: RunState = {
      stageIndex,
      stage: stage.name,
      step,
      checkpoint: rel,
      time: new Date().toISOString(),
      ...(stageDone ? { stageDone } : {}),
      ...draws,
    };
    writeAtomic(join(this.runDir, 'state.json'), JSON.stringify(state, null, 2) + '\n');
    if (this.unhealthy.length > 0) throw new HealthError(this.unhealthy);
  }

  /** A capped stage goes on from its best check: those weights become the stage's result and what a resume loads. */
  private async restoreBest(stageIndex: number, stage: Stage, bestStep: number): Promise<void> {
    const rel = join('checkpoints', `${stage.name}-step-${pad(bestStep)}`);
    await this.policy.load(join(this.runDir, rel));
    const state: RunState = {
      stageIndex,
      stage: stage.name,
      step: stage.steps,
      checkpoint: rel,
      time: new Date().toISOString(),
      stageDone: true,
    };
    writeAtomic(join(this.runDir, 'state.json'), JSON.stringify(state, null, 2) + '\n');
    this.log(
      `[gate] ${stage.name}: not reached by the cap; going on from the best check, step ${bestStep} (${rel})`,
    );
  }

  async evaluate(stage: string, step: number): Promise<number> {
    const e = this.recipe.eval;
    this.beat('eval', stage, step);
    const trajs = await this.policy.rollout({
      problems: this.testSet,
      n: e.samples,
      maxResponseTokens: e.maxResponseTokens,
      maxTurns: e.maxTurns,
      temperature: e.temperature,
      topP: e.topP,
      seed: seedFor(this.recipe.seed, stage, step, 'eval'),
    });
    // samples an engine or the sandbox failed are no answers of the model's: left out, and said
    const failures = trajs.map(failureOf).filter((f) => f !== undefined);
    const scored = trajs.filter((t) => failureOf(t) === undefined);
    const scores = await this.score(scored, this.testSet, `eval ${stage} step ${step}`);
    const correct = scores.filter((r) => r.correct).length;
    const timeouts = scores.filter((r) => r.timedOut).length;
    const accuracy = correct / Math.max(1, scored.length);
    const record = {
      stage,
      step,
      accuracy: round(accuracy),
      n: scored.length,
      ...(failures.length ? { failed: failures.length } : {}),
      ...(timeouts ? { reward_timeouts: timeouts } : {}),
      samples: e.samples,
      temperature: e.temperature,
      split: 'test',
      tool_calls_mean: round(mean(trajs.map((t) => t.numToolCalls))),
      tool_errors_mean: round(mean(trajs.map((t) => t.numToolErrors))),
    };
    if (failures.length)
      this.warn([
        failuresWarning(
          `${stage} step ${step}`,
          failures.length,
          trajs.length,
          failures[0],
          'the held-out accuracy',
        ),
      ]);
    appendJsonl(join(this.runDir, 'evals.jsonl'), [record]);
    this.runLog?.record('evals', record);
    this.progressed();
    this.log(
      `[eval] ${stage} step ${step}: held-out accuracy ${(accuracy * 100).toFixed(1)}% ` +
        `(${this.testSet.length} problems × ${e.samples}, T=${e.temperature})`,
    );
    return accuracy;
  }
}

import {
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { availableParallelism, hostname } from 'node:os';
import { join } from 'node:path';
import { failureOf, sandboxFaultOf, type Trajectory } from '../agent/trajectory.js';
import {
  type ChatExample,
  type FilterResult,
  loadProblems,
  type Problem,
  type SftTemplate,
} from '../data/index.js';
import type { RolloutStats } from '../engines/scheduler.js';
import { type Scored, VerifierPool } from '../reward/index.js';
import { type PenaltyOptions, selectAndScore } from '../rl/index.js';
import { appendJsonl, readJsonlTolerant, writeAtomic } from '../util/jsonl.js';
import { pidNamespace } from '../util/lock.js';
import { Progress } from '../util/progress.js';
import { Rng, seedFor } from '../util/rng.js';
import type { TrainOptions, TrainStats } from '../worker/types.js';
import type { Recipe, RlStageConfig, SftStageConfig, Stage } from './config.js';
import {
  drawable,
  EpochSampler,
  rowFilters,
  sectionExamples,
  sectionProblems,
  weightedPicker,
  weightedSample,
} from './data.js';
import {
  describeGate,
  failuresWarning,
  type GateSpec,
  gainWarning,
  gatePassed,
  gateWarning,
  Health,
  HealthError,
  type HealthWarning,
  sftLossWarning,
  stallWarning,
} from './health.js';
import { openRunLog, type RunLog } from './loggers.js';
import { generateProblems, type ProblemSpec, sftExamples, toolCalls } from './tasks.js';

// The training loop over a recipe's stages, writing the run directory of docs/RUN_DIR.md. The policy, its
// engines and the sandbox sit behind PolicyBackend, so the loop is the same for the embedded torch worker,
// remote engines, and the fakes in tests.

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

export interface PolicyBackend {
  /** n trajectories per problem, in problem order then sample order; `promptId` is the problem id. */
  rollout(req: RolloutRequest, onDone?: (done: number, total: number) => void): Promise<Trajectory[]>;
  /** One optimizer step on chat examples, loss on the assistant tokens (tool turns masked, as in RL). */
  sftStep(examples: ChatExample[], opts: TrainOptions, template?: SftTemplate): Promise<TrainStats>;
  /** Scores held-out examples without training (the SFT gate's check). */
  sftHeldout(examples: ChatExample[], template?: SftTemplate): Promise<HeldoutScore>;
  /** One optimizer step on these trajectories; the new weights reach the rollout engines before the next rollout. */
  grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats>;
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

export interface RunState {
  stageIndex: number;
  stage: string;
  step: number; // completed steps of that stage
  checkpoint: string; // relative to the run dir
  time: string;
  /** The stage ended before its step count (its SFT gate was reached). */
  stageDone?: boolean;
  /** An RL stage: the prompt draws it made (a step's first and its redraws), where its epoch sampler goes on. */
  promptDraws?: number;
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

const MAX_REDRAWS = 8;
const pad = (n: number) => String(n).padStart(6, '0');
const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);
const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;

/** The stage's learning rate at a step (1-based); the worker applies warmup on top. */
export function stageLr(stage: Stage, step: number): number {
  if (stage.lrSchedule !== 'cosine') return stage.lr;
  return stage.minLr + (stage.lr - stage.minLr) * 0.5 * (1 + Math.cos((Math.PI * (step - 1)) / stage.steps));
}

/** The prompt draws a checkpoint's RL stage had made (its trainer_state.json); none for SFT or older checkpoints. */
function promptDrawsAt(dir: string): Pick<RunState, 'promptDraws'> {
  const p = join(dir, 'trainer_state.json');
  const n = existsSync(p) ? (JSON.parse(readFileSync(p, 'utf8')) as RunState).promptDraws : undefined;
  return n === undefined ? {} : { promptDraws: n };
}

export function readState(runDir: string): RunState | null {
  const p = join(runDir, 'state.json');
  return existsSync(p) ? (JSON.parse(readFileSync(p, 'utf8')) as RunState) : null;
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
  private promptDraws = 0;
  private hb: Heartbeat;
  private stallWarned = false;

  constructor(
    private readonly recipe: Recipe,
    private readonly runDir: string,
    private readonly backend: PolicyBackend,
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

  /** An SFT stage's chat examples: its files, or demos generated from the task family into the run dir. */
  private async sftData(stage: SftStageConfig): Promise<ChatExample[]> {
    const d = stage.data;
    const files = d.files ?? [
      this.generated(stage.name, () => {
        const problems = generateProblems({
          seed: d.seed,
          n: stage.demos,
          split: 'train',
          levels: d.levels,
          kinds: d.kinds,
        });
        return sftExamples(problems, stage.demoMix, seedFor(this.recipe.seed, stage.name, 'demos'), {
          echo: stage.echo,
          trainFailedCalls: stage.trainFailedCalls,
        });
      }),
    ];
    const all = await sectionExamples(files, d.limit, d.files ? d.weights : null);
    const count = this.backend.sftTokens?.bind(this.backend);
    if (stage.maxTokens === null || !count) return all;
    const kept = all.filter((ex) => count(ex, stage.template) <= stage.maxTokens!);
    if (kept.length < all.length)
      this.log(
        `[${stage.name}] dropped ${all.length - kept.length} of ${all.length} examples: longer than maxTokens ${stage.maxTokens}`,
      );
    if (kept.length === 0)
      throw new Error(
        `stage ${stage.name}: every example is longer than maxTokens ${stage.maxTokens} tokens`,
      );
    return kept;
  }

  /**
   * Step s's examples (s from 1): the epoch sampler's draw s - 1, or (sampler 'independent') draws with replacement
   * seeded by the step. Either depends only on s, so a resumed stage goes on exactly.
   */
  private sftBatches(stage: SftStageConfig, demos: ChatExample[]): (step: number) => ChatExample[] {
    const weights = stage.data.files ? stage.data.weights : null;
    if (stage.sampler === 'independent') {
      const pick = weightedPicker(demos, weights);
      return (step) => {
        const rng = new Rng(seedFor(this.recipe.seed, stage.name, step, 'batch'));
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
      seedFor(this.recipe.seed, stage.name, 'sft'),
    );
    return (step) => sampler.draw(step - 1);
  }

  private filtered<T>(stage: string, r: FilterResult<T>): T[] {
    if (r.dropped > 0) this.log(`[${stage}] dropped ${r.dropped} problems: ${r.reason}`);
    return r.kept;
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
        await this.backend.load(join(this.runDir, state.checkpoint));
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
          if (!this.backend.resetOptimizer)
            throw new Error(`stage ${stage.name}: this backend cannot reset its optimizer`);
          await this.backend.resetOptimizer();
        }
        if (stage.type === 'sft') await this.runSft(i, stage, start);
        else await this.runRl(i, stage, start);
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
    await this.backend.save(dir);
    const draws = stage.type === 'rl' ? { promptDraws: this.promptDraws } : {};
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

  private async runSft(stageIndex: number, stage: SftStageConfig, start: number): Promise<void> {
    const all = await this.sftData(stage);
    const gate = stage.gate;
    if (gate && gate.heldout >= all.length)
      throw new Error(
        `stage ${stage.name}: gate.heldout ${gate.heldout} leaves no examples of ${all.length} to train on`,
      );
    const held = gate ? all.slice(all.length - gate.heldout) : [];
    const least = gate?.on === 'tool' ? 1 : gate?.on === 'retry' ? 2 : 0;
    const heldout = held.filter((ex) => toolCalls(ex) >= least);
    if (gate && heldout.length === 0)
      throw new Error(
        `stage ${stage.name}: none of the ${gate.heldout} held-out examples calls a tool ${least > 1 ? 'more than once ' : ''}(gate.on: ${gate.on})`,
      );
    const demos = gate ? all.slice(0, all.length - gate.heldout) : all;
    const restart = gate?.restart ?? null;
    if (restart && (stageIndex !== 0 || this.recipe.model.path || !this.backend.reinit))
      throw new Error(
        `stage ${stage.name}: gate.restart re-initialises the model, so it is only for the first stage of a recipe that trains a preset from scratch`,
      );
    const fresh = (): HeldoutScore => ({ loss: Number.POSITIVE_INFINITY, exact: 0 });
    // best and bestStep cover the checks since the last (re)start: a restart forgets the abandoned weights
    let best = fresh();
    let bestStep = 0; // the step of the best check by the gate's own measure (exact if it has one)
    let since = 0; // the step of the last restart
    let restarts = 0;
    // with an exact gate, equal exact (e.g. 0 at every check) falls back to the loss, not to the earliest check
    const better = (a: HeldoutScore, b: HeldoutScore) =>
      gate?.exact != null ? a.exact > b.exact || (a.exact === b.exact && a.loss < b.loss) : a.loss < b.loss;
    if (gate && start > 0) {
      // a resumed stage picks up the checks it made before (metrics.jsonl is cut back to the checkpoint)
      const done = readJsonlTolerant<{
        stage: string;
        step: number;
        heldout_loss?: number;
        heldout_exact?: number;
        restart?: number;
      }>(join(this.runDir, 'metrics.jsonl'));
      for (const r of done)
        if (r.stage === stage.name && r.step <= start && r.heldout_loss !== undefined) {
          const score = { loss: r.heldout_loss, exact: r.heldout_exact ?? 0 };
          if (better(score, best)) bestStep = r.step;
          best = { loss: Math.min(best.loss, score.loss), exact: Math.max(best.exact, score.exact) };
          if (r.restart !== undefined) [best, bestStep, since, restarts] = [fresh(), 0, r.step, r.restart];
        }
    }
    const bar = new Progress(
      `${stage.name}`,
      stage.steps,
      (this.opts.progress ?? true) && !process.env.RSTAR2_NO_PROGRESS,
    );
    bar.set(start);
    const batchOf = this.sftBatches(stage, demos);
    for (let step = start + 1; step <= stage.steps; step++) {
      const t0 = Date.now();
      const batch = batchOf(step);
      this.beat('sft', stage.name, step);
      const st = await this.backend.sftStep(
        batch,
        { lr: stageLr(stage, step), warmupSteps: stage.warmupSteps },
        stage.template,
      );
      const record: Record<string, unknown> = {
        stage: stage.name,
        step,
        time: new Date().toISOString(),
        loss: round(st.loss),
        grad_norm: round(st.gradNorm),
        lr: st.lr,
        epoch: round((step * stage.batchSize) / demos.length, 3), // passes over the training examples, as HF logs it
        tokens_per_s: Math.round(st.tokensPerS),
        time_update_s: round((Date.now() - t0) / 1000, 3),
      };
      const warnings = sftLossWarning(stage.name, step, st.loss);
      let passed = false;
      let extraCheckpoint = false;
      if (gate && (step % gate.every === 0 || step === stage.steps)) {
        this.beat('heldout');
        const score = await this.backend.sftHeldout(heldout, stage.template);
        record.heldout_loss = round(score.loss);
        record.heldout_exact = round(score.exact);
        const improved = better(score, best);
        if (improved) bestStep = step;
        best = { loss: Math.min(best.loss, score.loss), exact: Math.max(best.exact, score.exact) };
        passed = gatePassed(gate, score);
        if (passed) record.gate = 'reached';
        else if (step === stage.steps) {
          warnings.push(gateWarning(stage.name, step, best, gate));
          // the weights the run goes on from, for whoever forks or reads it later
          if (gate.restoreBest && bestStep > 0 && bestStep < stage.steps) record.restored = bestStep;
        }
        // the best weights must exist on disk if the stage is to go back to them at its cap
        if (gate.restoreBest && improved && !passed && step < stage.steps) extraCheckpoint = true;
        if (
          restart &&
          !passed &&
          best.loss > restart.loss &&
          step - since >= restart.within &&
          restarts < restart.max &&
          step < stage.steps
        ) {
          restarts++;
          const seed = seedFor(this.recipe.seed, stage.name, 'restart', restarts);
          this.log(
            `[gate] ${stage.name}: held-out loss ${round(best.loss)} after ${step - since} steps, not at or below ${restart.loss}; re-initialising the model (restart ${restarts} of ${restart.max}, seed ${seed})`,
          );
          await this.backend.reinit?.(seed); // present: checked before the stage started
          record.restart = restarts;
          [best, bestStep, since] = [fresh(), 0, step];
          extraCheckpoint = true; // a resume must not go back to the abandoned weights
        }
      }
      this.warn(warnings, record);
      appendJsonl(join(this.runDir, 'metrics.jsonl'), [record]);
      this.runLog?.record('metrics', record);
      this.progressed();
      bar.set(step, `loss=${st.loss.toFixed(3)}`);
      if (passed) {
        bar.finish();
        this.log(
          `[gate] ${stage.name}: held-out loss ${record.heldout_loss}, exact ${record.heldout_exact} at step ${step} (${describeGate(gate as GateSpec)}); stage done`,
        );
        await this.checkpoint(stageIndex, stage, step, true);
        return;
      }
      if (step % stage.checkpointEvery === 0 || step === stage.steps || extraCheckpoint)
        await this.checkpoint(stageIndex, stage, step);
      await this.stopPoint(stageIndex, stage, step);
    }
    bar.finish();
    if (gate?.restoreBest && bestStep > 0 && bestStep < stage.steps)
      await this.restoreBest(stageIndex, stage, bestStep);
  }

  /** A capped stage goes on from its best check: those weights become the stage's result and what a resume loads. */
  private async restoreBest(stageIndex: number, stage: Stage, bestStep: number): Promise<void> {
    const rel = join('checkpoints', `${stage.name}-step-${pad(bestStep)}`);
    await this.backend.load(join(this.runDir, rel));
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
    const trajs = await this.backend.rollout({
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

  /**
   * The stage's prompt pool: its files (or generated problems) after the row filters, then with filter
   * 'unsolved' only problems the current policy does not solve in every one of `filterSamples` samples (the
   * paper's difficulty filter). The policy pass goes in chunks whose counts are appended to
   * `filter-<stage>.jsonl`, so an interrupted pass resumes where it stopped; the final pool is cached.
   */
  private async rlPool(stage: RlStageConfig): Promise<Problem[]> {
    const pool = await this.rlPoolCached(stage);
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

  private async rlPoolCached(stage: RlStageConfig): Promise<Problem[]> {
    const path = join(this.runDir, `pool-${stage.name}.json`);
    if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8')) as Problem[];
    const d = stage.data;
    const repeats = { dropped: 0 };
    let pool: Problem[] = d.files
      ? await sectionProblems(d, repeats)
      : await this.generatedProblems(stage.name, {
          seed: seedFor(d.seed, stage.name),
          n: d.filter === 'all' ? 2000 : d.filterPool,
          split: 'train',
          levels: d.levels,
          kinds: d.kinds,
        });
    if (repeats.dropped > 0)
      this.log(`[${stage.name}] dropped ${repeats.dropped} problems while reading: duplicate question`);
    const count = this.backend.promptTokens?.bind(this.backend) ?? ((q: string) => q.length);
    pool = rowFilters(pool, d, count, (r) => this.filtered(stage.name, r));
    if (pool.length === 0) throw new Error(`stage ${stage.name}: no problems left after the data filters`);
    if (d.filter === 'unsolved') {
      const screened = d.files
        ? new Rng(seedFor(d.seed, stage.name)).sample(pool, Math.min(d.filterPool, pool.length))
        : pool;
      const solved = await this.solvedCounts(stage, screened);
      pool = this.filtered(stage.name, {
        kept: screened.filter((p) => (solved.get(p.id) ?? 0) < d.filterSamples),
        dropped: screened.filter((p) => (solved.get(p.id) ?? 0) >= d.filterSamples).length,
        reason: `solved in all ${d.filterSamples} samples by the current policy (filter 'unsolved')`,
      });
      this.log(`[${stage.name}] filter 'unsolved': ${pool.length}/${screened.length} problems kept`);
      if (pool.length === 0) throw new Error(`stage ${stage.name}: the 'unsolved' filter left no problems`);
    }
    writeAtomic(path, JSON.stringify(pool));
    return pool;
  }

  /** Correct samples per problem under the current policy, resumable through `filter-<stage>.jsonl`. */
  private async solvedCounts(stage: RlStageConfig, problems: Problem[]): Promise<Map<string, number>> {
    const file = join(this.runDir, `filter-${stage.name}.jsonl`);
    const solved = new Map<string, number>();
    for (const r of readJsonlTolerant<{ id: string; solved: number }>(file)) solved.set(r.id, r.solved);
    const todo = problems.filter((p) => !solved.has(p.id));
    if (solved.size > 0)
      this.log(`[${stage.name}] filter pass resumed: ${solved.size} problems already screened`);
    const chunk = Math.max(1, stage.promptsPerStep);
    for (let i = 0; i < todo.length; i += chunk) {
      const part = todo.slice(i, i + chunk);
      this.beat('filter', stage.name, 0);
      const trajs = await this.backend.rollout({
        problems: part,
        n: stage.data.filterSamples,
        maxResponseTokens: stage.maxResponseTokens,
        maxTurns: stage.maxTurns,
        temperature: stage.temperature,
        topP: stage.topP,
        seed: seedFor(this.recipe.seed, stage.name, 'filter', i),
      });
      const counts = new Map(part.map((p) => [p.id, 0]));
      const scores = await this.score(trajs, part, `${stage.name} filter`);
      for (const [j, t] of trajs.entries())
        if (scores[j].correct) counts.set(t.promptId, (counts.get(t.promptId) ?? 0) + 1);
      appendJsonl(
        file,
        [...counts].map(([id, n]) => ({ id, solved: n })),
      );
      for (const [id, n] of counts) solved.set(id, n);
      this.progressed();
    }
    return solved;
  }

  /**
   * A step's prompts, draw after draw (its first, then its redraws): the epoch sampler's next ones, counted in
   * promptDraws so a resume goes on from there, or ('independent') a fresh sample seeded by step and attempt.
   */
  private promptPicker(stage: RlStageConfig, pool: Problem[], start: number) {
    const { weights } = stage.data;
    if (stage.sampler === 'independent')
      return (step: number, attempt: number) => {
        const again = attempt > 0 ? [attempt] : [];
        const rng = new Rng(seedFor(this.recipe.seed, stage.name, step, 'prompts', ...again));
        return weightedSample(pool, weights, stage.promptsPerStep, rng);
      };
    const seed = seedFor(this.recipe.seed, stage.name, 'prompts');
    const sampler = new EpochSampler(pool, weights, stage.promptsPerStep, seed);
    this.promptDraws = start === 0 ? 0 : this.resumedDraws(stage, start);
    return () => sampler.draw(this.promptDraws++);
  }

  /**
   * How many prompt draws the stage made up to `step`: what the checkpoint resumed from says, else (a run directory
   * from before promptDraws was saved) a draw per step plus its redraws, from metrics.jsonl.
   */
  private resumedDraws(stage: RlStageConfig, step: number): number {
    const s = readState(this.runDir);
    if (s?.stage === stage.name && s.step === step && s.promptDraws !== undefined) return s.promptDraws;
    return readJsonlTolerant<{ stage: string; step: number; redraws?: number }>(
      join(this.runDir, 'metrics.jsonl'),
    )
      .filter((r) => r.stage === stage.name && r.step <= step)
      .reduce((a, r) => a + 1 + (r.redraws ?? 0), 0);
  }

  /** One rollout of a step's prompts, scored, then reject-equal-reward + RoC + advantages. */
  private async rlDraw(
    stage: RlStageConfig,
    problems: Problem[],
    n: number,
    roc: Parameters<typeof selectAndScore>[1],
    penalty: PenaltyOptions,
    step: number,
    attempt: number,
  ) {
    const again = attempt > 0 ? [attempt] : [];
    this.beat('rollout', stage.name, step);
    const trajs = await this.backend.rollout({
      problems,
      n,
      maxResponseTokens: stage.maxResponseTokens,
      maxTurns: stage.maxTurns,
      temperature: stage.temperature,
      topP: stage.topP,
      seed: seedFor(this.recipe.seed, stage.name, step, 'rollout', ...again),
    });
    const t1 = Date.now();
    const byId = new Map(problems.map((p, i) => [p.id, i]));
    const groups: Trajectory[][] = problems.map(() => []);
    const failures: string[] = [];
    for (const t of trajs)
      if (!byId.has(t.promptId))
        throw new Error(`rollout returned a trajectory for unknown prompt ${t.promptId}`);
    this.beat('reward');
    const scores = await this.score(trajs, problems, `${stage.name} step ${step}`);
    const timeouts = scores.filter((r) => r.timedOut).length;
    const extraPenalty = new Map(trajs.map((t, j) => [t, scores[j].penalty]));
    for (const [j, t] of trajs.entries()) {
      const p = problems[byId.get(t.promptId) as number];
      const r = scores[j];
      Object.assign(t, { gold: p.answer, reward: r.reward, correct: r.correct });
      t.verify = { extracted: r.extracted, matchedBy: r.matchedBy };
      // an engine or sandbox failure is not the policy's doing: as a negative it would be trained against
      // (sandboxFaults 'keep' trains on a sandbox fault's text as the reference does; an engine error is always out)
      const why = failureOf(t);
      const kept = why === undefined || (stage.sandboxFaults === 'keep' && why === sandboxFaultOf(t));
      if (kept) groups[byId.get(t.promptId)!].push(t);
      else failures.push(why);
    }
    const t2 = Date.now();
    const sel = selectAndScore(
      groups.map((g) => g.map((t) => ({ ...t, reward: t.reward ?? 0, penalty: extraPenalty.get(t) }))),
      roc,
      penalty,
      new Rng(seedFor(this.recipe.seed, stage.name, step, 'roc', ...again)),
    );
    return { problems, trajs, groups, sel, failures, timeouts, t1, t2 };
  }

  /**
   * A stage's KL reference (kl.coef > 0): the weights saved under `reference/` when it started ('stage') or when the
   * run's first RL stage did ('initial', verl's reference policy); null without a KL loss.
   */
  private async referencePolicy(stage: RlStageConfig, start: number): Promise<string | null> {
    const rl = this.recipe.stages.filter((s): s is RlStageConfig => s.type === 'rl');
    const save = async (name: string) => {
      const dir = join(this.runDir, 'reference', name);
      rmSync(`${dir}.tmp`, { recursive: true, force: true });
      await (this.backend.saveWeights ?? this.backend.save).call(this.backend, `${dir}.tmp`);
      rmSync(dir, { recursive: true, force: true });
      renameSync(`${dir}.tmp`, dir);
    };
    if (start === 0 && rl[0] === stage && rl.some((s) => s.kl.coef > 0 && s.kl.reference === 'initial'))
      await save('initial');
    if (stage.kl.coef === 0) return null;
    const name = stage.kl.reference === 'initial' ? 'initial' : stage.name;
    if (start === 0 && stage.kl.reference === 'stage') await save(name);
    const dir = join(this.runDir, 'reference', name);
    if (!existsSync(dir))
      throw new Error(
        `stage ${stage.name}: kl needs the reference weights in ${dir}, saved when ${name === 'initial' ? "the run's first RL stage" : 'the stage'} starts; this run went past that without them`,
      );
    if (!this.backend.referenceLogprobs)
      throw new Error(`stage ${stage.name}: kl.coef > 0 needs a backend that computes reference logprobs`);
    return dir;
  }

  private async runRl(stageIndex: number, stage: RlStageConfig, start: number): Promise<void> {
    const pool = await this.rlPool(stage);
    const prompts = this.promptPicker(stage, pool, start);
    const reference = await this.referencePolicy(stage, start);
    if (start === 0 && this.recipe.eval.atStart) await this.evaluate(stage.name, 0);
    const roc = { ...stage.roc, downSampleToN: stage.groupSize };
    const penalty: PenaltyOptions = {
      errorMatch: stage.roc.errorMatch,
      noToolErrorPenalty: stage.roc.noToolErrorPenalty,
      formatTurns: stage.roc.formatTurns,
      answerOpen: '<answer>',
      answerClose: '</answer>',
    };
    const n = roc.doDownSampling
      ? Math.max(stage.groupSize, Math.round(stage.groupSize * stage.oversample))
      : stage.groupSize;
    const bar = new Progress(
      `${stage.name}${roc.doDownSampling ? ' (RoC)' : ''}`,
      stage.steps,
      (this.opts.progress ?? true) && !process.env.RSTAR2_NO_PROGRESS,
    );
    bar.set(start);
    for (let step = start + 1; step <= stage.steps; step++) {
      const t0 = Date.now();
      // 'redraw' (the reference): a step whose groups are all rejected does not count; new prompts are drawn
      let d = await this.rlDraw(stage, prompts(step, 0), n, roc, penalty, step, 0);
      let redraws = 0;
      let timeouts = d.timeouts;
      while (stage.emptyStep === 'redraw' && d.sel.kept.length === 0 && redraws < MAX_REDRAWS) {
        redraws++;
        d = await this.rlDraw(stage, prompts(step, redraws), n, roc, penalty, step, redraws);
        timeouts += d.timeouts;
      }
      const { problems, trajs, groups, sel, failures, t1, t2 } = d;
      const items: ScoredItem[] = sel.kept.map((k) => ({
        trajectory: groups[k.group][k.index],
        advantage: k.advantage,
      }));
      this.beat('update');
      if (stage.oldLogprobs === 'recompute' && items.length > 0) {
        if (!this.backend.recomputeLogprobs)
          throw new Error(
            `stage ${stage.name}: oldLogprobs 'recompute' needs a backend that computes logprobs`,
          );
        const old = await this.backend.recomputeLogprobs(
          items.map((it) => it.trajectory),
          stage.temperature,
        );
        for (const [i, it] of items.entries()) it.oldLogprobs = old[i];
      }
      if (reference && items.length > 0) {
        const refs = await this.backend.referenceLogprobs!(
          reference,
          items.map((it) => it.trajectory),
        );
        for (const [i, it] of items.entries()) it.refLogprobs = refs[i];
      }
      // update (several mini-batches activate the clipped ratio; epochs pass over them again)
      const stats: TrainStats[] = [];
      // verl splits what was kept into mini-batches of the nominal size (ppo_mini_batch_size prompts × rollout.n)
      // and scales each micro-batch's loss by its share of that size: a step RoC cut takes fewer, smaller steps
      const nominal = (stage.promptsPerStep / stage.miniBatches) * n;
      const verl = stage.lossAgg === 'micro-mean-nominal';
      const mb = verl ? nominal : Math.max(1, Math.ceil(items.length / stage.miniBatches));
      for (let epoch = 0; epoch < stage.epochs; epoch++)
        for (let j = 0; j < items.length; j += mb) {
          stats.push(
            await this.backend.grpoStep(items.slice(j, j + mb), {
              lr: stageLr(stage, step),
              warmupSteps: stage.warmupSteps,
              clipLow: stage.clipLow,
              clipHigh: stage.clipHigh,
              lossAgg: stage.lossAgg,
              ...(verl ? { nominalSeqs: nominal } : {}),
              ...(reference ? { klCoef: stage.kl.coef, klEstimator: stage.kl.estimator } : {}),
              ...(stage.entropyCoef > 0 ? { entropyCoef: stage.entropyCoef } : {}),
            }),
          );
        }
      const t3 = Date.now();
      const rollout = this.backend.lastRolloutStats?.();
      // log: rates over the trajectories the model answered; the file keeps them all
      const all = trajs;
      const answered = groups.flat();
      const metrics: Record<string, unknown> & {
        reward_mean: number;
        accuracy: number;
        tool_calls_mean: number;
      } = {
        stage: stage.name,
        step,
        time: new Date().toISOString(),
        reward_mean: round(mean(answered.map((t) => t.reward ?? 0))),
        accuracy: round(mean(answered.map((t) => (t.correct ? 1 : 0)))),
        ...(failures.length ? { failed: failures.length } : {}),
        ...(timeouts ? { reward_timeouts: timeouts } : {}),
        tool_error_ratio_pos: round(sel.metrics.tool_error_ratio_pos),
        tool_error_ratio_pos_kept: round(sel.metrics.tool_error_ratio_pos_kept),
        format_penalty_pos: round(sel.metrics.format_penalty_pos),
        response_len_mean: round(mean(all.map((t) => t.responseIds.length)), 1),
        turns_mean: round(mean(all.map((t) => t.events.filter((e) => e.kind === 'generation').length)), 3),
        tool_calls_mean: round(mean(all.map((t) => t.numToolCalls)), 3),
        ...(stats.length > 0
          ? {
              clip_frac: round(mean(stats.map((s) => s.clipFrac))),
              entropy: round(mean(stats.map((s) => s.entropy))),
              ...(reference ? { kl: round(mean(stats.map((s) => s.kl ?? 0))) } : {}),
              grad_norm: round(mean(stats.map((s) => s.gradNorm))),
              loss: round(mean(stats.map((s) => s.loss))),
              lr: stats[stats.length - 1].lr,
            }
          : { skipped: true }),
        ...(redraws > 0 ? { redraws } : {}),
        tokens_per_s: Math.round(
          all.reduce((a, t) => a + t.responseIds.length, 0) / Math.max(0.001, (t1 - t0) / 1000),
        ),
        time_rollout_s: round((t1 - t0) / 1000, 3),
        ...(rollout ? { rollout } : {}),
        time_reward_s: round((t2 - t1) / 1000, 3),
        time_update_s: round((t3 - t2) / 1000, 3),
        roc: {
          before: sel.metrics.before,
          after: sel.metrics.after,
          groups_kept: sel.metrics.groups_kept,
          groups_rejected_all_correct: sel.metrics.groups_rejected_all_correct,
          groups_rejected_all_wrong: sel.metrics.groups_rejected_all_wrong,
          groups_too_few: sel.metrics.groups_too_few,
          penalty_pos_mean: round(sel.metrics.penalty_pos_mean),
          penalty_pos_kept_mean: round(sel.metrics.penalty_pos_kept_mean),
          answers_zero: sel.metrics.answers_zero,
          answers_one: sel.metrics.answers_one,
          answers_gt_one: sel.metrics.answers_gt_one,
        },
      };
      this.warn(
        this.health.rlStep({
          stage: stage.name,
          step,
          rewardMean: metrics.reward_mean,
          groups: problems.length,
          groupsKept: sel.metrics.groups_kept,
          groupsAllCorrect: sel.metrics.groups_rejected_all_correct,
          toolCalls: all.reduce((a, t) => a + t.numToolCalls, 0),
          toolErrors: all.reduce((a, t) => a + t.numToolErrors, 0),
          loss: stats.length > 0 ? mean(stats.map((s) => s.loss)) : undefined,
          trajectories: all.length,
          failed: failures.length,
          failure: failures[0],
        }),
        metrics,
      );
      const kept = new Map(items.map((it) => [it.trajectory, it.advantage]));
      writeAtomic(
        join(this.runDir, 'trajectories', `${stage.name}-step-${pad(step)}.jsonl`),
        all
          .map((t) => JSON.stringify({ ...t, kept: kept.has(t), advantage: kept.get(t) ?? null }) + '\n')
          .join(''),
      );
      appendJsonl(join(this.runDir, 'metrics.jsonl'), [metrics]);
      this.runLog?.record('metrics', metrics);
      this.progressed();
      bar.set(
        step,
        `reward=${metrics.reward_mean.toFixed(2)} acc=${metrics.accuracy.toFixed(2)} tools=${metrics.tool_calls_mean.toFixed(2)}`,
      );
      if ((stage.evalEvery > 0 && step % stage.evalEvery === 0) || step === stage.steps) {
        await this.evaluate(stage.name, step);
      }
      if (step === stage.steps) {
        const evals = readJsonlTolerant<{ stage: string; accuracy: number }>(
          join(this.runDir, 'evals.jsonl'),
        ).filter((r) => r.stage === stage.name);
        if (evals.length > 1)
          this.warn(gainWarning(stage.name, evals[0].accuracy, evals[evals.length - 1].accuracy));
      }
      if (step % stage.checkpointEvery === 0 || step === stage.steps)
        await this.checkpoint(stageIndex, stage, step);
      await this.stopPoint(stageIndex, stage, step);
    }
    bar.finish();
  }
}

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Problem } from '../data/index.js';
import type { Scored } from '../reward/index.js';
import type { Trajectory } from '../rl/index.js';
import { Progress } from '../util/progress.js';
import type { Recipe, Stage } from './config.js';
import type { Health, HealthWarning } from './health.js';
import type { ProblemSpec } from './tasks.js';
import type { Policy } from './trainer.js';

// What a stage (sft-stage.ts, rl-stage.ts) gets from the trainer: the run directory's records, heartbeat,
// checkpoints and stop point stay the trainer's, so each stage file holds only its own loop.

export interface StageHost {
  readonly recipe: Recipe;
  readonly runDir: string;
  readonly policy: Policy;
  readonly health: Health;
  /** The current RL stage's prompt draws so far; the trainer saves them with each of its checkpoints. */
  readonly draws: { count: number };
  log(line: string): void;
  /** heartbeat.json: the phase the run is in (and the stage and step, when they change). */
  beat(phase?: string, stage?: string, step?: number): void;
  /** A step, eval or filter chunk finished: the stall clock starts again. */
  progressed(): void;
  /** Reports warnings (attached to `record` when given); strict health stops at the next checkpoint. */
  warn(warnings: HealthWarning[], record?: Record<string, unknown>): void;
  /** Appends a step's record to metrics.jsonl and the run's loggers. */
  record(metrics: Record<string, unknown>): void;
  score(trajs: Trajectory[], problems: Problem[], at: string): Promise<Scored[]>;
  evaluate(stage: string, step: number): Promise<number>;
  checkpoint(stageIndex: number, stage: Stage, step: number, stageDone?: boolean): Promise<void>;
  /** The end of a step: with a stop asked, a checkpoint here (unless the step made one) and Stopped. */
  stopPoint(stageIndex: number, stage: Stage, step: number): Promise<void>;
  /** A generated data file under `data/` of the run directory, written once (`again`: rewritten). */
  generated(name: string, rows: () => unknown[], again?: boolean): string;
  generatedProblems(name: string, spec: ProblemSpec, again?: boolean): Promise<Problem[]>;
  /** Whether a stage shows its progress bar. */
  readonly progress: boolean;
}

/** state.json (docs/RUN_DIR.md): the last checkpoint, where `--resume` goes on. */
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

export function readState(runDir: string): RunState | null {
  const p = join(runDir, 'state.json');
  return existsSync(p) ? (JSON.parse(readFileSync(p, 'utf8')) as RunState) : null;
}

export const pad = (n: number) => String(n).padStart(6, '0');
export const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);
export const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;

export function stageBar(host: StageHost, label: string, stage: Stage, start: number): Progress {
  const bar = new Progress(label, stage.steps, host.progress && !process.env.RSTAR2_NO_PROGRESS);
  bar.set(start);
  return bar;
}

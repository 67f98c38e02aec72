import { appendFileSync, existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { crc32c } from '@node-rs/crc32';
import protobuf from 'protobufjs';
import { readJson, readJsonlTolerant } from '../util/jsonl.js';
import type { LoggerName } from './config.js';

// Experiment tracking. metrics.jsonl and evals.jsonl stay the run's record (resume and the dashboard read them);
// loggers copy each record out as scalars under the names verl runs use (actor/pg_loss, critic/score/mean,
// val/accuracy, ...), so an rstar2 run sits next to others in the same TensorBoard or W&B workspace.

export interface MetricsLogger {
  log(step: number, scalars: Record<string, number>, wallTime: number): void;
  close(): void;
}

export const WANDB_UNAVAILABLE =
  'logger wandb: there is no Weights & Biases client for Node that works offline (@wandb/sdk 0.5.1, the only ' +
  'one, needs an API key and api.wandb.ai to start a run, and keeps nothing on disk in WANDB_MODE=offline). ' +
  'Use --logger tensorboard and upload the event files with `wandb sync --sync-tensorboard RUN/tensorboard`, ' +
  'or convert a finished run with `rstar2 export-metrics RUN --tensorboard DIR`';

/** Fails before any training starts for a logger this build cannot provide. */
export function checkLoggers(names: readonly LoggerName[]): void {
  if (names.includes('wandb')) throw new Error(WANDB_UNAVAILABLE);
}

// --- TensorBoard event files -----------------------------------------------------------------------------

// The part of tensorflow/core/util/event.proto and framework/summary.proto a scalar curve needs. simple_value
// sits in a oneof as in TensorFlow, so 0.0 is written with presence (TensorBoard ignores a value without it).
const EVENT_PROTO = `
syntax = "proto3";
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what {
    string file_version = 3;
    Summary summary = 5;
    SessionLog session_log = 6;
  }
}
message Summary {
  message Value {
    string tag = 1;
    oneof value { float simple_value = 2; }
  }
  repeated Value value = 1;
}
message SessionLog {
  enum SessionStatus { STATUS_UNSPECIFIED = 0; START = 1; STOP = 2; CHECKPOINT = 3; }
  SessionStatus status = 1;
}`;

let eventType: protobuf.Type | undefined;
const Event = () => (eventType ??= protobuf.parse(EVENT_PROTO, { keepCase: true }).root.lookupType('Event'));

/** TFRecord's checksum: CRC32C rotated and offset, so a CRC of data that itself holds CRCs stays informative. */
function maskedCrc(data: Uint8Array): number {
  const c = crc32c(data);
  return (((c >>> 15) | (c << 17)) + 0xa282ead8) >>> 0;
}

/** One TFRecord: u64 length, masked CRC of the length, data, masked CRC of the data (all little-endian). */
export function tfRecord(data: Uint8Array): Buffer {
  const head = Buffer.alloc(12);
  head.writeBigUInt64LE(BigInt(data.length), 0);
  head.writeUInt32LE(maskedCrc(head.subarray(0, 8)), 8);
  const tail = Buffer.alloc(4);
  tail.writeUInt32LE(maskedCrc(data), 0);
  return Buffer.concat([head, data, tail]);
}

/**
 * Appends events to `<dir>/events.out.tfevents.<unix>.<hostname>`, one synchronous write per event, so a
 * killed run leaves a readable file. Each session opens with SessionLog START at `firstStep`: TensorBoard then
 * drops what an earlier session wrote at or after that step (the steps a resume redoes).
 */
export class TensorBoardLogger implements MetricsLogger {
  readonly path: string;

  constructor(dir: string, firstStep = 0) {
    mkdirSync(dir, { recursive: true });
    const base = join(dir, `events.out.tfevents.${Math.floor(Date.now() / 1000)}.${hostname()}`);
    let path = base;
    for (let i = 1; existsSync(path); i++) path = `${base}.${i}`;
    this.path = path;
    const now = Date.now() / 1000;
    this.write({ wall_time: now, step: 0, file_version: 'brain.Event:2' });
    this.write({ wall_time: now, step: firstStep, session_log: { status: 'START' } });
  }

  private write(event: Record<string, unknown>): void {
    appendFileSync(this.path, tfRecord(Event().encode(Event().fromObject(event)).finish()));
  }

  log(step: number, scalars: Record<string, number>, wallTime: number): void {
    const value = Object.entries(scalars).map(([tag, v]) => ({ tag, simple_value: v }));
    if (value.length > 0) this.write({ wall_time: wallTime, step, summary: { value } });
  }

  close(): void {} // nothing buffered
}

// --- record fields -> scalar names -------------------------------------------------------------------------

type Rec = Record<string, unknown>;

// verl's name where verl logs the same quantity; null: a setting of the eval, not a measurement.
const RL_NAMES: Record<string, string> = {
  loss: 'actor/pg_loss',
  clip_frac: 'actor/clipfrac',
  entropy: 'actor/entropy',
  grad_norm: 'actor/grad_norm',
  lr: 'actor/lr',
  reward_mean: 'critic/score/mean',
  response_len_mean: 'response_length/mean',
  accuracy: 'rollout/accuracy',
  turns_mean: 'rollout/turns_mean',
  tool_calls_mean: 'rollout/tool_calls_mean',
  skipped: 'rollout/skipped',
  redraws: 'rollout/redraws',
  tool_error_ratio_pos: 'roc/tool_error_ratio_pos',
  tool_error_ratio_pos_kept: 'roc/tool_error_ratio_pos_kept',
  format_penalty_pos: 'roc/format_penalty_pos',
  roc: 'roc',
  tokens_per_s: 'perf/throughput',
  time_rollout_s: 'timing_s/gen',
  rollout: 'rollout',
  time_reward_s: 'timing_s/reward',
  time_update_s: 'timing_s/update_actor',
};
const SFT_NAMES: Record<string, string> = {
  loss: 'sft/loss',
  heldout_loss: 'sft/heldout_loss',
  heldout_exact: 'sft/heldout_exact',
  grad_norm: 'actor/grad_norm',
  lr: 'actor/lr',
  tokens_per_s: 'perf/throughput',
  time_update_s: 'timing_s/update_actor',
};
const EVAL_NAMES: Record<string, string | null> = {
  accuracy: 'val/accuracy',
  n: null,
  samples: null,
  temperature: null,
};

/** The scalars of one metrics.jsonl (sft/rl) or evals.jsonl (eval) record; unknown numbers go under misc/ (val/). */
export function scalarsOf(kind: 'sft' | 'rl' | 'eval', rec: Rec): Record<string, number> {
  const names: Record<string, string | null> =
    kind === 'sft' ? SFT_NAMES : kind === 'rl' ? RL_NAMES : EVAL_NAMES;
  const out: Record<string, number> = {};
  const put = (name: string, v: unknown) => {
    if (typeof v === 'number' || typeof v === 'boolean') out[name] = Number(v);
    else if (v && typeof v === 'object' && !Array.isArray(v))
      for (const [k, x] of Object.entries(v)) put(`${name}/${k}`, x);
  };
  for (const [k, v] of Object.entries(rec)) {
    if (k === 'stage' || k === 'step' || k === 'time') continue;
    if (k === 'health') out['health/warnings'] = Array.isArray(v) ? v.length : 0;
    else if (k === 'gate') out['sft/gate_reached'] = v === 'reached' ? 1 : 0;
    else if (names[k] !== null) put(names[k] ?? (kind === 'eval' ? `val/${k}` : `misc/${k}`), v);
  }
  return out;
}

// --- the run's loggers -------------------------------------------------------------------------------------

export interface StageInfo {
  name: string;
  type: 'sft' | 'rl';
  steps: number;
}

/**
 * Sends run records to the loggers at a global step: a stage's steps follow the `steps` of every earlier stage,
 * so curves of successive stages never overlap (a stage ended early by its gate leaves a gap). `stage/index`
 * marks where each stage begins.
 */
export class RunLog {
  private readonly stages = new Map<string, StageInfo & { index: number; offset: number }>();
  private wallTime = 0;

  constructor(
    stages: StageInfo[],
    private readonly loggers: MetricsLogger[],
  ) {
    let offset = 0;
    for (const [index, s] of stages.entries()) {
      this.stages.set(s.name, { ...s, index, offset });
      offset += s.steps;
    }
  }

  private stage(name: unknown) {
    const s = this.stages.get(String(name));
    if (!s) throw new Error(`metrics record of stage "${name}", which the run's config does not have`);
    return s;
  }

  globalStep(stage: unknown, step: number): number {
    return this.stage(stage).offset + step;
  }

  record(file: 'metrics' | 'evals', rec: Rec): void {
    if (this.loggers.length === 0) return;
    const s = this.stage(rec.stage);
    const scalars = scalarsOf(file === 'evals' ? 'eval' : s.type, rec);
    if (file === 'metrics') scalars['stage/index'] = s.index;
    // evals carry no time of their own: they follow the step record before them
    this.wallTime =
      typeof rec.time === 'string' ? Date.parse(rec.time) / 1000 : this.wallTime || Date.now() / 1000;
    for (const l of this.loggers) l.log(s.offset + Number(rec.step), scalars, this.wallTime);
  }

  /**
   * Logs the records already in a run directory, in global-step order (a step's metrics before its eval). Records
   * of stages the config lacks (a fork whose recipe renamed them) have no place on the step axis and are left out.
   */
  replay(runDir: string): number {
    const recs = [
      ...readJsonlTolerant<Rec>(join(runDir, 'metrics.jsonl')).map((r) => ['metrics', r] as const),
      ...readJsonlTolerant<Rec>(join(runDir, 'evals.jsonl')).map((r) => ['evals', r] as const),
    ].filter(([, r]) => this.stages.has(String(r.stage)));
    const at = (r: Rec) => this.globalStep(r.stage, Number(r.step));
    recs.sort((a, b) => at(a[1]) - at(b[1])); // stable: ties keep metrics first
    for (const [file, r] of recs) this.record(file, r);
    return recs.length;
  }

  close(): void {
    for (const l of this.loggers) l.close();
  }
}

/**
 * The loggers of a training session, opened after the run directory was truncated to its last checkpoint
 * (`resumedAt`). A tensorboard directory that does not exist yet (a new run, a fork, or a resume that adds
 * `--logger tensorboard`) first gets the records already on disk.
 */
export function openRunLog(
  names: readonly LoggerName[],
  stages: StageInfo[],
  runDir: string,
  resumedAt: { stage: string; step: number } | null,
): RunLog {
  checkLoggers(names);
  const loggers: MetricsLogger[] = [];
  const log = new RunLog(stages, loggers);
  if (names.includes('tensorboard')) {
    const dir = join(runDir, 'tensorboard');
    const fresh = !existsSync(dir);
    loggers.push(
      new TensorBoardLogger(
        dir,
        fresh || !resumedAt ? 0 : log.globalStep(resumedAt.stage, resumedAt.step) + 1,
      ),
    );
    if (fresh) log.replay(runDir);
  }
  return log;
}

/** `rstar2 export-metrics`: a finished run's records as a new TensorBoard event file in `outDir`. */
export function exportMetrics(runDir: string, outDir: string): { path: string; records: number } {
  const cfg = join(runDir, 'config.json');
  if (!existsSync(cfg)) throw new Error(`${runDir}: no config.json (not a run directory?)`);
  if (!existsSync(join(runDir, 'metrics.jsonl'))) throw new Error(`${runDir}: no metrics.jsonl`);
  if (existsSync(outDir) && readdirSync(outDir).some((f) => f.includes('tfevents')))
    throw new Error(
      `${outDir} already holds event files; TensorBoard would show both (give a new directory)`,
    );
  const stages = readJson<{ stages?: StageInfo[] } | null>(cfg)?.stages;
  if (!Array.isArray(stages)) throw new Error(`${cfg}: no stages (not a run's config.json)`);
  const tb = new TensorBoardLogger(outDir);
  const log = new RunLog(stages, [tb]);
  let records: number;
  try {
    records = log.replay(runDir);
  } catch (e) {
    // a file with only its header would make the export's own re-run refuse outDir
    log.close();
    rmSync(tb.path);
    throw e;
  }
  log.close();
  return { path: tb.path, records };
}

import type { RolloutStats } from '../engines/index.js';
import type { RocMetrics, Trajectory } from '../rl/index.js';
import type { TrainStats } from '../worker/index.js';
import { mean, round } from './stage.js';

// An RL step's record in metrics.jsonl (docs/RUN_DIR.md). Its keys and their order are what every run directory
// already holds, and what resume, fork, the dashboard and the loggers read back: change them only on purpose.

/** What one RL step did, as the record reports it. */
export interface RlStepView {
  stage: string;
  step: number;
  /** Every trajectory the step's (last) rollout returned. */
  trajectories: Trajectory[];
  /** Those the model answered: engine and sandbox failures left out. */
  answered: Trajectory[];
  failures: string[];
  /** Reward checks that timed out, over the step's draws. */
  timeouts: number;
  roc: RocMetrics;
  /** One per optimizer step (mini-batch × epoch); none when nothing was kept. */
  stats: TrainStats[];
  kl: boolean;
  redraws: number;
  rollout?: RolloutStats;
  /** Date.now() at the step's start, after its rollouts, after scoring, after the update and weight sync. */
  times: [number, number, number, number];
}

export type RlMetrics = Record<string, unknown> & {
  reward_mean: number;
  accuracy: number;
  tool_calls_mean: number;
};

/** The step's record: rates over the trajectories the model answered; lengths and tool use over them all. */
export function rlMetrics(v: RlStepView): RlMetrics {
  const { trajectories: all, answered, stats, roc: m } = v;
  const [t0, t1, t2, t3] = v.times;
  return {
    stage: v.stage,
    step: v.step,
    time: new Date().toISOString(),
    reward_mean: round(mean(answered.map((t) => t.reward ?? 0))),
    accuracy: round(mean(answered.map((t) => (t.correct ? 1 : 0)))),
    ...(v.failures.length ? { failed: v.failures.length } : {}),
    ...(v.timeouts ? { reward_timeouts: v.timeouts } : {}),
    tool_error_ratio_pos: round(m.tool_error_ratio_pos),
    tool_error_ratio_pos_kept: round(m.tool_error_ratio_pos_kept),
    format_penalty_pos: round(m.format_penalty_pos),
    response_len_mean: round(mean(all.map((t) => t.responseIds.length)), 1),
    turns_mean: round(mean(all.map((t) => t.events.filter((e) => e.kind === 'generation').length)), 3),
    tool_calls_mean: round(mean(all.map((t) => t.numToolCalls)), 3),
    ...(stats.length > 0 ? updateMetrics(stats, v.kl) : { skipped: true }),
    ...(v.redraws > 0 ? { redraws: v.redraws } : {}),
    tokens_per_s: Math.round(
      all.reduce((a, t) => a + t.responseIds.length, 0) / Math.max(0.001, (t1 - t0) / 1000),
    ),
    time_rollout_s: round((t1 - t0) / 1000, 3),
    ...(v.rollout ? { rollout: v.rollout } : {}),
    time_reward_s: round((t2 - t1) / 1000, 3),
    time_update_s: round((t3 - t2) / 1000, 3),
    roc: {
      before: m.before,
      after: m.after,
      groups_kept: m.groups_kept,
      groups_rejected_all_correct: m.groups_rejected_all_correct,
      groups_rejected_all_wrong: m.groups_rejected_all_wrong,
      groups_too_few: m.groups_too_few,
      penalty_pos_mean: round(m.penalty_pos_mean),
      penalty_pos_kept_mean: round(m.penalty_pos_kept_mean),
      answers_zero: m.answers_zero,
      answers_one: m.answers_one,
      answers_gt_one: m.answers_gt_one,
    },
  };
}

/** Means over the step's optimizer steps; the lr is the last one's (warmup moves it within a step). */
function updateMetrics(stats: TrainStats[], kl: boolean) {
  return {
    clip_frac: round(mean(stats.map((s) => s.clipFrac))),
    entropy: round(mean(stats.map((s) => s.entropy))),
    ...(kl ? { kl: round(mean(stats.map((s) => s.kl ?? 0))) } : {}),
    grad_norm: round(mean(stats.map((s) => s.gradNorm))),
    loss: round(mean(stats.map((s) => s.loss))),
    lr: stats[stats.length - 1].lr,
  };
}

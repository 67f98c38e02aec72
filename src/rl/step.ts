import type { Rng } from '../util/rng.js';
import { type PenaltyOptions, rocAnswerFormatPenalty, rocErrorRatioPenalty, rocPenalty } from './penalty.js';
import { groupAdvantages, type RocConfig, rejectEqualReward, resampleOnCorrect } from './roc.js';
import type { Trajectory } from './trajectory.js';

// One RL step's data selection: reject equal-reward groups -> RoC down-sampling -> advantages over the kept
// group. RoC off (`doDownSampling: false`) is plain GRPO over the same code path.

export type Scored = Pick<Trajectory, 'text' | 'events' | 'numToolCalls' | 'numToolErrors'> & {
  reward: number;
  /** Added to the RoC penalty (a reward module's own, reward/custom.ts). */
  penalty?: number;
};

export interface KeptTrace {
  group: number;
  index: number; // rollout order within the group
  advantage: number;
  penalty: number;
}

export interface RocMetrics {
  before: number;
  after: number;
  groups_kept: number;
  groups_rejected_all_correct: number;
  groups_rejected_all_wrong: number;
  groups_too_few: number;
  /** Tool errors / tool calls over all positive rollouts (the policy's behaviour, before selection). */
  tool_error_ratio_pos: number;
  /** The same over the kept positives (what the update trains on). */
  tool_error_ratio_pos_kept: number;
  /** Mean answer-format penalty among positive rollouts. */
  format_penalty_pos: number;
  /** Mean RoC penalty of all positives vs. kept positives. */
  penalty_pos_mean: number;
  penalty_pos_kept_mean: number;
  answers_zero: number;
  answers_one: number;
  answers_gt_one: number;
}

export interface SelectionResult {
  kept: KeptTrace[];
  metrics: RocMetrics;
}

function toolErrorRatio(ts: Scored[], errorRatioOf: (t: Scored) => number): number {
  let calls = 0;
  let errs = 0;
  for (const t of ts) {
    const n = t.events.filter((e) => e.kind === 'tool_result').length;
    calls += n;
    errs += n === 0 ? 0 : errorRatioOf(t) * n;
  }
  return calls === 0 ? 0 : errs / calls;
}

const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);

export function selectAndScore(
  groups: Scored[][],
  cfg: RocConfig,
  penaltyOpts: PenaltyOptions,
  rng: Rng,
  eps = 1e-6,
): SelectionResult {
  const kept: KeptTrace[] = [];
  const m: RocMetrics = {
    before: 0,
    after: 0,
    groups_kept: 0,
    groups_rejected_all_correct: 0,
    groups_rejected_all_wrong: 0,
    groups_too_few: 0,
    tool_error_ratio_pos: 0,
    tool_error_ratio_pos_kept: 0,
    format_penalty_pos: 0,
    penalty_pos_mean: 0,
    penalty_pos_kept_mean: 0,
    answers_zero: 0,
    answers_one: 0,
    answers_gt_one: 0,
  };
  const errOf = (t: Scored) => rocErrorRatioPenalty(t, penaltyOpts);
  const allPos: Scored[] = [];
  const keptPos: Scored[] = [];
  const posPen: number[] = [];
  const keptPosPen: number[] = [];
  groups.forEach((g, gi) => {
    m.before += g.length;
    const rewards = g.map((t) => t.reward);
    const penalties = g.map((t) => rocPenalty(t, cfg, penaltyOpts) + (t.penalty ?? 0));
    for (const t of g) {
      const answers = t.text.split(penaltyOpts.answerOpen).length - 1;
      if (answers === 0) m.answers_zero++;
      else if (answers === 1) m.answers_one++;
      else m.answers_gt_one++;
    }
    g.forEach((t, i) => {
      if (t.reward > 0) {
        allPos.push(t);
        posPen.push(penalties[i]);
      }
    });
    if (cfg.rejectEqualReward) {
      const eq = rejectEqualReward(rewards);
      if (eq === 'all_correct') m.groups_rejected_all_correct++;
      if (eq === 'all_wrong') m.groups_rejected_all_wrong++;
      if (eq) return;
    }
    let keep = g.map((_, i) => i);
    if (cfg.doDownSampling) {
      const sel = resampleOnCorrect(rewards, penalties, cfg, rng);
      if (!sel.keep) {
        m.groups_too_few++;
        return;
      }
      keep = sel.keep;
    }
    const adv = groupAdvantages(
      keep.map((i) => rewards[i]),
      eps,
    );
    keep.forEach((i, j) => {
      kept.push({ group: gi, index: i, advantage: adv[j], penalty: penalties[i] });
      if (g[i].reward > 0) {
        keptPos.push(g[i]);
        keptPosPen.push(penalties[i]);
      }
    });
    m.groups_kept++;
  });
  m.after = kept.length;
  m.tool_error_ratio_pos = toolErrorRatio(allPos, errOf);
  m.tool_error_ratio_pos_kept = toolErrorRatio(keptPos, errOf);
  m.format_penalty_pos = mean(allPos.map((t) => rocAnswerFormatPenalty(t, penaltyOpts)));
  m.penalty_pos_mean = mean(posPen);
  m.penalty_pos_kept_mean = mean(keptPosPen);
  return { kept, metrics: m };
}

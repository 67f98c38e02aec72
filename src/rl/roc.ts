import { z } from 'zod';
import type { Rng } from '../util/rng.js';

// GRPO-RoC selection as pure functions over one prompt's group (reference: reject_equal_reward and
// resample_of_correct in the verl fork's trainer). Indices refer to rollout order within the group.

// The RoC options, each default written here once (the recipe's stage.roc; docs/reference prints them).
export const RocSchema = z
  .object({
    doDownSampling: z.boolean().default(true).describe('RoC master switch; off = plain GRPO (--roc off)'),
    rejectEqualReward: z
      .boolean()
      .default(true)
      .describe('drop groups whose rewards are all equal (all correct or all wrong): their advantages are 0'),
    rocErrorRatio: z
      .boolean()
      .default(true)
      .describe(
        "rank positives by the share of their tool responses that are errors (RoC's tool-error penalty)",
      ),
    rocAnswerFormat: z
      .boolean()
      .default(true)
      .describe("rank positives by RoC's format penalty (answers in more than one turn)"),
    minZeroRewardTraceNum: z
      .number()
      .int()
      .default(2)
      .describe('negatives a kept group must have (-1 = no minimum); a group with fewer is dropped'),
    minNonZeroRewardTraceNum: z
      .number()
      .int()
      .default(2)
      .describe('positives a kept group must have (-1 = no minimum); a group with fewer is dropped'),
    negativeSelection: z
      .enum(['random', 'first'])
      .default('random')
      .describe('negatives kept uniformly at random (seeded), or the first in rollout order (reference)'),
    errorMatch: z
      .enum(['substring', 'flag'])
      .default('substring')
      .describe(
        "what counts as a tool error: a response containing 'error' (reference), or the agent loop's error flag",
      ),
    noToolErrorPenalty: z
      .number()
      .default(0.5)
      .describe('the tool-error penalty of a trajectory without a tool response (reference value)'),
    formatTurns: z
      .enum(['reference', 'paper'])
      .default('paper')
      .describe(
        "turns the format penalty counts: every finished assistant turn ('paper'), or only those after a tool response ('reference')",
      ),
  })
  .strict();

/** The selection's options: the schema's RoC switches and minimums, and the group size G it cuts down to. */
export type RocConfig = Pick<
  z.output<typeof RocSchema>,
  | 'doDownSampling'
  | 'rejectEqualReward'
  | 'rocErrorRatio'
  | 'rocAnswerFormat'
  | 'minZeroRewardTraceNum'
  | 'minNonZeroRewardTraceNum'
  | 'negativeSelection'
> & {
  /** Target group size G after down-sampling (-1 = keep everything). */
  downSampleToN: number;
};

/** The schema's defaults; a caller adds downSampleToN (a stage's groupSize). */
export const DEFAULT_ROC: Omit<RocConfig, 'downSampleToN'> = RocSchema.parse({});

/** Python's round(): halves go to the even neighbour, so round(7.5) + round(8.5) = 16. */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

// torch.allclose(rtol=1e-5, atol=1e-8) against the first reward, as the reference checks equality.
function allClose(rewards: readonly number[]): boolean {
  const r0 = rewards[0];
  return rewards.every((r) => Math.abs(r - r0) <= 1e-8 + 1e-5 * Math.abs(r0));
}

export type EqualKind = 'all_correct' | 'all_wrong' | null;

/** Whether reject_equal_reward drops this group, and which way it is degenerate. */
export function rejectEqualReward(rewards: readonly number[]): EqualKind {
  if (rewards.length === 0 || !allClose(rewards)) return null;
  return rewards[0] > 0 ? 'all_correct' : 'all_wrong';
}

export interface RocSelection {
  keep: number[] | null; // null = the whole group is dropped
  reason: 'kept_all' | 'down_sampled' | 'too_few' | 'below_minimums';
}

/**
 * Resample-on-Correct for one group: positives (reward > 0) by ascending penalty (stable), negatives uniform
 * (seeded) or first-k; the pos/neg proportion is preserved with banker's rounding and raised to the minimums.
 */
export function resampleOnCorrect(
  rewards: readonly number[],
  penalties: readonly number[],
  cfg: Pick<
    RocConfig,
    'downSampleToN' | 'minZeroRewardTraceNum' | 'minNonZeroRewardTraceNum' | 'negativeSelection'
  >,
  rng: Rng,
): RocSelection {
  const n = cfg.downSampleToN;
  const N = rewards.length;
  if (rewards.length !== penalties.length)
    throw new Error('resampleOnCorrect: rewards and penalties differ in length');
  if (n <= 0 || N === n) return { keep: rewards.map((_, i) => i), reason: 'kept_all' };
  if (N < n) return { keep: null, reason: 'too_few' };
  const minNeg = cfg.minZeroRewardTraceNum;
  const minPos = cfg.minNonZeroRewardTraceNum;
  const neg: number[] = [];
  const pos: number[] = [];
  rewards.forEach((r, i) => {
    (r > 0 ? pos : neg).push(i);
  });
  pos.sort((a, b) => penalties[a] - penalties[b] || a - b);
  let kNeg = roundHalfEven((neg.length * n) / N);
  let kPos = roundHalfEven((pos.length * n) / N);
  if (kNeg < minNeg && kPos < minPos) return { keep: rewards.map((_, i) => i), reason: 'below_minimums' };
  if (kNeg <= Math.min(minNeg, neg.length)) {
    kNeg = Math.min(minNeg, neg.length);
    kPos = n - kNeg;
  }
  if (kPos <= Math.min(minPos, pos.length)) {
    kPos = Math.min(minPos, pos.length);
    kNeg = n - kPos;
  }
  // Proportional rounding can leave the sum one off n (7.5 + 8.5 cases are even-rounded; odd splits are not).
  if (kPos + kNeg !== n) kPos = n - kNeg;
  kPos = Math.min(kPos, pos.length);
  kNeg = Math.min(n - kPos, neg.length);
  const negKept = cfg.negativeSelection === 'first' ? neg.slice(0, kNeg) : rng.sample(neg, kNeg);
  const keep = [...pos.slice(0, kPos), ...negKept];
  if (keep.length !== n) throw new Error(`resampleOnCorrect: selected ${keep.length}, expected ${n}`);
  return { keep, reason: 'down_sampled' };
}

/**
 * Group-normalised GRPO advantages (verl compute_grpo_outcome_advantage): (r - mean) / (std + eps) with the
 * unbiased std; a group of one gets mean 0 and std 1.
 */
export function groupAdvantages(rewards: readonly number[], eps = 1e-6, normByStd = true): number[] {
  const n = rewards.length;
  if (n === 0) return [];
  if (n === 1) return [rewards[0] / (1 + eps)];
  const mean = rewards.reduce((a, b) => a + b, 0) / n;
  const variance = rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / (n - 1);
  const std = Math.sqrt(variance);
  return rewards.map((r) => (normByStd ? (r - mean) / (std + eps) : r - mean));
}

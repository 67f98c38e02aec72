// The update's shape per RL step: the stage's learning rate at a step and how the kept trajectories split into
// optimizer steps. Pure functions over plain numbers (the worker applies warmup on its own step count).

export interface LrSchedule {
  lr: number;
  lrSchedule: 'constant' | 'cosine';
  minLr: number;
  steps: number;
}

/** The stage's learning rate at a step (1-based); the worker applies warmup on top. */
export function stageLr(s: LrSchedule, step: number): number {
  if (s.lrSchedule !== 'cosine') return s.lr;
  return s.minLr + (s.lr - s.minLr) * 0.5 * (1 + Math.cos((Math.PI * (step - 1)) / s.steps));
}

export interface MiniBatchPlan {
  /** Trajectories per optimizer step (the last one takes what is left). */
  size: number;
  /** lossAgg 'micro-mean-nominal': the nominal mini-batch size the worker scales each micro-batch's loss by. */
  nominalSeqs?: number;
}

/**
 * verl splits what was kept into mini-batches of the nominal size (ppo_mini_batch_size prompts × rollout.n) and
 * scales each micro-batch's loss by its share of that size: a step RoC cut takes fewer, smaller steps. Otherwise
 * the kept trajectories split into `miniBatches` near-equal parts.
 */
export function miniBatchPlan(
  kept: number,
  p: { promptsPerStep: number; miniBatches: number; samplesPerPrompt: number; lossAgg: string },
): MiniBatchPlan {
  if (p.lossAgg === 'micro-mean-nominal') {
    const nominal = (p.promptsPerStep / p.miniBatches) * p.samplesPerPrompt;
    return { size: nominal, nominalSeqs: nominal };
  }
  return { size: Math.max(1, Math.ceil(kept / p.miniBatches)) };
}

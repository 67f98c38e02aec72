// The update's shape per RL step: the learning rate each optimizer step uses (the stage's schedule times warmup)
// and how the kept trajectories split into optimizer steps. Pure functions over plain numbers.

export interface LrSchedule {
  lr: number;
  lrSchedule: 'constant' | 'cosine';
  minLr: number;
  steps: number;
}

/** The stage's learning rate at a step (1-based), counted in stage steps so a resume continues the curve. */
export function stageLr(s: LrSchedule, step: number): number {
  if (s.lrSchedule !== 'cosine') return s.lr;
  return s.minLr + (s.lr - s.minLr) * 0.5 * (1 + Math.cos((Math.PI * (step - 1)) / s.steps));
}

/**
 * Linear warmup on top of stageLr: lr · min(1, (taken + 1) / warmupSteps), `taken` the optimizer steps the worker
 * has taken before this one (each mini-batch is one). That count is the worker's, not the stage's: optimizer.pt
 * keeps it across a resume, a fresh optimizer restarts it, and it runs on across stages that keep the optimizer,
 * so the client applies this on the count the worker reports (PolicyWorker.trainStep).
 */
export function warmupLr(lr: number, warmupSteps: number, taken: number): number {
  return warmupSteps > 0 ? lr * Math.min(1, (taken + 1) / warmupSteps) : lr;
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

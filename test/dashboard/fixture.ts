import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { perRequest, runEval } from '../../src/eval/run.js';
import { fallbackVerify, lastBoxed } from '../../src/eval/verify.js';
import { appendJsonl } from '../../src/util/jsonl.js';

export function metricLine(step: number) {
  const acc = Math.min(0.9, 0.2 + step * 0.02);
  return {
    stage: 'rl',
    step,
    time: 1_700_000_000 + step * 60,
    reward_mean: acc * 2 - 1,
    accuracy: acc,
    tool_error_ratio_pos: Math.max(0.02, 0.3 - step * 0.008),
    format_penalty_pos: 0.1,
    response_len_mean: 800 + step * 25,
    turns_mean: 2.5,
    tool_calls_mean: 1.6,
    clip_frac: 0.01,
    entropy: 0.5 - step * 0.005,
    grad_norm: 0.3,
    loss: 0.05,
    tokens_per_s: 12000,
    time_rollout_s: 30 + step,
    time_reward_s: 2,
    time_update_s: 12,
    roc: {
      before: 64,
      after: 32,
      groups_kept: 6,
      groups_rejected_all_correct: 1,
      groups_rejected_all_wrong: 1,
    },
  };
}

/** A run directory shaped as docs/RUN_DIR.md describes, with scored trajectories for two steps. */
export function makeRun(dir: string, steps = 20): void {
  mkdirSync(join(dir, 'trajectories'), { recursive: true });
  mkdirSync(join(dir, 'checkpoints', 'rl-step-000010'), { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ name: 'demo', stages: [{ kind: 'rl' }] }));
  appendJsonl(
    join(dir, 'metrics.jsonl'),
    Array.from({ length: steps }, (_, i) => metricLine(i + 1)),
  );
  appendJsonl(join(dir, 'evals.jsonl'), [
    { stage: 'rl', step: 10, accuracy: 0.3, n: 30, split: 'aime24' },
    { stage: 'rl', step: 20, accuracy: 0.4, n: 30, split: 'aime24' },
  ]);
  for (const step of [10, 20]) {
    const rows = [];
    for (let p = 0; p < 4; p++) {
      for (let s = 0; s < 4; s++) {
        const t = fakeTrajectory(
          { problemId: `q${p}`, answer: String(100 + p), sample: s, seed: step * 100 + p * 4 + s },
          0.5,
        );
        const ex = lastBoxed(t.text);
        const correct = ex === String(100 + p);
        rows.push({
          ...t,
          gold: String(100 + p),
          correct,
          reward: correct ? 1 : -1,
          verify: { extracted: ex, matchedBy: correct ? 'integer' : null },
          kept: s < 2,
          advantage: correct ? 0.8 : -0.8,
        });
      }
    }
    appendJsonl(join(dir, 'trajectories', `rl-step-${String(step).padStart(6, '0')}.jsonl`), rows);
  }
  writeFileSync(
    join(dir, 'state.json'),
    JSON.stringify({ stage: 'rl', step: 10, checkpoint: 'checkpoints/rl-step-000010' }),
  );
}

export async function makeEval(dir: string, acc: number, engine: string): Promise<void> {
  const problems = Array.from({ length: 5 }, (_, i) => ({
    id: `aime24-${i}`,
    problem: `P${i}`,
    answer: String(10 * i + 7),
  }));
  await runEval({
    outDir: dir,
    config: { bench: 'aime24', dataFile: '/none', k: 4, temperature: 0.6, topP: 0.95, seed: 1, engine },
    problems,
    rollout: perRequest(async (r) => fakeTrajectory(r, acc), 4),
    verify: fallbackVerify,
    progress: false,
    log: () => {},
  });
}

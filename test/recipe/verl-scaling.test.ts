import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { type ScoredItem, Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';
import type { TrainOptions, TrainStats } from '../../src/worker/types.js';

// Issue 43: lossAgg 'micro-mean-nominal' is verl's step scaling (the worker's formula is tested against verl's in
// python/tests/test_policy_loss.py); here, what the trainer hands the worker for it. In verl (J-shang/verl d0dc976,
// dp_actor.py update_policy) the kept batch is split by the normalised ppo_mini_batch_size (train_batch_size ×
// rollout.n / world, fsdp_workers.py) and each micro-batch's loss scaled by its sequences over that size.

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };

class Recording extends FakePolicy {
  calls: { n: number; opts: TrainOptions }[] = [];
  override async grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats> {
    this.calls.push({ n: items.length, opts });
    return super.grpoStep(items, opts);
  }
}

const spec = (rl: Record<string, unknown>) => ({
  name: 'scale',
  seed: 2,
  eval: { n: 8 },
  stages: [
    {
      type: 'rl',
      steps: 4,
      promptsPerStep: 6,
      groupSize: 4,
      oversample: 2,
      lr: 0.5,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
      ...rl,
    },
  ],
});

async function run(rl: Record<string, unknown>) {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-scale-'));
  const policy = new Recording();
  await new Trainer(parseRecipe(spec(rl), 'scale'), dir, policy, quiet).run();
  const kept = readJsonl<{ roc: { after: number }; skipped?: boolean }>(join(dir, 'metrics.jsonl'))
    .filter((m) => !m.skipped)
    .map((m) => m.roc.after);
  return { calls: policy.calls, kept };
}

test('micro-mean-nominal: mini-batches of the nominal size, each scaled by prompts × rollouts, not by what was kept', async () => {
  // 6 prompts × 8 rollouts (G 4 × oversample 2) in 2 mini-batches: 24 sequences nominal each; RoC keeps ≤ 6 × 4
  const { calls, kept } = await run({ lossAgg: 'micro-mean-nominal', miniBatches: 2 });
  assert.ok(kept.length > 0 && kept.every((k) => k <= 24), `${kept}`);
  assert.ok(calls.every((c) => c.opts.lossAgg === 'micro-mean-nominal' && c.opts.nominalSeqs === 24));
  // verl's data.split(ppo_mini_batch_size): what RoC kept fills one nominal mini-batch, so one update a step
  assert.deepEqual(
    calls.map((c) => c.n),
    kept,
  );
  // the same without RoC: G rollouts a prompt, 6 × 4 / 2 = 12 nominal, so two full mini-batches when all are kept
  const off = await run({ lossAgg: 'micro-mean-nominal', miniBatches: 2, roc: { doDownSampling: false } });
  assert.ok(off.calls.every((c) => c.opts.nominalSeqs === 12 && c.n <= 12));
  assert.equal(
    off.calls.length,
    off.kept.map((k) => Math.ceil(k / 12)).reduce((a, b) => a + b, 0),
  );
});

test('token-mean and micro-mean-batch split what was kept into miniBatches and send no nominal size', async () => {
  for (const lossAgg of ['token-mean', 'micro-mean-batch']) {
    const { calls, kept } = await run({ lossAgg, miniBatches: 2 });
    assert.equal(calls.length, 2 * kept.length);
    assert.ok(calls.every((c) => c.opts.lossAgg === lossAgg && c.opts.nominalSeqs === undefined));
    assert.deepEqual(
      calls.map((c) => c.n),
      kept.flatMap((k) => [Math.ceil(k / 2), k - Math.ceil(k / 2)]),
    );
  }
});

test("lossAgg 'verl' is refused naming what it computed and verl's own; nominal mini-batches must divide", () => {
  assert.throws(
    () => parseRecipe(spec({ lossAgg: 'verl' }), 'r'),
    /'verl' was renamed: 'micro-mean-batch' is what it computed .*verl's own scaling is 'micro-mean-nominal'/,
  );
  assert.throws(
    () => parseRecipe(spec({ lossAgg: 'micro-mean-nominal', promptsPerStep: 5, miniBatches: 2 }), 'r'),
    /promptsPerStep 5 must be a multiple of miniBatches 2/,
  );
  assert.throws(() => parseRecipe(spec({ lossAgg: 'seq-mean' }), 'r'), /lossAgg/);
});

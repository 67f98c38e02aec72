import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import type { RewardFn, RolloutRequest, ScoredItem } from '../../src/recipe/trainer.js';
import { Trainer } from '../../src/recipe/trainer.js';
import type { TrainOptions } from '../../src/worker/types.js';

process.env.RSTAR2_NO_PROGRESS = '1';

// The RL step pushes its weights to the rollout engines as a call of its own, right after the update: a policy
// that records what the trainer asks of it shows the order, step by step.
class Recording extends FakePolicy {
  readonly calls: string[] = [];
  override async rollout(req: RolloutRequest) {
    this.calls.push(req.temperature === 0 ? 'eval' : 'rollout');
    return super.rollout(req);
  }
  override async grpoStep(items: ScoredItem[], opts: TrainOptions) {
    this.calls.push('update');
    return super.grpoStep(items, opts);
  }
  async syncWeights() {
    this.calls.push('sync');
  }
}

const recipe = parseRecipe(
  {
    name: 't',
    seed: 5,
    eval: { n: 8, temperature: 0 },
    stages: [
      { type: 'rl', steps: 3, promptsPerStep: 4, groupSize: 4, miniBatches: 2, evalEvery: 0, lr: 0.5 },
    ],
  },
  't',
  { roc: 'off' },
);

async function calls(reward?: RewardFn): Promise<string[]> {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-rl-stage-'));
  try {
    const b = new Recording();
    await new Trainer(recipe, dir, b, { log: () => {}, progress: false, reward }).run();
    return b.calls;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('an RL step syncs the weights once, after all of its update and before the next rollout', async () => {
  const c = await calls();
  // every step whose groups are not all rejected updates; this seed's steps all do (else the test says so)
  assert.equal(c.filter((x) => x === 'rollout').length, 3);
  assert.equal(c.filter((x) => x === 'sync').length, 3, c.join(' '));
  const steps = c.join(' ').split('rollout ').slice(1);
  for (const s of steps) assert.match(s, /^(update )+sync /, c.join(' '));
  assert.deepEqual(c.slice(0, 1), ['eval']);
  assert.equal(c.at(-1), 'eval');
});

test('a step that keeps nothing trains nothing and syncs nothing', async () => {
  // every sample correct: every group has equal rewards and is rejected
  const allCorrect: RewardFn = async () => ({
    reward: 1,
    correct: true,
    extracted: '1',
    matchedBy: 'test',
    reason: 'test',
  });
  const c = await calls(allCorrect);
  assert.deepEqual(c, ['eval', 'rollout', 'rollout', 'rollout', 'eval']);
});

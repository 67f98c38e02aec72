import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { type Policy, readState, Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

// A few real SFT + RL steps on a from-scratch tiny model (torch worker, agent loop, sandbox pool), with a
// crash in the middle of RL and a resume on a freshly started worker.

process.env.RSTAR2_NO_PROGRESS = '1';

const recipe = parseRecipe({
  name: 'e2e',
  eval: { n: 2, maxResponseTokens: 40, maxTurns: 2 },
  stages: [
    { type: 'sft', steps: 2, batchSize: 4, demos: 20, checkpointEvery: 1 },
    {
      type: 'rl',
      steps: 3,
      promptsPerStep: 2,
      groupSize: 2,
      oversample: 2,
      maxResponseTokens: 40,
      maxTurns: 2,
      checkpointEvery: 1,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1, rejectEqualReward: false },
    },
  ],
});

test('tiny model: SFT + RL steps, run directory, crash and resume', { timeout: 170_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-e2e-'));
  const quiet = { log: () => {}, progress: false };
  const first = await EmbeddedPolicy.create(recipe);
  let rl = 0;
  const crashing: Policy = Object.assign(Object.create(first), {
    rollout: (req: Parameters<Policy['rollout']>[0]) => {
      if (req.n > 1 && ++rl === 3) throw new Error('simulated kill in rl step 3');
      return first.rollout(req);
    },
  });
  try {
    await assert.rejects(new Trainer(recipe, dir, crashing, quiet).run(), /simulated kill/);
  } finally {
    await first.close();
  }
  assert.deepEqual(readState(dir)?.checkpoint, join('checkpoints', 'rl-step-000002'));

  const second = await EmbeddedPolicy.create(recipe);
  try {
    await new Trainer(recipe, dir, second, quiet).run(true);
  } finally {
    await second.close();
  }
  const m = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => `${r.stage}:${r.step}`),
    ['sft:1', 'sft:2', 'rl:1', 'rl:2', 'rl:3'],
  );
  assert.ok(m[0].loss > 0 && Number.isFinite(m[1].loss));
  for (const r of m.slice(2)) {
    assert.equal(r.roc.before, 8);
    assert.equal(r.roc.after, r.roc.groups_kept * 2);
    if (!r.skipped) assert.ok(Number.isFinite(r.loss) && Number.isFinite(r.entropy));
  }
  assert.deepEqual(
    readJsonl<Record<string, any>>(join(dir, 'evals.jsonl')).map((e) => `${e.stage}:${e.step}:${e.n}`),
    ['rl:0:2', 'rl:3:2'],
  );
  assert.deepEqual(readdirSync(join(dir, 'trajectories')).sort(), [
    'rl-step-000001.jsonl',
    'rl-step-000002.jsonl',
    'rl-step-000003.jsonl',
  ]);
  const t = readJsonl<Record<string, any>>(join(dir, 'trajectories', 'rl-step-000003.jsonl'));
  assert.equal(t.length, 8);
  for (const x of t) {
    assert.equal(x.responseIds.length, x.responseMask.length);
    assert.ok(x.responseIds.length <= 40);
    assert.equal(typeof x.reward, 'number');
  }
  for (const f of [
    'config.json',
    'model.safetensors',
    'tokenizer.json',
    'optimizer.pt',
    'trainer_state.json',
  ]) {
    assert.ok(existsSync(join(dir, 'checkpoints', 'rl-step-000003', f)), f);
  }
  assert.equal(readState(dir)?.step, 3);
});

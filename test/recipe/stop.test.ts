import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakeBackend } from '../../src/recipe/fake.js';
import { type RewardFn, Trainer } from '../../src/recipe/trainer.js';
import { scoreTrajectory } from '../../src/reward/index.js';
import { readJsonl } from '../../src/util/jsonl.js';

// Issue 44: nothing in a run can hang it or hide. Reward checks are bounded and a timeout is said.

process.env.RSTAR2_NO_PROGRESS = '1';

const spec = (extra: Record<string, unknown> = {}) => ({
  name: 't',
  seed: 3,
  eval: { n: 40 },
  stages: [
    { type: 'sft', steps: 4, batchSize: 16, demos: 200, checkpointEvery: 2, lr: 0.01 },
    {
      type: 'rl',
      steps: 6,
      promptsPerStep: 8,
      groupSize: 4,
      oversample: 2,
      checkpointEvery: 3,
      evalEvery: 4,
      lr: 0.5,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
    },
  ],
  ...extra,
});
const recipe = (extra?: Record<string, unknown>) => parseRecipe(spec(extra), 't');
const quiet = { log: () => {}, progress: false };
const tmp = (tag: string) => mkdtempSync(join(tmpdir(), `rstar2-${tag}-`));

test('a reward check that times out scores 0, is logged and counted in the step and eval records', async () => {
  const dir = tmp('timeouts');
  const lines: string[] = [];
  let calls = 0;
  let injected = 0;
  // every 7th check "times out" as the verifier pool reports one
  const reward: RewardFn = async (t, gold) => {
    if (++calls % 7 !== 0) return scoreTrajectory(t, gold, 'strict');
    injected++;
    const reason = 'time limit: no verdict within 2000 ms, worker replaced';
    return { reward: 0, correct: false, extracted: null, matchedBy: null, reason, timedOut: true };
  };
  await new Trainer(recipe(), dir, new FakeBackend(), { ...quiet, reward, log: (l) => lines.push(l) }).run();
  const counted = [
    ...readJsonl<{ reward_timeouts?: number }>(join(dir, 'metrics.jsonl')),
    ...readJsonl<{ reward_timeouts?: number }>(join(dir, 'evals.jsonl')),
  ].reduce((a, r) => a + (r.reward_timeouts ?? 0), 0);
  assert.ok(injected > 10, `${injected}`);
  assert.equal(counted, injected);
  const said = lines.filter((l) => l.startsWith('[reward]'));
  assert.equal(said.length, injected);
  assert.match(said[0], /timed out, reward 0 \(time limit: no verdict within 2000 ms/);
});

test('the trainer scores on verifier pool threads and closes them when the run ends', async () => {
  const dir = tmp('pool');
  const ports = () => process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length;
  const during: number[] = [];
  const backend = new FakeBackend();
  backend.onRollout = () => {
    during.push(ports());
  };
  await new Trainer(recipe(), dir, backend, quiet).run();
  assert.ok(during.length > 0 && during.every((n) => n >= 1), `${during}`);
  const t = readJsonl<{ reward: number; correct: boolean }>(
    join(dir, 'trajectories', 'rl-step-000001.jsonl'),
  );
  assert.ok(t.some((x) => x.correct) && t.some((x) => !x.correct));
  assert.ok(t.every((x) => x.reward === (x.correct ? 1 : 0)));
  // an open pool's worker threads are message ports that would keep the process alive
  assert.equal(ports(), 0);
});

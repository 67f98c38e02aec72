import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe, runConfig } from '../../src/recipe/config.js';
import { EpochSampler, weightedSample } from '../../src/recipe/data.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { generateProblems } from '../../src/recipe/tasks.js';
import { readState, Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';
import { Rng } from '../../src/util/rng.js';

// Issue 43: a stage's prompts as verl's shuffled dataloader gives them (RandomSampler + drop_last, resumed from
// its saved state): without replacement, reshuffled per epoch, seeded, and resumed mid-epoch exactly.

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };
const items = (n: number, entry?: number) =>
  Array.from({ length: n }, (_, i) => ({
    id: `${entry ?? ''}p${i}`,
    ...(entry === undefined ? {} : { entry }),
  }));
const ids = (xs: { id: string }[]) => xs.map((x) => x.id);

test('an epoch walks the pool without replacement; the short rest is dropped and the next epoch reshuffled', () => {
  const pool = items(10);
  const s = new EpochSampler(pool, null, 3, 7);
  const draws = Array.from({ length: 9 }, (_, d) => ids(s.draw(d)));
  // 10 prompts, 3 a draw: 3 draws an epoch (9 distinct), the 10th of each epoch dropped as verl's drop_last
  for (let e = 0; e < 3; e++) {
    const epoch = draws.slice(3 * e, 3 * e + 3).flat();
    assert.equal(new Set(epoch).size, 9, `epoch ${e}: ${epoch}`);
  }
  assert.notDeepEqual(draws.slice(0, 3), draws.slice(3, 6), 'each epoch is shuffled anew');
  assert.deepEqual(s.epochs(), [2]);
  // seeded and addressable: draw d is the same whether reached in order, alone, or after a later one
  assert.deepEqual(ids(new EpochSampler(pool, null, 3, 7).draw(5)), draws[5]);
  assert.deepEqual(ids(s.draw(4)), draws[4]);
  assert.notDeepEqual(ids(new EpochSampler(pool, null, 3, 8).draw(0)), draws[0]);
  assert.throws(
    () => new EpochSampler(pool, null, 11, 1),
    /11 prompts a draw, but the sources with a weight hold 10/,
  );
  assert.throws(() => s.draw(-1), /draw must be an integer >= 0/);
});

test("with data.weights each source is walked without replacement and gives its weight's share", () => {
  const pool = [...items(12, 0), ...items(40, 1), ...items(5, 2)];
  const k = 4;
  const s = new EpochSampler(pool, [1, 3, 0], k, 2);
  const picks: string[][] = [[], [], []];
  for (let d = 0; d < 100; d++) {
    const got = s.draw(d) as { id: string; entry: number }[];
    assert.equal(new Set(ids(got)).size, k, `draw ${d} repeats a prompt`);
    for (const x of got) picks[x.entry].push(x.id);
  }
  assert.equal(picks[2].length, 0, 'weight 0 gives nothing');
  const share = picks[0].length / (100 * k);
  assert.ok(Math.abs(share - 0.25) < 0.06, `source 0 gave ${share} of the prompts, weight 1/4`);
  // before a source's walk is reshuffled, at most k - 1 of its prompts are dropped: that many are distinct
  for (const [i, size] of [
    [0, 12],
    [1, 40],
  ])
    assert.equal(new Set(picks[i].slice(0, size - (k - 1))).size, size - (k - 1), `source ${i}`);
});

test('the independent draw leaves much of the pool unseen where an epoch covers it (the issue: 40 % vs 9 %)', () => {
  // stage 1's shape scaled down: 300 steps × 128 prompts out of 42K ≈ 0.91 of the pool
  const pool = items(4200);
  const steps = 320;
  const k = 12;
  const epoch = new EpochSampler(pool, null, k, 1);
  const seenEpoch = new Set(Array.from({ length: steps }, (_, d) => ids(epoch.draw(d))).flat());
  const seenIndependent = new Set(
    Array.from({ length: steps }, (_, d) => ids(weightedSample(pool, null, k, new Rng(d)))).flat(),
  );
  assert.equal(seenEpoch.size, steps * k, 'no prompt twice within the epoch');
  const unseen = 1 - seenIndependent.size / pool.length;
  // (1 - k/N)^steps ≈ e^-0.91 ≈ 0.40 expected unseen; its spread over 4,200 prompts is < 0.01
  assert.ok(Math.abs(unseen - Math.exp(-(steps * k) / pool.length)) < 0.03, `${unseen}`);
});

/** A plain-layout file of the built-in tasks (the fake policy solves those), small enough for epochs to turn. */
function taskFile(n: number): string {
  const f = join(mkdtempSync(join(tmpdir(), 'rstar2-order-')), 'tasks.jsonl');
  const rows = generateProblems({ seed: 4, n, split: 'train', levels: [0, 1] });
  writeFileSync(f, rows.map((r) => JSON.stringify(r) + '\n').join(''));
  return f;
}

const recipe = (file: string, sampler?: string) =>
  parseRecipe(
    {
      name: 'order',
      seed: 5,
      eval: { n: 8 },
      stages: [
        {
          type: 'rl',
          steps: 8,
          promptsPerStep: 6,
          groupSize: 4,
          oversample: 2,
          checkpointEvery: 3,
          evalEvery: 0,
          lr: 0.5,
          roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
          ...(sampler ? { sampler } : {}),
          data: { files: [file], layout: 'plain', dedupe: false },
        },
      ],
    },
    'order',
  );

/** The prompts of each RL step, in order, from the run's trajectory files. */
function stepPrompts(dir: string, steps: number): string[][] {
  return Array.from({ length: steps }, (_, i) => {
    const rows = readJsonl<{ promptId: string }>(
      join(dir, 'trajectories', `rl-step-${String(i + 1).padStart(6, '0')}.jsonl`),
    );
    return [...new Set(rows.map((r) => r.promptId))];
  });
}

test('a kill mid-epoch and --resume give the same prompts, step for step, as a run never stopped', async () => {
  const file = taskFile(20); // 6 a step: 3 steps an epoch, 2 dropped each time
  const ref = mkdtempSync(join(tmpdir(), 'rstar2-order-ref-'));
  await new Trainer(recipe(file), ref, new FakePolicy(), quiet).run();
  const want = stepPrompts(ref, 8);
  for (const e of [0, 1]) assert.equal(new Set(want.slice(3 * e, 3 * e + 3).flat()).size, 18);
  assert.equal(readState(ref)?.promptDraws, 8);

  // killed during step 5 (epoch 2, its 2nd step): resumes from the step-3 checkpoint, 3 draws made
  for (const oldRunDir of [false, true]) {
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-order-kill-'));
    const killing = new FakePolicy();
    let rollouts = 0;
    killing.onRollout = (req) => {
      if (req.n > 1 && ++rollouts === 5) throw new Error('simulated kill');
    };
    await assert.rejects(new Trainer(recipe(file), dir, killing, quiet).run(), /simulated kill/);
    const state = readState(dir);
    assert.deepEqual([state?.step, state?.promptDraws], [3, 3]);
    if (oldRunDir) {
      // a run directory from before promptDraws was saved: the draws are counted from metrics.jsonl
      const { promptDraws: _, ...older } = state!;
      writeFileSync(join(dir, 'state.json'), JSON.stringify(older));
    }
    await new Trainer(recipe(file), dir, new FakePolicy(), quiet).run(true);
    assert.deepEqual(stepPrompts(dir, 8), want, oldRunDir ? 'without promptDraws' : 'with promptDraws');
  }
});

test("sampler 'independent' is the old draw; a run directory written before keeps its draw and its lossAgg", async () => {
  const file = taskFile(20);
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-order-ind-'));
  await new Trainer(recipe(file, 'independent'), dir, new FakePolicy(), quiet).run();
  const got = stepPrompts(dir, 8);
  // drawn afresh each step, 3 steps of 6 out of 20 are all distinct with probability C(14,6)·C(8,6)/C(20,6)² < 0.001
  assert.ok(
    got.some((_, i) => i + 3 <= got.length && new Set(got.slice(i, i + 3).flat()).size < 18),
    JSON.stringify(got),
  );
  const r = parseRecipe({ stages: [{ type: 'rl' }] });
  assert.equal(r.stages[0].type === 'rl' ? r.stages[0].sampler : null, 'epoch', 'the default for RL stages');
  // config.json of a run made before: its RL stages drew independently, and resuming it must not change that
  const saved = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  delete saved.stages[0].sampler;
  saved.stages[0].lossAgg = 'verl'; // the old name of micro-mean-batch, refused in a recipe written today
  assert.throws(() => parseRecipe(saved, 'config.json'), /'verl' was renamed/);
  const resumed = parseRecipe(runConfig(saved), 'config.json').stages[0];
  assert.ok(resumed.type === 'rl');
  assert.deepEqual([resumed.sampler, resumed.lossAgg], ['independent', 'micro-mean-batch']);
});

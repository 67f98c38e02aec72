import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { PolicyWorker, type TrainBatch } from '../../src/worker/index.js';
import { sampling, TEST_CONFIG } from './helpers.js';

function batch(step: number): TrainBatch {
  return {
    loss: 'grpo',
    sequences: [
      { ids: [1, 2, 3, 4, 5 + step], mask: [0, 0, 1, 1, 1], advantage: 1 },
      { ids: [6, 7, 8 + step], mask: [0, 1, 1], advantage: -0.5 },
      { ids: [9, 10, 11, 12], mask: [0, 1, 0, 1], advantage: 0.7 },
    ],
  };
}
const opts = { lr: 5e-3, warmupSteps: 3, microBatchTokens: 8 };
const probe = [[1, 5, 9, 13, 17, 21]];

test('save → load → continue equals an uninterrupted run (weights, optimizer, step, sampling RNG)', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-resume-'));
  const ckpt = join(dir, 'ckpt');
  try {
    const a = await PolicyWorker.start({ threads: 1 });
    let straight: { losses: number[]; probe: number[]; gen: number[][] };
    try {
      await a.init(TEST_CONFIG, 21);
      await a.trainStep(batch(0), opts);
      await a.trainStep(batch(1), opts);
      await a.generate([[1, 2]], sampling()); // advances the unseeded sampling RNG before the save
      await a.save(ckpt, { optimizer: true });
      const losses = [];
      for (let s = 2; s < 5; s++) losses.push((await a.trainStep(batch(s), opts)).loss);
      const gen = (await a.generate([[3, 4], [5]], sampling())).map((r) => r.outputIds);
      straight = { losses, probe: (await a.logprobs(probe))[0].logprobs, gen };
    } finally {
      await a.close();
    }
    for (const f of ['config.json', 'model.safetensors', 'optimizer.pt'])
      assert.ok(existsSync(join(ckpt, f)), f);

    const b = await PolicyWorker.start({ threads: 1 });
    try {
      const info = await b.load(ckpt);
      assert.equal(info.restoredOptimizer, true);
      const losses = [];
      let last = 0;
      for (let s = 2; s < 5; s++) {
        const st = await b.trainStep(batch(s), opts);
        losses.push(st.loss);
        last = st.step;
      }
      assert.equal(last, 5);
      assert.deepEqual(losses, straight.losses);
      const gen = (await b.generate([[3, 4], [5]], sampling())).map((r) => r.outputIds);
      assert.deepEqual(gen, straight.gen);
      assert.deepEqual((await b.logprobs(probe))[0].logprobs, straight.probe);
    } finally {
      await b.close();
    }

    // without optimizer state the weights still round-trip exactly, but Adam restarts (so training differs)
    const c = await PolicyWorker.start({ threads: 1 });
    try {
      await c.init(TEST_CONFIG, 21);
      const before = (await c.logprobs(probe))[0].logprobs;
      await c.save(join(dir, 'plain'));
      assert.ok(!existsSync(join(dir, 'plain', 'optimizer.pt')));
      const info = await c.load(join(dir, 'plain'));
      assert.equal(info.restoredOptimizer, false);
      assert.deepEqual((await c.logprobs(probe))[0].logprobs, before);
    } finally {
      await c.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { PolicyWorker, type TrainBatch, type TrainStats } from '../../src/worker/index.js';
import { TEST_CONFIG } from './helpers.js';

// Warmup is applied once, by the client (rl/schedule.ts warmupLr), on the optimizer step count the worker
// reports: lr · min(1, (taken + 1) / warmupSteps). The worker uses the lr it is sent. Applied twice, the first
// step would report lr/16 here; not at all, lr.

const batch: TrainBatch = { loss: 'sft', sequences: [{ ids: [1, 2, 3, 4, 5, 6], mask: [0, 1, 1, 1, 1, 1] }] };
const opts = { lr: 0.012, warmupSteps: 4 };
const QUARTER = [0.003, 0.006, 0.009, 0.012]; // lr at the worker's 1st..4th optimizer step

async function steps(w: PolicyWorker, n: number): Promise<TrainStats[]> {
  const out = [];
  for (let i = 0; i < n; i++) out.push(await w.trainStep(batch, opts));
  return out;
}

function assertLrs(got: TrainStats[], want: number[], firstStep: number): void {
  assert.deepEqual(
    got.map((s) => s.step),
    want.map((_, i) => firstStep + i),
  );
  for (const [i, s] of got.entries())
    assert.ok(Math.abs(s.lr - want[i]) < 1e-15, `step ${s.step}: lr ${s.lr}, want ${want[i]}`);
}

test('warmup: the lr of optimizer steps 1..6 with warmupSteps 4, and again from 1 after a reset', {
  timeout: 60_000,
}, async () => {
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    assert.equal((await w.init(TEST_CONFIG, 5)).step, 0);
    assertLrs(await steps(w, 6), [...QUARTER, 0.012, 0.012], 1);
    assertLrs(await steps(w, 1), [0.012], 7);
    await w.resetOptimizer(); // a stage's optimizer: 'fresh'
    assertLrs(await steps(w, 2), QUARTER.slice(0, 2), 1);
    assertLrs(await w.trainStep(batch, { lr: 0.012 }).then((s) => [s]), [0.012], 3); // no warmupSteps: none
  } finally {
    await w.close();
  }
});

test('warmup: its count survives a resume from optimizer.pt and a worker restart, and restarts without one', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-warmup-'));
  try {
    const a = await PolicyWorker.start({ threads: 1 });
    try {
      await a.init(TEST_CONFIG, 5);
      assertLrs(await steps(a, 2), QUARTER.slice(0, 2), 1);
      await a.save(join(dir, 'ckpt'), { optimizer: true });
      await a.save(join(dir, 'weights'));
    } finally {
      await a.close();
    }
    assert.ok(!existsSync(join(dir, 'weights', 'optimizer.pt')));
    const b = await PolicyWorker.start({ threads: 1 });
    try {
      assert.equal((await b.load(join(dir, 'ckpt'))).step, 2);
      assertLrs(await steps(b, 1), QUARTER.slice(2, 3), 3);
      // killed: the next call restarts it and replays the load, so it counts from the checkpoint's 2 again
      const pid = b.pids[0];
      process.kill(pid, 'SIGKILL');
      await new Promise((r) => setTimeout(r, 300)); // its exit reaches the client
      assertLrs(await steps(b, 3), [0.009, 0.012, 0.012], 3);
      assert.equal(b.restarts, 1);
      // weights alone: a fresh AdamW, so warmup starts over
      assert.equal((await b.load(join(dir, 'weights'))).step, 0);
      assertLrs(await steps(b, 1), QUARTER.slice(0, 1), 1);
    } finally {
      await b.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

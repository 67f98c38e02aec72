import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PolicyWorker, type TrainBatch, type TrainStats } from '../../src/worker/index.js';
import { maxAbsDiff, sampling, TEST_CONFIG } from './helpers.js';

const batch: TrainBatch = {
  loss: 'grpo',
  sequences: [
    {
      ids: [1, 2, 3, 4, 5, 6, 7],
      mask: [0, 0, 1, 1, 1, 1, 1],
      advantage: 1.2,
      oldLogprobs: [0, -4, -4.1, -4.2, -3.9, -4, -4.3],
    },
    { ids: [8, 9, 10], mask: [0, 1, 1], advantage: -0.8 },
    {
      ids: [11, 12, 13, 14, 15],
      mask: [0, 1, 0, 1, 1],
      advantage: 0.3,
      oldLogprobs: [0, -4.5, -4, -3.5, -4.4],
    },
    { ids: [16, 17, 18, 19], mask: [0, 0, 0, 1], advantage: -1.5 },
    { ids: [20, 21, 22, 23, 24, 25], mask: [0, 1, 1, 1, 0, 1], advantage: 0.9 },
  ],
};
const probe = [
  [1, 3, 5, 7, 9, 11, 13],
  [2, 4, 6],
];

async function run(
  ranks: number,
  memory: { maxTokensPerMicroBatch?: number; gradientCheckpointing?: boolean } = {},
): Promise<{ stats: TrainStats[]; lp: number[][] }> {
  const w = await PolicyWorker.start({ ranks, threads: 1 });
  try {
    await w.init(TEST_CONFIG, 4);
    const stats = [];
    for (let i = 0; i < 2; i++)
      stats.push(await w.trainStep(batch, { lr: 1e-2, microBatchTokens: 12, ...memory }));
    return { stats, lp: (await w.logprobs(probe)).map((r) => r.logprobs) };
  } finally {
    await w.close();
  }
}

function assertSame(one: Awaited<ReturnType<typeof run>>, two: Awaited<ReturnType<typeof run>>): void {
  for (let i = 0; i < 2; i++) {
    assert.ok(Math.abs(one.stats[i].loss - two.stats[i].loss) < 1e-5, `step ${i} loss`);
    assert.ok(Math.abs(one.stats[i].gradNorm - two.stats[i].gradNorm) < 1e-4, `step ${i} grad norm`);
    assert.equal(one.stats[i].trainedTokens, two.stats[i].trainedTokens);
    assert.equal(one.stats[i].tokens, two.stats[i].tokens);
    assert.ok(Math.abs(one.stats[i].clipFrac - two.stats[i].clipFrac) < 1e-9);
  }
  probe.forEach((_, j) => {
    const d = maxAbsDiff(one.lp[j], two.lp[j]);
    assert.ok(d < 1e-5, `probe ${j}: max abs diff ${d}`);
  });
  // the update did something (otherwise equality would be trivial)
  assert.ok(one.stats[1].loss !== one.stats[0].loss);
}

test('2 gloo ranks under DDP give the same update as 1 rank on the same global batch', {
  timeout: 120_000,
}, async () => {
  assertSame(await run(1), await run(2));
});

test('2 gloo ranks under FSDP2 give the 1-rank update for GRPO and SFT steps (loss within 1e-5, grad norm 1e-4)', {
  timeout: 120_000,
}, async () => {
  // FSDP2 shards each layer's weights over the ranks, gathers them for each pass and reduce-scatters the gradients:
  // other sums than DDP's, the same update to float rounding
  const sft: TrainBatch = { loss: 'sft', sequences: batch.sequences.map(({ ids, mask }) => ({ ids, mask })) };
  const both = async (ranks: number, sharding: 'ddp' | 'fsdp') => {
    const w = await PolicyWorker.start({ ranks, threads: 1, sharding });
    try {
      await w.init(TEST_CONFIG, 4);
      const stats = [];
      for (const b of [batch, batch, sft, sft])
        stats.push(await w.trainStep(b, { lr: 1e-2, microBatchTokens: 12 }));
      return { stats, lp: (await w.logprobs(probe)).map((r) => r.logprobs) };
    } finally {
      await w.close();
    }
  };
  const [one, two] = [await both(1, 'ddp'), await both(2, 'fsdp')];
  one.stats.forEach((a, i) => {
    const b = two.stats[i];
    assert.ok(Math.abs(a.loss - b.loss) < 1e-5, `step ${i}: ${a.loss} vs ${b.loss}`);
    assert.ok(Math.abs(a.gradNorm - b.gradNorm) < 1e-4, `step ${i} grad norm ${a.gradNorm} vs ${b.gradNorm}`);
    assert.equal(a.trainedTokens, b.trainedTokens);
  });
  for (const j of probe.keys()) assert.ok(maxAbsDiff(one.lp[j], two.lp[j]) < 1e-5, `probe ${j}`);
  assert.ok(one.stats[3].loss < one.stats[2].loss, 'the SFT steps trained');
});

test('under DDP, packed micro-batches with per-layer checkpointing give the same update as 1 padded rank', {
  timeout: 120_000,
}, async () => {
  // 10-token packs split rank 0's share over two micro-batches, so no_sync and the final sync both run
  assertSame(await run(1), await run(2, { maxTokensPerMicroBatch: 10, gradientCheckpointing: true }));
});

test('a batch with fewer sequences than ranks: the rank without data still joins the reduction', {
  timeout: 120_000,
}, async () => {
  const one = { loss: 'sft' as const, sequences: [{ ids: [3, 4, 5, 6], mask: [0, 1, 1, 1] }] };
  const losses: number[][] = [];
  const lps: number[][] = [];
  for (const ranks of [1, 2]) {
    const w = await PolicyWorker.start({ ranks, threads: 1 });
    try {
      await w.init(TEST_CONFIG, 4);
      const l = [];
      for (let i = 0; i < 2; i++) l.push((await w.trainStep(one, { lr: 1e-2 })).loss);
      losses.push(l);
      lps.push((await w.logprobs(probe))[0].logprobs);
    } finally {
      await w.close();
    }
  }
  assert.ok(losses[0][1] < losses[0][0], 'the step trained');
  assert.ok(Math.abs(losses[0][1] - losses[1][1]) < 1e-5, `${losses[0]} vs ${losses[1]}`);
  assert.ok(maxAbsDiff(lps[0], lps[1]) < 1e-5);
});

test('ranks with different numbers of micro-batches run as many passes each (FSDP gathers weights in every one); scoring is shared out', {
  timeout: 120_000,
}, async () => {
  // rank 0 gets the two short sequences (one micro-batch of 12 tokens), rank 1 the two long ones (two)
  const uneven: TrainBatch = {
    loss: 'sft',
    sequences: [
      { ids: [1, 2, 3], mask: [0, 1, 1] },
      { ids: [4, 5, 6, 7], mask: [0, 1, 1, 1] },
      { ids: [8, 9, 10, 11, 12, 13, 14, 15, 16, 17], mask: [0, 0, 1, 1, 1, 1, 1, 1, 1, 1] },
      { ids: [18, 19, 20, 21, 22, 23, 24, 25, 26, 27], mask: [0, 1, 1, 1, 1, 1, 1, 1, 1, 0] },
    ],
  };
  const got: TrainStats[][] = [];
  const scored: number[][][] = [];
  // scoring is shared out too: each rank scores its share (here 2 and 3 sequences, one of them a single token)
  const rows = [...uneven.sequences.map((s) => s.ids), [5]];
  for (const ranks of [1, 2]) {
    const w = await PolicyWorker.start({ ranks, threads: 1 });
    try {
      await w.init(TEST_CONFIG, 4);
      got.push([]);
      for (let i = 0; i < 2; i++)
        got[got.length - 1].push(await w.trainStep(uneven, { lr: 1e-2, microBatchTokens: 12 }));
      scored.push((await w.logprobs(rows, { microBatchTokens: 12 })).map((r) => r.logprobs));
    } finally {
      await w.close();
    }
  }
  rows.forEach((r, j) => {
    assert.equal(scored[1][j].length, r.length);
    const d = maxAbsDiff(scored[0][j], scored[1][j]);
    assert.ok(d < 1e-5, `row ${j}: max abs diff ${d}`);
  });
  const [one, two] = got;
  assert.equal(two[0].microBatches, 2, 'rank 0 ran a zero-weight pass to match rank 1');
  for (let i = 0; i < 2; i++) {
    assert.ok(Math.abs(one[i].loss - two[i].loss) < 1e-5, `step ${i}: ${one[i].loss} vs ${two[i].loss}`);
    assert.ok(Math.abs(one[i].gradNorm - two[i].gradNorm) < 1e-4, `step ${i} grad norm`);
  }
  assert.ok(one[1].loss < one[0].loss, 'the step trained');
});

test('a rank failing part-way through a shared op ends every rank instead of leaving them in a collective', {
  timeout: 120_000,
}, async () => {
  const w = await PolicyWorker.start({ ranks: 2, threads: 1, env: { RSTAR2_WORKER_FAIL: 'train_step:1' } });
  try {
    await w.init(TEST_CONFIG, 4);
    const before = (await w.logprobs(probe))[0].logprobs;
    // rank 0 goes on into the step's collectives; without the exit it would wait there for rank 1
    await assert.rejects(w.trainStep(batch, { lr: 1e-2 }), /rank 1 .*died with exit code 3/);
    assert.deepEqual((await w.logprobs(probe))[0].logprobs, before, 'restarted from the last state');
    assert.equal(w.restarts, 1);
  } finally {
    await w.close();
  }
});

test('a rank other than 0 dying fails the call in flight with its own report; the next call restarts all ranks', {
  timeout: 120_000,
}, async () => {
  const w = await PolicyWorker.start({ ranks: 2, threads: 1 });
  try {
    await w.init(TEST_CONFIG, 4);
    const before = (await w.logprobs(probe))[0].logprobs;
    const [pid0, pid1] = w.pids;
    const long = w.generate(
      Array.from({ length: 16 }, () => [1, 2, 3]),
      sampling({ maxNewTokens: 3000 }),
    );
    setTimeout(() => process.kill(pid1, 'SIGKILL'), 300);
    await assert.rejects(long, new RegExp(`policy worker rank 1 \\(pid ${pid1}\\) died with signal SIGKILL`));
    const after = (await w.logprobs(probe))[0].logprobs;
    assert.equal(w.restarts, 1);
    assert.ok(!w.pids.includes(pid0) && !w.pids.includes(pid1));
    assert.deepEqual(after, before);
    assert.equal((await w.trainStep(batch, { lr: 1e-2 })).trainedTokens, 15);
  } finally {
    await w.close();
  }
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { PolicyWorker, type TrainBatch } from '../../src/worker/index.js';
import { assertHfShards, maxAbsDiff, TEST_CONFIG } from './helpers.js';

const batch = (k: number): TrainBatch => ({
  loss: 'grpo',
  sequences: [
    { ids: [1, 2, 3, 4, 5 + k], mask: [0, 0, 1, 1, 1], advantage: 1 },
    { ids: [6, 7, 8 + k], mask: [0, 1, 1], advantage: -0.5 },
    { ids: [9, 10, 11, 12], mask: [0, 1, 0, 1], advantage: 0.7 },
  ],
});
const opts = { lr: 5e-3, microBatchTokens: 8 };
const probe = [[1, 5, 9, 13, 17, 21]];
const shards = (dir: string) =>
  [1, 2, 3].map((i) => readFileSync(join(dir, `model-0000${i}-of-00003.safetensors`)));

test('HF shards saved by 2 ranks load bit-identically on 1 and 2 ranks; the optimizer resumes on either', {
  timeout: 170_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-shardck-'));
  const saved = join(root, 'saved');
  try {
    let ref: number[];
    const straight: number[] = [];
    const a = await PolicyWorker.start({ ranks: 2, threads: 1 });
    try {
      await a.init(TEST_CONFIG, 7);
      for (let k = 0; k < 2; k++) await a.trainStep(batch(k), opts);
      await a.save(saved, { shards: 3, optimizer: true });
      ref = (await a.logprobs(probe))[0].logprobs;
      for (let k = 2; k < 4; k++) straight.push((await a.trainStep(batch(k), opts)).loss);
    } finally {
      await a.close();
    }
    assertHfShards(saved, 3);
    for (const ranks of [1, 2]) {
      const w = await PolicyWorker.start({ ranks, threads: 1 });
      try {
        const info = await w.load(saved);
        assert.equal(info.restoredOptimizer, true);
        assert.deepEqual((await w.logprobs(probe))[0].logprobs, ref);
        const again = join(root, `again-${ranks}`);
        await w.save(again, { shards: 3 });
        const [before, after] = [shards(saved), shards(again)];
        for (let i = 0; i < 3; i++) assert.ok(before[i].equals(after[i]), `${ranks} rank(s): shard ${i + 1}`);
        const losses = [];
        for (let k = 2; k < 4; k++) losses.push((await w.trainStep(batch(k), opts)).loss);
        // the same ranks replay the same sums exactly; one rank adds the same terms in another order
        if (ranks === 2) assert.deepEqual(losses, straight);
        else
          for (let i = 0; i < 2; i++)
            assert.ok(Math.abs(losses[i] - straight[i]) < 1e-5, `${losses} vs ${straight}`);
      } finally {
        await w.close();
      }
    }
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('FSDP2: optimizer shards saved by 2 ranks resume exactly on 2 ranks and, resharded, on 1', {
  timeout: 170_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-fsdpck-'));
  const saved = join(root, 'saved');
  // two steps on from the checkpoint: their gradient norms and the log-probs after them depend on the weights and
  // on the restored Adam moments (an on-policy GRPO loss is -mean(advantage) whatever the weights)
  const onwards = async (w: PolicyWorker) => {
    const norms = [];
    for (let k = 2; k < 4; k++) norms.push((await w.trainStep(batch(k), opts)).gradNorm);
    return { norms, lp: (await w.logprobs(probe))[0].logprobs };
  };
  try {
    let ref: number[];
    let straight: Awaited<ReturnType<typeof onwards>>;
    const a = await PolicyWorker.start({ ranks: 2, threads: 1, sharding: 'fsdp' });
    try {
      await a.init(TEST_CONFIG, 7);
      for (let k = 0; k < 2; k++) await a.trainStep(batch(k), opts);
      await a.save(saved, { optimizer: true });
      ref = (await a.logprobs(probe))[0].logprobs;
      straight = await onwards(a);
    } finally {
      await a.close();
    }
    for (const ranks of [2, 1]) {
      const w = await PolicyWorker.start({ ranks, threads: 1, sharding: 'fsdp' });
      try {
        assert.equal((await w.load(saved)).restoredOptimizer, true);
        assert.deepEqual((await w.logprobs(probe))[0].logprobs, ref);
        const got = await onwards(w);
        if (ranks === 2)
          assert.deepEqual(got, straight); // the same ranks replay the same sums
        else {
          assert.ok(maxAbsDiff(got.norms, straight.norms) < 1e-5, `${got.norms} vs ${straight.norms}`);
          assert.ok(maxAbsDiff(got.lp, straight.lp) < 1e-5, `1 rank: ${maxAbsDiff(got.lp, straight.lp)}`);
        }
      } finally {
        await w.close();
      }
    }
    // the same weights with a fresh optimizer: what a resume that lost the moments would give
    const f = await PolicyWorker.start({ threads: 1, sharding: 'fsdp' });
    try {
      await f.load(saved);
      await f.resetOptimizer();
      const fresh = await onwards(f);
      assert.ok(maxAbsDiff(fresh.lp, straight.lp) > 1e-4, 'the moments change the update');
    } finally {
      await f.close();
    }
    const ddp = await PolicyWorker.start({ threads: 1 });
    try {
      await assert.rejects(
        ddp.load(saved),
        /its optimizer state is sharded \(saved under sharding: fsdp\); resume it with sharding: fsdp, on any number of ranks/,
      );
    } finally {
      await ddp.close();
    }
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('safetensors are memory-mapped copy-on-write: the file is mapped, never read whole, never written', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-mmap-'));
  try {
    const path = join(dir, 'model.safetensors');
    const code = `
import sys, torch
from rstar2_worker.train.checkpoint import read_safetensors, write_safetensors
path = sys.argv[1]
write_safetensors(path, {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)})
sd = read_safetensors(path)
print(sum(path in line for line in open("/proc/self/maps")))
assert torch.equal(sd["a"], torch.arange(4096, dtype=torch.float32)) and sd["b"].dtype == torch.bfloat16
sd["a"].add_(1)  # private mapping: the file keeps its bytes
del sd
print(torch.equal(read_safetensors(path)["a"], torch.arange(4096, dtype=torch.float32)))
`;
    const r = spawnSync(findPython(), ['-c', code, path], {
      env: { ...process.env, PYTHONPATH: PYTHON_DIR },
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    const [mapped, unchanged] = r.stdout.trim().split('\n');
    assert.ok(Number(mapped) >= 2, `one mapping per tensor, got ${mapped}`);
    assert.equal(unchanged, 'True');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// GPU check (bench/gpu-check.sh step 3): sharding: fsdp through the same launcher as DDP, world size 1.
// Scores a batch, then trains 3 steps under DDP and under FSDP from the same init and compares the losses; then saves under FSDP
// (consolidated HF shards + a sharded optimizer), reloads and checks the next step matches an unbroken run.
// Run: node --import tsx bench/gpu-fsdp.ts   (needs CUDA and torch >= 2.2 for RSTAR2_PYTHON)
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PolicyWorker, type TrainBatch } from '../src/worker/index.js';
import { benchArgs } from './args.js';

benchArgs(import.meta.url, { options: {} }); // no flags: --help prints the header

const config = {
  model_type: 'qwen3',
  vocab_size: 1024,
  hidden_size: 256,
  intermediate_size: 512,
  num_hidden_layers: 4,
  num_attention_heads: 8,
  num_key_value_heads: 2,
  head_dim: 64,
};
const batch = (k: number): TrainBatch => ({
  loss: 'sft',
  sequences: [0, 1, 2, 3].map((i) => {
    const ids = Array.from({ length: 64 }, (_, j) => (j * 7 + i * 13 + k) % 1024);
    return { ids, mask: ids.map((_, j) => (j === 0 ? 0 : 1)) };
  }),
});
const opts = { lr: 1e-3, microBatchTokens: 128 };

async function run(sharding: 'ddp' | 'fsdp', dir?: string): Promise<number[]> {
  const w = await PolicyWorker.start({ sharding, threads: 4 });
  try {
    await w.init(config, 3);
    // scored first, as oldLogprobs: recompute does: FSDP2 leaves the root's weights gathered after a forward
    // without backward, and an optimizer made then would never train them (the losses would part from DDP's)
    await w.logprobs(batch(0).sequences.map((s) => s.ids));
    const losses = [];
    for (let k = 0; k < 3; k++) {
      losses.push((await w.trainStep(batch(k), opts)).loss);
      if (dir && k === 1) await w.save(dir, { optimizer: true, shards: 2 });
    }
    return losses;
  } finally {
    await w.close();
  }
}

const dir = mkdtempSync(join(tmpdir(), 'rstar2-gpu-fsdp-'));
let bad = false;
try {
  const ddp = await run('ddp');
  const fsdp = await run('fsdp', join(dir, 'ckpt'));
  const d = Math.max(...ddp.map((l, i) => Math.abs(l - fsdp[i])));
  console.log(
    `fsdp vs ddp, 3 steps: losses ${fsdp.map((l) => l.toFixed(5))} vs ${ddp.map((l) => l.toFixed(5))}; max diff ${d.toExponential(2)}`,
  );
  bad ||= !(d < 1e-3);
  console.log(`checkpoint: ${readdirSync(join(dir, 'ckpt')).sort().join(' ')}`);
  const w = await PolicyWorker.start({ sharding: 'fsdp', threads: 4 });
  try {
    const info = await w.load(join(dir, 'ckpt'));
    const next = (await w.trainStep(batch(2), opts)).loss;
    const ok = info.restoredOptimizer === true && Math.abs(next - fsdp[2]) < 1e-4;
    console.log(
      `resume under fsdp: step 3 loss ${next.toFixed(6)} vs unbroken ${fsdp[2].toFixed(6)} ${ok ? 'ok' : 'FAIL'}`,
    );
    bad ||= !ok;
  } finally {
    await w.close();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
if (bad) process.exit(1);

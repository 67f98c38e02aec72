// Policy worker throughput vs a bare PyTorch loop on the same model, in the same run.
// Run: flock /tmp/bench.lock node --import tsx bench/worker.ts [--reps 3] [--threads 2] [--models tiny,small]
// Generate: batch 64, 32-token prompts, 96 new tokens (no stops), temperature 1. Train: GRPO step on 32×128 tokens.
// Worker numbers are timed in TypeScript (protocol and bookkeeping included). Reports medians and ratios.
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Rng } from '../src/util/index.js';
import { findPython, PYTHON_DIR } from '../src/util/python.js';
import { MODEL_PRESETS, type ModelPreset, PolicyWorker, type TrainBatch } from '../src/worker/index.js';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '3' },
    threads: { type: 'string', default: '2' },
    models: { type: 'string', default: 'tiny,small' },
  },
});
const reps = Number(values.reps);
const threads = Number(values.threads);
const SHAPE = { batch: 64, prompt: 32, new: 96, train_batch: 32, train_len: 128 };

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

async function timeIt(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return (performance.now() - t0) / 1000;
}

for (const name of values.models.split(',') as ModelPreset[]) {
  const config = { ...MODEL_PRESETS[name], vocab_size: 267 };
  const rng = new Rng(1);
  const prompts = Array.from({ length: SHAPE.batch }, () =>
    Array.from({ length: SHAPE.prompt }, () => rng.int(0, config.vocab_size - 1)),
  );
  const batch: TrainBatch = {
    loss: 'grpo',
    sequences: Array.from({ length: SHAPE.train_batch }, () => {
      const ids = Array.from({ length: SHAPE.train_len }, () => rng.int(0, config.vocab_size - 1));
      return { ids, mask: ids.map((_, i) => (i === 0 ? 0 : 1)), advantage: rng.next() * 2 - 1 };
    }),
  };
  const w = await PolicyWorker.start({ threads });
  const gen: number[] = [];
  const train: number[] = [];
  let params = 0;
  try {
    params = (await w.init(config, 0)).params;
    const sampling = {
      temperature: 1,
      topP: 1,
      topK: -1,
      maxNewTokens: SHAPE.new,
      stopTokenIds: [],
      stopStrings: [],
      seed: 0,
    };
    for (let i = 0; i <= reps; i++) {
      const dt = await timeIt(() => w.generate(prompts, sampling));
      if (i) gen.push((SHAPE.batch * SHAPE.new) / dt);
    }
    for (let i = 0; i <= reps; i++) {
      const dt = await timeIt(() => w.trainStep(batch, { lr: 1e-4, microBatchTokens: 1 << 20 }));
      if (i) train.push((SHAPE.train_batch * SHAPE.train_len) / dt);
    }
  } finally {
    await w.close();
  }
  const arg = JSON.stringify({ config, seed: 0, threads, reps, ...SHAPE });
  const r = spawnSync(findPython(), ['-m', 'rstar2_worker.bare_bench', arg], {
    env: {
      ...process.env,
      PYTHONPATH: resolve(PYTHON_DIR),
      OPENBLAS_NUM_THREADS: '1',
      OMP_NUM_THREADS: String(threads),
    },
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(`bare baseline failed: ${r.stderr}`);
  const bare = JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}') as {
    gen_tok_s: number[];
    train_tok_s: number[];
  };
  const g = median(gen);
  const t = median(train);
  const bg = median(bare.gen_tok_s);
  const bt = median(bare.train_tok_s);
  console.log(
    `${name} (${(params / 1e6).toFixed(2)}M params, ${threads} threads, median of ${reps}): ` +
      `generate ${g.toFixed(0)} tok/s vs bare ${bg.toFixed(0)} (bare/worker ${(bg / g).toFixed(2)}x); ` +
      `train ${t.toFixed(0)} tok/s vs bare ${bt.toFixed(0)} (bare/worker ${(bt / t).toFixed(2)}x)`,
  );
}

// Policy worker throughput vs a bare PyTorch loop on the same model, in the same run.
// Run: flock /tmp/bench.lock node --import tsx bench/worker.ts [--reps 5] [--threads 2] [--models tiny,small]
// Generate: batch 64, 32-token prompts, 96 new tokens (no stops), temperature 1. Train: one GRPO step on 32×128.
// Mixed: one GRPO step on 32 sequences of 16–256 tokens, padded length-grouped micro-batches (microBatchTokens)
// vs packed ones (maxTokensPerMicroBatch), both with an 8,192-token budget; tokens/s counts real tokens only.
// Worker numbers are timed in TypeScript (protocol, batching and bookkeeping included). The bare loop (same
// model, plain forward / multinomial / backward / AdamW) runs inside the same worker process, and the two
// alternate repetition by repetition, so both see the same machine load. Prints medians and ratios.
import { join } from 'node:path';
import { PYTHON_DIR, Rng } from '../src/util/index.js';
import { MODEL_PRESETS, type ModelPreset, PolicyWorker, type TrainBatch } from '../src/worker/index.js';
import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    reps: { type: 'string', default: '5' },
    threads: { type: 'string', default: '2' },
    models: { type: 'string', default: 'tiny,small' },
  },
});
const reps = Number(values.reps);
const threads = Number(values.threads);
const S = { batch: 64, prompt: 32, new: 96, trainBatch: 32, trainLen: 128 };

async function timeIt(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return (performance.now() - t0) / 1000;
}

for (const name of values.models.split(',') as ModelPreset[]) {
  const config = { ...MODEL_PRESETS[name], vocab_size: 267 };
  const rng = new Rng(1);
  const prompts = Array.from({ length: S.batch }, () =>
    Array.from({ length: S.prompt }, () => rng.int(0, config.vocab_size - 1)),
  );
  const batch: TrainBatch = {
    loss: 'grpo',
    sequences: Array.from({ length: S.trainBatch }, () => {
      const ids = Array.from({ length: S.trainLen }, () => rng.int(0, config.vocab_size - 1));
      return { ids, mask: ids.map((_, i) => (i === 0 ? 0 : 1)), advantage: rng.next() * 2 - 1 };
    }),
  };
  const mixed: TrainBatch = {
    loss: 'grpo',
    sequences: Array.from({ length: S.trainBatch }, () => {
      const ids = Array.from({ length: rng.int(16, 256) }, () => rng.int(0, config.vocab_size - 1));
      return { ids, mask: ids.map((_, i) => (i === 0 ? 0 : 1)), advantage: rng.next() * 2 - 1 };
    }),
  };
  const mixedTokens = mixed.sequences.reduce((n, s) => n + s.ids.length, 0);
  const sampling = {
    temperature: 1,
    topP: 1,
    topK: -1,
    maxNewTokens: S.new,
    stopTokenIds: [],
    stopStrings: [],
    seed: 0,
  };
  // the bare loop is python/bench/bare_bench.py, which the worker imports from its PYTHONPATH
  const w = await PolicyWorker.start({ threads, env: { PYTHONPATH: join(PYTHON_DIR, 'bench') } });
  const r = {
    gen: [] as number[],
    bareGen: [] as number[],
    train: [] as number[],
    bareTrain: [] as number[],
    padded: [] as number[],
    packed: [] as number[],
  };
  let params = 0;
  try {
    params = (await w.init(config, 0)).params;
    for (let i = 0; i <= reps; i++) {
      const dt = await timeIt(() => w.generate(prompts, sampling));
      const bare = await w.bareBench({ kind: 'generate', batch: S.batch, prompt: S.prompt, new: S.new });
      if (i === 0) continue; // warm-up
      r.gen.push((S.batch * S.new) / dt);
      r.bareGen.push(bare);
    }
    for (let i = 0; i <= reps; i++) {
      const dt = await timeIt(() => w.trainStep(batch, { lr: 1e-4, microBatchTokens: 1 << 20 }));
      const bare = await w.bareBench({ kind: 'train', batch: S.trainBatch, len: S.trainLen });
      if (i === 0) continue;
      r.train.push((S.trainBatch * S.trainLen) / dt);
      r.bareTrain.push(bare);
    }
    for (let i = 0; i <= reps; i++) {
      const padded = await timeIt(() => w.trainStep(mixed, { lr: 1e-4, microBatchTokens: 8192 }));
      const packed = await timeIt(() => w.trainStep(mixed, { lr: 1e-4, maxTokensPerMicroBatch: 8192 }));
      if (i === 0) continue;
      r.padded.push(mixedTokens / padded);
      r.packed.push(mixedTokens / packed);
    }
  } finally {
    await w.close();
  }
  const [g, bg, t, bt] = [median(r.gen), median(r.bareGen), median(r.train), median(r.bareTrain)];
  console.log(
    `${name} (${(params / 1e6).toFixed(2)}M params, ${threads} threads, median of ${reps}): ` +
      `generate ${g.toFixed(0)} tok/s vs bare ${bg.toFixed(0)} (bare/worker ${(bg / g).toFixed(2)}x); ` +
      `train ${t.toFixed(0)} tok/s vs bare ${bt.toFixed(0)} (bare/worker ${(bt / t).toFixed(2)}x); ` +
      `mixed-length train: padded ${median(r.padded).toFixed(0)} tok/s, packed ${median(r.packed).toFixed(0)} ` +
      `(packed/padded ${(median(r.packed) / median(r.padded)).toFixed(2)}x)`,
  );
}

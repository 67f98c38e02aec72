// One GRPO step of the policy worker as 1 rank (all threads), 2 DDP ranks and 2 FSDP2 ranks over gloo (a thread
// each) on this machine: the same model, batch and options, the three layouts alternating step by step so they see
// the same load. Issue 51 asks that 2 ranks on 2 cores be no slower a step than 1. Prints each layout's median step
// time and its ratio to 1 rank, and the loss each layout reports (equal within 1e-5: the same update).
//
//   node --import tsx bench/ranks.ts [--reps 7] [--threads 2] [--model small] [--batch 32] [--len 128]
import { Rng } from '../src/util/rng.js';
import { MODEL_PRESETS, type ModelPreset, PolicyWorker, type TrainBatch } from '../src/worker/index.js';
import { benchArgs, median } from './args.js';

const { values: v } = benchArgs(import.meta.url, {
  options: {
    reps: { type: 'string', default: '7' },
    threads: { type: 'string', default: '2' },
    model: { type: 'string', default: 'small' },
    batch: { type: 'string', default: '32' },
    len: { type: 'string', default: '128' },
  },
});
const threads = Number(v.threads);
if (!MODEL_PRESETS[v.model as ModelPreset]) {
  console.error(`ranks: --model must be one of ${Object.keys(MODEL_PRESETS).join(', ')}, got ${v.model}`);
  process.exit(2);
}
const config = { ...MODEL_PRESETS[v.model as ModelPreset], vocab_size: 267 };
const rng = new Rng(1);
const batch: TrainBatch = {
  loss: 'grpo',
  sequences: Array.from({ length: Number(v.batch) }, () => {
    const ids = Array.from({ length: Number(v.len) }, () => rng.int(0, config.vocab_size - 1));
    return { ids, mask: ids.map((_, i) => (i === 0 ? 0 : 1)), advantage: rng.next() * 2 - 1 };
  }),
};
const layouts = [
  { name: '1 rank', start: { ranks: 1, threads } },
  { name: '2 ranks DDP', start: { ranks: 2, threads: Math.max(1, threads / 2) } },
  {
    name: '2 ranks FSDP2',
    start: { ranks: 2, threads: Math.max(1, threads / 2), sharding: 'fsdp' as const },
  },
];
const workers: PolicyWorker[] = [];
try {
  for (const l of layouts) {
    const w = await PolicyWorker.start(l.start);
    await w.init(config, 7);
    workers.push(w);
  }
  const times: number[][] = layouts.map(() => []);
  const losses: number[][] = layouts.map(() => []);
  // lr 0: every step sees the same weights, so the layouts' losses can be compared at each step
  for (let r = 0; r <= Number(v.reps); r++)
    for (const [i, w] of workers.entries()) {
      const t0 = performance.now();
      const st = await w.trainStep(batch, { lr: 0, microBatchTokens: 8192 });
      if (r > 0) times[i].push((performance.now() - t0) / 1000); // the first step of each is warm-up
      losses[i].push(st.loss);
    }
  const base = median(times[0]);
  console.log(
    `model ${v.model}, ${v.batch} x ${v.len} tokens, ${threads} threads in all, ${v.reps} steps each`,
  );
  for (const [i, l] of layouts.entries()) {
    const m = median(times[i]);
    const d = Math.max(...losses[i].map((x, j) => Math.abs(x - losses[0][j])));
    console.log(
      `${l.name.padEnd(14)} step ${m.toFixed(3)} s (${Math.min(...times[i]).toFixed(3)}-${Math.max(...times[i]).toFixed(3)})  ` +
        `${(m / base).toFixed(2)}x 1 rank  loss diff ${d.toExponential(1)}`,
    );
  }
} finally {
  for (const w of workers) await w.close();
}

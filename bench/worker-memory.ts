// Peak memory of the policy worker: a logprob pass over one 4,096-token sequence with the logits made all at
// once vs in chunks (logitsChunkTokens), and a training step on the same sequence with and without activation
// checkpointing. Run: flock /tmp/bench.lock node --import tsx bench/worker-memory.ts [--reps 3] [--len 4096]
// Measured as the worker process's peak RSS (VmHWM in /proc/PID/status) over the call, minus its RSS just
// before it: the high-water mark is reset through /proc/PID/clear_refs first. CPU, fp32 (torch 1.13 has no
// allocator counters for CPU memory). Each measurement is the first call of a fresh worker (so memory the
// allocator kept from an earlier call cannot hide a peak); train rows include creating AdamW's state (2 × the
// parameters' bytes, ~37 MiB). Prints the median over reps.
import { readFileSync, writeFileSync } from 'node:fs';
import { Rng } from '../src/util/index.js';
import { MODEL_PRESETS, type ModelConfig, PolicyWorker } from '../src/worker/index.js';
import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: { reps: { type: 'string', default: '3' }, len: { type: 'string', default: '4096' } },
});
const reps = Number(values.reps);
const T = Number(values.len);

// Both ≈4.8M parameters: the `small` preset with a byte-sized vocabulary, and a narrower model whose
// parameters are mostly a 32K-entry embedding, where the [T, vocab] logits are what chunking is about.
const models: Record<string, ModelConfig> = {
  'small, vocab 512': { ...MODEL_PRESETS.small, max_position_embeddings: T },
  'hidden 128, vocab 32768': {
    ...MODEL_PRESETS.tiny,
    vocab_size: 32768,
    num_hidden_layers: 2,
    max_position_embeddings: T,
  },
};

const MiB = 1 << 20;
function kb(pid: number, field: string): number {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

/** Peak RSS growth (bytes) of the worker over `fn`. */
async function peak(w: PolicyWorker, fn: () => Promise<unknown>): Promise<number> {
  const pid = w.pids[0];
  writeFileSync(`/proc/${pid}/clear_refs`, '5'); // resets VmHWM to the current RSS
  const before = kb(pid, 'VmRSS');
  await fn();
  return kb(pid, 'VmHWM') - before;
}

for (const [name, config] of Object.entries(models)) {
  const rng = new Rng(1);
  const ids = Array.from({ length: T }, () => rng.int(0, config.vocab_size - 1));
  const seq = { ids, mask: ids.map((_, i) => (i ? 1 : 0)) };
  const variants: Record<string, (w: PolicyWorker) => Promise<unknown>> = {
    'logprobs, logits all at once': (w) => w.logprobs([ids], { logitsChunkTokens: T }),
    'logprobs, chunked (default)': (w) => w.logprobs([ids]),
    'train step, no checkpointing': (w) =>
      w.trainStep({ loss: 'sft', sequences: [seq] }, { lr: 1e-4, maxTokensPerMicroBatch: T }),
    'train step, gradientCheckpointing': (w) =>
      w.trainStep(
        { loss: 'sft', sequences: [seq] },
        { lr: 1e-4, maxTokensPerMicroBatch: T, gradientCheckpointing: true },
      ),
  };
  let params = 0;
  const out: string[] = [];
  for (const [label, fn] of Object.entries(variants)) {
    const xs: number[] = [];
    for (let r = 0; r < reps; r++) {
      const w = await PolicyWorker.start({ threads: 2 });
      try {
        params = (await w.init(config, 0)).params;
        xs.push(await peak(w, () => fn(w)));
      } finally {
        await w.close();
      }
    }
    out.push(
      `  ${label}: ${(median(xs) / MiB).toFixed(0)} MiB (${xs.map((x) => (x / MiB).toFixed(0)).join(', ')})`,
    );
  }
  console.log(
    `${name} (${(params / 1e6).toFixed(2)}M params), T = ${T}, peak RSS growth, median of ${reps}:`,
  );
  for (const l of out) console.log(l);
}

// GPU check (bench/gpu-check.sh, after the throughput step): `rstar2 plan`'s estimate of each throughput case's
// memory on one rank against the peak the GPU measured (torch.cuda.max_memory_allocated). Fails past ±15 %.
// Run: node --import tsx bench/gpu-plan.ts PEAKS.jsonl   (lines written by gpu_check throughput when
// RSTAR2_GPU_PEAKS names a file)
import { readFileSync } from 'node:fs';
import { type Precision, rankBytes } from '../src/worker/plan.js';
import type { ModelConfig } from '../src/worker/types.js';
import { benchArgs } from './args.js';

const { positionals } = benchArgs(import.meta.url, { options: {}, allowPositionals: true });
if (positionals.length !== 1) throw new Error('usage: bench/gpu-plan.ts PEAKS.jsonl');
const GiB = 2 ** 30;
let bad = 0;
for (const line of readFileSync(positionals[0], 'utf8').split('\n').filter(Boolean)) {
  const m = JSON.parse(line) as {
    config: ModelConfig & Record<string, unknown>;
    precision: Precision;
    tokens: number;
    checkpointing: boolean;
    peakGiB: number;
  };
  const est = rankBytes(m.config, m.precision, m.tokens, m.checkpointing) / GiB;
  const ok = Math.abs(est / m.peakGiB - 1) <= 0.15;
  bad += ok ? 0 : 1;
  console.log(
    `plan ${m.precision}, ${m.tokens} tokens a micro-batch${m.checkpointing ? ', checkpointing' : ''}: ` +
      `${est.toFixed(1)} GiB estimated vs ${m.peakGiB.toFixed(1)} measured (${((est / m.peakGiB - 1) * 100).toFixed(0)} %) ${ok ? 'ok' : 'FAIL'}`,
  );
}
if (bad) process.exit(1);

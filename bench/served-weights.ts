// Whether a served engine holds a run's trained weights (bench/live-engines.sh, issue 52 item 6): a fixed prompt is
// sampled on the engine and its tokens scored by a worker loaded from the run's newest checkpoint and from the one
// before it. It passes when the engine's log-probs are within --tolerance of the newest and nearer to it than to
// the one before (bf16 serving alone moves log-probs by about 1e-2, so the tolerance alone cannot tell them apart).
//
//   npx tsx bench/served-weights.ts --engine sglang+http://127.0.0.1:30000 --run RUN_DIR [--tolerance 0.05]
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { remoteEngine } from '../src/engines/factory.js';
import { PolicyWorker } from '../src/worker/client.js';
import { benchArgs } from './args.js';

const { values: v } = benchArgs(import.meta.url, {
  options: {
    engine: { type: 'string' },
    run: { type: 'string' },
    tolerance: { type: 'string', default: '0.05' },
  },
});
if (!v.engine || !v.run) {
  console.error('served-weights: --engine BACKEND+URL and --run RUN_DIR are needed (--help)');
  process.exit(2);
}
const dir = join(v.run, 'checkpoints');
const ckpts = readdirSync(dir)
  .map((name) => ({ path: join(dir, name), t: statSync(join(dir, name)).mtimeMs }))
  .sort((a, b) => b.t - a.t)
  .map((c) => c.path);
if (ckpts.length === 0) {
  console.error(`served-weights: no checkpoint in ${dir}`);
  process.exit(1);
}
const prompt = Array.from({ length: 16 }, (_, i) => 10 + i * 3);
const engine = remoteEngine(v.engine);
const r = await engine.generate(prompt, {
  temperature: 1,
  topP: 1,
  topK: -1,
  maxNewTokens: 16,
  stopTokenIds: [],
  stopStrings: [],
  seed: 7,
  ignoreEos: true,
});
if (r.finishReason === 'error' || r.outputIds.length === 0) {
  console.error(`served-weights: ${v.engine} generated nothing: ${r.error ?? r.finishReason}`);
  process.exit(1);
}
const worker = await PolicyWorker.start({ threads: 2 });
const gaps: number[] = [];
try {
  for (const ckpt of ckpts.slice(0, 2)) {
    await worker.load(ckpt);
    const [own] = await worker.logprobs([[...prompt, ...r.outputIds]]);
    const lps = own.logprobs.slice(prompt.length);
    gaps.push(Math.max(...lps.map((x, i) => Math.abs(x - r.logprobs[i]))));
  }
} finally {
  await worker.close();
}
const tol = Number(v.tolerance);
const [last, before] = gaps;
const ok = last <= tol && (before === undefined || last < before);
console.log(
  `served-weights: ${ok ? 'PASS' : 'FAIL'}: ${v.engine} against ${ckpts[0]}: max |Δ logprob| ${last.toExponential(2)} ` +
    `over ${r.outputIds.length} tokens (tolerance ${tol})` +
    (before === undefined
      ? ''
      : `; against the checkpoint before it (${ckpts[1]}): ${before.toExponential(2)}`),
);
process.exit(ok ? 0 : 1);

// Policy worker step time alone and beside a second busy worker on the same cores, per OpenMP wait setting.
// Run: node --import tsx bench/worker-contention.ts [--threads 2] [--steps 15] [settings…]
// A setting is `rstar2` (what the worker sets: GOMP_SPINCOUNT=1000), `default` (libgomp's own: spin 300k rounds
// before sleeping) or VAR=value[,VAR=value] for the worker's environment, e.g. OMP_WAIT_POLICY=PASSIVE.
// Work: quickstart-sized SFT steps (tiny preset, 16 sequences of 60-140 tokens). The second worker trains the
// same batch in a loop while the first is timed; "both" is the two workers' steps per second together.
import { Rng } from '../src/util/index.js';
import { MODEL_PRESETS, PolicyWorker, type TrainBatch } from '../src/worker/index.js';
import { benchArgs, median } from './args.js';

const { values, positionals } = benchArgs(import.meta.url, {
  allowPositionals: true,
  options: { threads: { type: 'string', default: '2' }, steps: { type: 'string', default: '15' } },
});
const threads = Number(values.threads);
const n = Number(values.steps);
const settings = positionals.length > 0 ? positionals : ['rstar2', 'default', 'OMP_WAIT_POLICY=PASSIVE'];

const config = { ...MODEL_PRESETS.tiny, vocab_size: 267 };
const rng = new Rng(1);
const batch: TrainBatch = {
  loss: 'sft',
  sequences: Array.from({ length: 16 }, () => {
    const ids = Array.from({ length: rng.int(60, 140) }, () => rng.int(0, 266));
    return { ids, mask: ids.map((_, i) => (i < 20 ? 0 : 1)) };
  }),
};

function envOf(setting: string): Record<string, string> | undefined {
  if (setting === 'rstar2') return undefined;
  if (setting === 'default') return { GOMP_SPINCOUNT: '300000' }; // libgomp's documented default
  return Object.fromEntries(setting.split(',').map((kv) => kv.split('=') as [string, string]));
}

async function start(env?: Record<string, string>): Promise<PolicyWorker> {
  const w = await PolicyWorker.start({ threads, env });
  await w.init(config, 1);
  return w;
}

async function stepMs(w: PolicyWorker, k: number): Promise<number> {
  const ts = [];
  for (let i = 0; i < k; i++) {
    const t0 = performance.now();
    await w.trainStep(batch, { lr: 1e-4 });
    ts.push(performance.now() - t0);
  }
  return median(ts);
}

console.log(`tiny preset, ${threads} threads per worker, median of ${n} SFT steps`);
for (const setting of settings) {
  const env = envOf(setting);
  const a = await start(env);
  await stepMs(a, 3);
  const alone = await stepMs(a, n);
  const b = await start(env);
  let stop = false;
  let bSteps = 0;
  const background = (async () => {
    while (!stop) {
      await b.trainStep(batch, { lr: 1e-4 });
      bSteps++;
    }
  })();
  await stepMs(a, 3);
  const t0 = performance.now();
  const b0 = bSteps;
  const shared = await stepMs(a, n);
  const secs = (performance.now() - t0) / 1000;
  const both = n / secs + (bSteps - b0) / secs;
  stop = true;
  await background;
  await a.close();
  await b.close();
  console.log(
    `${setting.padEnd(24)} alone ${alone.toFixed(0).padStart(5)} ms | beside a second worker ` +
      `${shared.toFixed(0).padStart(5)} ms (${(shared / alone).toFixed(1)}x) | both ${both.toFixed(1)} steps/s, ` +
      `one alone ${(1000 / alone).toFixed(1)}`,
  );
}

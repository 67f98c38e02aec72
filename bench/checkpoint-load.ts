// Peak memory of loading a ~100 MB fp32 checkpoint (qwen2, 25.8M parameters) into the policy, one file and 4 HF shards.
// Run: flock /tmp/bench.lock node --import tsx bench/checkpoint-load.ts [--reps 5] [--pythonpath DIR]
// Each repetition is a fresh python process: import torch and the worker, note VmRSS, Policy().load(dir), then
// VmHWM (peak RSS). Printed: medians of peak − RSS before the load, and of the load's wall time. --pythonpath
// points at another checkout's python/ to measure the code before a change (e.g. `git archive REV python`).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { findPython, PYTHON_DIR } from '../src/util/python.js';

import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: { reps: { type: 'string', default: '5' }, pythonpath: { type: 'string', default: PYTHON_DIR } },
});
const reps = Number(values.reps);
const config = {
  model_type: 'qwen2',
  vocab_size: 16000,
  hidden_size: 512,
  intermediate_size: 1536,
  num_hidden_layers: 3,
  num_attention_heads: 8,
  num_key_value_heads: 4,
  tie_word_embeddings: false,
};

function py(code: string, pythonpath: string, ...args: string[]): string {
  const r = spawnSync(findPython(), ['-c', code, ...args], {
    env: { ...process.env, PYTHONPATH: resolve(pythonpath), OMP_NUM_THREADS: '1' },
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

const root = mkdtempSync(join(tmpdir(), 'rstar2-loadbench-'));
try {
  const make = `
import json, sys
from rstar2_worker.train.policy import Policy
p = Policy()
p.init(json.loads(sys.argv[1]), 0)
p.save(sys.argv[2], False)
p.save(sys.argv[3], False, 4)
`;
  // the checkpoints always come from this checkout's writer, so both readers load the same bytes
  py(make, PYTHON_DIR, JSON.stringify(config), join(root, 'one'), join(root, 'sharded'));
  const measure = `
import sys, time
import torch
from rstar2_worker.train.policy import Policy
torch.set_num_threads(1)
def kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
before = kb("VmRSS:")
t0 = time.time()
Policy().load(sys.argv[1])
print(kb("VmHWM:") - before, time.time() - t0)
`;
  console.log(`python: ${values.pythonpath}; ${reps} fresh processes per layout; medians`);
  for (const layout of ['one', 'sharded']) {
    const peaks: number[] = [];
    const secs: number[] = [];
    for (let i = 0; i < reps; i++) {
      const [kb, s] = py(measure, values.pythonpath, join(root, layout)).split(' ').map(Number);
      peaks.push(kb / 1024);
      secs.push(s);
    }
    console.log(
      `${layout === 'one' ? 'model.safetensors' : '4 HF shards      '}: peak RSS over the pre-load RSS ` +
        `${median(peaks).toFixed(0)} MiB (checkpoint ${(statSync(join(root, 'one', 'model.safetensors')).size / 2 ** 20).toFixed(0)} MiB), load ${median(secs).toFixed(2)} s`,
    );
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}

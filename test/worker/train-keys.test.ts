import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { PYTHON_DIR } from '../../src/util/python.js';
import { TrainOptionsSchema } from '../../src/worker/types.js';

// The contract between the client and the worker's train_step: the options the TS schema sends (every key, its
// defaults filled in) are exactly those policy.py reads from `opts`. A key added on one side alone fails here.

function pythonKeys(): string[] {
  const src = readFileSync(join(PYTHON_DIR, 'rstar2_worker', 'train', 'policy.py'), 'utf8');
  const body = src.slice(
    src.indexOf('    def train_step('),
    src.indexOf('\ndef ', src.indexOf('    def train_step(')),
  );
  return [...new Set([...body.matchAll(/\bopts(?:\.get\(|\[)"(\w+)"/g)].map((m) => m[1]))].sort();
}

test("train options: the schema's keys are the keys policy.py's train_step reads", () => {
  const ts = Object.keys(TrainOptionsSchema.shape).sort();
  const py = pythonKeys();
  assert.ok(py.length > 10, `found only ${py.length} keys in policy.py: has train_step moved?`);
  assert.deepEqual(ts, py);
});

test('train options: a partial set parses to the full one, each default from the schema', () => {
  const full = TrainOptionsSchema.parse({ lr: 0.1 });
  assert.deepEqual(Object.keys(full).sort(), Object.keys(TrainOptionsSchema.shape).sort());
  assert.equal(full.clipHigh, 0.28);
  assert.equal(full.maxTokensPerMicroBatch, null);
});

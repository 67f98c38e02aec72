import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { TrainOptionsSchema } from '../../src/worker/types.js';

// The contract between the client and the worker's train_step: the options the TS schema sends (every key, its
// defaults filled in) are exactly those policy.py requires (TRAIN_KEYS) and train_options reads from `opts`, with no default of
// its own; and the full set Python's tests and benches build (python/tests/train_opts.py) is the schema's. A key
// added, or a default changed, on one side alone fails here.

const POLICY = readFileSync(join(PYTHON_DIR, 'rstar2_worker', 'train', 'policy.py'), 'utf8');

// train_step reads its options through train_options, the one function that checks and types them
function trainOptionsBody(): string {
  const at = POLICY.indexOf('\ndef train_options(');
  assert.ok(at >= 0, 'policy.py has no train_options: has it moved?');
  assert.match(
    POLICY,
    /def train_step\([^)]*\):[\s\S]*?= train_options\(opts,/,
    'train_step reads opts through train_options',
  );
  return POLICY.slice(at, POLICY.indexOf('\nclass ', at));
}

const sorted = (keys: Iterable<string>) => [...new Set(keys)].sort();

test("train options: the schema's keys are the keys policy.py's train_step requires and reads", () => {
  const ts = sorted(Object.keys(TrainOptionsSchema.shape));
  const tuple = POLICY.match(/^TRAIN_KEYS = \(([\s\S]*?)\n\)/m);
  assert.ok(tuple, 'policy.py has no TRAIN_KEYS tuple');
  const required = sorted([...tuple[1].matchAll(/"(\w+)"/g)].map((m) => m[1]));
  const body = trainOptionsBody();
  const read = sorted([...body.matchAll(/\bopts\["(\w+)"\]/g)].map((m) => m[1]));
  assert.ok(read.length > 10, `found only ${read.length} keys read in train_options: has it changed shape?`);
  assert.deepEqual(required, ts);
  assert.deepEqual(read, ts);
  assert.doesNotMatch(
    body,
    /\bopts\.get\(/,
    'train_options must not default a key of its own: the schema does',
  );
  assert.ok(
    !ts.includes('warmupSteps'),
    'warmup is applied by the client, on the step count the worker reports',
  );
});

test('train options: a partial set parses to the full one, each default from the schema', () => {
  const full = TrainOptionsSchema.parse({ lr: 0.1 });
  assert.deepEqual(Object.keys(full).sort(), Object.keys(TrainOptionsSchema.shape).sort());
  assert.equal(full.clipHigh, 0.28);
  assert.equal(full.maxTokensPerMicroBatch, null);
});

test("train options: Python's test and bench helper full_train_opts holds the schema's defaults", () => {
  const r = spawnSync(
    findPython(),
    [
      '-c',
      'import json; from tests.train_opts import full_train_opts; print(json.dumps(full_train_opts(0.1)))',
    ],
    { cwd: PYTHON_DIR, env: { ...process.env, PYTHONPATH: PYTHON_DIR }, encoding: 'utf8', timeout: 60_000 },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), TrainOptionsSchema.parse({ lr: 0.1 }));
});

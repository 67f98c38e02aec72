import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';

// The worker against transformers on CPU (python/tests/test_transformers_parity.py): Qwen2, Qwen2 with YaRN and
// Qwen3 on the built-in model and Llama on model.backend transformers, logits, log-probs and an SFT loss, and its
// sharded save read back by from_pretrained, greedy generation as transformers' generate. CI installs transformers
// (scripts/setup.sh); elsewhere it is skipped.

const PY = findPython();
const hasTransformers = spawnSync(PY, ['-c', 'import transformers'], { stdio: 'ignore' }).status === 0;

test("python: the worker gives transformers' logits, log-probs and loss; from_pretrained reads its save", {
  skip: hasTransformers
    ? false
    : `transformers is not importable by ${PY} (bash scripts/setup.sh installs it)`,
  timeout: 120_000,
}, () => {
  const r = spawnSync(PY, ['-m', 'unittest', '-v', 'tests/test_transformers_parity.py'], {
    cwd: PYTHON_DIR,
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', HF_HUB_OFFLINE: '1' },
    encoding: 'utf8',
    timeout: 110_000,
  });
  assert.equal(r.status, 0, r.error?.message ?? r.stderr);
  assert.match(r.stderr, /Ran 5 tests/);
  assert.doesNotMatch(r.stderr, /skipped/);
});

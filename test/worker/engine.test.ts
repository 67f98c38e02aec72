import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';

test('python: the serving engine (continuous batching, prefix reuse, retraction, device sampling) against the plain runs', {
  timeout: 300_000,
}, () => {
  const r = spawnSync(findPython(), ['-m', 'unittest', '-v', 'tests/test_engine.py'], {
    cwd: PYTHON_DIR,
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /Ran 1\d tests/);
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { PolicyWorker } from '../../src/worker/index.js';

// rope_scaling and the optional transformers backend (python/tests/test_rope.py, test_hf_backend.py), and the
// backend's one CPU-visible behaviour end to end: without the package, the worker refuses to start, naming it.

test('python: rope_scaling against the published formulas; the transformers backend through a stand-in', {
  timeout: 120_000,
}, () => {
  const r = spawnSync(
    findPython(),
    ['-m', 'unittest', '-v', 'tests/test_rope.py', 'tests/test_hf_backend.py'],
    {
      cwd: PYTHON_DIR,
      env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
      encoding: 'utf8',
    },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /Ran 11 tests/);
});

const hasTransformers =
  spawnSync(findPython(), ['-c', 'import transformers'], { encoding: 'utf8' }).status === 0;

test('model.backend transformers without the package: the worker says which package at start', {
  skip: hasTransformers ? 'transformers is installed here' : false,
}, async () => {
  await assert.rejects(
    PolicyWorker.start({ threads: 1, modelImpl: 'transformers' }),
    /failed to start: .*needs the transformers package.*pip install transformers/,
  );
});

test('recipes take model.backend (default native)', () => {
  const stages = [{ type: 'sft' }];
  assert.equal(parseRecipe({ stages }).model.backend, 'native');
  assert.equal(parseRecipe({ stages, model: { backend: 'transformers' } }).model.backend, 'transformers');
  assert.throws(() => parseRecipe({ stages, model: { backend: 'hf' } }), /model.backend/);
});

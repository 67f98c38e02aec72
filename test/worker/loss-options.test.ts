import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { PolicyWorker, type TrainBatch } from '../../src/worker/index.js';
import { TEST_CONFIG } from './helpers.js';

// The RL loss's optional terms (issue 44), off by default: KL against a reference policy (k1, k3) and an entropy
// bonus, in the worker's train_step.

test('python: k1/k3 estimates, a k3 step toward the reference, the entropy bonus gradient, verl loss scaling', {
  timeout: 120_000,
}, () => {
  const r = spawnSync(findPython(), ['-m', 'unittest', '-v', 'tests/test_policy_loss.py'], {
    cwd: PYTHON_DIR,
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /Ran 10 tests/);
});

test('reference logprobs reach train_step through the protocol: KL against itself is 0 and changes nothing', {
  timeout: 60_000,
}, async () => {
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(TEST_CONFIG, 5);
    const sequences = [12, 7, 20].map((n, i) => {
      const ids = Array.from({ length: n }, (_, t) => (5 * i + 3 * t + 1) % TEST_CONFIG.vocab_size);
      return { ids, mask: ids.map((_, t) => (t > 2 ? 1 : 0)), advantage: i - 0.8 };
    });
    const batch: TrainBatch = { loss: 'grpo', sequences };
    const refLogprobs = (await w.logprobs(sequences.map((s) => s.ids))).map((r) => r.logprobs);
    const plain = await w.trainStep(batch, { lr: 0 });
    const kl = await w.trainStep(batch, { lr: 0, klCoef: 0.5, klEstimator: 'k3', refLogprobs });
    assert.ok(Math.abs(kl.loss - plain.loss) < 1e-5 && Math.abs(kl.gradNorm - plain.gradNorm) < 1e-4);
    assert.ok(kl.kl !== undefined && Math.abs(kl.kl) < 1e-5, `${kl.kl}`);
    assert.equal(plain.kl, undefined);
    const off = refLogprobs.map((r) => r.map((x) => x - 0.5));
    const far = await w.trainStep(batch, { lr: 0, klCoef: 0.5, klEstimator: 'k1', refLogprobs: off });
    assert.ok(Math.abs((far.kl ?? 0) - 0.5) < 1e-4, `k1 of a reference 0.5 nats below: ${far.kl}`);
    const ent = await w.trainStep(batch, { lr: 0, entropyCoef: 0.05 });
    assert.ok(Math.abs(ent.gradNorm - plain.gradNorm) > 1e-6);
    await assert.rejects(w.trainStep(batch, { lr: 0, klCoef: 0.5 }), /klCoef needs refLogprobs/);
  } finally {
    await w.close();
  }
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { PolicyWorker, type TrainBatch, type TrainStats } from '../../src/worker/index.js';
import { maxAbsDiff, TEST_CONFIG } from './helpers.js';

test('python: chunked log-probs, packing, checkpointing, the sdpa call and bf16 against the plain paths', {
  timeout: 180_000,
}, () => {
  const r = spawnSync(findPython(), ['-m', 'unittest', '-v', 'tests/test_memory.py'], {
    cwd: PYTHON_DIR,
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /Ran 2\d tests/);
});

test("python: model.compile's pieces against the modules' own forward, and its fallbacks", {
  timeout: 120_000,
}, () => {
  const r = spawnSync(findPython(), ['-m', 'unittest', '-v', 'tests/test_pieces.py'], {
    cwd: PYTHON_DIR,
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /Ran 6 tests/);
});

let w: PolicyWorker;
before(async () => {
  w = await PolicyWorker.start({ threads: 1 });
  await w.init(TEST_CONFIG, 21);
});
after(async () => {
  await w?.close();
});

// lengths 2..40 so a padded micro-batch pads and a packed one holds several sequences
const batch: TrainBatch = {
  loss: 'grpo',
  sequences: [40, 3, 17, 2, 29, 9, 33, 5].map((n, i) => {
    const ids = Array.from({ length: n }, (_, t) => (7 * i + 3 * t) % TEST_CONFIG.vocab_size);
    return {
      ids,
      mask: ids.map((_, t) => (t > 0 && (t + i) % 4 !== 0 ? 1 : 0)),
      advantage: (i % 3) - 1.1,
      oldLogprobs: i % 2 ? ids.map((_, t) => -4 - 0.05 * t) : undefined,
    };
  }),
};

function assertSameStep(a: TrainStats, b: TrainStats, what: string): void {
  assert.ok(Math.abs(a.loss - b.loss) < 1e-5, `${what}: loss ${a.loss} vs ${b.loss}`);
  assert.ok(Math.abs(a.gradNorm - b.gradNorm) < 1e-5, `${what}: grad norm ${a.gradNorm} vs ${b.gradNorm}`);
  assert.ok(Math.abs(a.entropy - b.entropy) < 1e-5, `${what}: entropy`);
  assert.equal(a.clipFrac, b.clipFrac);
  assert.equal(a.trainedTokens, b.trainedTokens);
}

test('packed micro-batches, checkpointing and logit chunks give the padded step’s loss and grads', {
  timeout: 60_000,
}, async () => {
  const tokens = batch.sequences.reduce((n, s) => n + s.ids.length, 0);
  const padded = await w.trainStep(batch, { lr: 0, microBatchTokens: 120 });
  assert.ok(padded.paddedTokens > tokens);
  const packed = await w.trainStep(batch, { lr: 0, maxTokensPerMicroBatch: 50 });
  assertSameStep(packed, padded, 'packed');
  assert.equal(packed.paddedTokens, tokens);
  assert.equal(packed.tokens, tokens);
  assert.equal(packed.microBatches, 3); // 138 tokens first-fit into 50: [40,9], [33,17], [29,5,3,2]
  const recomputed = await w.trainStep(batch, {
    lr: 0,
    maxTokensPerMicroBatch: 50,
    gradientCheckpointing: true,
    logitsChunkTokens: 7,
  });
  assertSameStep(recomputed, padded, 'checkpointed, chunked');
});

test('logprobs in 1-token logit chunks equal one chunk; bad options are named', {
  timeout: 60_000,
}, async () => {
  const seqs = batch.sequences.map((s) => s.ids);
  const whole = await w.logprobs(seqs, { temperature: 0.8 });
  const chunked = await w.logprobs(seqs, { temperature: 0.8, logitsChunkTokens: 1 });
  whole.forEach((r, i) => {
    assert.equal(r.logprobs.length, seqs[i].length);
    assert.ok(maxAbsDiff(r.logprobs, chunked[i].logprobs) < 1e-5);
    assert.ok(maxAbsDiff(r.entropy, chunked[i].entropy) < 1e-5);
    assert.deepEqual(r.argmax, chunked[i].argmax);
  });
  await assert.rejects(
    w.trainStep(batch, { lr: 0, maxTokensPerMicroBatch: 0 }),
    /maxTokensPerMicroBatch must be a positive integer, got 0/,
  );
  await assert.rejects(
    w.logprobs(seqs, { logitsChunkTokens: 2.5 }),
    /logitsChunkTokens must be a positive integer, got 2.5/,
  );
  await assert.rejects(
    // @ts-expect-error: a precision the worker does not have
    PolicyWorker.start({ precision: 'fp16' }),
    /precision must be one of fp32, bf16-mixed, bf16, got "fp16"/,
  );
});

test('a bf16-mixed worker says where it runs and trains', { timeout: 60_000 }, async () => {
  const bf = await PolicyWorker.start({ threads: 1, precision: 'bf16-mixed' });
  try {
    const info = await bf.init(TEST_CONFIG, 21);
    assert.equal(info.precision, 'bf16-mixed');
    assert.equal(info.device, 'cpu'); // no CUDA on this machine
    const ref = await w.trainStep(batch, { lr: 0, maxTokensPerMicroBatch: 50 });
    const st = await bf.trainStep(batch, { lr: 0, maxTokensPerMicroBatch: 50 });
    assert.ok(Math.abs(st.loss - ref.loss) < 0.05, `${st.loss} vs ${ref.loss}`);
    assert.notEqual(st.loss, ref.loss);
  } finally {
    await bf.close();
  }
});

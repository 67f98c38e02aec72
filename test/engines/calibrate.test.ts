import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  fitEngineModel,
  leastSquares,
  nonNegativeLeastSquares,
  parseSamples,
} from '../../src/engines/calibrate.js';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { Rng } from '../../src/util/rng.js';

test('calibration recovers known step-time and prefill constants from noisy synthetic samples', () => {
  const truth = {
    stepBaseMs: 4.5,
    kvMsPerToken: 15.25e-6,
    seqMs: 0.005,
    prefillBaseMs: 2,
    prefillMsPerToken: 1 / 64,
  };
  const rng = new Rng(7);
  const noise = () => (rng.next() - 0.5) * 0.2; // ±0.1 ms
  const lines: string[] = [];
  for (let i = 0; i < 400; i++) {
    const batch = rng.int(1, 600);
    const kv = rng.int(1000, 1_200_000);
    const ms = truth.stepBaseMs + truth.kvMsPerToken * kv + truth.seqMs * batch + noise();
    lines.push(JSON.stringify({ batch, kv, ms }));
  }
  for (let i = 0; i < 100; i++) {
    const tokens = rng.int(100, 30_000);
    lines.push(
      JSON.stringify({ tokens, ms: truth.prefillBaseMs + truth.prefillMsPerToken * tokens + noise() }),
    );
  }
  const { steps, prefills } = parseSamples(`${lines.join('\n')}\n`);
  assert.equal(steps.length, 400);
  assert.equal(prefills.length, 100);
  const fit = fitEngineModel(steps, prefills);
  for (const [k, v] of Object.entries(truth)) {
    const got = fit[k as keyof typeof fit];
    assert.ok(Math.abs(got - v) / v < 0.05, `${k}: fitted ${got}, true ${v}`);
  }
});

test('least squares is exact on noiseless data and refuses samples that cannot separate the constants', () => {
  const [a, b] = leastSquares(
    [
      [1, 1],
      [1, 2],
      [1, 3],
    ],
    [5, 7, 9],
  );
  assert.ok(Math.abs(a - 3) < 1e-9 && Math.abs(b - 2) < 1e-9);
  assert.throws(
    () =>
      fitEngineModel(
        [1, 2, 3].map((i) => ({ batch: 8, kv: 1000 * i, ms: i })),
        [
          { tokens: 1, ms: 1 },
          { tokens: 2, ms: 2 },
        ],
      ),
    /do not vary enough/,
  );
  assert.throws(() => parseSamples('{"batch": 1}\n'), /line 1: needs a numeric 'ms'/);
});

test('no fitted constant is negative: a bent prefill line measured on an H100 gets a zero intercept', () => {
  // decode_timing's prefills of Qwen3-14B on one H100 (2026-11-26): short prompts run below the GPU's rate, so
  // a straight line through them crosses zero at ~85 tokens
  const prefills = [
    { tokens: 256, ms: 16.2592 },
    { tokens: 1024, ms: 51.4467 },
    { tokens: 4096, ms: 217.3118 },
    { tokens: 8192, ms: 464.0112 },
  ];
  const [plain] = leastSquares(
    prefills.map((p) => [1, p.tokens]),
    prefills.map((p) => p.ms),
  );
  assert.ok(plain < -1, `plain least squares' intercept ${plain}`);
  const steps = [64, 128, 256].flatMap((batch) =>
    [1, 2].map((i) => ({ batch, kv: 65536 * i, ms: 4 + 15e-6 * 65536 * i + 0.01 * batch })),
  );
  const fit = fitEngineModel(steps, prefills);
  assert.equal(fit.prefillBaseMs, 0);
  const through0 =
    prefills.reduce((a, p) => a + p.tokens * p.ms, 0) / prefills.reduce((a, p) => a + p.tokens ** 2, 0);
  assert.ok(Math.abs(fit.prefillMsPerToken - through0) < 1e-12);
  assert.ok(Math.abs(fit.stepBaseMs - 4) < 1e-9 && Math.abs(fit.seqMs - 0.01) < 1e-12);
  assert.deepEqual(
    nonNegativeLeastSquares(
      [
        [1, 1],
        [1, 2],
      ],
      [-1, -2],
    ),
    [0, 0],
  );
});

test('python/bench/decode_timing.py (CPU, a tiny shape) writes samples that calibrate fits', {
  timeout: 120_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-dt-'));
  const env = { ...process.env, PYTHONPATH: PYTHON_DIR, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' };
  const unit = spawnSync(findPython(), ['-m', 'unittest', '-v', 'tests/test_decode_timing.py'], {
    cwd: PYTHON_DIR,
    env,
    encoding: 'utf8',
  });
  assert.equal(unit.status, 0, unit.stderr);
  assert.match(unit.stderr, /Ran 3 tests/);
  const cfg = join(dir, 'config.json');
  writeFileSync(
    cfg,
    JSON.stringify({
      hidden_size: 64,
      intermediate_size: 128,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      vocab_size: 256,
    }),
  );
  const out = join(dir, 's.jsonl');
  const r = spawnSync(
    findPython(),
    [
      join(PYTHON_DIR, 'bench', 'decode_timing.py'),
      '--config',
      cfg,
      '--kv-tokens',
      '4096',
      '--batches',
      '4,16',
    ].concat(['--contexts', '64,256', '--prefills', '128,512,1024', '--reps', '2', '--out', out]),
    { env, encoding: 'utf8' },
  );
  assert.equal(r.status, 0, r.stderr);
  const { steps, prefills } = parseSamples(readFileSync(out, 'utf8'));
  assert.deepEqual(
    steps.map((x) => [x.batch, x.kv]),
    [
      [4, 256],
      [4, 1024],
      [16, 1024],
      [16, 4096],
    ],
  );
  assert.equal(prefills.length, 3);
  const fit = fitEngineModel(steps, prefills);
  for (const v of Object.values(fit)) assert.ok(Number.isFinite(v) && v >= 0);
  rmSync(dir, { recursive: true });
});

test('the non-negative fit is the constrained optimum (its KKT conditions hold) on random problems', () => {
  const rng = new Rng(3);
  for (let t = 0; t < 3000; t++) {
    const x = Array.from({ length: 6 }, () => [1, rng.next(), rng.next()]);
    const y = x.map(() => rng.next() * 2 - 0.5);
    const b = nonNegativeLeastSquares(x, y);
    // gradient of the squared error: zero along every constant left free, ≥ 0 along every one held at 0
    const r = x.map((row, i) => row.reduce((a, v, j) => a + v * b[j], 0) - y[i]);
    const g = b.map((_, j) => x.reduce((a, row, i) => a + row[j] * r[i], 0));
    for (const [j, v] of b.entries()) {
      assert.ok(v >= 0, `problem ${t}: constant ${j} is ${v}`);
      if (v > 1e-12)
        assert.ok(Math.abs(g[j]) < 1e-9, `problem ${t}: constant ${j} free but gradient ${g[j]}`);
      else assert.ok(g[j] > -1e-9, `problem ${t}: constant ${j} held at 0 but gradient ${g[j]}`);
    }
  }
  assert.throws(
    () => fitEngineModel([{ batch: 8, kv: 1000, ms: 1 }], []),
    /needs both kinds of sample: 1 decode steps \{batch, kv, ms\} and 0 prefills/,
  );
});

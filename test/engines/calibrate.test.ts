import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fitEngineModel, leastSquares, parseSamples } from '../../src/engines/calibrate.js';
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

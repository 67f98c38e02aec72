import assert from 'node:assert/strict';
import { test } from 'node:test';
import { miniBatchPlan, stageLr, warmupLr } from '../../src/rl/index.js';

test('stageLr: constant, or a half cosine from lr at step 1 toward minLr', () => {
  const s = { lr: 0.4, minLr: 0.1, steps: 4, lrSchedule: 'cosine' as const };
  assert.equal(stageLr({ ...s, lrSchedule: 'constant' }, 3), 0.4);
  assert.equal(stageLr(s, 1), 0.4);
  assert.ok(Math.abs(stageLr(s, 3) - 0.25) < 1e-12);
  assert.ok(stageLr(s, 4) > 0.1 && stageLr(s, 4) < stageLr(s, 3));
});

test("miniBatchPlan: near-equal parts of what was kept, or verl's nominal size", () => {
  const p = { promptsPerStep: 8, miniBatches: 2, samplesPerPrompt: 4, lossAgg: 'token-mean' };
  assert.deepEqual(miniBatchPlan(13, p), { size: 7 });
  assert.deepEqual(miniBatchPlan(0, p), { size: 1 });
  assert.deepEqual(miniBatchPlan(13, { ...p, lossAgg: 'micro-mean-nominal' }), { size: 16, nominalSeqs: 16 });
});

test('warmupLr: linear over the optimizer steps taken, then the lr itself; none at warmupSteps 0', () => {
  assert.deepEqual(
    [0, 1, 2, 3, 9].map((taken) => warmupLr(0.8, 4, taken)),
    [0.2, 0.4, 0.6000000000000001, 0.8, 0.8],
  );
  assert.equal(warmupLr(0.8, 0, 0), 0.8);
  assert.equal(warmupLr(0.8, 1, 0), 0.8);
});

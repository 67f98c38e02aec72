import assert from 'node:assert/strict';
import { test } from 'node:test';
import { VerifierPool, verify } from '../../src/reward/index.js';

test('pool returns results in input order, equal to in-thread verify', { timeout: 60_000 }, async () => {
  const pool = new VerifierPool({ size: 2 });
  try {
    const items = [
      { pred: '\\boxed{2}', gold: '2' },
      { pred: '\\boxed{(x+1)^2}', gold: 'x^2+2x+1' },
      { pred: '\\boxed{3}', gold: '2' },
      { pred: 'nothing', gold: '2' },
      { pred: '\\boxed{0.5}', gold: '\\frac12', opts: { profile: 'lenient' as const } },
    ];
    const got = await pool.verifyBatch(items);
    assert.deepEqual(
      got,
      items.map((i) => verify(i.pred, i.gold, i.opts)),
    );
    assert.deepEqual(
      got.map((r) => r.correct),
      [true, true, false, false, true],
    );
  } finally {
    await pool.close();
  }
});

test('a check past its hard limit gets a timeout result and the pool keeps working', {
  timeout: 60_000,
}, async () => {
  const pool = new VerifierPool({ size: 1, graceMs: 0 });
  try {
    // A 300-term sum compared at random points takes well over 0 ms; the worker is killed and replaced.
    const heavy = Array.from({ length: 300 }, (_, i) => `\\sin(${i}x)`).join('+');
    const [slow, after] = await Promise.all([
      pool.verify({
        pred: heavy,
        gold: `${heavy}+0`,
        opts: { extract: false, timeoutMs: 0, maxAnswerChars: 1e6 },
      }),
      pool.verify({ pred: '\\boxed{5}', gold: '5' }),
    ]);
    assert.equal(slow.correct, false);
    assert.equal(slow.status, 'timeout');
    assert.equal(after.correct, true);
  } finally {
    await pool.close();
  }
});

test('closed pool rejects new work', async () => {
  const pool = new VerifierPool({ size: 1 });
  await pool.close();
  await assert.rejects(pool.verify({ pred: '1', gold: '1' }), /closed/);
});

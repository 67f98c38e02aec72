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

// Answers only the CAS (@cortex-js/compute-engine) can read: our parser has no \sum, \lfloor or \operatorname.
// Issue 14: the package loaded only on tsx's main thread, so in a worker these came back "unsupported command".
test('the CAS works in worker threads: CAS-only answers get the in-thread verdict', {
  timeout: 60_000,
}, async () => {
  const pool = new VerifierPool({ size: 2 });
  try {
    const items = [
      { pred: '\\sum_{k=1}^{10} k', gold: '55', opts: { extract: false } },
      { pred: 'So the total is \\boxed{\\sum_{k=1}^{10} k}.', gold: '55' },
      { pred: '\\lfloor 7/2 \\rfloor', gold: '3', opts: { extract: false } },
      { pred: '\\operatorname{lcm}(4,6)', gold: '12', opts: { extract: false } },
      { pred: '\\sum_{k=1}^{10} k', gold: '56', opts: { extract: false } },
    ];
    const got = await pool.verifyBatch(items);
    assert.deepEqual(
      got.map((r) => [r.correct, r.status, r.matchedBy]),
      [
        [true, 'equal', 'cas-numeric'],
        [true, 'equal', 'cas-numeric'],
        [true, 'equal', 'cas-numeric'],
        [true, 'equal', 'cas-numeric'],
        [false, 'not-equal', null],
      ],
      got.map((r) => r.reason).join('\n'),
    );
    assert.deepEqual(
      got,
      items.map((i) => verify(i.pred, i.gold, i.opts)),
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

// Issue 44: compute-engine's parser backtracks, so `#` and 76 dashes (a random model's sample) or a dozen
// `[` never finished and hung training. Its parse now has a step budget: each gets its verdict (our parser
// cannot read it, so "unknown") well inside the pool's 2 s limit, where the unbounded parse timed out.
test('inputs that make the CAS parser backtrack get a verdict, not a timeout', {
  timeout: 60_000,
}, async () => {
  const pool = new VerifierPool({ size: 1 });
  try {
    const got = await pool.verifyBatch([
      { pred: `The answer is $#${'-'.repeat(76)}$`, gold: '5', opts: { profile: 'reference' } },
      { pred: `\\boxed{${'['.repeat(14)}}`, gold: '5', opts: { profile: 'reference' } },
      { pred: '('.repeat(40), gold: '5', opts: { extract: false } },
      { pred: `1${'+'.repeat(60)}`, gold: '1', opts: { extract: false } },
      { pred: '\\sum_{k=1}^{10} k', gold: '55', opts: { extract: false } }, // and the CAS still reads sums
    ]);
    assert.deepEqual(
      got.map((r) => [r.status, r.correct]),
      [
        ['unknown', false],
        ['unknown', false],
        ['unknown', false],
        ['unknown', false],
        ['equal', true],
      ],
      got.map((r) => r.reason).join('\n'),
    );
  } finally {
    await pool.close();
  }
});

test('closed pool rejects new work', async () => {
  const pool = new VerifierPool({ size: 1 });
  await pool.close();
  await assert.rejects(pool.verify({ pred: '1', gold: '1' }), /closed/);
});

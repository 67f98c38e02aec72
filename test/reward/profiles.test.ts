import assert from 'node:assert/strict';
import { test } from 'node:test';
import { scoreTrajectory, VerifierPool, verify } from '../../src/reward/index.js';

const int = (text: string, gold: string, finish?: string) =>
  scoreTrajectory({ text, finish }, gold, 'integer');

test('integer profile: a boxed integer, compared as an integer', () => {
  assert.deepEqual(int('so \\boxed{42}.', '42'), {
    reward: 1,
    correct: true,
    extracted: '42',
    matchedBy: 'integer',
    reason: 'equal integers',
  });
  assert.equal(int('\\boxed{042}', '42').reward, 1);
  assert.equal(int('\\boxed{+42}', '42').reward, 1);
  assert.equal(int('\\boxed{-7}', '-7').reward, 1);
  assert.equal(int('\\boxed{43}', '42').reward, 0);
  // The last box is the answer.
  assert.equal(int('\\boxed{41} no, \\boxed{42}', '42').reward, 1);
});

test('integer profile: \\text{}, commas, spaces and $ are stripped on both sides', () => {
  assert.equal(int('\\boxed{\\text{1,234}}', '1234').reward, 1);
  assert.equal(int('\\boxed{$1,000$}', '1,000').reward, 1);
  assert.equal(int('\\boxed{1 000}', '1000').reward, 1);
  assert.equal(int('\\boxed{7}', '\\text{7}').reward, 1);
});

test('integer profile: a non-boxed answer is found but not credited', () => {
  for (const text of ['The answer is 42', 'output: 42', '<answer>42</answer>', 'so $42$']) {
    const r = int(text, '42');
    assert.equal(r.reward, 0, text);
    assert.equal(r.extracted, '42', text);
    assert.match(r.reason, /only a \\boxed\{\} answer counts/);
  }
  assert.equal(int('nothing here', '42').extracted, null);
});

test('integer profile: only integers, nothing symbolic', () => {
  assert.equal(int('\\boxed{42.0}', '42').reward, 0);
  assert.equal(int('\\boxed{x=42}', '42').reward, 0);
  assert.equal(int('\\boxed{\\frac{84}{2}}', '42').reward, 0);
  const r = int('\\boxed{1/2}', '\\frac12');
  assert.equal(r.reward, 0);
  assert.equal(verify('\\boxed{3}', '\\frac{6}{2}', { profile: 'integer' }).reason, 'gold is not an integer');
});

test('integer profile: a trajectory that finished with an error scores 0', () => {
  assert.deepEqual(int('\\boxed{42}', '42', 'error'), {
    reward: 0,
    correct: false,
    extracted: null,
    matchedBy: null,
    reason: 'trajectory finished with an error',
  });
  assert.equal(int('\\boxed{42}', '42', 'stop').reward, 1);
});

test('reference profile: PRIME leniencies on top of Math-Verify, integers stay exact', () => {
  const ref = (pred: string, gold: string) => verify(pred, gold, { profile: 'reference' }).correct;
  const strict = (pred: string, gold: string) => verify(pred, gold).correct;
  assert.equal(ref('\\boxed{37.7}', '12\\pi'), true); // PRIME's 1e-4 relative tolerance
  assert.equal(ref('\\boxed{25}', '0.25'), true); // PRIME's ×100 percentage
  assert.equal(ref('\\boxed{3.14}', '\\pi'), true); // PRIME's π ≈ 3.14
  assert.equal(strict('\\boxed{37.7}', '12\\pi'), false);
  // PRIME drops bases and would accept these at 1e-4; two integers must be equal.
  assert.equal(ref('\\boxed{1112122_3}', '1112112_3'), false);
  assert.equal(ref('\\boxed{100001}', '100000'), false);
});

test('reference profile: Math-Verify readings that strict does not have', () => {
  const ref = (pred: string, gold: string) => verify(pred, gold, { profile: 'reference' });
  const pairs: [string, string][] = [
    ['$(3,2)$', '$(p,q)=(3,2)$'],
    ['so it is 1 000 in total', '1000'],
    ['$\\boxed{7:32}$', 'S_{MBCN}:S=7:32'],
    ['$x \\in [-2,7]$', '-2 \\le x \\le 7'],
    ['$\\boxed{(7,11),\\ (11,7)}$', '(11,7)or(7,11)'],
    ['$x = 5+5+1 = 7 =11$', 'x = 11'],
    ['Therefore the probability is 2/3. <|im_start|>user', '2/3'],
  ];
  for (const [pred, gold] of pairs) {
    assert.equal(ref(pred, gold).correct, true, `${gold} vs ${pred}: ${ref(pred, gold).reason}`);
    assert.equal(verify(pred, gold).correct, false, `strict ${gold} vs ${pred}`);
  }
  assert.equal(ref('$\\boxed{3:2}$', '7:32').correct, false);
});

test('a rounding other than 6 decimals', () => {
  assert.equal(verify('0.33', '\\frac13', { extract: false, floatRounding: 2 }).correct, true);
  assert.equal(verify('0.33', '\\frac13', { extract: false }).correct, false);
});

test('pool: every profile, the same verdicts as in-thread, and score()', { timeout: 60_000 }, async () => {
  const pool = new VerifierPool({ size: 1 });
  try {
    const items = [
      { pred: 'The answer is 42', gold: '42', opts: { profile: 'integer' as const } },
      { pred: '\\boxed{42}', gold: '42', opts: { profile: 'integer' as const } },
      { pred: '$(3,2)$', gold: '$(p,q)=(3,2)$', opts: { profile: 'reference' as const } },
      { pred: '\\boxed{37.7}', gold: '12\\pi', opts: { profile: 'lenient' as const } },
      { pred: '\\boxed{37.7}', gold: '12\\pi', opts: { profile: 'strict' as const } },
    ];
    const got = await pool.verifyBatch(items);
    assert.deepEqual(
      got,
      items.map((i) => verify(i.pred, i.gold, i.opts)),
    );
    assert.deepEqual(
      got.map((r) => r.correct),
      [false, true, true, true, false],
    );
    const t = { text: 'so \\boxed{42}' };
    assert.deepEqual(await pool.score(t, '42', 'integer'), scoreTrajectory(t, '42', 'integer'));
    assert.equal((await pool.score({ ...t, finish: 'error' }, '42', 'reference')).reward, 0);
    await assert.rejects(
      pool.verify({ pred: '1', gold: '1', opts: { profile: 'loose' as never } }),
      /unknown verify profile "loose" \(valid: integer, strict, lenient, reference\)/,
    );
  } finally {
    await pool.close();
  }
  assert.throws(
    () => new VerifierPool({ defaults: { profile: 'exact' as never } }),
    /valid: integer, strict/,
  );
});

test('unknown profiles name the valid ones', () => {
  assert.throws(
    () => scoreTrajectory({ text: '1' }, '1', 'loose' as never),
    /unknown verify profile "loose" \(valid: integer, strict, lenient, reference\)/,
  );
});

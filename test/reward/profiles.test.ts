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

test('reference profile: PRIME leniencies on top of Math-Verify', () => {
  const ref = (pred: string, gold: string) => verify(pred, gold, { profile: 'reference' }).correct;
  const strict = (pred: string, gold: string) => verify(pred, gold).correct;
  assert.equal(ref('\\boxed{37.7}', '12\\pi'), true); // PRIME's 1e-4 relative tolerance
  assert.equal(ref('\\boxed{25}', '0.25'), true); // PRIME's ×100 percentage
  assert.equal(ref('\\boxed{3.14}', '\\pi'), true); // PRIME's π ≈ 3.14
  assert.equal(strict('\\boxed{37.7}', '12\\pi'), false);
  // PRIME drops a base, then its tolerance accepts other digits; with a base stated they stay exact.
  assert.equal(ref('\\boxed{1112122_3}', '1112112_3'), false);
});

// PRIME's math_equal (PRIME-RL/PRIME@18ad596f training/verl/utils/reward_score/evaluation_utils/math_util/
// grader.py:194-202) accepts a prediction within isclose(rel_tol=1e-4) of gold/100, gold or gold·100, for
// integers as for any number; evaluate_math (__init__.py:376) calls it with those defaults.
test("reference profile: PRIME's leniencies between integers, on by default, each with a switch", () => {
  const ref = (pred: string, gold: string, leniencies?: object) =>
    verify(`\\boxed{${pred}}`, gold, { profile: 'reference', leniencies }).correct;
  // ×100 / ÷100
  assert.equal(ref('5000', '50'), true);
  assert.equal(ref('5', '500'), true);
  assert.equal(ref('0.5', '50'), true);
  assert.equal(ref('5000', '50', { percentTimes100: false }), false);
  assert.equal(ref('0.5', '50', { percentTimes100: false }), false);
  assert.equal(ref('500', '50'), false);
  // near-miss integers: |a - b| <= 1e-4 · max(|a|, |b|), so AIME-sized answers stay exact
  assert.equal(ref('100001', '100000'), true);
  assert.equal(ref('100010', '100000'), true); // 10 <= 10.001
  assert.equal(ref('100011', '100000'), false); // 11 > 10.0011
  assert.equal(ref('-100001', '-100000'), true);
  assert.equal(ref('-100001', '100000'), false);
  assert.equal(ref('1000', '999'), false);
  assert.equal(ref('10000001', '100000'), true); // ×100 and the tolerance together, as PRIME
  assert.equal(ref('100001', '100000', { nearMissIntegers: false }), false);
  assert.equal(ref('10000000', '100000', { nearMissIntegers: false }), true);
  // the integer fast path and the parsed path agree
  assert.equal(verify('100001', '100000', { profile: 'reference', extract: false }).correct, true);
  assert.equal(ref('100000 + 1', '100000'), true);
  // strict has none of them; lenient has them all
  assert.equal(verify('\\boxed{100001}', '100000').correct, false);
  assert.equal(verify('\\boxed{5000}', '50').correct, false);
  assert.equal(verify('\\boxed{100001}', '100000', { profile: 'lenient' }).correct, true);
  assert.equal(ref('3.14', '\\pi', { piAs314: false }), false);
  assert.throws(() => ref('1', '1', { nearMiss: true }), /unknown leniency "nearMiss".*nearMissIntegers/);
  assert.throws(() => ref('1', '1', { piAs314: 1 }), /leniency piAs314 must be true or false/);
});

// MATH's is_equiv test file (hendrycks/math modeling/math_equivalence_test.py) pairs these as equal; the
// answers alone are the response, as a model that answers without a box writes them.
test('reference profile: the LaTeX normal forms, bare and boxed', () => {
  const pairs: [string, string][] = [
    ['10\\sqrt3 + \\sqrt{4}', '10\\sqrt{3} + \\sqrt4'],
    ['\\frac34i', '\\frac{3}{4}i'],
    ['(x-2)(x+2)', '\\left(x-2\\right)\\left(x+2\\right)'],
    ['\\left(x-2\\right)\\left(x+2\\right)', '(x-2)(x+2)'],
    ['\\$10', '10'],
    ['10', '\\$10'],
    ['\\tfrac83', '\\frac{8}{3}'],
    ['1\\frac12', '1.5'],
    ['185\\', '185'],
    ['\\sin(90^{\\circ}-x)', '\\cos(x)'],
    ['i(2-i)', '1+2i'],
  ];
  for (const [pred, gold] of pairs) {
    for (const text of [pred, `\\boxed{${pred}}`, `So the answer is ${pred}.`]) {
      const r = verify(text, gold, { profile: 'reference' });
      assert.equal(r.correct, true, `${text} vs ${gold}: ${r.reason}`);
    }
  }
  assert.equal(verify('(x-2)(x+3)', '(x-2)(x+2)', { profile: 'reference' }).correct, false);
  assert.equal(verify('\\frac34', '\\frac{3}{4}i', { profile: 'reference' }).correct, false);
  assert.equal(verify('i(2+i)', '1+2i', { profile: 'reference' }).correct, false);
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

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { scoreTrajectory, verify } from '../../src/reward/index.js';

interface Labelled {
  gold: string;
  pred?: string;
  response?: string;
  label: boolean;
}

const LABELLED: Labelled[] = readFileSync(new URL('./labelled.jsonl', import.meta.url), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => JSON.parse(l));

// Every labelled pair, strict profile: the set has both equal and not-equal pairs of every answer type
// (integers, fractions, decimals, mixed numbers, percent, radicals, constants, units, text, symbolic,
// complex, tuples, sets, intervals, unions, ±, matrices, equations, inequalities, bases, responses).
for (const c of LABELLED) {
  const input = c.pred ?? (c.response as string);
  test(`${c.label ? 'equal' : 'not equal'}: gold ${JSON.stringify(c.gold)} vs ${JSON.stringify(input).slice(0, 70)}`, () => {
    const r = c.pred !== undefined ? verify(c.pred, c.gold, { extract: false }) : verify(input, c.gold);
    assert.equal(r.correct, c.label, r.reason);
  });
}

test('results carry extracted, normalised, matched-by and a reason', () => {
  const r = verify('Thus $\\boxed{\\dfrac{1}{2}}$.', '0.5');
  assert.equal(r.correct, true);
  assert.equal(r.extracted, '\\dfrac{1}{2}');
  assert.equal(r.normalised, '\\frac{1}{2}');
  assert.equal(r.matchedBy, 'exact-rational');
  assert.equal(r.status, 'equal');
  assert.equal(r.source, 'boxed');
  assert.match(r.reason, /exact-rational/);
  const w = verify('\\boxed{3}', '4');
  assert.equal(w.correct, false);
  assert.equal(w.matchedBy, null);
  assert.match(w.reason, /3 != 4/);
});

test('lenient profile adds the PRIME leniencies, strict keeps them off', () => {
  const pairs: [string, string][] = [
    ['12\\pi', '37.7'], // 1e-4 relative tolerance
    ['0.25', '25'], // ×100 percentage
    ['\\pi', '3.14'], // π ≈ 3.14
  ];
  for (const [gold, pred] of pairs) {
    assert.equal(verify(pred, gold, { extract: false }).correct, false, `strict ${gold} vs ${pred}`);
    assert.equal(
      verify(pred, gold, { extract: false, profile: 'lenient' }).correct,
      true,
      `lenient ${gold} vs ${pred}`,
    );
  }
  assert.equal(verify('38', '12\\pi', { extract: false, profile: 'lenient' }).correct, false);
});

test('unknown is never equal: unparsable answers score 0 with a reason', () => {
  const r = verify('\\boxed{\\foo{3}}', '3');
  assert.equal(r.correct, false);
  assert.equal(r.status, 'unknown');
  assert.match(r.reason, /does not parse/);
  const v = verify('\\boxed{\\sqrt{-x^2-1}}', '\\sqrt{-x^2-1}+0');
  assert.equal(v.correct, false, v.reason);
});

test('no answer and overlong answers are reported, not crashed on', () => {
  const none = verify('I do not know', '5');
  assert.equal(none.correct, false);
  assert.equal(none.status, 'no-answer');
  const long = verify(`\\boxed{${'1+'.repeat(600)}1}`, '601');
  assert.equal(long.correct, false);
  assert.match(long.reason, /longer than 1000/);
});

test('long predictions keep their tail and say so', () => {
  const text = `${'x'.repeat(300_000)} \\boxed{7}`;
  const r = verify(text, '7');
  assert.equal(r.correct, true);
  assert.match(r.reason, /truncated to its last 200000 chars/);
});

test('time limit: an expired deadline yields timeout, not equal', () => {
  const r = verify('\\boxed{(x+1)^2}', 'x^2+2x+1', { timeoutMs: -1 });
  assert.equal(r.correct, false);
  assert.equal(r.status, 'timeout');
});

test('huge powers and factorials do not hang', () => {
  const r = verify('\\boxed{2^{1000000000}}', '2^{1000000000}+1');
  assert.equal(r.correct, false);
  const f = verify('\\boxed{100000!}', '100000!+1');
  assert.equal(f.correct, false);
});

test('absurd nesting is unparsable, not a crash', () => {
  const r = verify(`\\boxed{${'('.repeat(490)}1${')'.repeat(490)}}`, '2');
  assert.equal(r.correct, false);
  const deep = verify('{'.repeat(5000) + '1' + '}'.repeat(5000), '1', {
    extract: false,
    maxAnswerChars: 20000,
  });
  assert.equal(typeof deep.correct, 'boolean');
});

test('CAS second opinion for values our parser does not read', () => {
  const eq = (p: string, g: string) => verify(p, g, { extract: false });
  assert.equal(eq('\\sum_{k=1}^{10} k', '55').matchedBy, 'cas-numeric');
  assert.equal(eq('\\sum_{k=1}^{10} k', '56').correct, false);
  assert.equal(eq('\\operatorname{lcm}(4,6)', '12').correct, true);
  assert.equal(eq('\\prod_{k=1}^{4} k', '4!').correct, true);
  // unbound symbols: CE would substitute a value; we refuse
  assert.equal(eq('\\sum_{k=1}^{n} k', '55').correct, false);
  assert.equal(eq('\\int_0^1 x\\,dx', '\\frac12').correct, false);
  assert.equal(eq('\\foo{3}', '\\bar{3}').correct, false);
});

test('random points are seeded: the same inputs give the same verdict', () => {
  const a = verify('\\boxed{\\frac{\\sin 2x}{2}}', '\\sin x \\cos x', { seed: 7 });
  const b = verify('\\boxed{\\frac{\\sin 2x}{2}}', '\\sin x \\cos x', { seed: 7 });
  assert.deepEqual(a, b);
});

test('bad options and inputs are clear errors', () => {
  assert.throws(() => verify('1', '1', { profile: 'loose' as never }), /unknown verify profile "loose"/);
  assert.throws(() => verify(1 as never, '1'), /must be strings/);
});

test('scoreTrajectory reads a whole multi-turn text', () => {
  const text =
    '<reason>Let me compute with code.</reason><tool_call>{"name":"python"}</tool_call>\n' +
    'output: 1.5\n<reason>So it is 3/2.</reason><answer>The answer is \\boxed{\\frac{3}{2}}</answer>';
  assert.deepEqual(scoreTrajectory({ text }, '1.5'), {
    reward: 1,
    correct: true,
    extracted: '\\frac{3}{2}',
    matchedBy: 'exact-rational',
    reason: 'equal by exact-rational',
  });
  assert.equal(scoreTrajectory({ text }, '2').reward, 0);
  for (const profile of ['lenient', 'reference'] as const) {
    assert.equal(scoreTrajectory({ text }, '3/2', profile).correct, true, profile);
  }
  // An errored trajectory scores 0 in every profile, whatever its text says.
  for (const profile of ['integer', 'strict', 'lenient', 'reference'] as const) {
    const r = scoreTrajectory({ text: '\\boxed{2}', finish: 'error' }, '2', profile);
    assert.deepEqual([r.reward, r.correct, r.extracted], [0, false, null], profile);
  }
});

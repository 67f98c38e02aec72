import assert from 'node:assert/strict';
import { test } from 'node:test';
import { verify } from '../../src/reward/index.js';

// Order-sensitive answers (issue 56 item 7), built to Math-Verify's published behaviour
// (huggingface/Math-Verify@5d148cfa grader.py `sympy_deep_compare_set_and_tuple`, latex2sympy2_extended@02999f5d
// `convert_elements_to_set_or_tuple`): a tuple or interval compares element by element in order, a `\{…\}` set
// and a bare comma list `1, 2, 3` (a FiniteSet there) in any order.

const PROFILES = ['strict', 'lenient', 'reference'] as const;
const boxed = (answer: string) => `so the answer is \\boxed{${answer}}.`;

test('tuples, coordinates, intervals and vectors hold their order in every profile', () => {
  const swapped: [string, string][] = [
    ['(1,2)', '(2,1)'],
    ['(3, \\frac{\\pi}{2})', '(\\frac{\\pi}{2}, 3)'],
    ['\\left(\\frac{4}{5},\\frac{1}{5}\\right)', '\\left(\\frac{1}{5},\\frac{4}{5}\\right)'],
    ['(6,31,-1)', '(-1,31,6)'],
    ['(6,31,-1)', '-1, 31, 6'],
    ['(1,2)', '\\{2,1\\}'],
    ['[1,2]', '[2,1]'],
    ['[-4,0]', '[0,-4]'],
    ['\\begin{pmatrix}1\\\\2\\end{pmatrix}', '\\begin{pmatrix}2\\\\1\\end{pmatrix}'],
    ['(1,2),(3,4)', '(2,1),(4,3)'],
  ];
  for (const profile of PROFILES) {
    for (const [gold, pred] of swapped) {
      const r = verify(boxed(pred), gold, { profile });
      assert.equal(r.correct, false, `${profile}: ${pred} accepted for ${gold} (${r.reason})`);
      assert.equal(verify(boxed(gold), gold, { profile }).correct, true, `${profile}: ${gold} vs itself`);
    }
  }
});

test('sets and bare comma lists are unordered, as Math-Verify reads them', () => {
  const reordered: [string, string][] = [
    ['\\{1,2,3\\}', '\\{3,1,2\\}'],
    ['-2,1', '1,-2'],
    ['1, 2, 3', '3, 2, 1'],
    ['(1,2),(3,4)', '(3,4),(1,2)'],
    ['x=1, y=2', 'y=2, x=1'],
  ];
  for (const profile of PROFILES) {
    for (const [gold, pred] of reordered) {
      const r = verify(boxed(pred), gold, { profile });
      assert.equal(r.correct, true, `${profile}: ${pred} vs ${gold} (${r.reason})`);
    }
  }
});

test('strict and lenient: assignments fix the order by their names, not where they were written', () => {
  for (const profile of ['strict', 'lenient'] as const) {
    const v = (pred: string, gold: string) => verify(boxed(pred), gold, { profile });
    // `y = 1, x = 2` is the point (2, 1).
    assert.equal(v('y=1, x=2', '(1,2)').correct, false, profile);
    assert.equal(v('y=1, x=2', '(2,1)').correct, true, profile);
    assert.equal(v('x=1, y=2', '(1,2)').correct, true, profile);
    assert.equal(v('b=2, a=1, c=3', '(1, 2, 3)').correct, true, profile);
    assert.equal(v('b=1, a=2, c=3', '(1, 2, 3)').correct, false, profile);
    // A gold `a = 1, b = 2` is the pair (a, b).
    assert.equal(v('(2,1)', 'a=1, b=2').correct, false, profile);
    assert.equal(v('(1,2)', 'a=1, b=2').correct, true, profile);
    // Two values of one variable are a set of roots, in any order.
    assert.equal(v('(2,1)', 'x=1, x=2').correct, true, profile);
  }
});

test('reference profile: Math-Verify compares such assignments in written order and as sets', () => {
  // What the reference reward accepts (Math-Verify's assignment reading drops the names); kept there so the
  // profile stays what rStar2's reward scores.
  const ref = (pred: string, gold: string) => verify(boxed(pred), gold, { profile: 'reference' });
  assert.equal(ref('y=1, x=2', '(1,2)').correct, true);
  assert.equal(ref('(2,1)', 'a=1, b=2').correct, true);
});

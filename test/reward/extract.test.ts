import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  extractAnswer,
  extractGold,
  extractPrime,
  extractReference,
  findBoxes,
} from '../../src/reward/extract.js';

const CASES: [string, string | null, string | null][] = [
  // [response, expected answer, expected source]
  ['so \\boxed{42}.', '42', 'boxed'],
  ['\\boxed{\\frac{1}{2}} and later \\boxed{\\sqrt{2}}', '\\sqrt{2}', 'boxed'],
  ['nested \\boxed{\\frac{a}{\\sqrt{b}}}', '\\frac{a}{\\sqrt{b}}', 'boxed'],
  ['\\fbox{7}', '7', 'boxed'],
  ['\\boxed{\\boxed{8}}', '8', 'boxed'],
  ['\\boxed{5} is it; the format was \\boxed{}', '5', 'boxed'],
  ['$\\boxed 5$', '5', 'boxed'],
  ['roots \\boxed{3}, \\boxed{5} and \\boxed{7}', '3, 5, 7', 'boxed'],
  ['try \\boxed{3}. Checking again it must be \\boxed{7}', '7', 'boxed'],
  ['same \\boxed{7} again \\boxed{7}', '7', 'boxed'],
  ['truncated \\boxed{12', '12', 'last-number'],
  ['<answer>The total is 18</answer>', 'The total is 18', 'answer-tag'],
  ['<answer>\nAnswer: 18\n</answer>', '18', 'answer-tag'],
  ['<answer>$x=3$</answer> trailing', 'x=3', 'answer-tag'],
  ['tool said 5 <answer>\\boxed{6}</answer>', '6', 'boxed'],
  ['The final answer is $\\frac{3}{4}$. I hope it is correct.', '\\frac{3}{4}', 'final-answer-is'],
  ['final answer: 12 apples. Then more words', '12 apples', 'final-answer-is'],
  ['The answer is $(1,2)$ and that is it', '(1,2)', 'answer-colon'],
  ['Answer: 204', '204', 'answer-colon'],
  ['we find $x=3$ and then $y = 4$ so', 'y = 4', 'math-env'],
  ['display \\[ \\frac{1}{3} \\] done', '\\frac{1}{3}', 'math-env'],
  ['She earns $1,450,000 in total', '1,450,000', 'last-number'],
  ['Total 1,234.5 m', '1,234.5', 'last-number'],
  ['about 28% of them', '28%', 'last-number'],
  ['decimal .5 left', '.5', 'last-number'],
  ['Soucis : 2,74 $ a..', '2.74', 'last-number'],
  ['it is 1000,99', '1000.99', 'last-number'],
  ['costs \\$5 then $x = 3$', 'x = 3', 'math-env'],
  ['no digits here', null, null],
];

for (const [text, answer, source] of CASES) {
  test(`extract ${JSON.stringify(text).slice(0, 60)}`, () => {
    const got = extractAnswer(text);
    assert.equal(got?.answer ?? null, answer);
    assert.equal(got?.source ?? null, source);
  });
}

test('boxes are brace matched and escaped braces do not count', () => {
  const b = findBoxes('\\boxed{\\{1,2\\}} and \\boxed{a{b}c}');
  assert.deepEqual(
    b.map((x) => x.content),
    ['\\{1,2\\}', 'a{b}c'],
  );
});

test('gold answers are taken whole unless boxed or wrapped in $', () => {
  assert.equal(extractGold('1,450,000'), '1,450,000');
  assert.equal(extractGold('$\\frac12$'), '\\frac12');
  assert.equal(extractGold('\\boxed{5}'), '5');
  assert.equal(extractGold(' x \\in [-2,7] '), 'x \\in [-2,7]');
});

// Math-Verify's extraction, as the reference profile reads a response.
const REFERENCE_CASES: [string, string | null, string | null][] = [
  ['so \\boxed{42}.', '42', 'boxed'],
  // Boxes join when under 10 characters apart, or under 70 with a separator between them.
  ['\\boxed{1} papers and \\boxed{2} bins', '1, 2', 'boxed'],
  ['\\boxed{1} no no no no no \\boxed{2}', '2', 'boxed'],
  ['\\boxed{3}. After checking, it is \\boxed{7}', '3, 7', 'boxed'],
  ['$\\boxed{35} ++++++ \\boxed{4}$', '35, 4', 'boxed'],
  // The rightmost "final answer is X. I hope" beats an earlier box.
  ['\\boxed{1}. The final answer is $2$. I hope it is correct.', '2', 'final-answer-is'],
  ['Final Answer: The volume of $ABCD$ is 120. I hope it is correct.', '120', 'final-answer-is'],
  ['The answer is $(1,2)$ and that is it', '(1,2)', 'answer-colon'],
  // Without an anchor: the rightmost environment, number or arithmetic.
  ['we find $x=3$ and then $y = 4$ so', 'y = 4', 'math-env'],
  ['$1$, $2$ and $3$', '1, 2, 3', 'math-env'],
  ['there are 12 of them, see $d = 90/n$ above. So 12 it is', '12', 'last-number'],
  ['so P(A) = 2/3. <|im_start|>user', '2/3', 'last-number'],
  ['it is 1 000 in total', '1000', 'last-number'],
  ['Soucis : 2,74 $ a..', '2.74', 'last-number'],
  ['worth $1,000.99', '1000.99', 'last-number'],
  ['up by 100%.', '100%', 'last-number'],
  // A number needs a space, `=` or the start before it; inline math may not span lines.
  ['AZYUK2A', null, null],
  ['<answer>7</answer>', null, null],
  ['Answer $ \n 9 \n $', '9', 'answer-colon'],
];

for (const [text, answer, source] of REFERENCE_CASES) {
  test(`extractReference ${JSON.stringify(text).slice(0, 60)}`, () => {
    const got = extractReference(text);
    assert.equal(got?.answer ?? null, answer);
    assert.equal(got?.source ?? null, source);
  });
}

test('extractReference with the LaTeX target alone finds no bare numbers', () => {
  assert.equal(extractReference('Answer $ \n 9 \n $', ['latex']), null);
  assert.equal(extractReference('it is 1 000', ['latex']), null);
  // With numbers alone a `$` reads as a currency sign.
  assert.equal(extractReference('it is $5$', ['expr'])?.answer, '5');
});

// PRIME's match_answer (PRIME-RL/PRIME@18ad596f training/verl/utils/reward_score/evaluation_utils/math_util/
// __init__.py:333-373), step by step: the answer marker, the last box, the last ". ", then "is"/"="/...
test('extractPrime reads a response as PRIME does', () => {
  const cases: [string, string][] = [
    ['so the answer is \\boxed{7}. Done', '7'],
    ['\\boxed{x = 5}', '5'], // the cuts apply inside the box too
    ['(x-2)(x+2)', '(x-2)(x+2)'], // nothing found: the whole text
    ['It is 3. Then 4 is wrong', '3'],
    ['Answer: 12 apples', '12 apples'],
    ['\\boxed{1} and later \\boxed{2}', '2'],
    ['14 is the answer. I checked', '14'],
    ['\\boxed{}', '\\boxed{}'], // an empty box is no box
    ['\\boxed{3', '\\boxed{3'], // nor is an unclosed one
  ];
  for (const [text, want] of cases) assert.equal(extractPrime(text), want, text);
});

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  dedupeQuestions,
  integerAnswers,
  isIntegerAnswer,
  loadProblems,
  maxPromptTokens,
  normaliseQuestion,
  type Problem,
} from '../../src/data/index.js';

const p = (id: string, question: string, answer: string | null): Problem => ({ id, question, answer });

test('integerAnswers keeps plain decimal integers only and counts the rest', () => {
  const rows = [
    p('a', 'q', '42'),
    p('b', 'q', ' -7 '),
    p('c', 'q', '4.0'),
    p('d', 'q', '1,000'),
    p('e', 'q', null),
    p('f', 'q', '\\frac{1}{2}'),
    p('g', 'q', '+3'),
  ];
  const r = integerAnswers(rows);
  assert.deepEqual(
    r.kept.map((x) => x.id),
    ['a', 'b', 'g'],
  );
  assert.equal(r.dropped, 4);
  assert.equal(r.reason, 'answer is not an integer');
  assert.equal(isIntegerAnswer('2^10'), false);
});

test('dedupeQuestions keeps the first of questions equal up to case, width and whitespace', () => {
  const rows = [
    p('a', 'What is 2+2?', '4'),
    p('b', '  what IS 2+2?\n', '4'),
    p('c', 'What is ２+2?', '4'), // fullwidth digit: NFKC folds it
    p('d', 'What is 2+3?', '5'),
  ];
  const r = dedupeQuestions(rows);
  assert.deepEqual(
    r.kept.map((x) => x.id),
    ['a', 'd'],
  );
  assert.equal(r.dropped, 2);
  assert.equal(r.reason, 'duplicate question');
  assert.equal(normaliseQuestion(' A\tB  c '), 'a b c');
});

test('maxPromptTokens drops prompts over the limit with the caller counting tokens', () => {
  const rows = [p('a', 'one two', '1'), p('b', 'one two three four', '1'), p('c', 'one two three', '1')];
  const words = (q: string) => q.split(' ').length;
  const r = maxPromptTokens(rows, 3, words);
  assert.deepEqual(
    r.kept.map((x) => x.id),
    ['a', 'c'],
  );
  assert.equal(r.dropped, 1);
  assert.equal(r.reason, 'prompt longer than 3 tokens');
});

test('the fixtures pass every filter untouched (distinct integer-answer problems)', async () => {
  const ps = await loadProblems('data/samples/{verl,dapo}-arith.*');
  assert.equal(integerAnswers(ps).dropped, 0);
  assert.equal(dedupeQuestions(ps).dropped, 0);
  assert.equal(maxPromptTokens(ps, 40, (q) => q.split(' ').length).dropped, 0);
});

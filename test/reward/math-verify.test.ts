import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { verify } from '../../src/reward/index.js';

// Math-Verify's own test cases (huggingface/Math-Verify 5d148cfa, tests/*.py), one row per parametrised
// case, with the settings that case ran under. src/reward/README.md lists where and why we disagree.
interface Case {
  source: string;
  gold: string;
  pred: string;
  expected: boolean;
  match_types?: ('latex' | 'expr')[];
  precision: number;
  strict: boolean;
  allow_set_relation_comp: boolean;
}

const CASES: Case[] = readFileSync(new URL('./math-verify-cases.jsonl', import.meta.url), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => JSON.parse(l));

// The rows the reference profile disagrees with, each explained in src/reward/README.md.
const KNOWN_DISAGREEMENTS = [
  'tests/test_all.py::test_set_rel_assymetry[2]',
  'tests/test_strict.py::test_strict_variable_comparison[1]',
  'tests/test_yujianll.py::test_string_extraction[5]',
  'tests/test_yujianll.py::test_string_extraction[9]',
];

function run(c: Case) {
  return verify(c.pred, c.gold, { profile: 'reference', floatRounding: c.precision, targets: c.match_types });
}

test('every row names its source test and carries a label', () => {
  assert.equal(CASES.length, 274);
  for (const c of CASES) {
    assert.match(c.source, /^tests\/test_\w+\.py::test_\w+\[[^\]]+\]$/);
    assert.equal(typeof c.expected, 'boolean', c.source);
  }
  assert.equal(new Set(CASES.map((c) => c.source)).size, CASES.length);
});

test('reference profile: no false positives, >= 97% agreement with Math-Verify', { timeout: 60_000 }, () => {
  const wrong = CASES.filter((c) => run(c).correct !== c.expected);
  const falsePositives = wrong.filter((c) => !c.expected).map((c) => c.source);
  assert.deepEqual(falsePositives, []);
  const agreement = 1 - wrong.length / CASES.length;
  assert.ok(agreement >= 0.97, `agreement ${(100 * agreement).toFixed(1)}%`);
  assert.deepEqual(
    wrong.map((c) => c.source),
    KNOWN_DISAGREEMENTS,
  );
});

test('the settings rows: the reference reward runs Math-Verify with its defaults', () => {
  // Same pairs under the defaults (strict variables, no set-from-relation) are rejected, as labelled.
  for (const s of [
    'tests/test_all.py::test_set_rel_assymetry[3]',
    'tests/test_strict.py::test_strict_variable_comparison[0]',
  ]) {
    const c = CASES.find((x) => x.source === s) as Case;
    assert.equal(c.expected, false);
    assert.equal(run(c).correct, false, s);
  }
});

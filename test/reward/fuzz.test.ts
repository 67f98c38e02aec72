import assert from 'node:assert/strict';
import { test } from 'node:test';
import { verify } from '../../src/reward/index.js';
import { Rng } from '../../src/util/rng.js';

// Random LaTeX-ish garbage must never throw: every input gets a result with a reason.
const ATOMS = [
  '1',
  '23',
  '0.5',
  'x',
  '\\pi',
  '\\frac',
  '\\sqrt',
  '{',
  '}',
  '(',
  ')',
  '[',
  ']',
  '+',
  '-',
  '/',
  '^',
  '_',
  '=',
  '<',
  '\\le',
  ',',
  '\\pm',
  '\\infty',
  '\\cup',
  '\\{',
  '\\}',
  '|',
  '!',
  '\\%',
  '\\text{cm}',
  '\\begin{pmatrix}',
  '\\end{pmatrix}',
  '&',
  '\\\\',
  '\\sin',
  'e',
  'i',
  '\\boxed{',
  '$',
  ' ',
  'and',
  '\\left(',
  '\\sum_{k=1}^{3}',
  '\\lfloor',
  '2^{1000}',
  '99!',
];

test('random inputs never throw', { timeout: 120_000 }, () => {
  const rng = new Rng(11);
  const mk = () => Array.from({ length: rng.int(1, 10) }, () => rng.pick(ATOMS)).join('');
  for (let k = 0; k < 400; k++) {
    const p = mk();
    const g = mk();
    for (const r of [verify(p, g), verify(p, g, { extract: false, profile: 'lenient' })]) {
      assert.equal(typeof r.correct, 'boolean');
      assert.ok(r.reason.length > 0);
    }
  }
});

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { verify } from '../../src/reward/index.js';
import { perturbations, rewritings } from './rewrite.js';

const DIR = new URL('../../data/benchmarks/', import.meta.url);
const FILES = readdirSync(DIR).filter((f) => f.endsWith('.jsonl'));

function answers(file: string): string[] {
  return readFileSync(new URL(file, DIR), 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => String(JSON.parse(l).answer));
}

test('the project carries its benchmark files', () => {
  for (const f of ['aime24', 'aime25', 'aime26', 'amc23', 'gsm8k', 'hmmt_feb25', 'math500']) {
    assert.ok(FILES.includes(`${f}.jsonl`), `data/benchmarks/${f}.jsonl missing`);
  }
});

for (const file of FILES) {
  test(`${file}: every answer equals itself, boxed in a response and bare`, { timeout: 60_000 }, () => {
    for (const a of answers(file)) {
      assert.equal(verify(`So the answer is \\boxed{${a}}.`, a).correct, true, `boxed ${a}`);
      assert.equal(verify(a, a, { extract: false }).correct, true, `bare ${a}`);
    }
  });

  test(`${file}: common rewritings are equal, perturbations are not`, { timeout: 60_000 }, () => {
    const fails: string[] = [];
    for (const a of answers(file)) {
      for (const r of rewritings(a)) {
        const v = verify(`\\boxed{${r.pred}}`, a);
        if (!v.correct) fails.push(`rewrite ${r.name}: ${a} vs ${r.pred} (${v.reason})`);
      }
      for (const r of perturbations(a)) {
        const v = verify(`\\boxed{${r.pred}}`, a);
        if (v.correct) fails.push(`perturb ${r.name}: ${a} vs ${r.pred} (${v.reason})`);
      }
    }
    // Units are ignored by design, so changing a unit's exponent (`cm^2` → `cm^3`) is not a difference;
    // a mixed number followed by more terms reads as a product (see DECISIONS).
    const known = [/inches\}\^3/, /cm\}\^3/, /perturb plus-one: 1\\frac\{4\}\{5\}/];
    assert.deepEqual(
      fails.filter((f) => !known.some((k) => k.test(f))),
      [],
    );
  });
}

// Reward verifier benchmark: integer checks/s (target ≥ 20,000/s), median/p99 ms on LaTeX expression
// pairs (target median ≤ 1 ms), pool throughput, FP/FN rates on the labelled set, and agreement with
// Math-Verify's own test cases and MATH's, MARIO_EVAL's, NeMo-Skills' test files; strict and reference side by side.
// Run: flock /tmp/bench.lock node --import tsx bench/reward.ts
import { readdirSync, readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { VerifierPool, type VerifyProfile, verify } from '../src/reward/index.js';
import { rewritings } from '../test/reward/rewrite.js';
import { benchArgs } from './args.js';

benchArgs(import.meta.url, { options: {} }); // no flags: --help prints the header

const root = new URL('../', import.meta.url);
const answers = readdirSync(new URL('data/benchmarks/', root))
  .filter((f) => f.endsWith('.jsonl'))
  .flatMap((f) =>
    readFileSync(new URL(`data/benchmarks/${f}`, root), 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => String(JSON.parse(l).answer)),
  );

function quantile(xs: number[], q: number): number {
  const s = xs.slice().sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

// 1. Integer answers: a short response with a boxed integer vs the gold, in-thread.
const ints = answers.filter((a) => /^-?\d+$/.test(a));
const intPairs = ints.map((a, i) => [`so the answer is \\boxed{${i % 3 === 0 ? Number(a) + 1 : a}}.`, a]);
function checksPerSecond(profile: VerifyProfile): number {
  for (const [p, g] of intPairs.slice(0, 2000)) verify(p, g, { profile }); // warm-up
  const runs: number[] = [];
  for (let run = 0; run < 5; run++) {
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < 400) {
      for (const [p, g] of intPairs) verify(p, g, { profile });
      n += intPairs.length;
    }
    runs.push(n / ((performance.now() - t0) / 1000));
  }
  return quantile(runs, 0.5);
}
const intRate = checksPerSecond('strict');
const refIntRate = checksPerSecond('reference');

// 2. LaTeX expressions: every non-integer benchmark answer against its rewritings (and itself).
const latexPairs: [string, string][] = [];
for (const a of answers.filter((x) => !/^-?\d+$/.test(x))) {
  latexPairs.push([`\\boxed{${a}}`, a]);
  for (const r of rewritings(a)) latexPairs.push([`\\boxed{${r.pred}}`, a]);
}
function latexTimes(profile: VerifyProfile): number[] {
  for (const [p, g] of latexPairs) verify(p, g, { profile }); // warm-up
  const times: number[] = [];
  for (let rep = 0; rep < 3; rep++) {
    for (const [p, g] of latexPairs) {
      const t0 = performance.now();
      verify(p, g, { profile });
      times.push(performance.now() - t0);
    }
  }
  return times;
}
const times = latexTimes('strict');
const refTimes = latexTimes('reference');

// 3. Pool throughput on the integer pairs (worker threads; includes message passing).
const pool = new VerifierPool({ size: 2 });
await pool.verifyBatch(intPairs.slice(0, 200).map(([pred, gold]) => ({ pred, gold })));
const poolItems = intPairs.concat(intPairs).map(([pred, gold]) => ({ pred, gold }));
const tp = performance.now();
await pool.verifyBatch(poolItems);
const poolRate = poolItems.length / ((performance.now() - tp) / 1000);
await pool.close();

// 4. FP/FN on the labelled set.
const labelled = readFileSync(new URL('test/reward/labelled.jsonl', root), 'utf8')
  .split('\n')
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l) as { gold: string; pred?: string; response?: string; label: boolean });
function rates(profile: VerifyProfile) {
  let fp = 0;
  let fn = 0;
  const pos = labelled.filter((c) => c.label).length;
  const neg = labelled.length - pos;
  for (const c of labelled) {
    const r =
      c.pred !== undefined
        ? verify(c.pred, c.gold, { extract: false, profile })
        : verify(c.response as string, c.gold, { profile });
    if (r.correct && !c.label) fp++;
    if (!r.correct && c.label) fn++;
  }
  return { fp, fn, pos, neg, fpRate: fp / neg, fnRate: fn / pos };
}
const strict = rates('strict');
const lenient = rates('lenient');
const reference = rates('reference');

// 5. Agreement with Math-Verify's own test cases (each row under the settings its test used).
const mvCases = readFileSync(new URL('test/reward/math-verify-cases.jsonl', root), 'utf8')
  .split('\n')
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l));
function agreement(profile: VerifyProfile) {
  let agree = 0;
  let fp = 0;
  for (const c of mvCases) {
    const r = verify(c.pred, c.gold, { profile, floatRounding: c.precision, targets: c.match_types });
    if (r.correct === c.expected) agree++;
    else if (r.correct) fp++;
  }
  return { agree, fp, fn: mvCases.length - agree - fp };
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
console.log(`integer checks/s (in-thread, median of 5): ${Math.round(intRate)}  (target >= 20000)`);
console.log(`integer checks/s, reference profile:        ${Math.round(refIntRate)}`);
console.log(`integer checks/s (pool of 2 workers):       ${Math.round(poolRate)}`);
for (const [name, ts] of [
  ['strict', times],
  ['reference', refTimes],
] as const) {
  console.log(
    `latex pairs (${name}): n=${ts.length} median ${quantile(ts, 0.5).toFixed(3)} ms  p99 ${quantile(ts, 0.99).toFixed(3)} ms  max ${Math.max(...ts).toFixed(1)} ms  (target median <= 1 ms)`,
  );
}
for (const [name, r] of [
  ['strict', strict],
  ['lenient', lenient],
  ['reference', reference],
] as const) {
  console.log(
    `labelled set (${labelled.length} pairs, ${r.neg} wrong answers) ${name}: false positives ${r.fp} (${pct(r.fpRate)}), false negatives ${r.fn} (${pct(r.fnRate)})`,
  );
}
for (const profile of ['strict', 'lenient', 'reference'] as const) {
  const a = agreement(profile);
  console.log(
    `Math-Verify's cases (${mvCases.length}) ${profile}: agree ${a.agree} (${pct(a.agree / mvCases.length)}), false positives ${a.fp}, false negatives ${a.fn}`,
  );
}

// 6. Agreement with MATH's, MARIO_EVAL's and NeMo-Skills' test files (default-semantics rows; the reference
// profile reads each answer as a whole response, as test/reward/suites.test.ts does).
const suiteCases = readFileSync(new URL('test/reward/suite-cases.jsonl', root), 'utf8')
  .split('\n')
  .filter((l) => l.trim())
  .map(
    (l) =>
      JSON.parse(l) as { suite: string; gold: string; pred: string; expected: boolean; exclude?: string },
  );
for (const suite of [...new Set(suiteCases.map((c) => c.suite))]) {
  const rows = suiteCases.filter((c) => c.suite === suite && !c.exclude);
  let agree = 0;
  let fp = 0;
  for (const c of rows) {
    const ok = verify(c.pred, c.gold, { profile: 'reference' }).correct;
    if (ok === c.expected) agree++;
    else if (ok) fp++;
  }
  const excluded = suiteCases.filter((c) => c.suite === suite).length - rows.length;
  console.log(
    `${suite} test file (${rows.length} rows, ${excluded} excluded) reference: agree ${agree} (${pct(agree / rows.length)}), false positives ${fp}`,
  );
}

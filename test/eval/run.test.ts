import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Trajectory } from '../../src/agent/trajectory.js';
import { loadProblems } from '../../src/eval/bench.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { type EvalConfig, perRequest, rescoreEvalDir, reverifyEvalDir, runEval } from '../../src/eval/run.js';
import { fallbackVerify, lastBoxed, openVerifier } from '../../src/eval/verify.js';
import { readJsonl } from '../../src/util/jsonl.js';
import { sleep } from '../../src/util/sleep.js';

const problems = [
  { id: 'p1', problem: '1+1?', answer: '2' },
  { id: 'p2', problem: '2+2?', answer: '4' },
  { id: 'p3', problem: '3+3?', answer: '6' },
];
const config = (k = 4): EvalConfig => ({
  bench: 'toy',
  dataFile: '/nonexistent',
  k,
  temperature: 0.6,
  topP: 0.95,
  seed: 0,
  engine: 'test',
});
const dir = () => mkdtempSync(join(tmpdir(), 'rstar2-eval-'));
const quiet = { progress: false, log: () => {} };

// answers right on even samples, so the expected scores are known by hand
const rolloutFn = (t: { problemId: string; answer: string; sample: number; seed: number }): Trajectory => {
  const base = fakeTrajectory(t, 1);
  return { ...base, text: `\\boxed{${t.sample % 2 === 0 ? t.answer : '999'}}` };
};

test('lastBoxed and the fallback verifier', async () => {
  assert.equal(lastBoxed('a \\boxed{1} b \\boxed{\\frac{1}{2}}'), '\\frac{1}{2}');
  assert.equal(lastBoxed('none'), null);
  assert.equal((await fallbackVerify({ text: '\\boxed{012}' }, '12')).correct, true);
  assert.equal((await fallbackVerify({ text: '\\boxed{13}' }, '12')).correct, false);
});

test('runEval saves scored trajectories and a report', async () => {
  const out = dir();
  const r = await runEval({
    outDir: out,
    config: config(),
    problems,
    rollout: perRequest(async (q) => rolloutFn(q), 3),
    verify: fallbackVerify,
    ...quiet,
  });
  assert.equal(r.samples, 12);
  assert.equal(r.complete, true);
  assert.equal(r.avgAtK, 0.5);
  assert.equal(r.passAtK['2'], 1 - 1 / 6); // 2 of 4 correct: 1 - C(2,2)/C(4,2)
  const saved = readJsonl<Trajectory>(join(out, 'trajectories.jsonl'));
  assert.equal(saved.length, 12);
  assert.ok(saved.every((t) => typeof t.correct === 'boolean' && t.gold !== undefined));
  assert.match(readFileSync(join(out, 'report.md'), 'utf8'), /avg@4 \(mean pass@1\) \| 50\.0%/);
  assert.equal(JSON.parse(readFileSync(join(out, 'report.json'), 'utf8')).avgAtK, 0.5);
});

test('a killed eval resumes from saved trajectories without regenerating them', async () => {
  const out = dir();
  const generated: string[] = [];
  let calls = 0;
  const crashing = perRequest(async (q) => {
    if (++calls > 5) throw new Error('engine died');
    generated.push(`${q.problemId}#${q.sample}`);
    return rolloutFn(q);
  }, 1);
  await assert.rejects(
    runEval({ outDir: out, config: config(), problems, rollout: crashing, verify: fallbackVerify, ...quiet }),
    /stopped after 5\/12 new samples .*engine died/,
  );
  // a torn last line, as a SIGKILL mid-write leaves
  appendFileSync(join(out, 'trajectories.jsonl'), '{"id":"p3#3","promptId":"p3"');
  const second: string[] = [];
  const r = await runEval({
    outDir: out,
    config: config(),
    problems,
    rollout: perRequest(async (q) => {
      second.push(`${q.problemId}#${q.sample}`);
      return rolloutFn(q);
    }, 2),
    verify: fallbackVerify,
    ...quiet,
  });
  assert.equal(second.length, 7);
  assert.deepEqual(
    second.filter((id) => generated.includes(id)),
    [],
  );
  assert.equal(r.complete, true);
  assert.equal(r.avgAtK, 0.5);
  assert.equal(readJsonl(join(out, 'trajectories.jsonl')).length, 12); // torn line gone, file parses
  const state = JSON.parse(readFileSync(join(out, 'state.json'), 'utf8'));
  assert.equal(state.sessions, 2);
});

test('state.json counts a session killed mid-way: sessions and wall time add up across the resume', async () => {
  const out = dir();
  // Session 1 stops for good after 3 samples: its runEval never returns, so nothing it would do at
  // the end happens, as when the process gets SIGKILL. Each session's measured span (first rollout
  // call to last sample returned) lies inside what it must record.
  let calls = 0;
  const span1 = { first: 0, last: 0 };
  void runEval({
    outDir: out,
    config: config(),
    problems,
    rollout: perRequest(async (q) => {
      span1.first ||= Date.now();
      if (++calls > 3) return new Promise<Trajectory>(() => {});
      await sleep(100);
      span1.last = Date.now();
      return rolloutFn(q);
    }, 1),
    verify: fallbackVerify,
    stateEveryMs: 0,
    ...quiet,
  });
  while (calls <= 3) await sleep(10); // the 4th call starts once the 3rd sample is saved
  const span2 = { first: 0, last: 0 };
  const r = await runEval({
    outDir: out,
    config: config(),
    problems,
    rollout: perRequest(async (q) => {
      span2.first ||= Date.now();
      await sleep(100);
      span2.last = Date.now();
      return rolloutFn(q);
    }, 1),
    verify: fallbackVerify,
    ...quiet,
  });
  assert.equal(r.samples, 12);
  const state = JSON.parse(readFileSync(join(out, 'state.json'), 'utf8'));
  assert.equal(state.sessions, 2);
  const ranMs = span1.last - span1.first + (span2.last - span2.first);
  assert.ok(Math.round(state.wallTimeS * 1000) >= ranMs, `recorded ${state.wallTimeS} s, ran ${ranMs} ms`);
  assert.equal(r.wallTimeS, state.wallTimeS);
});

test('resume refuses different settings; engine-error samples are regenerated', async () => {
  const out = dir();
  let first = true;
  await runEval({
    outDir: out,
    config: config(2),
    problems,
    rollout: perRequest(async (q) => {
      const t = rolloutFn(q);
      if (first && q.problemId === 'p2')
        return { ...t, finish: 'error' as const, error: 'timeout', text: '' };
      return t;
    }, 1),
    verify: fallbackVerify,
    ...quiet,
  });
  first = false;
  await assert.rejects(
    runEval({
      outDir: out,
      config: config(4),
      problems,
      rollout: async () => {},
      verify: fallbackVerify,
      ...quiet,
    }),
    /different settings \(k: 2 there, 4 now\)/,
  );
  const again: string[] = [];
  const r = await runEval({
    outDir: out,
    config: config(2),
    problems,
    rollout: perRequest(async (q) => {
      again.push(`${q.problemId}#${q.sample}`);
      return rolloutFn(q);
    }, 1),
    verify: fallbackVerify,
    ...quiet,
  });
  assert.deepEqual(again.sort(), ['p2#0', 'p2#1']);
  assert.equal(r.finishes.error, undefined); // the regenerated records replace the errored ones
  assert.equal(r.avgAtK, 0.5);
});

test('rescoring a saved eval reproduces the report without a rollout', async () => {
  const out = dir();
  const r1 = await runEval({
    outDir: out,
    config: config(),
    problems,
    rollout: perRequest(async (q) => rolloutFn(q), 4),
    verify: fallbackVerify,
    ...quiet,
  });
  writeFileSync(join(out, 'report.json'), '{}');
  const r2 = rescoreEvalDir(out, problems);
  assert.deepEqual(r2, r1);
  assert.deepEqual(JSON.parse(readFileSync(join(out, 'report.json'), 'utf8')), r1);
});

test('loadProblems validates rows', () => {
  const d = dir();
  const f = join(d, 'b.jsonl');
  writeFileSync(f, '{"id": "a", "problem": "x", "answer": 3}\n');
  assert.deepEqual(loadProblems(f), [{ id: 'a', problem: 'x', answer: '3' }]);
  writeFileSync(f, '{"id": "a", "problem": "x"}\n');
  assert.throws(() => loadProblems(f), /b\.jsonl:1: missing string field 'answer'/);
  writeFileSync(
    f,
    '{"id": "a", "problem": "x", "answer": "1"}\n{"id": "a", "problem": "y", "answer": "1"}\n',
  );
  assert.throws(() => loadProblems(f), /duplicate id 'a'/);
});

test('CLI: eval with the fake engine, then eval-rescore', { timeout: 60_000 }, () => {
  const d = dir();
  const data = join(d, 'toy.jsonl');
  writeFileSync(data, problems.map((p) => JSON.stringify(p)).join('\n'));
  const out = join(d, 'ev');
  const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };
  const run = (...args: string[]) =>
    spawnSync(process.execPath, ['bin/rstar2.js', ...args], { encoding: 'utf8', env });
  const a = run('eval', '--engine', 'fake:1', '--data', data, '--samples', '2', '--out', out);
  assert.equal(a.status, 0, a.stderr);
  assert.match(a.stdout, /toy: avg@2 100\.0% {2}pass@2 100\.0% {2}maj@2 100\.0%/);
  const b = run('eval-rescore', out);
  assert.equal(b.status, 0, b.stderr);
  assert.match(b.stdout, /avg@2 100\.0%/);
  const c = run('eval', '--engine', 'fake:1', '--bench', 'toy', '--data', data);
  assert.notEqual(c.status, 0);
  assert.match(c.stderr, /exactly one of --bench NAME or --data FILE/);
  const e = run('eval', '--engine', 'fake:1', '--data', data, '--samples', '0');
  assert.notEqual(e.status, 0);
  assert.match(
    e.stderr,
    /option '-n, --samples <n>' argument '0' is invalid\. Expected a positive integer\./,
  );
  const u = run('eval', '--engine', 'http://127.0.0.1:9', '--data', data, '--out', join(d, 'u'));
  assert.notEqual(u.status, 0);
  assert.match(u.stderr, /prompts need a tokenizer: give --tokenizer PATH/);
  const m = run('eval', '--data', data);
  assert.match(m.stderr, /exactly one of --model DIR or --engine URL/);
});

test('CLI: eval --data reads Parquet in the verl layout', { timeout: 60_000 }, () => {
  const out = join(dir(), 'ev');
  const data = join(import.meta.dirname, '../../data/samples/verl-arith.parquet');
  const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };
  const args = [
    'bin/rstar2.js',
    'eval',
    '--engine',
    'fake:1',
    '--data',
    data,
    '--samples',
    '2',
    '--limit',
    '5',
  ];
  const r = spawnSync(process.execPath, [...args, '--out', out], { encoding: 'utf8', env });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /verl-arith: avg@2 100\.0% .*\(5 problems, 10 samples/);
  const saved = readJsonl<Trajectory>(join(out, 'trajectories.jsonl'));
  assert.equal(saved.length, 10);
  assert.ok(saved.every((t) => t.correct === true && /^\d+$/.test(t.gold ?? '')));
  const b = spawnSync(process.execPath, ['bin/rstar2.js', 'eval-rescore', out], { encoding: 'utf8', env });
  assert.equal(b.status, 0, b.stderr);
  assert.match(b.stdout, /\(5 problems, 10 samples/);
});

test('eval-rescore --reverify re-checks saved answers with the reward verifier', {
  timeout: 60_000,
}, async () => {
  const out = dir();
  const half = [{ id: 'h', problem: 'half?', answer: '0.5' }];
  const r1 = await runEval({
    outDir: out,
    config: config(2),
    problems: half,
    rollout: perRequest(async (q) => ({ ...rolloutFn(q), text: 'so \\boxed{\\frac{1}{2}}' }), 1),
    verify: fallbackVerify, // string match: 1/2 != 0.5
    ...quiet,
  });
  assert.equal(r1.avgAtK, 0);
  const v = openVerifier('strict');
  try {
    const r2 = await reverifyEvalDir(out, v.verify, half);
    assert.equal(r2.avgAtK, 1);
    assert.equal(r2.majAtK, 1);
    const saved = readJsonl<Trajectory>(join(out, 'trajectories.jsonl'));
    assert.ok(saved.every((t) => t.correct === true && t.verify?.matchedBy));
  } finally {
    await v.close();
  }
});

test('CLI: an eval killed with SIGKILL resumes where it stopped', { timeout: 60_000 }, async () => {
  const d = dir();
  const data = join(d, 'toy.jsonl');
  writeFileSync(data, problems.map((p) => JSON.stringify(p)).join('\n'));
  const out = join(d, 'ev');
  const args = [
    'bin/rstar2.js',
    'eval',
    '--engine',
    'fake:1:150',
    '--data',
    data,
    '--samples',
    '4',
    '--concurrency',
    '1',
    '--out',
    out,
  ];
  const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };
  const child = spawn(process.execPath, args, { env, stdio: 'ignore' });
  const trajPath = join(out, 'trajectories.jsonl');
  // kill once a few samples are on disk (poll the file; no timing assertion)
  while (!existsSync(trajPath) || readJsonl(trajPath).length < 3) await new Promise((r) => setTimeout(r, 50));
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  const before = readJsonl<Trajectory>(trajPath).length;
  assert.ok(before >= 3 && before < 12, `killed after ${before} samples`);
  const again = spawnSync(process.execPath, args, { encoding: 'utf8', env });
  assert.equal(again.status, 0, again.stderr);
  assert.match(again.stderr, new RegExp(`resuming .*: ${before}/12 samples already saved`));
  const saved = readJsonl<Trajectory>(trajPath);
  assert.equal(saved.length, 12);
  assert.equal(new Set(saved.map((t) => t.id)).size, 12);
  assert.match(again.stdout, /avg@4 100\.0%/);
  assert.equal(JSON.parse(readFileSync(join(out, 'state.json'), 'utf8')).sessions, 2);
});

test('eval scores with any reward profile through reward/, and rejects unknown ones by name', async () => {
  assert.throws(
    () => openVerifier('bogus' as never),
    /unknown verify profile "bogus" \(valid: integer, strict, lenient, reference\)/,
  );
  const v = openVerifier('integer');
  try {
    assert.equal((await v.verify({ text: '\\boxed{42}' }, '42')).correct, true);
    assert.equal(
      (await v.verify({ text: 'the answer is 42' }, '42')).correct,
      false,
      'integer needs a boxed answer',
    );
    assert.equal((await v.verify({ text: '\\boxed{42}', finish: 'error' }, '42')).correct, false);
  } finally {
    await v.close();
  }
  const r = openVerifier('reference');
  try {
    assert.equal((await r.verify({ text: '\\boxed{(p,q)=(3,2)}' }, '(3,2)')).correct, true);
  } finally {
    await r.close();
  }
});

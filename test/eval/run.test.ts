import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { loadProblems } from '../../src/eval/bench.js';
import { modelTag } from '../../src/eval/cli.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { type EvalConfig, perRequest, rescoreEvalDir, reverifyEvalDir, runEval } from '../../src/eval/run.js';
import { fallbackVerify, lastBoxed, openVerifier } from '../../src/eval/verify.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { appendJsonl, readJsonl } from '../../src/util/jsonl.js';
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

test('resume refuses another model, verify profile or data; the same problems from another path resume', async () => {
  const out = dir();
  const run = (cfg: Partial<EvalConfig>, ps = problems) =>
    runEval({
      outDir: out,
      config: { ...config(2), verifyProfile: 'strict', ...cfg },
      problems: ps,
      rollout: perRequest(async (q) => rolloutFn(q), 1),
      verify: fallbackVerify,
      ...quiet,
    });
  await run({ engine: 'embedded:/ckpt/step-10', dataFile: '/d/a/toy.jsonl' });
  await assert.rejects(
    run({ engine: 'embedded:/ckpt/step-20', dataFile: '/d/a/toy.jsonl' }),
    /different settings \(engine: "embedded:\/ckpt\/step-10" there, "embedded:\/ckpt\/step-20" now\); use another --out/,
  );
  await assert.rejects(
    run({ engine: 'embedded:/ckpt/step-10', dataFile: '/d/a/toy.jsonl', verifyProfile: 'lenient' }),
    /different settings \(verifyProfile: "strict" there, "lenient" now\)/,
  );
  // another file with the same name (and ids), other problems
  const other = problems.map((p) => ({ ...p, problem: `${p.problem} (v2)` }));
  await assert.rejects(
    run({ engine: 'embedded:/ckpt/step-10', dataFile: '/d/b/toy.jsonl' }, other),
    /different settings \(data: \/d\/a\/toy\.jsonl there, \/d\/b\/toy\.jsonl now, whose first 3 problems differ in content\)/,
  );
  await assert.rejects(
    run({ engine: 'embedded:/ckpt/step-10', dataFile: '/d/b/toy.jsonl' }, problems.slice(0, 2)),
    /holds samples of 3 problems; the 2 given now cannot be checked against them: use --limit 3 or more/,
  );
  // the same problems copied elsewhere, and one more (a grown --limit): resumed, only the new problem sampled
  const more = [...problems, { id: 'p4', problem: '4+4?', answer: '8' }];
  const r = await run({ engine: 'embedded:/ckpt/step-10', dataFile: '/elsewhere/toy.jsonl' }, more);
  assert.equal(r.samples, 8);
  assert.equal(readJsonl(join(out, 'trajectories.jsonl')).length, 8);
});

test('an eval directory from before the model, data and profile checks', async () => {
  const out = dir();
  const run = (cfg: Partial<EvalConfig>) =>
    runEval({
      outDir: out,
      config: { ...config(2), ...cfg },
      problems,
      rollout: perRequest(async (q) => rolloutFn(q), 1),
      verify: fallbackVerify,
      ...quiet,
    });
  await run({ dataFile: '/d/toy.jsonl' });
  const cfgPath = join(out, 'config.json');
  const { dataHash, dataCount, ...old } = JSON.parse(readFileSync(cfgPath, 'utf8'));
  assert.equal(typeof dataHash, 'string');
  assert.equal(dataCount, 3);
  writeFileSync(cfgPath, JSON.stringify(old)); // as written before: no dataHash, no verifyProfile
  // its data identity was the resolved path: another path is refused, the same path resumes
  await assert.rejects(
    run({ dataFile: '/e/toy.jsonl' }),
    /\(data: \/d\/toy\.jsonl there, \/e\/toy\.jsonl now\)/,
  );
  // its verifier is unknown: re-scoring under a profile records it, then the resume goes on
  await assert.rejects(
    run({ dataFile: '/d/toy.jsonl', verifyProfile: 'strict' }),
    /does not record its verifyProfile .*re-score them under it first \(rstar2 eval-rescore .* --reverify --verify-profile strict\) or use another --out/,
  );
  await reverifyEvalDir(out, fallbackVerify, problems, 'strict');
  assert.equal(JSON.parse(readFileSync(cfgPath, 'utf8')).verifyProfile, 'strict');
  const r = await run({ dataFile: '/d/toy.jsonl', verifyProfile: 'strict' });
  assert.equal(r.samples, 6);
  assert.equal(JSON.parse(readFileSync(cfgPath, 'utf8')).dataHash, dataHash);
});

// what an unreachable sandbox service leaves in a trajectory (sandbox/client.ts through the agent loop)
const unreachable = (t: Trajectory): Trajectory => ({
  ...t,
  text: 'the tool failed; \\boxed{0}',
  events: t.events.map((e) =>
    e.kind === 'tool_result'
      ? {
          ...e,
          error: true,
          status: 'internal_error',
          text: 'Tool call failure\nreason: internal_error\nstderr: cannot reach sandbox service at http://127.0.0.1:1: ECONNREFUSED (after 6 attempts)\nexecution time: 0.00s',
        }
      : e,
  ),
});

test('samples failed by the sandbox are left out and regenerated on resume (kept with retryErrors false)', async () => {
  const out = dir();
  let down = true;
  const made: string[] = [];
  const rollout = perRequest(async (q) => {
    made.push(`${q.problemId}#${q.sample}`);
    return down && q.problemId !== 'p1' ? unreachable(rolloutFn(q)) : rolloutFn(q);
  }, 2);
  const run = (retryErrors?: boolean) =>
    runEval({
      outDir: out,
      config: config(2),
      problems,
      rollout,
      verify: fallbackVerify,
      retryErrors,
      ...quiet,
    });
  const r1 = await run();
  assert.equal(r1.samples, 2);
  assert.equal(r1.failed, 4);
  assert.match(
    r1.failure ?? '',
    /^sandbox internal_error: cannot reach sandbox service at http:\/\/127\.0\.0\.1:1/,
  );
  assert.equal(r1.complete, false);
  assert.equal(r1.avgAtK, 0.5); // p1 alone, not p2 and p3 scored wrong
  down = false;
  made.length = 0;
  assert.equal((await run(false)).failed, 4);
  assert.deepEqual(made, []);
  const r2 = await run();
  assert.deepEqual(made.sort(), ['p2#0', 'p2#1', 'p3#0', 'p3#1']);
  assert.equal(r2.failed, 0);
  assert.equal(r2.complete, true);
  assert.equal(r2.avgAtK, 0.5);
});

test('an interrupted eval saves no aborted samples; eval-rescore leaves out those an older one saved', async () => {
  const out = dir();
  const ac = new AbortController();
  let n = 0;
  // a rollout as the agent loop ends it when its signal fires: finish 'error', 'rollout aborted by caller'
  const rollout = perRequest(async (q, signal) => {
    if (++n === 4) ac.abort();
    if (signal?.aborted)
      return { ...rolloutFn(q), finish: 'error' as const, error: 'rollout aborted by caller' };
    return rolloutFn(q);
  }, 1);
  await assert.rejects(
    runEval({
      outDir: out,
      config: config(4),
      problems,
      rollout,
      verify: fallbackVerify,
      signal: ac.signal,
      ...quiet,
    }),
    /eval stopped after 3\/12 new samples/,
  );
  const saved = readJsonl<Trajectory>(join(out, 'trajectories.jsonl'));
  assert.deepEqual(
    saved.map((t) => t.id),
    ['p1#0', 'p1#1', 'p1#2'],
  );
  // records an older rstar2 wrote on SIGINT
  appendJsonl(
    join(out, 'trajectories.jsonl'),
    problems.flatMap((p) =>
      [0, 1, 2, 3].map((s) => ({
        ...rolloutFn({ problemId: p.id, answer: p.answer, sample: s, seed: s }),
        finish: 'error',
        error: 'rollout aborted by caller',
        gold: p.answer,
        correct: false,
      })),
    ),
  );
  const r = rescoreEvalDir(out, problems);
  assert.equal(r.samples, 3);
  assert.equal(r.failed, 9);
  assert.equal(r.avgAtK, 2 / 3); // the real samples' score (p1#0 and p1#2 right), not diluted by the aborted ones
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

test('an --out that is not an eval directory, or a damaged config.json, is refused by name', async () => {
  const model = dir();
  writeFileSync(join(model, 'config.json'), JSON.stringify({ model_type: 'qwen2', vocab_size: 267 }));
  const opts = { config: config(), problems, rollout: perRequest(async (q) => rolloutFn(q), 4) };
  await assert.rejects(
    runEval({ outDir: model, ...opts, verify: fallbackVerify, ...quiet }),
    /is not an eval directory \(its config\.json has no k or dataFile\)/,
  );
  assert.throws(() => rescoreEvalDir(model, problems), /is not an eval directory/);
  const out = dir();
  await runEval({ outDir: out, ...opts, verify: fallbackVerify, ...quiet });
  writeFileSync(join(out, 'config.json'), '{"bench": ');
  assert.throws(() => rescoreEvalDir(out, problems), /config\.json: invalid JSON/);
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
  // --no-tool is recorded, and an eval made with the tool is not continued without it (or the reverse)
  const nt = join(d, 'no-tool');
  const t1 = run('eval', '--engine', 'fake:1', '--data', data, '--samples', '1', '--no-tool', '--out', nt);
  assert.equal(t1.status, 0, t1.stderr);
  assert.equal(JSON.parse(readFileSync(join(nt, 'config.json'), 'utf8')).tool, 'none');
  const t2 = run('eval', '--engine', 'fake:1', '--data', data, '--samples', '2', '--out', out);
  assert.equal(t2.status, 0, t2.stderr);
  const t3 = run('eval', '--engine', 'fake:1', '--data', data, '--samples', '2', '--no-tool', '--out', out);
  assert.notEqual(t3.status, 0);
  assert.match(t3.stderr, /different settings \(tool: "python" there, "none" now\)/);
  const u = run('eval', '--engine', 'http://127.0.0.1:9', '--data', data, '--out', join(d, 'u'));
  assert.notEqual(u.status, 0);
  assert.match(u.stderr, /prompts need a tokenizer: give --tokenizer PATH/);
  const m = run('eval', '--data', data);
  assert.match(m.stderr, /exactly one of --model DIR or --engine URL/);
});

test('CLI: the default --out names the model, so two checkpoints get two directories', {
  timeout: 60_000,
}, () => {
  const d = dir();
  const data = join(d, 'toy.jsonl');
  writeFileSync(data, problems.map((p) => JSON.stringify(p)).join('\n'));
  const bin = join(import.meta.dirname, '../../bin/rstar2.js');
  const run = (engine: string) =>
    spawnSync(process.execPath, [bin, 'eval', '--engine', engine, '--data', data, '--samples', '2'], {
      cwd: d,
      encoding: 'utf8',
      env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
    });
  const a = run('fake:1');
  assert.equal(a.status, 0, a.stderr);
  const b = run('fake:0');
  assert.equal(b.status, 0, b.stderr);
  assert.doesNotMatch(b.stderr, /resuming/);
  assert.match(b.stdout, /toy: avg@2 0\.0%/);
  assert.match(b.stdout, /report: .*\/evals\/toy-fake-0-k2-t0\.6\/report\.md/);
  assert.equal(JSON.parse(readFileSync(join(d, 'evals/toy-fake-1-k2-t0.6/report.json'), 'utf8')).avgAtK, 1);
  assert.equal(modelTag('runs/quick/checkpoints/rl-step-000010/'), 'quick-rl-step-000010');
  assert.equal(modelTag('/models/Qwen2.5 7B'), 'Qwen2.5-7B');
  assert.equal(modelTag(undefined, 'sglang+http://10.0.0.2:30000'), 'sglang-10.0.0.2-30000');
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

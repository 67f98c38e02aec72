import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { VerifierPool } from '../../src/reward/index.js';
import { readJsonl } from '../../src/util/jsonl.js';

// A reward of one's own (issue 44): `reward.module` / `--reward-module`, run on the verifier pool's threads
// under its deadline, in train, eval and verify alike.

process.env.RSTAR2_NO_PROGRESS = '1';
const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };

function modules() {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-reward-'));
  const write = (name: string, src: string) => {
    writeFileSync(join(dir, name), src);
    return join(dir, name);
  };
  return {
    dir,
    // half a point for any answer, the full point for the gold one; a penalty from the data row
    graded: write(
      'graded.mjs',
      `export default ({ text, gold, row }) => {
        const right = text.includes('\\\\boxed{' + gold + '}');
        return { reward: right ? 1 : text.includes('\\\\boxed{') ? 0.5 : 0, correct: right,
                 reason: 'graded ' + (row?.id ?? 'no row'), penalty: row?.meta?.hard ? 0.25 : 0 };
      };`,
    ),
    stuck: write('stuck.mjs', 'export default () => { for (;;) {} };'),
    wrong: write('wrong.mjs', 'export default () => "yes";'),
    async: write('async.mjs', 'export default async ({ text }) => (await Promise.resolve(text.length > 3));'),
  };
}

test('a reward module scores on the pool: its reward, correct, reason and penalty, with the data row', {
  timeout: 60_000,
}, async () => {
  const m = modules();
  const pool = new VerifierPool({ size: 2, defaults: { module: m.graded, timeoutMs: 1000 } });
  try {
    const row = { id: 'p7', question: 'q', answer: '4', meta: { hard: true } };
    const right = await pool.score({ text: 'so \\boxed{4}' }, '4', undefined, row);
    assert.deepEqual(
      [right.reward, right.correct, right.reason, right.penalty],
      [1, true, 'graded p7', 0.25],
    );
    const half = await pool.score({ text: 'so \\boxed{5}' }, '4', undefined, { id: 'p8' });
    assert.deepEqual([half.reward, half.correct, half.penalty], [0.5, false, 0]);
    // an errored trajectory scores 0 whatever a module would say, as under every profile
    assert.equal((await pool.score({ text: '\\boxed{4}', finish: 'error' }, '4')).reward, 0);
  } finally {
    await pool.close();
  }
  const quick = new VerifierPool({ size: 1, defaults: { module: m.async } });
  assert.equal((await quick.score({ text: 'long' }, '')).reward, 1);
  await quick.close();
});

test('a module that never returns times out at the deadline; one that returns no number is an error', {
  timeout: 60_000,
}, async () => {
  const m = modules();
  const pool = new VerifierPool({ size: 1, graceMs: 200, defaults: { module: m.stuck, timeoutMs: 300 } });
  try {
    const r = await pool.score({ text: 'x' }, '1');
    assert.equal(r.timedOut, true);
    assert.match(r.reason, /no verdict within 300 ms, thread replaced/);
  } finally {
    await pool.close();
  }
  const bad = new VerifierPool({ size: 1, defaults: { module: m.wrong } });
  try {
    const r = await bad.score({ text: 'x' }, '1');
    assert.deepEqual([r.reward, r.errored], [0, true]);
    assert.match(r.reason, /wrong\.mjs returned "yes": expected a finite reward/);
  } finally {
    await bad.close();
  }
});

test('train: reward.module scores every step and eval; its penalty reaches RoC; a missing module stops the start', {
  timeout: 120_000,
}, async () => {
  const m = modules();
  const recipe = parseRecipe({
    name: 't',
    seed: 3,
    eval: { n: 8 },
    reward: { module: m.graded },
    stages: [
      { type: 'sft', steps: 4, batchSize: 8, demos: 100, lr: 0.01 },
      {
        type: 'rl',
        steps: 2,
        promptsPerStep: 4,
        groupSize: 4,
        lr: 0.5,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
      },
    ],
  });
  const run = join(m.dir, 'run');
  await new Trainer(recipe, run, new FakePolicy(), { log: () => {}, progress: false }).run();
  const trajs = readJsonl<{ reward: number; correct: boolean; text: string; verify: { matchedBy: string } }>(
    join(run, 'trajectories', 'rl-step-000001.jsonl'),
  );
  assert.ok(trajs.every((t) => t.verify.matchedBy === 'module'));
  assert.ok(
    trajs.some((t) => t.reward === 0.5) || trajs.every((t) => t.correct),
    'a wrong boxed answer gets the module half point',
  );
  assert.ok(trajs.every((t) => t.reward === (t.correct ? 1 : t.text.includes('\\boxed{') ? 0.5 : 0)));
  const cfg = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
  assert.equal(cfg.reward.module, m.graded);
  const file = join(m.dir, 'r.json');
  writeFileSync(file, JSON.stringify({ ...cfg, reward: { module: './nope.mjs' } }));
  const r = spawnSync(
    process.execPath,
    [bin, 'train', '--recipe', file, '--policy-backend', 'fake', '--dry-run'],
    {
      encoding: 'utf8',
      env,
    },
  );
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /reward module .*\/nope\.mjs: no such file/);
});

test('verify and eval take --reward-module', { timeout: 60_000 }, () => {
  const m = modules();
  const lines = join(m.dir, 'v.jsonl');
  writeFileSync(
    lines,
    '{"pred": "\\\\boxed{3}", "gold": "4", "id": "a"}\n{"pred": "\\\\boxed{4}", "gold": "4"}\n',
  );
  const v = spawnSync(process.execPath, [bin, 'verify', lines, '--reward-module', m.graded], {
    encoding: 'utf8',
    env,
  });
  assert.equal(v.status, 0, v.stderr);
  const out = v.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.deepEqual(
    out.map((o) => [o.reward, o.correct, o.reason]),
    [
      [0.5, false, 'graded a'],
      [1, true, 'graded no row'],
    ],
  );
  const data = join(m.dir, 'toy.jsonl');
  writeFileSync(
    data,
    '{"id": "a", "problem": "x", "answer": "42"}\n{"id": "b", "problem": "y", "answer": "7"}\n',
  );
  const ev = join(m.dir, 'ev');
  const e = spawnSync(
    process.execPath,
    [
      bin,
      'eval',
      '--engine',
      'fake:1',
      '--data',
      data,
      '--samples',
      '2',
      '--out',
      ev,
      '--reward-module',
      m.graded,
    ],
    { encoding: 'utf8', env },
  );
  assert.equal(e.status, 0, e.stderr);
  assert.match(
    JSON.parse(readFileSync(join(ev, 'config.json'), 'utf8')).verifyProfile,
    /^module:.*graded\.mjs$/,
  );
  const t = readJsonl<{ reward: number; verify: { reason: string } }>(join(ev, 'trajectories.jsonl'));
  assert.ok(t.every((x) => x.reward === 1 && /^graded [ab]$/.test(x.verify.reason)));
});

test("a module's penalty ranks positives for RoC: of two otherwise equal positives the penalised one goes", async () => {
  const { selectAndScore, DEFAULT_PENALTY_OPTIONS, DEFAULT_ROC } = await import('../../src/rl/index.js');
  const { Rng } = await import('../../src/util/rng.js');
  const t = (reward: number, penalty?: number) => ({
    text: '<answer>\\boxed{1}</answer>',
    events: [],
    numToolCalls: 0,
    numToolErrors: 0,
    reward,
    ...(penalty === undefined ? {} : { penalty }),
  });
  const roc = { ...DEFAULT_ROC, downSampleToN: 3, minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 };
  for (const [a, b, kept] of [
    [0.3, 0, 1],
    [0, 0.3, 0],
  ] as const) {
    const sel = selectAndScore([[t(1, a), t(1, b), t(0), t(0)]], roc, DEFAULT_PENALTY_OPTIONS, new Rng(1));
    const positives = sel.kept.filter((k) => k.index < 2).map((k) => k.index);
    assert.deepEqual(positives, [kept]);
  }
});

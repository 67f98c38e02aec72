import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Problem } from '../../src/data/index.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { emptyStats } from '../../src/recipe/fake.js';
import type { Policy, RolloutRequest } from '../../src/recipe/trainer.js';
import { Trainer } from '../../src/recipe/trainer.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };
const FIX = join(import.meta.dirname, '../../data/samples');

// A policy for file problems: it answers right exactly when the question's length is even, every sample.
class ParityPolicy implements Policy {
  seen: RolloutRequest[] = [];
  failOnRollout = 0;
  async rollout(req: RolloutRequest): Promise<Trajectory[]> {
    if (this.failOnRollout > 0 && this.seen.length + 1 === this.failOnRollout)
      throw new Error('simulated kill');
    this.seen.push(req);
    return req.problems.flatMap((p) =>
      Array.from({ length: req.n }, (_, s) => {
        const text = `\\boxed{${p.question.length % 2 === 0 ? p.answer : 'nope'}}`;
        return {
          id: `${p.id}#${s}`,
          promptId: p.id,
          sample: s,
          promptIds: [1],
          responseIds: [2],
          responseMask: [1],
          responseLogprobs: [-1],
          events: [],
          finish: 'answered',
          text,
          numToolCalls: 0,
          numToolErrors: 0,
          ms: 1,
        } as Trajectory;
      }),
    );
  }
  async sftStep() {
    return emptyStats();
  }
  async sftHeldout() {
    return { loss: 0, exact: 1 };
  }
  async grpoStep() {
    return emptyStats();
  }
  promptTokens(q: string) {
    return q.length;
  }
  async save(dir: string) {
    mkdirSync(dir, { recursive: true });
  }
  async load() {}
  async close() {}
}

const recipe = (data: Record<string, unknown>, evalData: Record<string, unknown> = {}) =>
  parseRecipe({
    name: 'files',
    eval: { n: 10, files: [join(FIX, 'dapo-arith.jsonl')], ...evalData },
    reward: { profile: 'strict' },
    stages: [
      {
        type: 'rl',
        name: 'rl',
        steps: 2,
        promptsPerStep: 4,
        groupSize: 2,
        oversample: 1,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
        data,
      },
    ],
  });

test('an RL stage reads its problems from Parquet and JSONL files in any layout, with row filters', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-files-'));
  const b = new ParityPolicy();
  const r = recipe({
    files: [join(FIX, 'verl-arith.parquet'), join(FIX, 'dapo-*.jsonl')],
    integerOnly: true,
    maxPromptTokens: 80,
  });
  const lines: string[] = [];
  await new Trainer(r, dir, b, { ...quiet, log: (l) => lines.push(l) }).run();
  const pool = JSON.parse(readFileSync(join(dir, 'pool-rl.json'), 'utf8')) as Problem[];
  assert.ok(pool.every((p) => p.question.length <= 80));
  const long = lines.find((l) => l.includes('dropped') && l.includes('80'));
  assert.ok(long, lines.join('\n'));
  assert.equal(pool.length + Number(/dropped (\d+)/.exec(long)?.[1]), 60);
  // the DAPO instruction wrapper is gone, the verl rows kept their ids and answers
  assert.ok(pool.every((p) => !p.question.includes('Answer:')));
  assert.ok(pool.some((p) => p.source === 'math_dapo') && pool.some((p) => p.source !== 'math_dapo'));
  // eval read the first 10 DAPO problems; every training prompt came from the pool
  const evalReq = b.seen[0];
  assert.equal(evalReq.problems.length, 10);
  const ids = new Set(pool.map((p) => p.id));
  assert.ok(b.seen.slice(1, 3).every((q) => q.problems.every((p) => ids.has(p.id))));
  // the strict verifier scored them: parity-even questions are right
  const m = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl'));
  assert.equal(m.length, 2);
  const evals = readJsonl<Record<string, any>>(join(dir, 'evals.jsonl'));
  const even = evalReq.problems.filter((p) => p.question.length % 2 === 0).length;
  assert.equal(evals[0].accuracy, even / 10);
});

test("the 'unsolved' filter pass resumes after a kill without re-screening finished chunks", async () => {
  const data = {
    files: [join(FIX, 'verl-arith.parquet')],
    filter: 'unsolved',
    filterSamples: 3,
    filterPool: 30,
  };
  const ref = mkdtempSync(join(tmpdir(), 'rstar2-filter-ref-'));
  await new Trainer(recipe(data), ref, new ParityPolicy(), quiet).run();
  const refPool = JSON.parse(readFileSync(join(ref, 'pool-rl.json'), 'utf8')) as Problem[];
  assert.ok(refPool.length > 0 && refPool.length < 30);
  assert.ok(
    refPool.every((p) => p.question.length % 2 === 1),
    'kept exactly the problems never solved',
  );

  const dir = mkdtempSync(join(tmpdir(), 'rstar2-filter-'));
  const dying = new ParityPolicy();
  dying.failOnRollout = 4; // screening goes in chunks of promptsPerStep = 4: dies in the 4th chunk
  await assert.rejects(new Trainer(recipe(data), dir, dying, quiet).run(), /simulated kill/);
  assert.equal(existsSync(join(dir, 'pool-rl.json')), false);
  assert.equal(readJsonl(join(dir, 'filter-rl.jsonl')).length, 12);
  const again = new ParityPolicy();
  await new Trainer(recipe(data), dir, again, quiet).run(true);
  const screened = again.seen.filter((q) => q.n === 3).flatMap((q) => q.problems.map((p) => p.id));
  assert.equal(screened.length, 18, 'only the 18 problems not yet screened');
  assert.deepEqual(JSON.parse(readFileSync(join(dir, 'pool-rl.json'), 'utf8')), refPool);
});

test('bad data in a recipe names the file and the problem', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-bad-'));
  const missing = recipe({ files: [join(FIX, 'nope-*.jsonl')] });
  await assert.rejects(new Trainer(missing, dir, new ParityPolicy(), quiet).run(), /nope-\*\.jsonl/);
  const sft = recipe({ files: [join(FIX, 'sft-arith-tools.jsonl')] });
  await assert.rejects(
    new Trainer(sft, mkdtempSync(join(tmpdir(), 'rstar2-bad-')), new ParityPolicy(), quiet).run(),
    /sft-arith-tools\.jsonl:1/,
  );
});

test('data.weights mixes sources: each step draws from each files entry in proportion, or not at all at weight 0', async () => {
  const files = [join(FIX, 'verl-arith.parquet'), join(FIX, 'dapo-arith.jsonl')];
  const fromDapo = (b: ParityPolicy) =>
    b.seen.slice(1, -1).flatMap((q) => q.problems.map((p) => p.source === 'math_dapo'));
  const only = new ParityPolicy();
  const rOnly = recipe({ files, weights: [1, 0] });
  await new Trainer(rOnly, mkdtempSync(join(tmpdir(), 'rstar2-mix-')), only, quiet).run();
  assert.deepEqual(fromDapo(only), Array(8).fill(false));
  const mixed = new ParityPolicy();
  const r = recipe({ files, weights: [1, 3] });
  r.stages[0].steps = 20;
  await new Trainer(r, mkdtempSync(join(tmpdir(), 'rstar2-mix-')), mixed, quiet).run();
  const dapo = fromDapo(mixed);
  assert.equal(dapo.length, 80);
  const share = dapo.filter(Boolean).length / dapo.length;
  assert.ok(share > 0.6 && share < 0.9, `DAPO share ${share}, weight 3 of 4`);
  // the shorthand carries its weights to the stages it fills; a count that is not one per entry is refused
  const short = parseRecipe({ data: { train: files, weights: [2, 1] }, stages: [{ type: 'rl' }] });
  assert.deepEqual(short.stages[0].data.weights, [2, 1]);
  assert.throws(
    () => recipe({ files, weights: [1] }),
    /stage rl: data.weights needs one weight per entry of data.files \(2\), not all 0; got \[1\]/,
  );
});

test('weightedPicker draws SFT examples by source weight, uniformly within a source', async () => {
  const { weightedPicker } = await import('../../src/recipe/data.js');
  const { Rng } = await import('../../src/util/rng.js');
  const items = [...Array(10).keys()].map((i) => ({ i, entry: i < 9 ? 0 : 1 }));
  const pick = weightedPicker(items, [1, 1]);
  const rng = new Rng(5);
  const got = Array.from({ length: 4000 }, () => pick(rng));
  const last = got.filter((x) => x.i === 9).length;
  assert.ok(last > 1800 && last < 2200, `the one-item source drew ${last} of 4000`);
});

test('rollout top-p: the stage topP reaches its rollouts, eval.topP the held-out ones; 1 (off) unless set', async () => {
  const files = [join(FIX, 'dapo-arith.jsonl')];
  const b = new ParityPolicy();
  const r = parseRecipe({
    ...recipe({ files }),
    stages: [{ ...recipe({ files }).stages[0], topP: 0.9 }],
    eval: { ...recipe({ files }).eval, topP: 0.95 },
  });
  await new Trainer(r, mkdtempSync(join(tmpdir(), 'rstar2-topp-')), b, quiet).run();
  assert.deepEqual(
    b.seen.map((q) => q.topP),
    [0.95, 0.9, 0.9, 0.95],
  );
  const plain = recipe({ files }).stages[0];
  assert.equal(plain.type === 'rl' ? plain.topP : null, 1);
  assert.throws(() => recipe({ files }, { topP: 0 }), /eval\.topP/);
});

test('repeated rows are dropped while reading, keeping what integerOnly then dedupe kept', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-repeats-'));
  const file = join(dir, 'repeated.jsonl');
  // 100 copies of each of 20 problems (as DAPO-Math-17k ships), then one question whose first row is no integer
  const rows = Array.from({ length: 2000 }, (_, i) => ({
    id: `r${i}`,
    problem: `What is ${i % 20} + 1?`,
    answer: String((i % 20) + 1),
  }));
  rows.push(
    { id: 'odd-a', problem: 'Half of one?', answer: '1/2' },
    { id: 'odd-b', problem: 'half of ONE?', answer: '0' },
  );
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n'));
  const lines: string[] = [];
  const r = recipe({ files: [file], integerOnly: true });
  await new Trainer(r, dir, new ParityPolicy(), { ...quiet, log: (l) => lines.push(l) }).run();
  const pool = JSON.parse(readFileSync(join(dir, 'pool-rl.json'), 'utf8')) as Problem[];
  assert.deepEqual(
    pool.map((p) => p.id),
    [...Array.from({ length: 20 }, (_, i) => `r${i}`), 'odd-b'],
  );
  assert.ok(lines.includes('[rl] dropped 1980 problems while reading: duplicate question'), lines.join('\n'));
});

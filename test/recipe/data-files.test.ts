import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Trajectory } from '../../src/agent/trajectory.js';
import type { Problem } from '../../src/data/index.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { emptyStats } from '../../src/recipe/fake.js';
import type { PolicyBackend, RolloutRequest } from '../../src/recipe/trainer.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };
const FIX = join(import.meta.dirname, '../../data/samples');

// A policy for file problems: it answers right exactly when the question's length is even, every sample.
class ParityPolicy implements PolicyBackend {
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

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { applySets, loadRecipe, parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { readState, Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

// Shaping a recipe from the command line (issue 44): stages picked, fields set in every stage at once, errors
// that name what exists; and changing a run: what --resume --set may change, --fork, dry runs that write nothing.

process.env.RSTAR2_NO_PROGRESS = '1';
const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };
const rstar2 = (args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env });
const data = ['data.sft=s.jsonl', 'data.train=t.parquet'];

test("--set 'stages.*.x' reaches every stage that has the field; a name that is no stage lists the stages", () => {
  const raw = { stages: [{ type: 'sft' }, { type: 'rl', name: 'a' }, { type: 'rl', name: 'b' }] };
  const r = parseRecipe(raw, 'r', { set: ['stages.*.steps=3', 'stages.*.promptsPerStep=2'] });
  assert.deepEqual(
    r.stages.map((s) => [s.steps, s.type === 'rl' ? s.promptsPerStep : null]),
    [
      [3, null],
      [3, 2],
      [3, 2],
    ],
  );
  // a stage written without a name answers to its type's default name, as --print-config shows it
  assert.equal(parseRecipe(raw, 'r', { set: ['stages.sft.steps=7'] }).stages[0].steps, 7);
  assert.throws(
    () => applySets(raw, ['stages.*.nope=1']),
    /no element of stages takes 'nope' \(sft stages take: type, name, steps/,
  );
  const paper = () => loadRecipe('paper', { set: [...data, 'stages.rl.steps=5'] });
  assert.throws(
    paper,
    /--set stages\.rl\.steps=5: no stage 'rl' in stages \(stages: sft, stage1-8k, stage2-12k, stage3-hard;/,
  );
});

test('a --set the schema refuses is named as the --set, with the fields its section takes', () => {
  assert.throws(
    () => loadRecipe('paper', { set: [...data, 'stages.stage1-8k.stepz=5'] }),
    (e: Error) =>
      /^--set does not fit recipe .*paper\.yaml:\n {2}--set stages\.stage1-8k\.stepz=5: stages\.stage1-8k: Unrecognized key: "stepz" \(stages\.stage1-8k takes: type, name, steps, promptsPerStep,/.test(
        e.message,
      ),
  );
  // an error of the file itself still names the file
  assert.throws(
    () => parseRecipe({ stages: [{ type: 'rl', stepz: 1 }] }, 'my.yaml'),
    /invalid recipe my\.yaml:\n {2}stages\.rl: Unrecognized key/,
  );
});

test('--stages keeps the named stages in recipe order; an unknown name lists the stages', () => {
  const r = loadRecipe('paper', { set: data, stages: ['stage1-8k', 'sft'] });
  assert.deepEqual(
    r.stages.map((s) => s.name),
    ['sft', 'stage1-8k'],
  );
  assert.throws(
    () => loadRecipe('paper', { set: data, stages: ['rl'] }),
    /--stages: no stage 'rl' in recipe .* \(stages: sft, stage1-8k, stage2-12k, stage3-hard\)/,
  );
  const cfg = rstar2([
    'train',
    '--recipe',
    'paper',
    '--stages',
    'stage2-12k',
    ...data.flatMap((s) => ['--set', s]),
    '--print-config',
  ]);
  assert.equal(cfg.status, 0, cfg.stderr);
  assert.deepEqual(
    JSON.parse(cfg.stdout).stages.map((s: { name: string }) => s.name),
    ['stage2-12k'],
  );
});

test('paper refuses to train or dry-run without model.path, saying how to give one', () => {
  const r = rstar2(['train', '--recipe', 'paper', ...data.flatMap((s) => ['--set', s]), '--dry-run']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /recipe paper trains a real base model: give one with --set model\.path=DIR/);
  assert.doesNotMatch(r.stdout, /dry run/);
});

const small = (over: Record<string, unknown> = {}) => ({
  name: 't',
  seed: 3,
  eval: { n: 8 },
  stages: [
    { type: 'sft', steps: 4, batchSize: 8, demos: 100, checkpointEvery: 2, lr: 0.01 },
    {
      type: 'rl',
      steps: 2,
      promptsPerStep: 4,
      groupSize: 4,
      oversample: 1,
      lr: 0.5,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
      ...over,
    },
  ],
});

test('promptsPerStep above what the data leave is refused, not silently capped', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-pps-'));
  const r = parseRecipe(small({ promptsPerStep: 8, data: { filter: 'unsolved', filterPool: 4 } }), 't');
  await assert.rejects(
    new Trainer(r, dir, new FakePolicy(), { log: () => {}, progress: false }).run(),
    /stage rl: promptsPerStep is 8, but its data leave [0-4] problems after the filters; lower it \(--set stages\.rl\.promptsPerStep=/,
  );
});

/** A run stopped by a crash at its first RL rollout: its last checkpoint is the SFT stage's end. */
async function crashedAfterSft(): Promise<{ dir: string; file: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-change-'));
  const file = join(dir, 'r.json');
  writeFileSync(file, JSON.stringify(small()));
  const run = join(dir, 'run');
  const fake = new FakePolicy();
  fake.onRollout = () => {
    throw new Error('killed');
  };
  await assert.rejects(
    new Trainer(loadRecipe(file), run, fake, { log: () => {}, progress: false }).run(),
    /killed/,
  );
  assert.deepEqual(readState(run), { ...readState(run), stage: 'sft', step: 4 });
  return { dir, file };
}

test('--resume --set changes the reward, eval and a later stage, records each, and refuses the rest naming --fork', async () => {
  const { dir } = await crashedAfterSft();
  const run = join(dir, 'run');
  const refused = rstar2(['train', '--resume', run, '--set', 'stages.sft.lr=0.5']);
  assert.notEqual(refused.status, 0);
  assert.match(
    refused.stderr,
    /--resume cannot change stages\.sft\.lr: a resume may change reward\.profile, .*eval\.\*.* steps, promptsPerStep/,
  );
  assert.match(refused.stderr, /rstar2 train --fork RUN\/checkpoints\/STAGE-step-N --out NEW/);
  const sftSteps = rstar2(['train', '--resume', run, '--set', 'stages.sft.steps=9']);
  assert.match(
    sftSteps.stderr,
    /--resume cannot change stages\.sft\.steps \(stage sft has started\)/,
    JSON.stringify(sftSteps),
  );
  const seed = rstar2(['train', '--resume', run, '--seed', '4']);
  assert.match(
    seed.stderr,
    /cannot change a run being resumed.*--fork .*checkpoints\/STAGE-step-N --out NEW/,
  );
  assert.ok(!existsSync(join(run, 'changes.jsonl')), 'a refused change is not recorded');
  // the run was trained on the fake policy: the resume finds that out from its checkpoint
  const sets = ['reward.profile=lenient', 'eval.n=6', 'stages.rl.steps=3'];
  const ok = rstar2(['train', '--resume', run, ...sets.flatMap((s) => ['--set', s])]);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stderr, /resume changes stages\.rl\.steps: 2 -> 3/);
  const changes = readJsonl<Record<string, unknown>>(join(run, 'changes.jsonl'));
  assert.deepEqual(
    changes.map(({ path, from, to, after }) => ({ path, from, to, after })),
    [
      { path: 'eval.n', from: 8, to: 6, after: { stage: 'sft', step: 4 } },
      { path: 'reward.profile', from: 'strict', to: 'lenient', after: { stage: 'sft', step: 4 } },
      { path: 'stages.rl.steps', from: 2, to: 3, after: { stage: 'sft', step: 4 } },
    ].sort(
      (a, b) => changes.findIndex((c) => c.path === a.path) - changes.findIndex((c) => c.path === b.path),
    ),
  );
  const cfg = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
  assert.equal(cfg.reward.profile, 'lenient');
  assert.deepEqual(
    readJsonl<{ stage: string; step: number }>(join(run, 'metrics.jsonl'))
      .filter((m) => m.stage === 'rl')
      .map((m) => m.step),
    [1, 2, 3],
  );
  assert.ok(readJsonl<{ n: number }>(join(run, 'evals.jsonl')).every((e) => e.n === 6));
  // the RL stage has started now: its sizes are fixed
  const late = rstar2(['train', '--resume', run, '--set', 'stages.rl.steps=5', '--dry-run']);
  assert.match(late.stderr, /--resume cannot change stages\.rl\.steps \(stage rl has started\)/);
});

test('--fork with --dry-run writes nothing, so the real command that follows is not refused', async () => {
  const { dir } = await crashedAfterSft();
  const out = join(dir, 'forked');
  const fork = ['train', '--fork', join(dir, 'run', 'checkpoints', 'sft-step-000004'), '--out', out];
  const dry = rstar2([...fork, '--set', 'stages.rl.steps=1', '--dry-run', '--insecure-no-sandbox']);
  assert.ok(!existsSync(out), `the dry run made ${out}: ${dry.stderr}`);
  const real = rstar2([...fork, '--set', 'stages.rl.steps=1', '--policy-backend', 'fake']);
  assert.equal(real.status, 0, real.stderr);
  assert.deepEqual(
    readJsonl<{ stage: string; step: number }>(join(out, 'metrics.jsonl')).map((m) => `${m.stage}:${m.step}`),
    ['sft:1', 'sft:2', 'sft:3', 'sft:4', 'rl:1'],
  );
});

test("paper.yaml's header example parses as written and fills every stage with data", () => {
  const header = readFileSync(join(import.meta.dirname, '../../data/recipes/paper.yaml'), 'utf8');
  const line = /^#\s+(rstar2 train --recipe paper .*)$/m.exec(header)?.[1];
  assert.ok(line, 'the header gives a command');
  const sets = [...line.matchAll(/--set '?([^' ]+)'?/g)].map((m) => m[1]);
  assert.ok(sets.includes('model.path=DIR'));
  const r = loadRecipe('paper', { set: sets });
  assert.ok(r.stages.every((s) => s.data.files?.length));
  assert.doesNotMatch(header, /\.\.\/shared|\.\.\/\.\.\//, 'it cites nothing outside the repository');
});

test('a hub id as model.path is refused saying it is not downloaded', () => {
  const r = rstar2([
    'train',
    '--recipe',
    'paper',
    '--set',
    'model.path=Qwen/Qwen3-0.6B',
    ...data.flatMap((s) => ['--set', s]),
    '--dry-run',
  ]);
  assert.notEqual(r.status, 0);
  assert.match(
    r.stderr,
    /model\.path Qwen\/Qwen3-0\.6B: no such directory; .*a hub id such as Qwen\/Qwen3-0\.6B is not downloaded/,
  );
});

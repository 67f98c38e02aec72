import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { forkRun, readState, Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';

const recipe = (roc: 'on' | 'off' = 'on') =>
  parseRecipe(
    {
      name: 't',
      seed: 3,
      eval: { n: 40 },
      stages: [
        { type: 'sft', steps: 4, batchSize: 16, demos: 200, checkpointEvery: 2, lr: 0.01 },
        {
          type: 'rl',
          steps: 8,
          promptsPerStep: 8,
          groupSize: 4,
          oversample: 2,
          checkpointEvery: 3,
          evalEvery: 4,
          lr: 0.5,
          roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
        },
      ],
    },
    't',
    { roc },
  );

const quiet = { log: () => {}, progress: false };
const stripTime = (rs: Record<string, unknown>[]) =>
  rs.map(
    ({ time: _t, time_rollout_s: _a, time_reward_s: _b, time_update_s: _c, tokens_per_s: _d, ...r }) => r,
  );

test('a run writes the run directory of docs/RUN_DIR.md', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-run-'));
  const policy = new FakePolicy();
  const { evals } = await new Trainer(recipe(), dir, policy, quiet).run();
  const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  assert.equal(cfg.stages[1].roc.doDownSampling, true);
  const m = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => `${r.stage}:${r.step}`),
    [...[1, 2, 3, 4].map((s) => `sft:${s}`), ...[1, 2, 3, 4, 5, 6, 7, 8].map((s) => `rl:${s}`)],
  );
  const rl = m.filter((r) => r.stage === 'rl');
  for (const r of rl) {
    assert.equal(r.roc.before, 64);
    assert.ok(r.roc.after <= 32 && r.roc.after % 4 === 0);
    assert.equal(r.roc.groups_kept * 4, r.roc.after);
    for (const k of [
      'reward_mean',
      'accuracy',
      'tool_error_ratio_pos',
      'format_penalty_pos',
      'response_len_mean',
      'turns_mean',
      'time_rollout_s',
    ])
      assert.equal(typeof r[k], 'number', k);
  }
  assert.deepEqual(
    evals.map((e) => `${e.stage}:${e.step}`),
    ['rl:0', 'rl:4', 'rl:8'],
  );
  const trajFiles = readdirSync(join(dir, 'trajectories')).sort();
  assert.equal(trajFiles.length, 8);
  const t1 = readJsonl<Record<string, any>>(join(dir, 'trajectories', 'rl-step-000001.jsonl'));
  assert.equal(t1.length, 64);
  assert.equal(t1.filter((t) => t.kept).length, rl[0].roc.after);
  assert.ok(
    t1.every(
      (t) =>
        typeof t.reward === 'number' && (t.kept ? typeof t.advantage === 'number' : t.advantage === null),
    ),
  );
  assert.deepEqual(readdirSync(join(dir, 'checkpoints')).sort(), [
    'rl-step-000003',
    'rl-step-000006',
    'rl-step-000008',
    'sft-step-000002',
    'sft-step-000004',
  ]);
  assert.ok(existsSync(join(dir, 'checkpoints', 'rl-step-000008', 'trainer_state.json')));
  assert.deepEqual(readState(dir)?.checkpoint, join('checkpoints', 'rl-step-000008'));
  // the fake policy learns to use the tool, and held-out accuracy rises
  assert.ok(evals[2].accuracy > evals[0].accuracy, JSON.stringify(evals));
});

test('a crash then --resume gives exactly the records of an uninterrupted run', async () => {
  const ref = mkdtempSync(join(tmpdir(), 'rstar2-ref-'));
  await new Trainer(recipe(), ref, new FakePolicy(), quiet).run();

  for (const crashAt of [2, 5, 8]) {
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-crash-'));
    const crashing = new FakePolicy();
    let rollouts = 0;
    // counts the training rollouts (evals use n = 1): throwing in the k-th is a kill during rl step k
    crashing.onRollout = (req) => {
      if (req.n > 1 && ++rollouts === crashAt) throw new Error('simulated kill');
    };
    await assert.rejects(new Trainer(recipe(), dir, crashing, quiet).run(), /simulated kill/);
    appendFileSync(join(dir, 'metrics.jsonl'), '{"stage":"rl","step":99,"torn'); // a line cut by kill -9
    // crash at rl step 2 resumes from the SFT checkpoint; 5 and 8 from rl step 3 and 6
    assert.equal(readState(dir)!.stage, crashAt === 2 ? 'sft' : 'rl');
    await new Trainer(recipe(), dir, new FakePolicy(), quiet).run(true);
    for (const f of ['metrics.jsonl', 'evals.jsonl']) {
      assert.deepEqual(
        stripTime(readJsonl(join(dir, f))),
        stripTime(readJsonl(join(ref, f))),
        `${f} after a crash at rollout ${crashAt}`,
      );
    }
    assert.deepEqual(
      readdirSync(join(dir, 'trajectories')).sort(),
      readdirSync(join(ref, 'trajectories')).sort(),
    );
    assert.deepEqual(
      readJsonl(join(dir, 'trajectories', 'rl-step-000008.jsonl')),
      readJsonl(join(ref, 'trajectories', 'rl-step-000008.jsonl')),
    );
  }
});

test('RoC off is plain GRPO: G rollouts per prompt, all kept from mixed groups', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-off-'));
  await new Trainer(recipe('off'), dir, new FakePolicy(), quiet).run();
  const rl = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl')).filter((r) => r.stage === 'rl');
  for (const r of rl) {
    assert.equal(r.roc.before, 32);
    assert.equal(r.roc.after, r.roc.groups_kept * 4);
  }
});

test('RoC lowers the tool-error ratio among positives versus plain GRPO (fake policy)', async () => {
  const base = recipe();
  const run = async (roc: 'on' | 'off') => {
    const r = {
      ...base,
      stages: base.stages.map((s) =>
        s.type === 'rl'
          ? { ...s, steps: 20, evalEvery: 0, roc: { ...s.roc, doDownSampling: roc === 'on' } }
          : s,
      ),
    };
    const dir = mkdtempSync(join(tmpdir(), `rstar2-abl-${roc}-`));
    await new Trainer(r, dir, new FakePolicy(), quiet).run();
    const rl = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl')).filter((x) => x.stage === 'rl');
    return rl.slice(-5).reduce((a, x) => a + x.tool_error_ratio_pos, 0) / 5;
  };
  const on = await run('on');
  const off = await run('off');
  assert.ok(on < off, `RoC on ${on} vs off ${off}`);
});

test('forkRun branches a new run from a checkpoint (ablation after SFT) with records up to it', async () => {
  const src = mkdtempSync(join(tmpdir(), 'rstar2-src-'));
  await new Trainer(recipe(), src, new FakePolicy(), quiet).run();
  const dst = join(mkdtempSync(join(tmpdir(), 'rstar2-fork-')), 'off');
  const off = recipe('off');
  const st = forkRun(src, 'sft-step-000004', dst, off);
  assert.deepEqual([st.stage, st.step], ['sft', 4]);
  assert.throws(() => forkRun(src, 'sft-step-000004', dst, off), /already holds a run/);
  assert.throws(() => forkRun(src, 'sft-step-000003', `${dst}2`, off), /no checkpoint sft-step-000003/);
  await new Trainer(off, dst, new FakePolicy(), quiet).run(true);
  const m = readJsonl<Record<string, any>>(join(dst, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => `${r.stage}:${r.step}`),
    [...[1, 2, 3, 4].map((s) => `sft:${s}`), ...[1, 2, 3, 4, 5, 6, 7, 8].map((s) => `rl:${s}`)],
  );
  assert.ok(m.filter((r) => r.stage === 'rl').every((r) => r.roc.before === 32));
  assert.equal(
    JSON.parse(readFileSync(join(dst, 'config.json'), 'utf8')).stages[1].roc.doDownSampling,
    false,
  );
});

test('lrSchedule cosine: each step gets lr on a half cosine to minLr over the stage, also after a resume', async () => {
  const r = parseRecipe(
    {
      name: 't',
      seed: 3,
      eval: { n: 40 },
      stages: [
        {
          type: 'sft',
          steps: 5,
          demos: 50,
          checkpointEvery: 2,
          lr: 0.01,
          warmupSteps: 0,
          lrSchedule: 'cosine',
          minLr: 0.002,
        },
        { type: 'rl', steps: 2, promptsPerStep: 4, groupSize: 4, lr: 0.3, lrSchedule: 'cosine' },
      ],
    },
    't',
  );
  const lrs = (dir: string) => readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl')).map((m) => m.lr);
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-cos-'));
  await new Trainer(r, dir, new FakePolicy(), quiet).run();
  const want = [0.01, 0.009236, 0.007236, 0.004764, 0.002764, 0.3, 0.15];
  assert.deepEqual(
    lrs(dir).map((x) => Number(x.toFixed(6))),
    want,
  );
  // killed after step 3: the resumed steps 4-5 continue the same curve, not a new one
  const cut = mkdtempSync(join(tmpdir(), 'rstar2-cos-cut-'));
  class Dies extends FakePolicy {
    override async sftStep(e: Parameters<FakePolicy['sftStep']>[0], o: { lr: number }) {
      if (this.p.steps === 3) throw new Error('simulated kill');
      return super.sftStep(e, o);
    }
  }
  await assert.rejects(new Trainer(r, cut, new Dies(), quiet).run(), /simulated kill/);
  await new Trainer(r, cut, new FakePolicy(), quiet).run(true);
  assert.deepEqual(
    lrs(cut).map((x) => Number(x.toFixed(6))),
    want,
  );
  const bad = {
    name: 't',
    stages: [{ type: 'sft', name: 'a', lr: 0.001, lrSchedule: 'cosine', minLr: 0.01 }],
  };
  assert.throws(() => parseRecipe(bad, 't'), /stage a: minLr 0.01 is above lr 0.001/);
});

test('eval.atStart false: no held-out eval before the first RL step, the stage still evaluates at its end', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-run-'));
  const r = parseRecipe(
    {
      name: 't',
      seed: 3,
      eval: { n: 8, atStart: false },
      stages: [{ type: 'rl', steps: 2, promptsPerStep: 4, groupSize: 4, lr: 0.5 }],
    },
    't',
  );
  assert.equal(parseRecipe({ stages: [{ type: 'rl' }] }).eval.atStart, true);
  const { evals } = await new Trainer(r, dir, new FakePolicy(), quiet).run();
  assert.deepEqual(
    evals.map((e) => `${e.stage}:${e.step}`),
    ['rl:2'],
  );
  const written = readJsonl<{ step: number }>(join(dir, 'evals.jsonl'));
  assert.deepEqual(
    written.map((e) => e.step),
    [2],
  );
});

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

// KL loss, entropy bonus and PPO epochs as recipe options (issue 44): off by default; on, the trainer saves the
// reference weights, scores the kept trajectories under them and passes each option to every update.

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };

const recipe = (rl: Record<string, unknown>[]) =>
  parseRecipe({
    name: 't',
    seed: 3,
    eval: { n: 8 },
    stages: [
      { type: 'sft', steps: 4, batchSize: 8, demos: 100, checkpointEvery: 2, lr: 0.01 },
      ...rl.map((o, i) => ({
        type: 'rl',
        name: `rl${i + 1}`,
        steps: 3,
        promptsPerStep: 8,
        groupSize: 4,
        lr: 0.5,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
        ...o,
      })),
    ],
  });

const fakeParams = (dir: string) => JSON.parse(readFileSync(join(dir, 'fake-policy.json'), 'utf8'));

test('off by default: one update per mini-batch, no KL, no entropy term, no reference weights', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-rlopt-'));
  const b = new FakePolicy();
  await new Trainer(recipe([{}]), dir, b, quiet).run();
  const updates = b.updates.filter((u) => u.items.length > 0);
  assert.equal(
    b.updates.length,
    readJsonl<{ stage: string; skipped?: boolean }>(join(dir, 'metrics.jsonl')).filter(
      (m) => m.stage === 'rl1' && !m.skipped,
    ).length,
  );
  assert.ok(updates.every((u) => u.opts.klCoef === undefined && u.opts.entropyCoef === undefined));
  assert.ok(updates.every((u) => u.items.every((it) => it.refLogprobs === undefined)));
  assert.ok(!existsSync(join(dir, 'reference')));
});

test("kl against the stage's start, entropy bonus and 2 epochs reach every update; kl is logged", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-rlopt-'));
  const b = new FakePolicy();
  const r = recipe([{ kl: { coef: 0.5, reference: 'stage' }, entropyCoef: 0.01, epochs: 2 }]);
  await new Trainer(r, dir, b, quiet).run();
  const steps = readJsonl<{ stage: string; skipped?: boolean; kl?: number }>(
    join(dir, 'metrics.jsonl'),
  ).filter((m) => m.stage === 'rl1' && !m.skipped);
  assert.ok(steps.length > 0);
  assert.equal(b.updates.length, 2 * steps.length, 'each step passes over its items twice');
  for (const u of b.updates) {
    assert.deepEqual([u.opts.klCoef, u.opts.klEstimator, u.opts.entropyCoef], [0.5, 'k3', 0.01]);
    assert.ok(u.items.every((it) => it.refLogprobs?.length === it.trajectory.responseIds.length));
  }
  assert.ok(steps.every((m) => typeof m.kl === 'number'));
  // the reference is the weights the stage started from: the SFT stage's last checkpoint
  assert.deepEqual(
    fakeParams(join(dir, 'reference', 'rl1')),
    fakeParams(join(dir, 'checkpoints', 'sft-step-000004')),
  );
});

test("kl.reference 'initial' keeps the first RL stage's start for every later stage, and pulls toward it", async () => {
  const run = async (coef: number) => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-rlopt-'));
    const b = new FakePolicy();
    await new Trainer(recipe([{}, { kl: { coef } }]), dir, b, quiet).run();
    return { dir, b };
  };
  const on = await run(2);
  assert.deepEqual(
    fakeParams(join(on.dir, 'reference', 'initial')),
    fakeParams(join(on.dir, 'checkpoints', 'sft-step-000004')),
  );
  assert.ok(!existsSync(join(on.dir, 'reference', 'rl2')));
  const ref = fakeParams(join(on.dir, 'reference', 'initial')).tool;
  const off = await run(0);
  assert.ok(
    Math.abs(on.b.p.tool - ref) < Math.abs(off.b.p.tool - ref),
    `with KL the tool logit ends nearer the reference (${on.b.p.tool} vs ${off.b.p.tool}, reference ${ref})`,
  );
});

test("sandboxFaults: 'drop' leaves a sample whose call the sandbox failed out of its group; 'keep' trains it, as the reference", async () => {
  // every sample 0 met a sandbox fault in a tool call (its code never ran); sample 1 an engine error
  class Faulty extends FakePolicy {
    override async rollout(...a: Parameters<FakePolicy['rollout']>) {
      const out = await super.rollout(...a);
      for (const t of out)
        if (t.sample === 0) {
          const text = 'Tool call failure\nreason: internal_error\nstderr: worker lost';
          t.events = [
            ...(t.events ?? []),
            {
              kind: 'tool_result',
              turn: 0,
              text,
              error: true,
              status: 'internal_error',
              ms: 1,
              start: 0,
              end: 1,
            },
          ];
        } else if (t.sample === 1) Object.assign(t, { finish: 'error', error: 'engine down' });
      return out;
    }
  }
  const run = async (sandboxFaults?: string) => {
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-faults-'));
    const b = new Faulty();
    await new Trainer(
      recipe([{ steps: 2, oversample: 1, ...(sandboxFaults ? { sandboxFaults } : {}) }]),
      dir,
      b,
      quiet,
    ).run();
    const m = readJsonl<{ stage: string; failed?: number; roc?: { before: number } }>(
      join(dir, 'metrics.jsonl'),
    );
    const trained = b.updates.flatMap((u) => u.items.map((i) => i.trajectory.sample));
    return { rl: m.filter((r) => r.stage === 'rl1' && r.roc), trained };
  };
  const drop = await run();
  for (const r of drop.rl) assert.deepEqual([r.failed, r.roc!.before], [16, 16]); // 8 prompts x (4 - 2 faulted)
  assert.ok(!drop.trained.includes(0) && !drop.trained.includes(1));
  const keep = await run('keep');
  for (const r of keep.rl) assert.deepEqual([r.failed, r.roc!.before], [8, 24]); // only the engine errors out
  assert.ok(!keep.trained.includes(1));
  assert.throws(() => recipe([{ sandboxFaults: 'retry' }]), /sandboxFaults/);
});

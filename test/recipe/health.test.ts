import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { ChatExample } from '../../src/data/index.js';
import { applySets, parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { gainWarning, gateWarning, HealthError, healthSummary } from '../../src/recipe/health.js';
import { answersExact } from '../../src/recipe/policy.js';
import type { RolloutRequest, ScoredItem } from '../../src/recipe/trainer.js';
import { forkRun, readState, Trainer } from '../../src/recipe/trainer.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };

interface Opts {
  gate?: {
    loss?: number;
    exact?: number;
    every?: number;
    heldout?: number;
    restoreBest?: boolean;
    restart?: { loss: number; within: number; max?: number };
  } | null;
  sftSteps?: number;
  rlSteps?: number;
  rlLr?: number;
  strict?: boolean;
}

const recipe = (o: Opts = {}) =>
  parseRecipe({
    name: 't',
    seed: 3,
    eval: { n: 40 },
    health: { strict: o.strict ?? false },
    stages: [
      {
        type: 'sft',
        steps: o.sftSteps ?? 40,
        batchSize: 16,
        demos: 200,
        checkpointEvery: 10,
        lr: 0.01,
        gate: o.gate ?? null,
      },
      {
        type: 'rl',
        steps: o.rlSteps ?? 4,
        promptsPerStep: 8,
        groupSize: 4,
        oversample: 2,
        evalEvery: 2,
        lr: o.rlLr ?? 0.5,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
      },
    ],
  });

type Rec = Record<string, any>;
const metrics = (dir: string) => readJsonl<Rec>(join(dir, 'metrics.jsonl'));
const codes = (dir: string) => metrics(dir).flatMap((r) => (r.health ?? []).map((w: Rec) => w.code));

// The fake's held-out loss is 1 - sigmoid(copy) and copy grows 0.01 per SFT step at lr 0.01: 0.5 at the start,
// 0.475 after 10 steps, 0.45 after 20.
test('an SFT gate ends its stage once held-out loss reaches it, and resume skips the finished stage', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-gate-'));
  const run = await new Trainer(
    recipe({ gate: { loss: 0.46, every: 5, heldout: 16 } }),
    dir,
    new FakePolicy(),
    quiet,
  );
  await run.run();
  const sft = metrics(dir).filter((r) => r.stage === 'sft');
  assert.equal(sft.length, 20, 'stops at the first check at or below 0.46 (step 20), not at the 40-step cap');
  assert.deepEqual(
    sft.filter((r) => r.heldout_loss !== undefined).map((r) => r.step),
    [5, 10, 15, 20],
  );
  assert.equal(sft[19].gate, 'reached');
  assert.ok(sft[19].heldout_loss <= 0.46 && sft[14].heldout_loss > 0.46);
  assert.deepEqual(codes(dir), []);
  assert.equal(readJsonl<Rec>(join(dir, 'metrics.jsonl')).filter((r) => r.stage === 'rl').length, 4);

  // a resumed (or forked) run dir ends with the same step records as this uninterrupted run
  const resumesLikeDir = async (d: string) => {
    await new Trainer(
      recipe({ gate: { loss: 0.46, every: 5, heldout: 16 } }),
      d,
      new FakePolicy(),
      quiet,
    ).run(true);
    const steps = (x: string) => metrics(x).map((r) => `${r.stage}:${r.step}`);
    assert.deepEqual(steps(d), steps(dir));
  };

  // a fork from the gate's checkpoint (the seed sweep's RoC-off arm) goes to RL as the source did, not on with SFT
  const fork = mkdtempSync(join(tmpdir(), 'rstar2-gate-fork-'));
  assert.equal(
    forkRun(dir, 'sft-step-000020', fork, recipe({ gate: { loss: 0.46, every: 5 } })).stageDone,
    true,
  );
  await resumesLikeDir(fork);

  // killed right after the gate's checkpoint: resume goes straight to RL instead of finishing SFT's steps
  const dir2 = mkdtempSync(join(tmpdir(), 'rstar2-gate-resume-'));
  const crashing = new FakePolicy();
  crashing.onRollout = (req) => {
    if (req.n > 1) throw new Error('simulated kill');
  };
  await assert.rejects(
    new Trainer(recipe({ gate: { loss: 0.46, every: 5, heldout: 16 } }), dir2, crashing, quiet).run(),
    /simulated kill/,
  );
  assert.deepEqual(readState(dir2), { ...readState(dir2), stage: 'sft', step: 20, stageDone: true });
  await resumesLikeDir(dir2);
});

// The fake's exact-copy rate is sigmoid(copy)^5 (five digits right): 0.050 after 20 steps, 0.06 first after 29.
test('an exact-copy gate, alone or with a loss gate, ends the stage only when every threshold is met', async () => {
  for (const gate of [{ exact: 0.06 }, { loss: 0.46, exact: 0.06 }]) {
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-exact-'));
    await new Trainer(
      recipe({ gate: { ...gate, every: 5, heldout: 16 } }),
      dir,
      new FakePolicy(),
      quiet,
    ).run();
    const sft = metrics(dir).filter((r) => r.stage === 'sft');
    assert.equal(sft.length, 30, JSON.stringify(gate));
    const checks = sft.filter((r) => r.heldout_exact !== undefined);
    assert.deepEqual(
      checks.map((r) => r.step),
      [5, 10, 15, 20, 25, 30],
    );
    assert.ok(checks[4].heldout_exact < 0.06 && checks[5].heldout_exact >= 0.06);
    assert.equal(sft[29].gate, 'reached');
  }
  assert.throws(() => recipe({ gate: { every: 5 } }), /gate needs loss, exact or both/);
});

test('a gate not reached by the step cap warns; strict health stops the run after its checkpoint', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-nogate-'));
  const t = new Trainer(
    recipe({ gate: { loss: 0.1, every: 10 }, sftSteps: 20 }),
    dir,
    new FakePolicy(),
    quiet,
  );
  await t.run();
  const last = metrics(dir).filter((r) => r.stage === 'sft')[19];
  assert.equal(last.health[0].code, 'sft_gate_not_reached');
  assert.match(last.health[0].message, /best held-out loss 0.4502, .* gate loss <= 0.1 not reached/);
  assert.ok(t.warnings.some((w) => w.code === 'sft_gate_not_reached'));

  const strictDir = mkdtempSync(join(tmpdir(), 'rstar2-strict-'));
  const st = new Trainer(
    recipe({ gate: { loss: 0.1, every: 10 }, sftSteps: 20, strict: true }),
    strictDir,
    new FakePolicy(),
    quiet,
  );
  await assert.rejects(st.run(), (e: unknown) => e instanceof HealthError && /not reached/.test(e.message));
  assert.deepEqual([readState(strictDir)?.stage, readState(strictDir)?.step], ['sft', 20]);
  assert.equal(metrics(strictDir).filter((r) => r.stage === 'rl').length, 0);
});

// Held-out exact peaks after 15 SFT steps and falls after (as seed 4 of the quickstart did); it records the
// SFT steps behind the weights RL starts from, and can die at a chosen SFT step or at the first RL step.
class Peaking extends FakePolicy {
  rlStartsAt?: number;
  constructor(private dieAt?: number | 'rl' | 'load') {
    super();
  }
  override async load(dir: string) {
    if (this.dieAt === 'load') throw new Error('simulated kill');
    return super.load(dir);
  }
  override async sftHeldout() {
    return { loss: 0.5, exact: 0.5 - Math.abs(this.p.steps - 15) * 0.01 };
  }
  override async sftStep(e: Parameters<FakePolicy['sftStep']>[0], o: { lr: number }) {
    if (this.p.steps + 1 === this.dieAt) throw new Error('simulated kill');
    return super.sftStep(e, o);
  }
  override async grpoStep(items: Parameters<FakePolicy['grpoStep']>[0], o: { lr: number }) {
    if (this.dieAt === 'rl') throw new Error('simulated kill');
    this.rlStartsAt ??= this.p.steps;
    return super.grpoStep(items, o);
  }
}

// exact stays 0 at every check; the held-out loss is lowest at step 25
class FlatExact extends Peaking {
  override async sftHeldout() {
    return { loss: 0.1 + Math.abs(this.p.steps - 25) * 0.01, exact: 0 };
  }
}

test('restoreBest: with exact tied at every check, the best check is the one with the lowest loss', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-best-tie-'));
  const b = new FlatExact();
  await new Trainer(recipe({ gate: { exact: 0.9, every: 5, restoreBest: true } }), dir, b, quiet).run();
  assert.equal(b.rlStartsAt, 25); // not 5, the first check
  assert.equal(metrics(dir).find((r) => r.stage === 'sft' && r.step === 40)?.restored, 25);
});

test('restoreBest: a stage capped without its gate goes on from its best check, also across kills', async () => {
  const gate = { exact: 0.9, every: 5, restoreBest: true };
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-best-'));
  const b = new Peaking();
  await new Trainer(recipe({ gate }), dir, b, quiet).run();
  assert.equal(b.rlStartsAt, 15); // not 40: the weights of step 15, checkpointed off the every-10 grid
  assert.ok(codes(dir).includes('sft_gate_not_reached'));
  const plain = new Peaking();
  await new Trainer(
    recipe({ gate: { ...gate, restoreBest: false } }),
    mkdtempSync(join(tmpdir(), 'rstar2-last-')),
    plain,
    quiet,
  ).run();
  assert.equal(plain.rlStartsAt, 40);
  // the cap's record names the check the run went on from, and a fork goes on from exactly the weights it names
  assert.equal(metrics(dir).find((r) => r.stage === 'sft' && r.step === 40)?.restored, 15);
  for (const [ckpt, from] of [
    ['sft-step-000015', 15],
    ['sft-step-000040', 40],
  ] as const) {
    const fork = mkdtempSync(join(tmpdir(), 'rstar2-best-fork-'));
    forkRun(dir, ckpt, fork, recipe({ gate }));
    const forked = new Peaking();
    await new Trainer(recipe({ gate }), fork, forked, quiet).run(true);
    assert.equal(forked.rlStartsAt, from);
    assert.equal(metrics(fork).filter((r) => r.stage === 'sft' && r.step > from).length, 0);
  }

  // killed at the first RL step: the resume loads the best weights, not the cap's
  const dir2 = mkdtempSync(join(tmpdir(), 'rstar2-best-rl-'));
  await assert.rejects(new Trainer(recipe({ gate }), dir2, new Peaking('rl'), quiet).run(), /simulated kill/);
  assert.deepEqual(readState(dir2), { ...readState(dir2), stage: 'sft', step: 40, stageDone: true });
  const resumed = new Peaking();
  await new Trainer(recipe({ gate }), dir2, resumed, quiet).run(true);
  assert.equal(resumed.rlStartsAt, 15);

  // killed between the cap's checkpoint and going back: the resume still goes back
  const dir4 = mkdtempSync(join(tmpdir(), 'rstar2-best-cap-'));
  await assert.rejects(
    new Trainer(recipe({ gate }), dir4, new Peaking('load'), quiet).run(),
    /simulated kill/,
  );
  assert.deepEqual([readState(dir4)?.step, readState(dir4)?.stageDone], [40, undefined]);
  const back = new Peaking();
  await new Trainer(recipe({ gate }), dir4, back, quiet).run(true);
  assert.equal(back.rlStartsAt, 15);

  // killed mid-stage after the peak: the resumed stage remembers its best check from metrics.jsonl
  const dir3 = mkdtempSync(join(tmpdir(), 'rstar2-best-sft-'));
  await assert.rejects(new Trainer(recipe({ gate }), dir3, new Peaking(23), quiet).run(), /simulated kill/);
  assert.equal(readState(dir3)?.step, 20);
  const again = new Peaking();
  await new Trainer(recipe({ gate }), dir3, again, quiet).run(true);
  assert.equal(again.rlStartsAt, 15);
});

// Held-out loss sits at 0.5 (the plateau of a bad initialisation) until the first re-initialisation, or for good
// with `never`; after one it falls as the fake's does (0.4875 five steps later, 0.475 after ten, 0.45 after twenty).
class Stuck extends FakePolicy {
  constructor(
    private never = false,
    private dieAt?: number,
  ) {
    super();
  }
  override async sftHeldout() {
    return this.never || this.p.seed === undefined ? { loss: 0.5, exact: 0 } : super.sftHeldout();
  }
  override async sftStep(e: Parameters<FakePolicy['sftStep']>[0], o: { lr: number }) {
    if (this.p.steps + 1 === this.dieAt) throw new Error('simulated kill');
    return super.sftStep(e, o);
  }
}

test('gate.restart re-initialises a start that plateaus, at most max times, and resumes across kills', async () => {
  const gate = { loss: 0.46, every: 5, heldout: 16, restart: { loss: 0.48, within: 10, max: 2 } };
  const restarts = (dir: string) =>
    metrics(dir)
      .filter((r) => r.restart !== undefined)
      .map((r) => [r.step, r.restart]);
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-restart-'));
  const b = new Stuck();
  const lines: string[] = [];
  await new Trainer(recipe({ gate }), dir, b, { ...quiet, log: (l) => lines.push(l) }).run();
  // stuck at 0.5 through steps 5 and 10: restart at 10; the new start reaches 0.475 by step 20 and the gate at 30
  assert.deepEqual(restarts(dir), [[10, 1]]);
  const sft = metrics(dir).filter((r) => r.stage === 'sft');
  assert.equal(sft.length, 30);
  assert.equal(sft[29].gate, 'reached');
  assert.ok(
    lines.some((l) =>
      /held-out loss 0.5 after 10 steps, not at or below 0.48; re-initialising the model \(restart 1 of 2, seed \d+\)/.test(
        l,
      ),
    ),
  );
  assert.deepEqual(codes(dir), []);
  // the restarted weights are on disk at once (step 10 is on the checkpoint grid; step 15 is not)
  assert.ok(typeof b.p.seed === 'number');

  // a start that never leaves the plateau: two restarts (steps 10 and 20), then the cap and its warning
  const dir2 = mkdtempSync(join(tmpdir(), 'rstar2-restart-max-'));
  await new Trainer(
    recipe({ gate: { ...gate, every: 5 }, sftSteps: 40 }),
    dir2,
    new Stuck(true),
    quiet,
  ).run();
  assert.deepEqual(restarts(dir2), [
    [10, 1],
    [20, 2],
  ]);
  assert.ok(codes(dir2).includes('sft_gate_not_reached'));

  // killed at step 17 (last checkpoint: step 10, just after the restart): the resume knows the restart from
  // metrics.jsonl, so it does not restart again at step 15, and the run ends as the uninterrupted one did
  const dir3 = mkdtempSync(join(tmpdir(), 'rstar2-restart-kill-'));
  await assert.rejects(
    new Trainer(recipe({ gate }), dir3, new Stuck(false, 17), quiet).run(),
    /simulated kill/,
  );
  assert.equal(readState(dir3)?.step, 10);
  await new Trainer(recipe({ gate }), dir3, new Stuck(), quiet).run(true);
  assert.deepEqual(restarts(dir3), [[10, 1]]);
  assert.deepEqual(
    metrics(dir3).map((r) => `${r.stage}:${r.step}:${r.heldout_loss}`),
    metrics(dir).map((r) => `${r.stage}:${r.step}:${r.heldout_loss}`),
  );

  // only a first stage that starts from a preset can start over
  const later = recipe({ gate });
  const first = later.stages[0];
  assert.equal(first.type, 'sft');
  if (first.type === 'sft') later.stages.unshift({ ...first, name: 'warm', gate: null });
  await assert.rejects(
    new Trainer(later, mkdtempSync(join(tmpdir(), 'rstar2-restart-2nd-')), new Stuck(), quiet).run(),
    /stage sft: gate.restart re-initialises the model, so it is only for the first stage/,
  );
  const loaded = recipe({ gate });
  loaded.model.path = '/models/some-checkpoint';
  await assert.rejects(
    new Trainer(loaded, mkdtempSync(join(tmpdir(), 'rstar2-restart-path-')), new Stuck(), quiet).run(),
    /only for the first stage of a recipe that trains a preset from scratch/,
  );
});

// Records the examples every held-out check scores.
class Scored extends FakePolicy {
  calls: number[][] = [];
  override async sftHeldout(examples: ChatExample[] = []) {
    this.calls.push(examples.map((ex) => ex.messages.filter((m) => m.tool_calls?.length).length));
    return super.sftHeldout();
  }
}

test('gate.on picks the held-out examples it scores: all, those that call a tool, those that retry one', async () => {
  const seen: Record<string, number[]> = {};
  for (const on of ['all', 'tool', 'retry'] as const) {
    const b = new Scored();
    const r = recipe({ sftSteps: 5, rlSteps: 0, gate: { loss: 0.01, every: 5, heldout: 64 } });
    Object.assign(r.stages[0], { demoMix: { direct: 0.4, tool: 0.4, recover: 0.2 } });
    Object.assign((r.stages[0] as { gate: object }).gate, { on });
    await new Trainer(r, mkdtempSync(join(tmpdir(), `rstar2-on-${on}-`)), b, quiet).run();
    seen[on] = b.calls[0];
  }
  assert.equal(seen.all.length, 64);
  assert.ok(seen.all.includes(0) && seen.all.includes(1) && seen.all.includes(2));
  assert.deepEqual(
    seen.tool,
    seen.all.filter((n) => n >= 1),
  );
  assert.deepEqual(
    seen.retry,
    seen.all.filter((n) => n >= 2),
  );
  assert.ok(seen.retry.length > 0 && seen.retry.length < seen.tool.length);

  // no retry demos held out: the stage refuses to start rather than gate on nothing
  const r = recipe({ sftSteps: 5, rlSteps: 0, gate: { loss: 0.01, every: 5, heldout: 64 } });
  Object.assign(r.stages[0], { demoMix: { direct: 0.5, tool: 0.5, recover: 0 } });
  Object.assign((r.stages[0] as { gate: object }).gate, { on: 'retry' });
  await assert.rejects(
    new Trainer(r, mkdtempSync(join(tmpdir(), 'rstar2-on-none-')), new Scored(), quiet).run(),
    /none of the 64 held-out examples calls a tool more than once \(gate.on: retry\)/,
  );
});

test('exact scores the turns that answer a tool output: the fix after an error and the final copy', () => {
  // prompt, failing call, error (masked), fixed call, stdout (masked), answer
  const retry = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1];
  const right = retry.map(() => true);
  const wrongAt = (t: number) => right.map((ok, i) => ok && i !== t);
  assert.equal(answersExact(retry, right), true);
  assert.equal(answersExact(retry, wrongAt(2)), true, 'the first call is a free choice');
  assert.equal(answersExact(retry, wrongAt(7)), false, 'a wrong fixed call');
  assert.equal(answersExact(retry, wrongAt(11)), false, 'a wrong copy into the answer');
  assert.equal(answersExact(retry, wrongAt(4)), true, 'masked tokens are not scored');
  // the failing call with weight 0 is not a run of trained tokens: the fix is the first run, and is scored
  const shown = [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1];
  assert.equal(answersExact(shown, wrongAt(7), false), false, 'a wrong fixed call');
  assert.equal(answersExact(shown, wrongAt(7)), true, 'scored as if trained, the fix would be a free choice');
  assert.equal(answersExact(shown, wrongAt(2), false), true, 'the shown call is not scored');
  // a direct answer has one turn, scored on itself
  assert.equal(answersExact([0, 0, 1, 1], [true, true, true, false]), false);
  assert.equal(answersExact([0, 0, 1, 1], [false, false, true, true]), true);
});

// A policy that never calls the tool and never answers right: every group is all-wrong.
class Hopeless extends FakePolicy {
  constructor() {
    super();
    this.p = { tool: -50, err: 0, copy: -50, steps: 0 };
  }
  override async sftStep(_e: unknown[], o: { lr: number }) {
    return super.grpoStep([], o);
  }
}

test('zero reward for k steps and all-skipped steps are reported, each on its step', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-zero-'));
  const t = new Trainer(recipe({ rlSteps: 4 }), dir, new Hopeless(), quiet);
  await t.run();
  const rl = metrics(dir).filter((r) => r.stage === 'rl');
  assert.ok(rl.every((r) => r.reward_mean === 0 && r.skipped));
  assert.deepEqual(
    rl.map((r) => (r.health ?? []).map((w: Rec) => w.code)),
    [
      ['all_groups_skipped'],
      ['all_groups_skipped'],
      ['all_groups_skipped', 'zero_reward'],
      ['all_groups_skipped'],
    ],
  );
  // held-out accuracy stayed at 0: the stage end says RL gained nothing
  assert.ok(t.warnings.some((w) => w.code === 'no_heldout_gain'));
});

// Every tool call fails: the fake's first call is always broken and the fixed call is made to fail too.
class Broken extends FakePolicy {
  override async rollout(req: RolloutRequest): Promise<Trajectory[]> {
    const out = await super.rollout(req);
    for (const t of out) t.numToolErrors = t.numToolCalls;
    return out;
  }
}

test('a step whose tool calls all fail warns', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-tools-'));
  const b = new Broken();
  b.p = { tool: 50, err: 50, copy: 0, steps: 0 };
  await new Trainer(recipe({ rlSteps: 2, sftSteps: 0 }), dir, b, quiet).run();
  const rl = metrics(dir).filter((r) => r.stage === 'rl');
  assert.ok(rl.every((r) => r.health.some((w: Rec) => w.code === 'tool_errors_all')));
});

test('a healthy run has no warnings and RL raises held-out accuracy', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-healthy-'));
  const t = new Trainer(recipe({ rlSteps: 4, sftSteps: 4 }), dir, new FakePolicy(), quiet);
  const { evals } = await t.run();
  assert.deepEqual(t.warnings, []);
  assert.ok(evals[evals.length - 1].accuracy > evals[0].accuracy);
});

test('--set overrides address nested fields and stages by index or name, values parsed as YAML', () => {
  const raw = {
    seed: 1,
    stages: [
      { type: 'sft', name: 'a' },
      { type: 'rl', name: 'b' },
    ],
  };
  const out = applySets(raw, [
    'seed=7',
    'stages.1.steps=5',
    'stages.a.gate.loss=0.2',
    'eval.temperature=0.6',
  ]);
  assert.deepEqual(out, {
    seed: 7,
    stages: [
      { type: 'sft', name: 'a', gate: { loss: 0.2 } },
      { type: 'rl', name: 'b', steps: 5 },
    ],
    eval: { temperature: 0.6 },
  });
  assert.equal(raw.seed, 1, 'the input is not modified');
  assert.throws(() => applySets(raw, ['stages.c.steps=1']), /no stage 'c' in stages \(stages: a, b;/);
  assert.throws(() => applySets(raw, ['stages']), /expected path=value/);
  assert.throws(() => applySets(raw, ['seed.x=1']), /seed is a value/);
  const r = parseRecipe(raw, 'r', { set: ['stages.b.steps=3'] });
  assert.equal(r.stages[1].steps, 3);
  assert.throws(
    () => parseRecipe(raw, 'r', { set: ['stages.b.stepz=3'] }),
    /--set stages.b.stepz=3: stages.b: Unrecognized key/,
  );
});

test('rstar2 train --strict-health exits 3 with the reason; --seed is validated', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-cli-health-'));
  const file = join(dir, 'r.yaml');
  writeFileSync(
    file,
    JSON.stringify({
      name: 'h',
      eval: { n: 8 },
      stages: [
        { type: 'sft', steps: 4, demos: 50, batchSize: 4, gate: { loss: 0.01, every: 2, heldout: 8 } },
      ],
    }),
  );
  const bin = join(import.meta.dirname, '../../bin/rstar2.js');
  const args = ['train', '--recipe', file, '--policy-backend', 'fake', '--strict-health', '--seed', '5'];
  const r = spawnSync(process.execPath, [bin, ...args, '--out', join(dir, 'run')], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
  });
  assert.equal(r.status, 3, r.stderr);
  assert.match(r.stderr, /WARNING \[health\] sft: best held-out loss .* gate loss <= 0.01 not reached/);
  const cfg = execFileSync(
    process.execPath,
    [bin, 'train', '--recipe', file, '--seed', '5', '--print-config'],
    {
      encoding: 'utf8',
    },
  );
  assert.equal(JSON.parse(cfg).seed, 5);
  const bad = spawnSync(process.execPath, [bin, 'train', '--recipe', file, '--seed', 'x'], {
    encoding: 'utf8',
  });
  assert.notEqual(bad.status, 0);
  assert.match(
    bad.stderr,
    /option '--seed <n>' argument 'x' is invalid\. Expected an integer from 0 to 2147483647\./,
  );
});

test('the end-of-run line says "may not be learning" only for a learning warning, not for a missed SFT gate', () => {
  const gate = gateWarning('sft-recover', 300, { loss: 0.02, exact: 0.54 }, { exact: 0.8 });
  const onlyGate = healthSummary([gate]);
  assert.match(onlyGate, /^1 health warning\(s\); a stage reached its step cap before its skill gate/);
  assert.doesNotMatch(onlyGate, /not be learning/);
  assert.match(onlyGate, /- sft-recover: .* exact 0\.540 at the 300-step cap/);
  const both = healthSummary([gate, ...gainWarning('rl', 0.3, 0.3)]);
  assert.match(both, /^2 health warning\(s\); the run may not be learning/);
});

// An engine that fails every third trajectory (finish 'error', as after its retries): none of them is trained on
// or scored, and the run says so.
class Flaky extends FakePolicy {
  trained: Trajectory[] = [];
  override async rollout(req: RolloutRequest): Promise<Trajectory[]> {
    const out = await super.rollout(req);
    out.forEach((t, i) => {
      if (i % 3 === 0) Object.assign(t, { finish: 'error', error: 'engine down (test)', correct: true });
    });
    return out;
  }
  override async grpoStep(items: ScoredItem[], o: Parameters<FakePolicy['grpoStep']>[1]) {
    this.trained.push(...items.map((it) => it.trajectory));
    return super.grpoStep(items, o);
  }
}

test('trajectories an engine or the sandbox failed are not trained on, not scored, and warned about', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-flaky-'));
  const b = new Flaky();
  await new Trainer(recipe({ rlSteps: 2, sftSteps: 0 }), dir, b, quiet).run();
  assert.ok(b.trained.length > 0);
  assert.ok(
    b.trained.every((t) => t.finish !== 'error'),
    'no failed trajectory reaches an update',
  );
  const rl = metrics(dir).filter((r) => r.stage === 'rl');
  // 8 prompts × 4 × 2 rollouts, every third failed
  assert.deepEqual(
    rl.map((r) => r.failed),
    [22, 22],
  );
  assert.ok(rl.every((r) => r.health.some((w: Rec) => w.code === 'rollout_failures')));
  assert.match(
    rl[0].health.find((w: Rec) => w.code === 'rollout_failures').message,
    /22 of 64 trajectories failed outside the model \(first: engine down \(test\)\) and were left out of training/,
  );
  const evals = readJsonl<Rec>(join(dir, 'evals.jsonl'));
  assert.ok(
    evals.every((e) => e.failed === 14 && e.n === 26),
    JSON.stringify(evals),
  );
});

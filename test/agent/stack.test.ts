import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runRollouts } from '../../src/agent/loop.js';
import { openRolloutStack } from '../../src/agent/stack.js';
import type { EngineWorker } from '../../src/engines/embedded.js';
import { FakeEngine } from '../../src/engines/fake.js';
import { buildCharTokenizer, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { FakeRunner } from './helpers.js';

test('a stack with the scripted fake engine and an in-process runner runs a trajectory', async () => {
  const runner = new FakeRunner();
  const seen: string[] = [];
  const stack = await openRolloutStack({
    engines: ['fake'],
    sandbox: runner,
    onTool: (_req, res) => seen.push(res.stdout),
  });
  try {
    const [t] = await runRollouts({
      problems: [{ id: 'a', question: 'What is 1+1?', gold: '2' }],
      n: 1,
      scheduler: stack.scheduler,
      template: stack.template,
      runner: stack.runner,
    });
    assert.equal(t.finish, 'answered', t.error);
    assert.equal(t.numToolCalls, 1);
    assert.match(t.text, /<tool_response>\nTool call success\nstdout: 2\n/);
    assert.match(t.text, /\\boxed\{2\}/);
    assert.equal(runner.requests.length, 1);
    assert.deepEqual(seen, ['2\n']);
    assert.deepEqual(
      stack.engines.map((e) => e.name),
      ['fake'],
    );
  } finally {
    await stack.close();
  }
});

test('no tools (a recipe with tool.enabled false): the prompt shows no tool schema, a call is answer text, one turn', async () => {
  const runner = new FakeRunner();
  const open = (tools?: []) => openRolloutStack({ engines: ['fake'], sandbox: runner, tools });
  const withTool = await open();
  const stack = await open([]);
  try {
    const q = 'What is 1+1?';
    const tok = stack.tokenizer;
    assert.match(tok.decode(withTool.template.promptIds(q)), /<tools>/);
    const prompt = tok.decode(stack.template.promptIds(q));
    assert.doesNotMatch(prompt, /<tools>|<tool_call>|python_code_with_standard_io/);
    assert.match(prompt, /<\|im_start\|>user\n.*What is 1\+1\?<\|im_end\|>/s);
    // the scripted engine writes a tool call: it ends the trajectory as the answer's text, never run
    const [t] = await runRollouts({
      problems: [{ id: 'a', question: q, gold: '2' }],
      n: 1,
      scheduler: stack.scheduler,
      template: stack.template,
      runner: stack.runner,
    });
    assert.equal(t.finish, 'answered', t.error);
    assert.equal(t.numToolCalls, 0);
    assert.deepEqual(
      t.events.map((e) => e.kind),
      ['generation'],
    );
    assert.ok(t.responseMask.every((m) => m === 1));
    assert.match(t.text, /<tool_call>/);
    assert.equal(runner.requests.length, 0);
  } finally {
    await stack.close();
    await withTool.close();
  }
});

test('close() closes only what the stack opened', { timeout: 60_000 }, async () => {
  const closed: string[] = [];
  const engine = new FakeEngine(() => ({ outputIds: [] }), { name: 'mine' });
  engine.close = async () => void closed.push('engine');
  // the trainer's worker both generates and trains: the stack must leave it running
  const worker: EngineWorker = {
    generate: async (ps) => ps.map(() => ({ outputIds: [], logprobs: [], finishReason: 'stop' as const })),
    close: async () => void closed.push('worker'),
  };
  const runner = new FakeRunner();
  runner.close = async () => void closed.push('runner');
  const stack = await openRolloutStack({
    engines: [engine, 'embedded'],
    worker,
    tokenizer: tokenizerFromFiles(buildCharTokenizer()),
    sandbox: runner,
    batching: true,
    onTool: () => {},
  });
  assert.deepEqual(
    stack.engines.map((e) => e.name),
    ['mine', 'embedded'],
  );
  await stack.close();
  assert.deepEqual(closed, []);
  await assert.rejects(stack.scheduler.acquire(10), /scheduler is closed/);

  // a sandbox pool it started itself is closed with it
  const own = await openRolloutStack({
    engines: ['fake'],
    sandboxOptions: { isolation: 'none', slots: 1, log: () => {} },
  });
  assert.equal((await own.runner.run({ code: 'print(1)' })).stdout, '1\n');
  await own.close();
  assert.equal((await own.runner.run({ code: 'print(1)' })).status, 'internal_error');
});

test('a failure while opening leaves passed-in parts open and names the problem', async () => {
  const closed: string[] = [];
  const runner = new FakeRunner();
  runner.close = async () => void closed.push('runner');
  const broken = new FakeEngine(() => ({ outputIds: [] }), { name: 'broken' });
  broken.load = async () => {
    throw new Error('connection refused');
  };
  await assert.rejects(
    openRolloutStack({
      engines: ['fake', broken],
      tokenizer: tokenizerFromFiles(buildCharTokenizer()),
      sandbox: runner,
    }),
    /cannot read KV capacity of broken: connection refused/,
  );
  assert.deepEqual(closed, []);
  await assert.rejects(
    openRolloutStack({ engines: ['embedded'], tokenizer: tokenizerFromFiles(buildCharTokenizer()) }),
    /--engines embedded needs --model DIR/,
  );
  await assert.rejects(openRolloutStack({ engines: ['http://127.0.0.1:9'] }), /prompts need a tokenizer/);
});

test('an embedded model whose tokenizer is not its own is refused before any worker starts', {
  timeout: 60_000,
}, async () => {
  const { mkdtempSync, writeFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { QWEN3_TOKENIZER_DIR } = await import('../worker/helpers.js');
  const model = mkdtempSync(join(tmpdir(), 'rstar2-vocab-'));
  const open = (vocab: number, tokenizer: string) => {
    writeFileSync(join(model, 'config.json'), JSON.stringify({ model_type: 'qwen3', vocab_size: vocab }));
    return openRolloutStack({ engines: ['embedded'], model, tokenizer, sandbox: new FakeRunner() });
  };
  // Qwen3's 151,669 ids against a model with the char tokenizer's 267
  await assert.rejects(
    open(267, QWEN3_TOKENIZER_DIR),
    /has 151669 token ids but .*config\.json has vocab_size 267/,
  );
  // and a model far larger than its tokenizer (a Qwen model dir given a tiny tokenizer)
  const tiny = mkdtempSync(join(tmpdir(), 'rstar2-vocab-tok-'));
  const { saveTokenizer } = await import('../../src/tokenizer/build.js');
  saveTokenizer(buildCharTokenizer(), tiny);
  await assert.rejects(open(151936, tiny), /has 267 token ids but .*vocab_size 151936/);
  // a vocabulary padded past the tokenizer's ids is how real checkpoints come: it passes the check (and then
  // the worker refuses this directory, which holds no weights)
  await assert.rejects(
    open(151936, QWEN3_TOKENIZER_DIR),
    (e: Error) => !/do not belong together/.test(e.message),
  );
});

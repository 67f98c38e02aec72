import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { renderAnswer } from '../../src/chat/render.js';
import { ask } from '../../src/chat/session.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { openPolicy } from '../../src/eval/policy.js';
import { buildCharTokenizer, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { pythonThenAnswer } from '../agent/helpers.js';

const ESC = '\x1b[';
const b64 = (s: string) => Buffer.from(s).toString('base64');

function sectionOrder(out: string): string[] {
  return [...out.matchAll(/── ([a-z ]+?)(?: ·| ─)/g)].map((m) => m[1]);
}

test('renderAnswer sets thinking, code, tool output and answer apart, in order', () => {
  const t = fakeTrajectory({ problemId: 'p', answer: '42', sample: 0, seed: 1 }, 1);
  const plain = renderAnswer(t, { color: false, width: 60 });
  assert.deepEqual(sectionOrder(plain), ['thinking', 'python', 'tool output', 'thinking', 'answer']);
  assert.ok(!plain.includes(ESC), 'no ANSI codes without colour');
  assert.match(plain, /── python ─+\nprint\(/);
  assert.match(plain, /⇒ 42\n/);
  const colored = renderAnswer(t, { color: true });
  assert.ok(colored.includes(`${ESC}36m── python`));
  assert.ok(colored.includes(`${ESC}32m── answer`));
});

test('renderAnswer labels tool errors and unfinished answers', () => {
  let t = fakeTrajectory({ problemId: 'p', answer: '1', sample: 0, seed: 0 }, 0);
  for (let s = 0; !t.numToolErrors; s++)
    t = fakeTrajectory({ problemId: 'p', answer: '1', sample: 0, seed: s }, 0);
  const stopped = { ...t, finish: 'length' as const, text: t.text.replace(/\\boxed\{[^}]*\}/, 'no box') };
  const out = renderAnswer(stopped, { color: false });
  assert.match(out, /── tool output · error/);
  assert.match(out, /⇒ \(no \\boxed\{\} answer\)/);
  assert.match(out, /\[stopped: length\]/);
});

const bwrap = existsSync('/usr/bin/bwrap');
test('a chat answer runs the model’s python call in the real sandbox', {
  skip: bwrap ? false : 'bubblewrap not installed',
  timeout: 120_000,
}, async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const engine = pythonThenAnswer(tok, (p) => `The tool says ${p}. <answer>\\boxed{${p}}</answer><|im_end|>`);
  const ran: string[] = [];
  const policy = await openPolicy({
    engineInstance: engine,
    tokenizerInstance: tok,
    temperature: 1,
    topP: 1,
    maxTokens: 4096,
    concurrency: 1,
    // the sandbox runs the model code inside the tool wrapper, which carries it base64-encoded
    onTool: (req, res) =>
      ran.push(`${req.code.includes(b64('print(6*7)'))} -> ${res.status}: ${res.stdout.trim()}`),
  });
  try {
    const t = await ask(policy, 'What is 6*7?', 1);
    assert.deepEqual(ran, ['true -> ok: 42']);
    assert.equal(t.finish, 'answered', t.error);
    assert.equal(t.numToolCalls, 1);
    const out = renderAnswer(t, { color: false });
    assert.deepEqual(sectionOrder(out), ['thinking', 'python', 'tool output', 'thinking', 'answer']);
    assert.match(out, /── tool output · ok[^\n]*\nTool call success\nstdout: 42/);
    assert.match(out, /⇒ 42/);
    await assert.rejects(ask(policy, '   ', 1), /empty message/);
  } finally {
    await policy.close();
  }
});

test('--no-tool (tools: []): the same python call is answer text, never run, one turn', {
  timeout: 60_000,
}, async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const engine = pythonThenAnswer(tok, (p) => `The tool says ${p}. <answer>\\boxed{${p}}</answer><|im_end|>`);
  const ran: string[] = [];
  const policy = await openPolicy({
    engineInstance: engine,
    tokenizerInstance: tok,
    tools: [],
    temperature: 1,
    topP: 1,
    maxTokens: 4096,
    concurrency: 1,
    onTool: (req) => ran.push(req.code),
  });
  try {
    const t = await ask(policy, 'What is 6*7?', 1);
    assert.deepEqual(ran, []);
    assert.equal(t.numToolCalls, 0);
    assert.deepEqual(
      t.events.map((e) => e.kind),
      ['generation'],
    );
    assert.doesNotMatch(tok.decode(t.promptIds), /<tools>|python_code_with_standard_io/);
  } finally {
    await policy.close();
  }
});

test('CLI: one-shot --prompt and piped interactive chat', { timeout: 60_000 }, () => {
  const env = { ...process.env, NO_COLOR: '1' };
  const one = spawnSync(
    process.execPath,
    ['bin/rstar2.js', 'chat', '--engine', 'fake:1', '--prompt', '6*7?'],
    {
      encoding: 'utf8',
      env,
    },
  );
  assert.equal(one.status, 0, one.stderr);
  assert.deepEqual(sectionOrder(one.stdout), ['thinking', 'python', 'tool output', 'thinking', 'answer']);
  assert.match(one.stdout, /⇒ 42/);
  const many = spawnSync(process.execPath, ['bin/rstar2.js', 'chat', '--engine', 'fake:1'], {
    encoding: 'utf8',
    env,
    input: 'first\n\nsecond\n/exit\nthird\n',
  });
  assert.equal(many.status, 0, many.stderr);
  assert.equal(many.stdout.match(/── answer/g)?.length, 2); // blank line skipped, nothing after /exit
  const bad = spawnSync(process.execPath, ['bin/rstar2.js', 'chat', '--prompt', 'x'], {
    encoding: 'utf8',
    env,
  });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /exactly one of --model DIR or --engine URL/);
});

import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  type ChatExample,
  chatExampleFromRow,
  chatSegments,
  loadChatExamples,
  toolCallBlock,
} from '../../src/data/index.js';
import { answerText, toolCallText } from '../../src/recipe/tasks.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import { executePythonTool, PYTHON_TOOL_NAME } from '../../src/sandbox/tool.js';
import { ChatTemplate } from '../../src/tokenizer/index.js';
import { parseToolCalls } from '../../src/tokenizer/parser.js';

const SFT = 'data/samples/sft-arith-tools.jsonl';
const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
function file(name: string, text: string): string {
  const f = join(mkdtempSync(join(tmpdir(), 'rstar2-sft-')), name);
  writeFileSync(f, text);
  return f;
}
const call = (code: string, args: unknown = JSON.stringify({ code, input: '' })) => ({
  id: 'c1',
  type: 'function',
  function: { name: PYTHON_TOOL_NAME, arguments: args },
});

test('SFT fixture: segments are the text the quickstart demos and rollouts contain', async () => {
  const exs = await loadChatExamples(SFT);
  assert.equal(exs.length, 30);
  let calls = 0;
  for (const ex of exs) {
    const { prompt, segments } = chatSegments(ex);
    assert.deepEqual(
      prompt.map((m) => m.role),
      ['user'],
    );
    const last = segments.at(-1);
    assert.equal(last?.role, 'assistant');
    for (const s of segments) {
      if (s.role !== 'assistant') continue;
      const parsed = parseToolCalls(s.text);
      for (const c of parsed) {
        calls++;
        const code = (JSON.parse(c.arguments) as { code: string }).code;
        // + the end-of-turn token the renderer adds, a call turn is exactly recipe toolCallText
        const thought = s.text.slice(0, s.text.indexOf('</reason>'));
        assert.equal(`${s.text}<|im_end|>`, thought + toolCallText(code));
        assert.equal(c.name, PYTHON_TOOL_NAME);
      }
    }
    if (last?.role === 'assistant' && !last.text.includes('=')) {
      const gold = /\\boxed\{(\d+)\}/.exec(last.text)?.[1] ?? '';
      assert.equal(`${last.text}<|im_end|>`, answerText(gold));
    }
  }
  assert.equal(calls, 33);
  // arguments given as a JSON string (OpenAI) and as an object render the same
  const fromString = chatSegments(exs[0]).segments[0];
  assert.equal(
    fromString.role === 'assistant' && fromString.text,
    `62*85</reason>\n<tool_call>\n{"name":"python_code_with_standard_io","arguments":{"code":"print(62*85)","input":""}}\n</tool_call>`,
  );
  assert.equal(typeof exs[0].messages[1].tool_calls?.[0].function.arguments, 'object');
});

test('SFT fixture tool turns are what the sandboxed python tool returns', { timeout: 120_000 }, async () => {
  const exs = await loadChatExamples(SFT);
  const pool = await SandboxPool.start();
  try {
    for (const ex of exs) {
      const msgs = ex.messages;
      for (let i = 0; i < msgs.length; i++) {
        const c = msgs[i].tool_calls?.[0];
        if (!c) continue;
        const got = await executePythonTool(c.function.arguments, pool);
        const time = /execution time: \d+\.\d+s$/;
        assert.equal(msgs[i + 1].content.replace(time, ''), got.text.replace(time, ''));
      }
    }
  } finally {
    await pool.close();
  }
});

test("'template' style is what the chat templates render for a tool_calls message", () => {
  const ex: ChatExample = {
    messages: [
      { role: 'user', content: 'What is 12*34?' },
      {
        role: 'assistant',
        content: 'Let me compute.',
        tool_calls: [
          {
            type: 'function',
            function: { name: PYTHON_TOOL_NAME, arguments: { code: 'print(12*34)', input: '' } },
          },
        ],
      },
      { role: 'tool', content: 'Tool call success\nstdout: 408\n\nexecution time: 0.01s' },
      { role: 'assistant', content: 'The answer is \\boxed{408}.' },
    ],
  };
  const { segments } = chatSegments(ex, { toolCallStyle: 'template' });
  const first = segments[0];
  assert.equal(first.role, 'assistant');
  for (const name of ['qwen', 'rstar2']) {
    const rendered = ChatTemplate.named(name).render(ex.messages);
    assert.ok(
      first.role === 'assistant' && rendered.includes(`<|im_start|>assistant\n${first.text}<|im_end|>`),
      name,
    );
  }
  assert.equal(
    first.role === 'assistant' && first.text,
    'Let me compute.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(12*34)", "input": ""}}\n</tool_call>',
  );
});

test('tool calls: python arguments in rollout order with input filled; consecutive tool messages form one turn', () => {
  assert.equal(
    toolCallBlock(PYTHON_TOOL_NAME, { input: '5', code: 'print(input())' }),
    '<tool_call>\n{"name":"python_code_with_standard_io","arguments":{"code":"print(input())","input":"5"}}\n</tool_call>',
  );
  assert.equal(
    toolCallBlock('other', { b: 1, a: [1, 'x'] }, 'template'),
    '<tool_call>\n{"name": "other", "arguments": {"b": 1, "a": [1, "x"]}}\n</tool_call>',
  );
  const ex = chatExampleFromRow(
    {
      messages: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('print(1)'), call('print(2)')] },
        { role: 'tool', content: 'one' },
        { role: 'tool', content: 'two' },
        { role: 'assistant', content: 'done' },
      ],
    },
    'x:1',
  );
  const { prompt, segments } = chatSegments(ex);
  assert.equal(prompt.length, 2);
  assert.deepEqual(segments, [
    {
      role: 'assistant',
      text: [
        toolCallBlock(PYTHON_TOOL_NAME, { code: 'print(1)' }),
        toolCallBlock(PYTHON_TOOL_NAME, { code: 'print(2)' }),
      ].join('\n'),
      train: true,
    },
    { role: 'tool', texts: ['one', 'two'] },
    { role: 'assistant', text: 'done', train: true },
  ]);
  // a call already written into the content (as rollout text) is followed by its tool turn too
  const inline = chatSegments({
    messages: [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: toolCallBlock(PYTHON_TOOL_NAME, { code: 'print(1)' }) },
      { role: 'tool', content: 'Tool call success\nstdout: 1\n\nexecution time: 0.01s' },
      { role: 'assistant', content: '\\boxed{1}' },
    ],
  });
  assert.equal(inline.segments.length, 3);
});

test('instruction rows become one user and one assistant message', async () => {
  const f = file(
    'inst.jsonl',
    jsonl([
      { instruction: 'Add the numbers.', input: '2 and 3', output: '5' },
      { instruction: 'Say hi.', input: '', output: 'hi' },
      { prompt: 'What is 1+1?', response: '2' },
      { question: 'What is 2+2?', answer_text: '4' },
    ]),
  );
  const exs = await loadChatExamples(f);
  assert.deepEqual(
    exs.map((e) => e.messages),
    [
      [
        { role: 'user', content: 'Add the numbers.\n\n2 and 3' },
        { role: 'assistant', content: '5' },
      ],
      [
        { role: 'user', content: 'Say hi.' },
        { role: 'assistant', content: 'hi' },
      ],
      [
        { role: 'user', content: 'What is 1+1?' },
        { role: 'assistant', content: '2' },
      ],
      [
        { role: 'user', content: 'What is 2+2?' },
        { role: 'assistant', content: '4' },
      ],
    ],
  );
  assert.equal((await loadChatExamples(f, { limit: 2 })).length, 2);
});

test('bad SFT rows: errors name the line and the message field', async () => {
  const bad = async (row: unknown, re: RegExp) => {
    await assert.rejects(
      loadChatExamples(
        file(
          'bad.jsonl',
          `${JSON.stringify({
            messages: [
              { role: 'user', content: 'ok' },
              { role: 'assistant', content: 'ok' },
            ],
          })}\n${JSON.stringify(row)}\n`,
        ),
      ),
      re,
    );
  };
  await bad(
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('x', '{"code": ')] },
      ],
    },
    /bad\.jsonl:2: messages\[1\]\.tool_calls\[0\]\.function\.arguments: not valid JSON/,
  );
  await bad(
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('x', '[1]')] },
      ],
    },
    /bad\.jsonl:2: messages\[1\]\.tool_calls\[0\]\.function\.arguments: must be a JSON object, got an array/,
  );
  await bad(
    { messages: [{ role: 'human', content: 'q' }] },
    /bad\.jsonl:2: messages\[0\]\.role: must be one of system, user, assistant, tool, got "human"/,
  );
  await bad(
    { messages: [{ role: 'user', content: 3 }] },
    /bad\.jsonl:2: messages\[0\]\.content: must be a string, got a number/,
  );
  await bad(
    { messages: [{ role: 'user', content: 'q' }] },
    /bad\.jsonl:2: no assistant message to learn from/,
  );
  await bad(
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'tool', content: 'r' },
        { role: 'assistant', content: 'a' },
      ],
    },
    /bad\.jsonl:2: messages\[1\]: tool message before the first assistant message/,
  );
  await bad(
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: 'a' },
        { role: 'tool', content: 'r' },
      ],
    },
    /bad\.jsonl:2: messages\[2\]: tool message without a tool call before it/,
  );
  // a conversation that goes on after an answer, or ends on a call, loads (whole-conversation templates take
  // it); only the RL template, which renders an example as one rollout, refuses it
  const rlOnly = async (messages: unknown[], re: RegExp) => {
    const [ex] = await loadChatExamples(file('ok.jsonl', `${JSON.stringify({ messages })}\n`));
    assert.throws(() => chatSegments(ex), re);
  };
  await rlOnly(
    [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'a' },
      { role: 'user', content: 'more' },
      { role: 'assistant', content: 'b' },
    ],
    /messages\[2\]: user message after the first assistant message: a rollout has one prompt, so the RL template cannot render it \(render the stage with template: model or qwen/,
  );
  await rlOnly(
    [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: '', tool_calls: [call('print(1)')] },
    ],
    /the last assistant message calls a tool that never answers: a rollout runs every call/,
  );
  await bad({ instruction: 'x', output: '' }, /bad\.jsonl:2: field 'output' must be a non-empty string/);
  await bad(
    { text: 'x' },
    /bad\.jsonl:2: unknown SFT layout; fields seen: text; tried messages .*alpaca .*prompt-response .*question-answer/,
  );
  await assert.rejects(loadChatExamples(file('e.jsonl', '')), /no examples: .*e\.jsonl has no rows/);
});

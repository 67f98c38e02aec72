import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  calledToolNames,
  chatExampleFromRow,
  chatSegments,
  loadChatExamples,
  toolUse,
  unservedToolsWarning,
} from '../../src/data/index.js';
import { PYTHON_TOOL_NAME } from '../../src/tokenizer/index.js';

// SFT rows in the layouts the paper's kind of data is published in, read from rows as their publishers give them.
//
// glaive-toolcall-sharegpt.jsonl: rows 3, 11, 36, 123 and 135 of LLaMA-Factory's data/glaive_toolcall_en_demo.json
// (hiyouga/LLaMA-Factory at ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30), its ShareGPT layout as data/README.md
// there specifies it: `conversations` of {from: human|gpt|function_call|observation|system, value}, `tools` a JSON
// string of functions, optional `system`.
const GLAIVE = 'test/data/fixtures/glaive-toolcall-sharegpt.jsonl';
const PYTHON_ROW = 'test/data/fixtures/openai-python-tool.jsonl';

// The example row of Salesforce/xlam-function-calling-60k's dataset card (huggingface.co/datasets/Salesforce/
// xlam-function-calling-60k, "JSON Data Format for Query and Answers"), with `tools` and `answers` as the JSON
// strings the Hub's files hold.
const XLAM_ROW = {
  query: 'Where can I find live giveaways for beta access and games?',
  tools:
    '[{"name": "live_giveaways_by_type", "description": "Retrieve live giveaways from the GamerPower API based on the specified type.", "parameters": {"type": {"description": "The type of giveaways to retrieve (e.g., game, loot, beta).", "type": "str", "default": "game"}}}]',
  answers:
    '[{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}}, {"name": "live_giveaways_by_type", "arguments": {"type": "game"}}]',
};

// The tool-calling training row of OpenAI's fine-tuning format, as Microsoft's "Fine-tuning and tool calling"
// page gives it (learn.microsoft.com/en-us/azure/ai-services/openai/how-to/fine-tuning-functions): an assistant
// message with tool_calls and no content, arguments as a JSON string, `tools` beside `messages`.
const OPENAI_ROW = {
  messages: [
    { role: 'user', content: 'What is the weather in San Francisco?' },
    {
      role: 'assistant',
      tool_calls: [
        {
          id: 'call_id',
          type: 'function',
          function: {
            name: 'get_current_weather',
            arguments: '{"location": "San Francisco, USA", "format": "celsius"}',
          },
        },
      ],
    },
  ],
  tools: [
    {
      type: 'function',
      function: {
        name: 'get_current_weather',
        description: 'Get the current weather',
        parameters: {
          type: 'object',
          properties: {
            location: { type: 'string', description: 'The city and country, eg. San Francisco, USA' },
            format: { type: 'string', enum: ['celsius', 'fahrenheit'] },
          },
          required: ['location', 'format'],
        },
      },
    },
  ],
};

function file(rows: unknown[]): string {
  const f = join(mkdtempSync(join(tmpdir(), 'rstar2-sft-layouts-')), 'rows.jsonl');
  writeFileSync(f, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return f;
}

test('ShareGPT (Glaive tool-call rows): roles mapped, calls parsed, tools wrapped, multi-turn kept', async () => {
  const layouts = {};
  const exs = await loadChatExamples(GLAIVE, { layouts });
  assert.deepEqual(layouts, { sharegpt: 5 });
  const [area, tip, password, chat, refusal] = exs;
  // human, function_call, observation, gpt, three times: a user message after each answer
  assert.deepEqual(
    area.messages.map((m) => m.role),
    [
      'user',
      'assistant',
      'tool',
      'assistant',
      'user',
      'assistant',
      'tool',
      'assistant',
      'user',
      'assistant',
      'tool',
      'assistant',
    ],
  );
  assert.deepEqual(area.messages[1], {
    role: 'assistant',
    content: '',
    tool_calls: [
      {
        type: 'function',
        function: { name: 'calculate_area', arguments: { shape: 'rectangle', dimensions: [5, 3] } },
      },
    ],
  });
  assert.equal(area.messages[2].content, '{"area": 15}');
  // the row's functions as OpenAI tools, otherwise as written (key order too: it is what the model is shown)
  assert.deepEqual(
    area.tools?.map((t) => t.function.name),
    ['calculate_area', 'calculate_discount'],
  );
  assert.equal(area.tools?.[0].type, 'function');
  assert.deepEqual(Object.keys(area.tools?.[0].function ?? {}), ['name', 'description', 'parameters']);
  assert.deepEqual(calledToolNames(area), ['calculate_area', 'calculate_area', 'calculate_area']);
  assert.deepEqual(calledToolNames(tip), ['calculate_tip']);
  // a question answered in words first, then a call
  assert.deepEqual(
    password.messages.map((m) => m.role),
    ['user', 'assistant', 'user', 'assistant', 'tool', 'assistant'],
  );
  // "tools": "[]" is no tools: a plain chat row
  assert.equal(chat.tools, undefined);
  assert.ok(chat.messages.every((m) => m.role === 'user' || m.role === 'assistant'));
  // a tool offered and not called
  assert.deepEqual(calledToolNames(refusal), []);
  assert.deepEqual(
    refusal.tools?.map((t) => t.function.name),
    ['calculate_age'],
  );
});

test('xLAM (query, tools, answers as JSON strings): one user turn, the parallel calls, bare functions wrapped', () => {
  const ex = chatExampleFromRow(XLAM_ROW, 'xlam.jsonl:1');
  assert.deepEqual(ex.messages, [
    { role: 'user', content: XLAM_ROW.query },
    {
      role: 'assistant',
      content: '',
      tool_calls: [
        { type: 'function', function: { name: 'live_giveaways_by_type', arguments: { type: 'beta' } } },
        { type: 'function', function: { name: 'live_giveaways_by_type', arguments: { type: 'game' } } },
      ],
    },
  ]);
  // the parameters stay in xLAM's own notation ("type": "str"), as the model is to be shown them
  assert.deepEqual(ex.tools, [{ type: 'function', function: JSON.parse(XLAM_ROW.tools)[0] }]);
  // the same row with the lists as lists (a converted copy) reads the same
  const native = { ...XLAM_ROW, tools: JSON.parse(XLAM_ROW.tools), answers: JSON.parse(XLAM_ROW.answers) };
  assert.deepEqual(chatExampleFromRow(native, 'x'), ex);
  // it ends on the calls: a rollout would run them, so only the whole-conversation templates take it
  assert.throws(() => chatSegments(ex), /calls a tool that never answers: a rollout runs every call/);
});

test('OpenAI messages with tools: no content on a call, arguments parsed, the row tools kept as given', () => {
  const ex = chatExampleFromRow(OPENAI_ROW, 'openai.jsonl:1');
  assert.deepEqual(ex.messages[1], {
    role: 'assistant',
    content: '',
    tool_calls: [
      {
        type: 'function',
        id: 'call_id',
        function: {
          name: 'get_current_weather',
          arguments: { location: 'San Francisco, USA', format: 'celsius' },
        },
      },
    ],
  });
  assert.deepEqual(ex.tools, OPENAI_ROW.tools);
});

test('Hermes-style calls written in the text: a tool turn may follow them, and their names are read', () => {
  // the card's inference example (huggingface.co/datasets/NousResearch/hermes-function-calling-v1): a Python
  // dict in the <tool_call> block, the response in a `tool` turn
  const ex = chatExampleFromRow(
    {
      conversations: [
        { from: 'human', value: 'Fetch the stock fundamentals data for Tesla (TSLA)' },
        {
          from: 'gpt',
          value:
            "<tool_call>\n{'arguments': {'symbol': 'TSLA'}, 'name': 'get_stock_fundamentals'}\n</tool_call>",
        },
        {
          from: 'tool',
          value:
            '<tool_response>\n{"name": "get_stock_fundamentals", "content": {\'symbol\': \'TSLA\'}}\n</tool_response>',
        },
        { from: 'gpt', value: 'The stock fundamentals data for Tesla (TSLA) are as follows:' },
      ],
    },
    'hermes.jsonl:1',
  );
  assert.deepEqual(
    ex.messages.map((m) => m.role),
    ['user', 'assistant', 'tool', 'assistant'],
  );
  assert.deepEqual(calledToolNames(ex), ['get_stock_fundamentals']);
});

test('bad rows of the new layouts name the row, the field and what is expected', () => {
  const bad = (row: Record<string, unknown>, re: RegExp) =>
    assert.throws(() => chatExampleFromRow(row, 'f.jsonl:7'), re);
  bad(
    { conversations: [{ from: 'bot', value: 'x' }] },
    /f\.jsonl:7: conversations\[0\]\.from: must be one of human, user, gpt, assistant, system, observation, tool, function_call, got "bot"/,
  );
  bad(
    {
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'function_call', value: '{"name": "f", "arguments": ' },
      ],
    },
    /f\.jsonl:7: conversations\[1\]\.value: not valid JSON/,
  );
  bad(
    {
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'gpt', value: 'a' },
      ],
      tools: '{"name": "f"}',
    },
    /f\.jsonl:7: tools: must be a list of tools, got an object/,
  );
  bad(
    {
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'gpt', value: 'a' },
      ],
      tools: [{ description: 'd' }],
    },
    /f\.jsonl:7: tools\[0\]: expected \{type: 'function', function: \{name/,
  );
  bad({ ...XLAM_ROW, answers: '[]' }, /f\.jsonl:7: field 'answers' must be a non-empty list of calls/);
  bad(
    { ...XLAM_ROW, answers: '[{"arguments": {}}]' },
    /f\.jsonl:7: answers\[0\]: expected \{type: 'function', function: \{name, arguments\}\}/,
  );
  bad(
    {
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'gpt', value: 'a' },
        { from: 'observation', value: 'r' },
      ],
    },
    /f\.jsonl:7: messages\[2\]: tool message without a tool call before it/,
  );
  // ShareGPT's system column becomes the first message unless the conversation has its own
  const sys = chatExampleFromRow(
    {
      system: 'Be brief.',
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'gpt', value: 'a' },
      ],
    },
    'x',
  );
  assert.deepEqual(sys.messages[0], { role: 'system', content: 'Be brief.' });
});

test('tools the RL stages do not serve: counted, and the rollout tool under another name is pointed out', async () => {
  // an OpenAI-format row whose tool is named `python` (issue 43): it takes `code` as the rollout tool does
  const python = JSON.parse(readFileSync(PYTHON_ROW, 'utf8'));
  const exs = await loadChatExamples(file([python, python, OPENAI_ROW, XLAM_ROW]));
  const use = toolUse(exs);
  assert.deepEqual(use, [
    { name: 'live_giveaways_by_type', calls: 2, examples: 1, takesCode: false },
    { name: 'python', calls: 2, examples: 2, takesCode: true },
    { name: 'get_current_weather', calls: 1, examples: 1, takesCode: false },
  ]);
  const w = unservedToolsWarning(use, PYTHON_TOOL_NAME) ?? '';
  assert.match(
    w,
    /SFT data calls tools the RL stages do not serve: 'python' \(2 calls in 2 examples; it takes 'code'[\s\S]*\), 'live_giveaways_by_type' \(2 calls in 1 example\), 'get_current_weather'/,
  );
  assert.match(
    w,
    /'python' \(2 calls in 2 examples; it takes 'code' as the rollout tool does: tool\.name: python serves it/,
  );
  assert.match(w, /Rollouts serve only 'python_code_with_standard_io' \(recipe tool\.name\)/);
  assert.equal(unservedToolsWarning(toolUse(exs.slice(0, 2)), 'python'), null);
});

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { type ChatMessage, ChatTemplate, PYTHON_TOOL_SCHEMA } from '../../src/tokenizer/index.js';

const tmpDirs: string[] = [];
function tempDir(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}
after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

// Written out by hand from rstar2-reference.md §1.1-1.2 (system prompt, tools block with the pydantic-dumped
// schema under HF tojson separators, user prefix, generation prompt ending in <reason>).
const SYSTEM =
  'A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>.';
const TOOL_JSON =
  '{"type": "function", "function": {"name": "python_code_with_standard_io", "description": "Execute Python code with standard input and capture standard output. This function takes a Python code string and an input string, provides the input string through standard input (stdin) to the code, and captures and returns any output produced through standard output (stdout). If the executed code raises an exception, the error message will be captured and returned instead.", "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "A string containing Python code to be executed. The code can read from standard input using the input() function."}, "input": {"type": "string", "description": "A string that will be provided as standard input to the code when it calls input()."}}, "required": ["code", "input"]}}}';
const PREFIX =
  'You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n';
const Q = 'Find the sum of all integers $n$ such that $n^2 < 10$.';

const EXPECTED_PROMPT = `<|im_start|>system
${SYSTEM}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
${TOOL_JSON}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
${PREFIX}${Q}<|im_end|>
<|im_start|>assistant
<reason>`;

test('rstar2 template with the python tool renders the reference prompt byte for byte', () => {
  const out = ChatTemplate.named('rstar2').render([{ role: 'user', content: Q }], {
    tools: [PYTHON_TOOL_SCHEMA],
    addGenerationPrompt: true,
  });
  assert.equal(out, EXPECTED_PROMPT);
  assert.ok(out.includes('extracted automatically by the \\boxed{} tag.'));
});

test('rstar2 without tools, without generation prompt', () => {
  const out = ChatTemplate.named('rstar2').render([{ role: 'user', content: 'Q' }]);
  assert.equal(out, `<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\n${PREFIX}Q<|im_end|>\n`);
});

test('rstar2 merges consecutive tool messages into one user turn', () => {
  const msgs: ChatMessage[] = [
    { role: 'user', content: 'Q' },
    {
      role: 'assistant',
      content: 'think',
      tool_calls: [
        {
          type: 'function',
          function: { name: 'python_code_with_standard_io', arguments: { code: 'print(2)', input: '' } },
        },
      ],
    },
    { role: 'tool', content: 'Tool call success\nstdout: 2\n\nexecution time: 0.01s' },
    { role: 'tool', content: 'second' },
  ];
  const out = ChatTemplate.named('rstar2').render(msgs, { addGenerationPrompt: true });
  const tail =
    '<|im_start|>assistant\nthink\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(2)", "input": ""}}\n</tool_call><|im_end|>\n' +
    '<|im_start|>user\n<tool_response>\nTool call success\nstdout: 2\n\nexecution time: 0.01s\n</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n' +
    '<|im_start|>assistant\n<reason>';
  assert.ok(out.endsWith(tail), out);
});

test('rstar2 prefix quirk: on by default for assistant turns without tool calls, off by option', () => {
  const msgs: ChatMessage[] = [
    { role: 'user', content: 'Q' },
    { role: 'assistant', content: 'A' },
  ];
  const t = ChatTemplate.named('rstar2');
  assert.ok(t.render(msgs).endsWith(`<|im_start|>assistant\n${PREFIX}A<|im_end|>\n`));
  const fixed = t.render(msgs, { vars: { rstar2_prefix_quirk: false } });
  assert.ok(fixed.endsWith('<|im_start|>assistant\nA<|im_end|>\n'));
  assert.ok(fixed.includes(`<|im_start|>user\n${PREFIX}Q<|im_end|>`));
});

test('a supplied system message replaces the default system prompt', () => {
  const out = ChatTemplate.named('rstar2').render(
    [
      { role: 'system', content: 'SYS' },
      { role: 'user', content: 'Q' },
    ],
    { tools: [PYTHON_TOOL_SCHEMA] },
  );
  assert.ok(out.startsWith('<|im_start|>system\nSYS\n\n# Tools\n'));
  assert.ok(!out.includes(SYSTEM));
});

test('qwen template: default Qwen system prompt, no user prefix, plain generation prompt', () => {
  const out = ChatTemplate.named('qwen').render([{ role: 'user', content: 'Q' }], {
    addGenerationPrompt: true,
  });
  assert.equal(
    out,
    '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n',
  );
  const withTools = ChatTemplate.named('qwen').render([{ role: 'user', content: 'Q' }], {
    tools: [PYTHON_TOOL_SCHEMA],
  });
  assert.ok(withTools.includes(`<tools>\n${TOOL_JSON}\n</tools>`));
});

test('compact template keeps the structure and is short', () => {
  const t = ChatTemplate.named('compact');
  const bare = t.render([{ role: 'user', content: 'Q' }], { addGenerationPrompt: true });
  assert.ok(bare.startsWith('<|im_start|>system\n'));
  assert.ok(bare.endsWith('<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<reason>'));
  assert.ok(bare.length < 140, `compact prompt is ${bare.length} chars`);
  const tools = t.render([{ role: 'user', content: 'Q' }], {
    tools: [PYTHON_TOOL_SCHEMA],
    addGenerationPrompt: true,
  });
  assert.ok(tools.includes('python_code_with_standard_io(code, input)'));
  assert.ok(tools.includes('<tool_call>') && tools.includes('</tool_call>'));
  assert.ok(tools.length < 260, `compact prompt with tools is ${tools.length} chars`);
  const toolTurn = t.render([{ role: 'tool', content: 'out' }], { addGenerationPrompt: true });
  assert.ok(
    toolTurn.endsWith(
      '<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>',
    ),
  );
});

test('templates resolve by name, from a .jinja file and from tokenizer_config.json; bad specs are named', () => {
  const dir = tempDir('rstar2-tpl-');
  writeFileSync(join(dir, 't.jinja'), '{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}');
  writeFileSync(
    join(dir, 'tokenizer_config.json'),
    JSON.stringify({ chat_template: 'X{{ messages[0].content }}' }),
  );
  writeFileSync(join(dir, 'empty_config.json'), JSON.stringify({}));
  assert.equal(
    ChatTemplate.resolve(join(dir, 't.jinja')).render([{ role: 'user', content: 'hi' }]),
    '[user:hi]',
  );
  assert.equal(
    ChatTemplate.resolve(join(dir, 'tokenizer_config.json')).render([{ role: 'user', content: 'hi' }]),
    'Xhi',
  );
  assert.equal(ChatTemplate.resolve('rstar2').name, 'rstar2');
  assert.throws(() => ChatTemplate.resolve('nope'), /neither a name/);
  assert.throws(() => ChatTemplate.resolve(join(dir, 'empty_config.json')), /no chat_template/);
  assert.throws(() => ChatTemplate.named('llama'), /unknown chat template "llama"/);
  assert.throws(() => new ChatTemplate('{% if %}', 'broken'), /broken does not parse/);
});

test('bad messages get a clear error', () => {
  const t = ChatTemplate.named('rstar2');
  assert.throws(
    () => t.render([{ role: 'bot', content: 'x' } as unknown as ChatMessage]),
    /messages\[0\]\.role/,
  );
  assert.throws(
    () => t.render([{ role: 'user' } as unknown as ChatMessage]),
    /messages\[0\]\.content must be a string/,
  );
});

test('templates see the tokenizer bos/eos and can raise_exception', () => {
  const t = new ChatTemplate(
    "{{ bos_token }}{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}{{ messages[0].content }}{{ eos_token }}",
    'mini',
  );
  assert.equal(
    t.render([{ role: 'user', content: 'x' }], { vars: { bos_token: '<s>', eos_token: '</s>' } }),
    '<s>x</s>',
  );
  assert.equal(t.render([{ role: 'user', content: 'x' }]), 'x<|im_end|>');
  assert.throws(() => t.render([]), /chat template mini: no messages/);
});

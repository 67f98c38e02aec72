import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  type ChatMessage,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  TEMPLATE_NAMES,
} from '../../src/tokenizer/index.js';
import { findPython, PYTHON_DIR } from '../../src/util/index.js';

// Cross-check against Python Jinja2 set up as transformers' apply_chat_template; skipped where jinja2 is absent.
const PY = findPython();
const hasJinja = spawnSync(PY, ['-c', 'import jinja2'], { stdio: 'ignore' }).status === 0;

const tool = (content: string): ChatMessage => ({ role: 'tool', content });
const CASES: {
  messages: ChatMessage[];
  tools?: unknown[];
  add_generation_prompt?: boolean;
  vars?: object;
}[] = [
  {
    messages: [{ role: 'user', content: 'What is 1+1? Use "quotes", \\boxed{} and ünïcode.' }],
    tools: [PYTHON_TOOL_SCHEMA],
    add_generation_prompt: true,
  },
  { messages: [{ role: 'user', content: 'Q' }], add_generation_prompt: true },
  { messages: [{}] as unknown as ChatMessage[] },
  { messages: [tool('a'), tool('b')], add_generation_prompt: true },
  {
    messages: [
      { role: 'system', content: 'SYS' },
      { role: 'user', content: 'Q' },
      {
        role: 'assistant',
        content: '<reason>think',
        tool_calls: [
          {
            type: 'function',
            function: { name: 'python_code_with_standard_io', arguments: { code: 'print(1)', input: '' } },
          },
        ],
      },
      tool('Tool call success\nstdout: 1\n\nexecution time: 0.01s'),
      { role: 'assistant', content: 'done' },
      { role: 'system', content: 'late system' },
    ],
    tools: [PYTHON_TOOL_SCHEMA],
  },
  {
    messages: [
      { role: 'user', content: 'Q' },
      { role: 'assistant', content: 'A' },
    ],
    vars: { rstar2_prefix_quirk: false },
  },
];

for (const name of TEMPLATE_NAMES) {
  test(`${name} template: @huggingface/jinja renders the same bytes as Python Jinja2`, {
    skip: hasJinja ? false : 'python jinja2 not installed',
  }, () => {
    const tpl = ChatTemplate.named(name);
    const r = spawnSync(PY, [join(PYTHON_DIR, 'rstar2_tokenizer', 'render_chat_template.py')], {
      input: JSON.stringify({ template: tpl.source, cases: CASES }),
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    const expected = JSON.parse(r.stdout) as string[];
    CASES.forEach((c, i) => {
      const ours = (tpl as unknown as { renderRaw(m: object[], o: object): string }).renderRaw(c.messages, {
        tools: c.tools,
        addGenerationPrompt: c.add_generation_prompt,
        vars: c.vars,
      });
      assert.equal(ours, expected[i], `case ${i}`);
    });
  });
}

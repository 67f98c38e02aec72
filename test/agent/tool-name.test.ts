import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runTrajectory } from '../../src/agent/loop.js';
import { agentTemplate } from '../../src/agent/template.js';
import { FakeEngine } from '../../src/engines/fake.js';
import { Scheduler } from '../../src/engines/scheduler.js';
import {
  buildCharTokenizer,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  rolloutToolSchema,
  tokenizerFromFiles,
} from '../../src/tokenizer/index.js';
import { FakeRunner } from './helpers.js';

// The rollout tool under another name (recipe `tool`): the prompt shows that name and the loop runs calls to it,
// and only to it, as the reference answers a name it does not serve (`Error when executing tool: '<name>'`).

const tok = tokenizerFromFiles(buildCharTokenizer({ template: 'rstar2' }));
const call = (name: string) =>
  `<tool_call>\n{"name": "${name}", "arguments": {"code": "print(6*7)", "input": ""}}\n</tool_call><|im_end|>`;

async function rollout(tools: (typeof PYTHON_TOOL_SCHEMA)[] | undefined, called: string) {
  const template = agentTemplate(tok, { chat: ChatTemplate.named('rstar2'), tools });
  const engine = new FakeEngine((ids) => {
    const done = tok.decode(ids).includes('<tool_response>');
    return {
      outputIds: tok.encode(done ? '</reason> \\boxed{42}<|im_end|>' : call(called), {
        addSpecialTokens: false,
      }),
    };
  });
  const scheduler = await Scheduler.create([engine], { pollMs: 0 });
  const runner = new FakeRunner();
  try {
    const t = await runTrajectory({ id: 'p', question: 'What is 6*7?' }, 0, scheduler, { template, runner });
    const result = t.events.find((e) => e.kind === 'tool_result');
    return {
      prompt: tok.decode(t.promptIds),
      runner,
      result: result?.kind === 'tool_result' ? result.text : '',
    };
  } finally {
    await scheduler.close();
  }
}

test("a renamed rollout tool: the prompt's schema and the executor follow the name", async () => {
  const python = rolloutToolSchema('python');
  assert.equal(python.function.name, 'python');
  assert.equal(python.function.description, PYTHON_TOOL_SCHEMA.function.description);
  const served = await rollout([python], 'python');
  assert.match(
    served.prompt,
    /<tools>\n\{"type": "function", "function": \{"name": "python", "description": "Execute Python code/,
  );
  assert.doesNotMatch(served.prompt, /python_code_with_standard_io/);
  assert.equal(served.runner.requests.length, 1);
  const other = await rollout([python], 'python_code_with_standard_io');
  assert.equal(other.runner.requests.length, 0);
  assert.equal(other.result, "Error when executing tool: 'python_code_with_standard_io'");
  // and by default, the reference's name as before
  const dflt = await rollout(undefined, 'python_code_with_standard_io');
  assert.equal(dflt.runner.requests.length, 1);
  assert.equal(agentTemplate(tok).toolNames?.join(), 'python_code_with_standard_io');
});

test('a rollout tool schema must take what the sandbox runs: code, and input at most', () => {
  const schema = (name: string, properties: object, required: string[]) => ({
    type: 'function',
    function: { name, description: 'Run code', parameters: { type: 'object', properties, required } },
  });
  const ok = rolloutToolSchema('run', schema('run', { code: { type: 'string' } }, ['code']));
  assert.equal(ok.function.description, 'Run code');
  assert.throws(
    () => rolloutToolSchema('run', schema('exec', { code: {} }, ['code'])),
    /tool\.schema names "exec" but tool\.name is "run"/,
  );
  assert.throws(
    () => rolloutToolSchema('run', schema('run', { script: {} }, ['script'])),
    /the sandbox runs the call's 'code' argument, and the schema has no 'code' parameter \(it has: script\)/,
  );
  assert.throws(
    () => rolloutToolSchema('run', schema('run', { code: {}, lang: {} }, ['code', 'lang'])),
    /tool\.schema: requires lang, which the sandbox does not take/,
  );
  assert.throws(() => rolloutToolSchema('has space'), /tool\.name "has space": 1-64 letters/);
});

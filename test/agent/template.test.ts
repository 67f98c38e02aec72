import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runTrajectory } from '../../src/agent/loop.js';
import { agentTemplate } from '../../src/agent/template.js';
import { FakeEngine } from '../../src/engines/fake.js';
import { Scheduler } from '../../src/engines/scheduler.js';
import { buildCharTokenizer, ChatTemplate, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { CALL, FakeRunner } from './helpers.js';

test('with the real tokenizer + rStar2 template, the trajectory equals prompt ⧺ turns, tool turn right after <|im_end|>', async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const tpl = agentTemplate(tok);
  const prompt = tpl.promptIds('What is 1+1?');
  assert.ok(tok.decode(prompt).endsWith('<|im_start|>assistant\n<reason>'));
  assert.ok(tok.decode(prompt).includes('python_code_with_standard_io'));
  const turns = [`compute${CALL}<|im_end|>`, '</reason> <answer>\\boxed{2}</answer><|im_end|>'];
  let k = 0;
  const e = new FakeEngine(() => ({ outputIds: tok.encode(turns[k++], { addSpecialTokens: false }) }));
  const s = await Scheduler.create([e], { pollMs: 0 });
  const t = await runTrajectory({ id: 'p', question: 'What is 1+1?' }, 0, s, {
    template: tpl,
    runner: new FakeRunner(),
  });
  await s.close();
  assert.equal(t.finish, 'answered');
  assert.match(t.text, /<\|im_end\|><\|im_start\|>user\n<tool_response>\nTool call success\nstdout: 2\n/);
  assert.ok(t.text.includes('</tool_response><|im_end|>\n<|im_start|>assistant\n<reason></reason>'));
  const chat = ChatTemplate.named('rstar2');
  const tool = t.events.find((x) => x.kind === 'tool_result');
  assert.ok(tool && tool.kind === 'tool_result');
  assert.deepEqual(t.responseIds.slice(tool.start, tool.end), chat.toolTurnIds(tok, [tool.text]));
});

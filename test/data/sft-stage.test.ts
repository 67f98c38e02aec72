import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import YAML from 'yaml';
import { loadRecipe, parseRecipe, recipeTool } from '../../src/recipe/config.js';
import { sectionExamples, weightedPicker } from '../../src/recipe/data.js';
import { dryRun } from '../../src/recipe/dry-run.js';
import { Rng } from '../../src/util/rng.js';

// An SFT stage as a recipe gives it: a template per stage, several files of any layout mixed by weight (the paper's
// 165K function-calling + 30K instruction-following + 27K chat), and the rollout tool its prompts name.

const GLAIVE = 'test/data/fixtures/glaive-toolcall-sharegpt.jsonl'; // provenance in sft-layouts.test.ts
const PYTHON_ROW = 'test/data/fixtures/openai-python-tool.jsonl';
const tmp = () => mkdtempSync(join(tmpdir(), 'rstar2-sft-stage-'));
const jsonl = (dir: string, name: string, rows: unknown[]) => {
  const f = join(dir, name);
  writeFileSync(f, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return f;
};
const chat = (q: string, a: string) => ({
  messages: [
    { role: 'user', content: q },
    { role: 'assistant', content: a },
  ],
});
const xlam = {
  query: 'Where can I find live giveaways for beta access and games?',
  tools: '[{"name": "live_giveaways_by_type", "description": "Retrieve live giveaways.", "parameters": {}}]',
  answers: '[{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}}]',
};
const recipe = (sft: object, more: object = {}) =>
  parseRecipe({ stages: [{ type: 'sft', ...sft }, { type: 'rl' }], ...more }, 'test');

test('a mixed SFT stage: three files of three layouts drawn 165 : 30 : 27, each rendered with the stage template', async () => {
  const d = tmp();
  const files = [
    jsonl(d, 'function-calling.jsonl', [xlam, xlam]),
    jsonl(d, 'instructions.jsonl', [{ instruction: 'Say hi.', output: 'Hi.' }]),
    GLAIVE,
  ];
  const r = recipe({ template: 'qwen', data: { files, weights: [165, 30, 27] } });
  const st = r.stages[0];
  assert.ok(st.type === 'sft');
  assert.equal(st.template, 'qwen');
  const exs = await sectionExamples(files, null, st.data.weights);
  assert.equal(exs.length, 8);
  const pick = weightedPicker(exs, st.data.weights);
  const rng = new Rng(7);
  const n = 22_200;
  const counts = [0, 0, 0];
  for (let i = 0; i < n; i++) counts[(pick(rng) as { entry: number }).entry]++;
  // binomial standard deviations of these shares are 0.002-0.003; 0.015 is five of them
  [165 / 222, 30 / 222, 27 / 222].forEach((p, i) => {
    assert.ok(Math.abs(counts[i] / n - p) < 0.015, `file ${i}: ${counts[i] / n} of draws, weight ${p}`);
  });
});

test('stage template and rollout tool: defaults as before, choices checked, a schema file read into the recipe', () => {
  const quick = loadRecipe('quickstart');
  for (const st of quick.stages) if (st.type === 'sft') assert.equal(st.template, 'rl');
  assert.deepEqual(quick.tool, { enabled: true, name: 'python_code_with_standard_io', schema: null });
  assert.equal(recipeTool(quick).function.name, 'python_code_with_standard_io');
  assert.throws(
    () => recipe({ template: 'chatml' }),
    /stages\.sft\.template: Invalid option: expected one of "rl"\|"model"\|"qwen"/,
  );
  // the paper's mix from the command line: data.sft fills the stage's files, the stage's weights go beside them
  const paper = parseRecipe(
    { stages: [{ type: 'sft', template: 'model', data: { generate: false } }] },
    'p',
    {
      set: ['data.sft=[fc.jsonl, if.jsonl, chat.jsonl]', 'stages.sft.data.weights=[165, 30, 27]'],
    },
  );
  assert.deepEqual(paper.stages[0].data.files, ['fc.jsonl', 'if.jsonl', 'chat.jsonl']);
  assert.deepEqual(paper.stages[0].data.weights, [165, 30, 27]);
  assert.throws(
    () => parseRecipe(paper, 'p', { set: ['stages.sft.data.weights=[165, 30]'] }),
    /stage sft: data\.weights needs one weight per entry of data\.files \(3\)/,
  );
  const renamed = recipe({}, { tool: { name: 'python' } });
  assert.equal(recipeTool(renamed).function.name, 'python');
  assert.throws(
    () => recipe({}, { tool: { name: 'python', schema: { type: 'function' } } }),
    /invalid recipe test: tool\.schema: expected/,
  );
  // a schema file beside the recipe, by a relative path; the run's config keeps the schema itself
  const d = tmp();
  const schema = {
    type: 'function',
    function: {
      name: 'execute_python_code_with_standard_io',
      description: 'Run Python code.',
      parameters: {
        type: 'object',
        properties: { code: { type: 'string' }, input: { type: 'string' } },
        required: ['code'],
      },
    },
  };
  writeFileSync(join(d, 'tool.json'), JSON.stringify(schema));
  writeFileSync(
    join(d, 'r.yaml'),
    YAML.stringify({
      tool: { name: 'execute_python_code_with_standard_io', schema: 'tool.json' },
      stages: [{ type: 'rl' }],
    }),
  );
  const fromFile = loadRecipe(join(d, 'r.yaml'));
  assert.deepEqual(fromFile.tool.schema, schema);
  assert.deepEqual(recipeTool(fromFile), schema);
  writeFileSync(
    join(d, 'r2.yaml'),
    YAML.stringify({ tool: { schema: 'missing.json' }, stages: [{ type: 'rl' }] }),
  );
  assert.throws(() => loadRecipe(join(d, 'r2.yaml')), /tool\.schema: no such file .*missing\.json/);
});

test('the dry run renders every SFT example with its stage template and warns of tools the rollouts do not serve', async () => {
  const d = tmp();
  // issue 43: an OpenAI-format file whose tool is named `python`, and a multi-turn ShareGPT file
  const files = [PYTHON_ROW, jsonl(d, 'chat.jsonl', [chat('Hi', 'Hello.')]), GLAIVE];
  const run = async (sft: object, more: object = {}) => {
    const out: string[] = [];
    await dryRun(recipe({ ...sft, data: { files } }, more), { log: (l) => out.push(l) });
    return out.join('\n');
  };
  const text = await run({ template: 'qwen' });
  assert.match(text, /\[sft\] sft: 7 chat examples, template qwen; the first \d+ tokens, \d+ trained/);
  assert.match(
    text,
    /\[sft\] warning: SFT data calls tools the RL stages do not serve: 'python' \(1 call in 1 example; it takes 'code' as the rollout tool does: tool\.name: python serves it under that name\), 'calculate_area' \(3 calls in 1 example\), 'calculate_tip'/,
  );
  // served under that name, python is no longer named
  assert.doesNotMatch(await run({ template: 'qwen' }, { tool: { name: 'python' } }), /'python' \(\d+ call/);
  // the RL template cannot render the multi-turn rows: the dry run says which example and why
  await assert.rejects(
    run({ template: 'rl' }),
    /\[sft\] SFT example 2 of .*: messages\[4\]: user message after the first assistant message: a rollout has one prompt/,
  );
});

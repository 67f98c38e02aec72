import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// `rstar2 data inspect --sft`: each layout's first examples exactly as a stage renders them, the trained text
// marked, and the tools the data calls against the one rollouts serve.

const GLAIVE = 'test/data/fixtures/glaive-toolcall-sharegpt.jsonl'; // provenance in sft-layouts.test.ts
const cli = (...args: string[]) =>
  spawnSync(process.execPath, ['bin/rstar2.js', 'data', 'inspect', '--sft', ...args], {
    encoding: 'utf8',
    timeout: 120_000,
  });

test('ShareGPT under qwen: the rendered text with the assistant turns marked, the tools and the warning', () => {
  const r = cli(GLAIVE, '--template', 'qwen', '--show', '1');
  assert.equal(r.status, 0, r.stderr);
  assert.match(
    r.stdout,
    /examples: 5 {2}assistantTurns: 17 {2}toolTurns: 5 {2}withToolCalls: 3 {2}withOwnTools: 4/,
  );
  assert.match(r.stdout, /layout: sharegpt \(5 rows\)/);
  assert.match(r.stdout, /tools called: calculate_area ×3, calculate_tip ×1, generate_random_password ×1/);
  assert.match(r.stdout, /warning: SFT data calls tools the RL stages do not serve: 'calculate_area'/);
  assert.match(r.stdout, /--- example 1 in 6 spans; its tools: calculate_area, calculate_discount/);
  assert.match(
    r.stdout,
    /<\|im_start\|>assistant\n⟦The area of the rectangle with length 5 units and breadth 3 units is 15 square units\.<\|im_end\|>⟧\n<\|im_start\|>user\nWhat about a circle/,
  );
  const j = JSON.parse(cli(GLAIVE, '--template', 'qwen', '--show', '5', '--json').stdout);
  assert.deepEqual(
    j.first.map((ex: { pieces: { train: boolean }[] }) => ex.pieces.filter((p) => p.train).length),
    [6, 2, 3, 5, 1], // the gpt and function_call turns of each row
  );
});

test('xLAM under the model template with a tokenizer: token counts; an OpenAI call-only row under rl is refused', () => {
  const d = mkdtempSync(join(tmpdir(), 'rstar2-sft-cli-'));
  // the dataset card's example row (see sft-layouts.test.ts)
  const xlam = join(d, 'xlam.jsonl');
  writeFileSync(
    xlam,
    `${JSON.stringify({
      query: 'Where can I find live giveaways for beta access and games?',
      tools:
        '[{"name": "live_giveaways_by_type", "description": "Retrieve live giveaways from the GamerPower API based on the specified type.", "parameters": {"type": {"description": "The type of giveaways to retrieve (e.g., game, loot, beta).", "type": "str", "default": "game"}}}]',
      answers:
        '[{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}}, {"name": "live_giveaways_by_type", "arguments": {"type": "game"}}]',
    })}\n`,
  );
  const r = cli(xlam, '--template', 'model', '--tokenizer', 'qwen3', '--json');
  assert.equal(r.status, 0, r.stderr);
  const j = JSON.parse(r.stdout);
  assert.deepEqual(j.layouts, { xlam: 1 });
  const [ex] = j.first;
  const trained = ex.pieces.filter((p: { train: boolean }) => p.train);
  assert.equal(trained.length, 1);
  assert.equal(
    trained[0].text,
    '<think>\n\n</think>\n\n<tool_call>\n{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}}\n</tool_call>\n<tool_call>\n{"name": "live_giveaways_by_type", "arguments": {"type": "game"}}\n</tool_call><|im_end|>',
  );
  assert.ok(ex.pieces.every((p: { tokens: number }) => p.tokens > 0));
  const rl = cli(xlam, '--show', '1');
  assert.equal(rl.status, 1);
  assert.match(
    rl.stderr,
    /example 1: template rl: the last assistant message calls a tool that never answers/,
  );
  const model = cli(xlam, '--template', 'model');
  assert.match(
    model.stderr,
    /--template model renders with the model's own chat template: give --tokenizer DIR/,
  );
});

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { loadRecipe, parseRecipe } from '../../src/recipe/config.js';
import { dryRun, memoryPlan, parameterCount } from '../../src/recipe/dry-run.js';
import { MODEL_PRESETS } from '../../src/worker/presets.js';
import { QWEN3_14B } from '../worker/helpers.js';

const SAMPLES = join(import.meta.dirname, '../../data/samples');
const tmp = () => mkdtempSync(join(tmpdir(), 'rstar2-dry-'));
const lines = async (r: ReturnType<typeof parseRecipe>) => {
  const out: string[] = [];
  await dryRun(r, { log: (l) => out.push(l) });
  return out;
};

test('dry run of tiny-files: tokenizer, data counts after each filter, first prompts, sandbox; trains nothing', async () => {
  const out = await lines(loadRecipe('tiny-files', { set: ['stages.rl.data.maxPromptTokens=108'] }));
  const text = out.join('\n');
  assert.match(text, /tokenizer: vocab \d+ \(bpe, preset\); template compact/);
  assert.match(text, /\[sft\] sft: 30 chat examples/);
  // the prompt-length filter drops some rows, not all
  assert.match(
    text,
    /\[rl\] rl: 60 rows; answer is not an integer: -0 -> 60; duplicate question: -0 -> 60; prompt longer than 108 tokens: -[1-9]\d* -> [1-9]\d*/,
  );
  assert.match(text, /\[rl\] first prompt \d+ tokens: ".*<\|im_start\|>user\\n/);
  assert.match(
    text,
    // the memory and process limits in force: the kernel's (a cgroup per slot) or polled
    /sandbox: ok \(bubblewrap, 1024 MiB a call, (memory polled|memory and processes held by cgroup v[12]); computing calls past 50 ms demoted( with their session)?\)/,
  );
  assert.equal(out.at(-1), 'dry run ok: nothing was trained');
});

test('tool.enabled false: the first prompt shows no tool (default: the tool line of the template)', async () => {
  const first = (out: string[]) => out.find((l) => l.startsWith('[rl] first prompt')) ?? '';
  const on = first(await lines(loadRecipe('tiny-files')));
  const off = first(await lines(loadRecipe('tiny-files', { set: ['tool.enabled=false'] })));
  assert.match(on, /Tools: python_code_with_standard_io\(code, input\)/);
  assert.match(off, /first prompt \d+ tokens: ".*<\|im_start\|>user\\n/);
  assert.doesNotMatch(off, /Tools:|tool_call|python_code_with_standard_io/);
});

test('sandbox.preload: the dry run preloads what the recipe names and refuses what does not import', async () => {
  const ok = await lines(loadRecipe('tiny-files', { set: ['sandbox.preload=[json, decimal]'] }));
  assert.match(
    ok.join('\n'),
    /sandbox: ok \(bubblewrap, 1024 MiB a call, (memory polled|memory and processes held by cgroup v[12]); preloaded json, decimal, zygote \d+ MiB; computing calls past 50 ms demoted( with their session)?\)/,
  );
  await assert.rejects(
    lines(loadRecipe('tiny-files', { set: ['sandbox.preload=[no_such_module_xyz]'] })),
    /sandbox\.preload: preload failed: no_such_module_xyz: ModuleNotFoundError/,
  );
  assert.throws(
    () => loadRecipe('tiny-files', { set: ['sandbox.preload=["os; rm"]'] }),
    /sandbox\.preload.*a module name/s,
  );
});

test('sandbox.demoteAfterMs: 50 unless the recipe says otherwise; 0 turns demotion off; a negative one is named', async () => {
  const off = await lines(loadRecipe('tiny-files', { set: ['sandbox.demoteAfterMs=0'] }));
  assert.match(
    off.join('\n'),
    /sandbox: ok \(bubblewrap, 1024 MiB a call, (memory polled|memory and processes held by cgroup v[12]); no demotion\)/,
  );
  assert.throws(
    () => loadRecipe('tiny-files', { set: ['sandbox.demoteAfterMs=-1'] }),
    /sandbox\.demoteAfterMs/,
  );
});

test('the memory plan counts parameters as the worker builds them', () => {
  // counted from the worker's own torch modules (python/rstar2_worker/models/model.py) for the same configs
  const tiny = { ...MODEL_PRESETS.tiny };
  assert.equal(parameterCount(tiny), 854_144);
  const small3 = { ...MODEL_PRESETS['tiny-qwen3'], vocab_size: 1000, tie_word_embeddings: false };

  assert.equal(parameterCount(small3), 226_688);
  const q14 = QWEN3_14B; // published size 14.8B
  assert.ok(Math.abs(parameterCount(q14) / 1e9 - 14.77) < 0.01, String(parameterCount(q14)));
  const model = (m: Record<string, unknown>) =>
    parseRecipe({ model: m, stages: [{ type: 'sft', steps: 1 }] }).model;
  const fp32 = memoryPlan(q14, model({})).join('\n');
  assert.match(
    fp32,
    /per rank \(fp32, ddp over 1\): weights 55\.0 GiB \+ gradients 55\.0 GiB \+ AdamW state 110\.0 GiB/,
  );
  // the paper's layout: bf16-mixed, sharded over 8 ranks, 20K-token packed micro-batches, checkpointing
  const paper = model({
    precision: 'bf16-mixed',
    sharding: 'fsdp',
    nprocPerNode: 8,
    maxTokensPerMicroBatch: 20480,
    gradientCheckpointing: true,
  });
  const lines8 = memoryPlan(q14, paper).join('\n');
  assert.match(
    lines8,
    /per rank \(bf16-mixed, fsdp over 8\): weights 3\.4 GiB \+ gradients 3\.4 GiB \+ AdamW state 20\.6 GiB \+ gathered 8\.3 GiB/,
  );
  assert.match(lines8, /a 20480-token micro-batch, checkpointed per layer: /);
});

test('bad input is named: model dir, data layout, a row without an answer', async () => {
  const d = tmp();
  const model = join(d, 'model');
  mkdirSync(model);
  const base = { name: 'x', eval: { n: 2 }, stages: [{ type: 'rl', steps: 1 }] };
  await assert.rejects(
    lines(parseRecipe({ ...base, model: { path: model } })),
    /model.path .*model: no config.json/,
  );
  writeFileSync(join(model, 'config.json'), '{}');
  await assert.rejects(lines(parseRecipe({ ...base, model: { path: model } })), /no weights/);

  const odd = join(d, 'odd.jsonl');
  writeFileSync(odd, `${JSON.stringify({ text: 'hi', label: 3 })}\n`);
  await assert.rejects(
    lines(parseRecipe({ ...base, stages: [{ type: 'rl', data: { files: [odd] } }] })),
    (e: Error) => e.message.includes('odd.jsonl:1') && /text/.test(e.message),
  );
  const noAnswer = join(d, 'q.jsonl');
  writeFileSync(noAnswer, `${JSON.stringify({ problem: 'What is 1+1?' })}\n`);
  await assert.rejects(
    lines(parseRecipe({ ...base, stages: [{ type: 'rl', data: { files: [noAnswer] } }] })),
    /q\.jsonl:1.*answer/,
  );
  assert.throws(
    () => parseRecipe({ ...base, stages: [{ type: 'rl', data: { generate: false } }] }),
    /stage rl has no data: give stages.rl.data.files/,
  );
  await assert.rejects(
    lines(
      parseRecipe({
        ...base,
        stages: [{ type: 'sft', data: { files: [join(SAMPLES, 'dapo-arith.jsonl')] } }],
      }),
    ),
    /dapo-arith\.jsonl:1/,
  );
});

test("a model_type the built-in model cannot load fails the dry run as the worker's load would", async () => {
  const model = join(tmp(), 'llama');
  mkdirSync(model);
  writeFileSync(join(model, 'config.json'), JSON.stringify({ model_type: 'llama' }));
  const base = { name: 'x', eval: { n: 2 }, stages: [{ type: 'rl', steps: 1 }] };
  await assert.rejects(
    lines(parseRecipe({ ...base, model: { path: model } })),
    /config\.json: model_type 'llama' is not supported by the built-in model \(qwen2, qwen3\); model\.backend 'transformers'/,
  );
  // transformers loads it: the dry run goes on to the next check
  await assert.rejects(
    lines(parseRecipe({ ...base, model: { path: model, backend: 'transformers' } })),
    /no weights/,
  );
});

test('an unknown --policy-backend fails --dry-run as the run would, and makes no run directory', () => {
  const bin = join(import.meta.dirname, '../../bin/rstar2.js');
  const out = join(tmp(), 'run');
  for (const extra of [['--dry-run'], ['--out', out]]) {
    const r = spawnSync(
      process.execPath,
      [bin, 'train', '--recipe', 'quickstart', '--policy-backend', 'fakee', ...extra],
      { encoding: 'utf8' },
    );
    assert.equal(r.status, 1);
    assert.match(r.stderr, /unknown --policy-backend fakee \(choose: embedded, fake\)/);
  }
  assert.equal(existsSync(out), false);
});

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { serve } from '../../src/engines/serve.js';
import { checkRunnable, parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { initModelDir } from '../../src/worker/index.js';

// Issue 56 item 6: a damaged or missing model directory is an error naming the file and what is wrong with it, and
// never a run on something else (a preset model, a default config).

test('model.path and rstar2 serve --model: a config.json that is no JSON is named before any worker starts; a missing directory is refused', {
  timeout: 120_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-model-dir-'));
  const m = join(root, 'model');
  try {
    await initModelDir({ preset: 'tiny', out: m, seed: 1, worker: { threads: 1 } });
    const recipe = parseRecipe({
      name: 'model-dir',
      model: { path: m, threads: 1 },
      stages: [{ type: 'sft', steps: 1, batchSize: 2, demos: 4 }],
    });
    writeFileSync(join(m, 'config.json'), '{"model_type": "qwen2", "vocab_size": ');
    // the old reader threw JSON.parse's own "Unexpected end of JSON input", naming no file
    await assert.rejects(EmbeddedPolicy.create(recipe), (e: Error) => {
      assert.ok(e.message.startsWith(`${join(m, 'config.json')}: invalid JSON`), e.message);
      return true;
    });
    // rstar2 serve reads it before it starts its worker (it threw JSON.parse's message too)
    await assert.rejects(serve({ model: m, port: 0, log: () => {} }), (e: Error) => {
      assert.ok(e.message.startsWith(`${join(m, 'config.json')}: invalid JSON`), e.message);
      return true;
    });
    rmSync(m, { recursive: true });
    await assert.rejects(
      serve({ model: m, port: 0, log: () => {} }),
      new RegExp(`--model ${m}: no such directory`),
    );
    assert.throws(() => checkRunnable(recipe), new RegExp(`model.path ${m}: no such directory`));
    await assert.rejects(EmbeddedPolicy.create(recipe), new RegExp(`model.path ${m}: no such directory`));
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

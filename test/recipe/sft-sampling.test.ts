import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { ChatExample } from '../../src/data/index.js';
import { parseRecipe, runConfig } from '../../src/recipe/config.js';
import { FakePolicy } from '../../src/recipe/fake.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';

process.env.RSTAR2_NO_PROGRESS = '1';

// 40 distinct one-turn examples; example i's question is "q<i>" and its rendered length 10 + i tokens (sftTokens)
const N = 40;
const dataFile = (() => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-sft-data-'));
  const file = join(dir, 'sft.jsonl');
  const rows = Array.from({ length: N }, (_, i) => ({
    messages: [
      { role: 'user', content: `q${i}` },
      { role: 'assistant', content: `\\boxed{${i}}` },
    ],
  }));
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return file;
})();

const id = (ex: ChatExample) => Number(String(ex.messages[0].content).slice(1));

class Recording extends FakePolicy {
  batches: number[][] = [];
  dieAt = 0;
  override async sftStep(e: ChatExample[], o: Parameters<FakePolicy['sftStep']>[1]) {
    if (this.dieAt && this.batches.length === this.dieAt) throw new Error('simulated kill');
    this.batches.push(e.map(id));
    return super.sftStep(e, o);
  }
  sftTokens(ex: ChatExample): number {
    return 10 + id(ex);
  }
}

const recipe = (sft: Record<string, unknown>) =>
  parseRecipe(
    {
      name: 't',
      seed: 5,
      eval: { n: 4 },
      stages: [
        {
          type: 'sft',
          steps: 10,
          batchSize: 8,
          checkpointEvery: 2,
          lr: 0.01,
          data: { files: [dataFile] },
          ...sft,
        },
      ],
    },
    't',
  );
const quiet = { log: () => {}, progress: false };

test("SFT's default sampler sees every example once an epoch, in a new order each epoch, and resumes exactly", async () => {
  assert.equal(recipe({}).stages[0].type === 'sft' && recipe({}).stages[0].sampler, 'epoch');
  const b = new Recording();
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-sft-epoch-'));
  await new Trainer(recipe({}), dir, b, quiet).run();
  assert.equal(b.batches.length, 10);
  const epoch1 = b.batches.slice(0, 5).flat();
  const epoch2 = b.batches.slice(5).flat();
  const all = Array.from({ length: N }, (_, i) => i);
  assert.deepEqual(
    [...epoch1].sort((x, y) => x - y),
    all,
  );
  assert.deepEqual(
    [...epoch2].sort((x, y) => x - y),
    all,
  );
  assert.notDeepEqual(epoch1, epoch2);
  const m = readJsonl<Record<string, number>>(join(dir, 'metrics.jsonl'));
  assert.deepEqual(
    m.map((r) => r.epoch),
    [0.2, 0.4, 0.6, 0.8, 1, 1.2, 1.4, 1.6, 1.8, 2],
  );
  // killed in step 4 (after the step-2 checkpoint): the resumed run draws steps 3-10 as the whole run did
  const cut = mkdtempSync(join(tmpdir(), 'rstar2-sft-cut-'));
  const dies = new Recording();
  dies.dieAt = 3;
  await assert.rejects(new Trainer(recipe({}), cut, dies, quiet).run(), /simulated kill/);
  const again = new Recording();
  await new Trainer(recipe({}), cut, again, quiet).run(true);
  assert.deepEqual(again.batches, b.batches.slice(2));
  // a run directory from before sampler and maxTokens existed resumes as it drew: independently, every length
  const saved = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  delete saved.stages[0].sampler;
  delete saved.stages[0].maxTokens;
  const old = parseRecipe(runConfig(saved), 'config.json').stages[0];
  assert.ok(old.type === 'sft');
  assert.deepEqual([old.sampler, old.maxTokens], ['independent', null]);
});

test("SFT sampler 'independent' draws with replacement (repeats within an epoch's worth of steps)", async () => {
  const b = new Recording();
  await new Trainer(
    recipe({ sampler: 'independent' }),
    mkdtempSync(join(tmpdir(), 'rstar2-sft-ind-')),
    b,
    quiet,
  ).run();
  const first = b.batches.slice(0, 5).flat();
  assert.ok(new Set(first).size < N, `${new Set(first).size} distinct of ${first.length} draws`);
});

test('SFT maxTokens drops longer examples before training and says how many; a batch larger than the data is refused', async () => {
  const logs: string[] = [];
  const b = new Recording();
  const r = recipe({ maxTokens: 10 + 31, steps: 8 }); // examples 32..39 are longer: 32 left, 4 steps an epoch
  await new Trainer(r, mkdtempSync(join(tmpdir(), 'rstar2-sft-max-')), b, {
    ...quiet,
    log: (s: string) => logs.push(s),
  }).run();
  const seen = b.batches.flat();
  assert.ok(
    seen.every((i) => i < 32),
    'an example over maxTokens was trained',
  );
  assert.equal(new Set(b.batches.slice(0, 4).flat()).size, 32);
  assert.ok(
    logs.some((l) => /dropped 8 of 40 examples: longer than maxTokens 41/.test(l)),
    logs.join('\n'),
  );
  await assert.rejects(
    new Trainer(
      recipe({ maxTokens: 5 }),
      mkdtempSync(join(tmpdir(), 'rstar2-sft-none-')),
      new Recording(),
      quiet,
    ).run(),
    /every example is longer than maxTokens 5 tokens/,
  );
  await assert.rejects(
    new Trainer(
      recipe({ batchSize: 41 }),
      mkdtempSync(join(tmpdir(), 'rstar2-sft-big-')),
      new Recording(),
      quiet,
    ).run(),
    /batchSize 41 is more than the 40 training examples, and sampler 'epoch' .*set sampler: independent/,
  );
});

// docs/reference/ is written by scripts/gen-reference.ts from the recipe schema and the commander program; a key
// or option added, removed or re-described without `npm run docs` leaves the reference wrong, and this says so.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import {
  CLI_REF,
  RECIPE_REF,
  recipeKeys,
  renderCliReference,
  renderRecipeReference,
  undescribed,
  verlMap,
} from '../../scripts/gen-reference.js';
import { buildProgram } from '../../src/cli/program.js';

const stale = (file: string) => `${file} is out of date: run \`npm run docs\` and commit what it writes`;

test('docs/reference/recipe.md is what the recipe schema and docs/VERL.md give', () => {
  assert.ok(readFileSync(RECIPE_REF, 'utf8') === renderRecipeReference(), stale(RECIPE_REF));
});

test('docs/reference/cli.md is what the commander program gives', () => {
  assert.ok(readFileSync(CLI_REF, 'utf8') === renderCliReference(), stale(CLI_REF));
});

test('every recipe key says what it does (a .describe() in src/recipe/config.ts)', () => {
  assert.deepEqual(undescribed(), []);
});

test('the recipe reference lists every key with its default, and every command with each of its options', () => {
  const recipe = readFileSync(RECIPE_REF, 'utf8');
  const { top, sft, rl } = recipeKeys();
  for (const k of [...top, ...sft, ...rl]) assert.match(recipe, new RegExp(`\\| \`${k.path}\` \\|`), k.path);
  // one row whole: type, default, meaning and the verl keys of its VERL.md row
  assert.ok(
    recipe.includes(
      '| `groupSize` | integer ≥ 2 | `8` | G: kept per prompt (down_sample_to_n) | `rollout.n`, `down_sampling_config.down_sample_to_n` |',
    ),
  );
  const cli = readFileSync(CLI_REF, 'utf8');
  const walk = (c: ReturnType<typeof buildProgram>): ReturnType<typeof buildProgram>[] => [
    c,
    ...c.commands.flatMap(walk),
  ];
  for (const c of walk(buildProgram()).filter((c) => c.commands.length === 0)) {
    const names: string[] = [];
    for (let x: typeof c | null = c; x; x = x.parent) names.unshift(x.name());
    assert.match(cli, new RegExp(`^## \`${names.join(' ')}\`$`, 'm'), names.join(' '));
    for (const o of c.options)
      if (!(o as { hidden?: boolean }).hidden)
        assert.ok(cli.includes(`| \`${o.flags.replace(/\|/g, '\\|')}\` |`), `${names.join(' ')} ${o.flags}`);
  }
});

test("docs/VERL.md's table is read back key by key, pairing names in order where a row has as many of each", () => {
  const map = verlMap(
    [
      '| verl | rstar2 | notes |',
      '|---|---|---|',
      '| `actor.clip_ratio_low` / `clip_ratio_high` [0.2 / 0.28] | `stages.*.clipLow` / `stages.*.clipHigh` | |',
      '| `rollout.n` [32] | `stages.*.groupSize` × `stages.*.oversample` | with RoC on |',
      '| `down_sampling_config.reject_equal_reward`, `roc_error_ratio` | `stages.*.roc.rejectEqualReward`, `.rocErrorRatio` | |',
      '| `trainer.logger` (`console`, `tensorboard`) | `logger` / `--logger tensorboard` | |',
    ].join('\n'),
  );
  assert.deepEqual(map.get('stage.clipHigh'), ['actor.clip_ratio_high']);
  assert.deepEqual(map.get('stage.oversample'), ['rollout.n']);
  assert.deepEqual(map.get('stage.roc.rocErrorRatio'), ['down_sampling_config.roc_error_ratio']);
  assert.deepEqual(map.get('logger'), ['trainer.logger']);
  assert.equal(map.has('--logger'), false);
});

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { plotRuns } from '../../src/recipe/plot.js';

test('train-plot: a 5-seed sweep with its ablation arms (10 runs) gets 10 colours and a legend that fits the image', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-plot-'));
  try {
    const runs = Array.from({ length: 10 }, (_, i) => {
      const run = join(dir, `seed-${i}`);
      mkdirSync(run);
      const rows = [1, 2, 3].map((step) => ({
        stage: 'rl',
        step,
        reward_mean: 0.1 * step,
        tool_error_ratio_pos: 0,
      }));
      writeFileSync(join(run, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
      return run;
    });
    const svg = plotRuns(runs);
    const width = Number(/<svg[^>]* width="(\d+)"/.exec(svg)?.[1]);
    const height = Number(/<svg[^>]* height="(\d+)"/.exec(svg)?.[1]);
    const swatches = [...svg.matchAll(/<rect x="(\d+)" y="(\d+)" width="12" height="12" fill="([^"]+)"/g)];
    assert.equal(swatches.length, 10);
    assert.equal(new Set(swatches.map((m) => m[3])).size, 10, 'each run its own colour');
    for (const [, x, y] of swatches) {
      assert.ok(Number(x) + 150 <= width, `legend entry at x=${x} runs past the ${width}px image`);
      assert.ok(Number(y) + 12 <= height, `legend entry at y=${y} below the ${height}px image`);
    }
    for (let i = 0; i < 10; i++) assert.ok(svg.includes(`>seed-${i}</text>`));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

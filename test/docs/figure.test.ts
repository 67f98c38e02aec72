// docs/figures/overview.svg is drawn by scripts/gen-figure.ts from recorded results; a result file changed without
// redrawing leaves the README's figure showing other numbers than docs/RESULTS.md, and this says so.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { FIGURE, renderFigure } from '../../scripts/gen-figure.js';

test('docs/figures/overview.svg is what scripts/gen-figure.ts draws from the recorded results', () => {
  const svg = renderFigure();
  assert.ok(
    readFileSync(FIGURE, 'utf8') === svg,
    `${FIGURE} is out of date: run npx tsx scripts/gen-figure.ts`,
  );
  // the numbers it shows are the recorded ones: the 3B train step (20,813 and 18,471 tokens/s) and batch-128 decode
  assert.match(svg, />20\.8k</);
  assert.match(svg, />18\.5k</);
  assert.match(svg, />26\.8k</);
});

#!/usr/bin/env node
// Runs the test suite with node's own runner over TypeScript sources (through tsx), so one
// subsystem's unfinished types never block another's tests. Type errors are caught by `npm run typecheck`.
// Usage: npm test [-- FILTER ...]   (a test file runs if its path contains any FILTER)
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';

const filters = process.argv.slice(2);
const files = readdirSync('test', { recursive: true })
  .map((f) => join('test', String(f)))
  .filter((f) => f.endsWith('.test.ts'))
  .filter((f) => filters.length === 0 || filters.some((p) => f.includes(p)))
  .sort();
if (files.length === 0) {
  console.error(`no test files match ${filters.join(' ') || '(all)'}`);
  process.exit(1);
}
const concurrency = process.env.TEST_CONCURRENCY ?? '2';
// No test may hang the suite: a test without its own timeout gets 10 minutes, a file's process ends when its
// tests have (a leaked handle cannot hold it), and test-deadline.mjs ends a file past its deadline and kills what
// the file started and left running.
const deadline = new URL('./test-deadline.mjs', import.meta.url).href;
const r = spawnSync(
  process.execPath,
  [
    '--import',
    'tsx',
    '--import',
    deadline,
    '--test',
    `--test-concurrency=${concurrency}`,
    '--test-timeout=600000',
    '--test-force-exit',
    '--test-reporter=spec',
    ...files,
  ],
  { stdio: 'inherit' },
);
process.exit(r.status ?? 1);

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

const run = (root: string) =>
  spawnSync(process.execPath, ['scripts/check-imports.mjs', `--root=${root}`], { encoding: 'utf8' });

function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-imports-'));
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(join(root, path, '..'), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  return root;
}

test('check-imports fails on an import that runs upward, and passes downward and cli.ts ones', () => {
  const ok = tree({
    'util/jsonl.ts': 'export const x = 1;\n',
    'rl/step.ts': "import { x } from '../util/jsonl.js';\n",
    'rl/cli.ts': "export const c = await import('../eval/index.js');\n",
    'eval/index.ts': "import type { T } from '../rl/index.js';\n",
  });
  const bad = tree({
    'rl/step.ts': "export { a } from '../agent/index.js';\n",
    'agent/index.ts': 'export const a = 1;\n',
  });
  try {
    assert.equal(run(ok).status, 0, run(ok).stderr);
    const r = run(bad);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /import runs upward: rl\/step\.ts -> agent\/index\.ts/);
  } finally {
    rmSync(ok, { recursive: true });
    rmSync(bad, { recursive: true });
  }
});

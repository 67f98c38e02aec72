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

test("check-imports fails on an import that bypasses a folder's index.ts, but not on util/ or a cli.ts registration", () => {
  const ok = tree({
    'util/jsonl.ts': 'export const x = 1;\n',
    'rl/index.ts': "export { y } from './roc.js';\n",
    'rl/roc.ts': "import { x } from '../util/jsonl.js';\nexport const y = x;\n",
    'eval/run.ts': "import { y } from '../rl/index.js';\nexport const z = y;\n",
    // registering a command reads a constant without loading the folder; the action goes through the door
    'eval/cli.ts':
      "import { y } from '../rl/roc.js';\nexport const c = async () => (await import('../rl/index.js')).y;\n",
  });
  const bad = tree({
    'rl/index.ts': "export { y } from './roc.js';\n",
    'rl/roc.ts': 'export const y = 1;\n',
    'eval/run.ts': "import { y } from '../rl/roc.js';\nexport const z = y;\n",
    'eval/cli.ts': "export const c = async () => (await import('../rl/roc.js')).y;\n",
  });
  try {
    assert.equal(run(ok).status, 0, run(ok).stderr);
    const r = run(bad);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /import bypasses the folder's index\.ts: eval\/run\.ts -> rl\/roc\.ts/);
    assert.match(r.stderr, /import bypasses the folder's index\.ts: eval\/cli\.ts -> rl\/roc\.ts/);
    assert.match(r.stderr, /0 upward, 2 bypassing index\.ts, 0 cycle/);
  } finally {
    rmSync(ok, { recursive: true });
    rmSync(bad, { recursive: true });
  }
});

test('check-imports fails on a cycle of runtime imports across folders; type-only imports close none', () => {
  const files = (dataImport: string) => ({
    'data/index.ts': "export { load } from './load.js';\n",
    'data/load.ts': "import { pool } from '../sandbox/index.js';\nexport const load = () => pool;\n",
    'sandbox/index.ts': "export { pool } from './pool.js';\n",
    'sandbox/pool.ts': `${dataImport}\nexport const pool = 1;\n`,
  });
  const ok = tree(files("import type { load } from '../data/index.js';"));
  const bad = tree(files("import { load } from '../data/index.js';"));
  try {
    assert.equal(run(ok).status, 0, run(ok).stderr);
    const r = run(bad);
    assert.equal(r.status, 1);
    assert.match(
      r.stderr,
      /import cycle across folders: data\/index\.ts -> data\/load\.ts -> sandbox\/index\.ts -> sandbox\/pool\.ts -> data\/index\.ts/,
    );
  } finally {
    rmSync(ok, { recursive: true });
    rmSync(bad, { recursive: true });
  }
});

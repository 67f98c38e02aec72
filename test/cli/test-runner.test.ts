import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// scripts/test.mjs on two test files that do what the suite must survive: one leaves a process and a live timer
// behind, one never ends.
const RUNNER = new URL('../../scripts/test.mjs', import.meta.url).pathname;
const MODULES = new URL('../../node_modules', import.meta.url).pathname;

test('the test runner ends a file that hangs and kills what a file left running', {
  timeout: 120_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-runner-'));
  try {
    mkdirSync(join(dir, 'test'));
    symlinkSync(MODULES, join(dir, 'node_modules'));
    writeFileSync(
      join(dir, 'test', 'leak.test.ts'),
      `import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { test } from 'node:test';
test('leaks', () => {
  writeFileSync('leak.pid', String(spawn('sleep', ['300'], { stdio: 'ignore' }).pid));
  setInterval(() => {}, 1000);
});
`,
    );
    writeFileSync(
      join(dir, 'test', 'hang.test.ts'),
      `import { test } from 'node:test';
test('hangs', { timeout: 1e9 }, () => new Promise(() => setInterval(() => {}, 1000)));
`,
    );
    // the runner's own marker would make the inner run think it is a test file
    const { NODE_TEST_CONTEXT: _, ...env } = process.env;
    const t0 = Date.now();
    const r = spawnSync(process.execPath, [RUNNER], {
      cwd: dir,
      encoding: 'utf8',
      timeout: 90_000,
      env: { ...env, RSTAR2_TEST_FILE_DEADLINE_S: '5' },
    });
    const out = r.stdout + r.stderr;
    assert.equal(r.status, 1, out); // the hanging file fails the run
    assert.ok(Date.now() - t0 < 60_000, `the run took ${Date.now() - t0} ms`);
    assert.match(out, /hang\.test\.ts ran past its deadline of 5 s \(RSTAR2_TEST_FILE_DEADLINE_S\)/);
    assert.match(out, /leak\.test\.ts left 1 process\(es\) running; killing them:\n\s+\d+ sleep 300/);
    assert.match(out, /✔ leaks/);
    const pid = Number(readFileSync(join(dir, 'leak.pid'), 'utf8'));
    let state = 'gone';
    try {
      state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0];
    } catch {}
    // killed: gone, or a zombie until pid 1 reaps it
    assert.match(state, /^(gone|Z)$/, `sleep 300 (pid ${pid}) is still running`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

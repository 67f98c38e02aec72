import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// What `rstar2 eval` prints (issue 44): no Node warning on the way, benchmark names as --bench takes them.

const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const rstar2 = (args: string[]) =>
  spawnSync(process.execPath, [bin, ...args], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
  });

test('eval on the built-in engine prints no MaxListenersExceededWarning with many samples in flight', {
  timeout: 180_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-eval-msg-'));
  const init = rstar2(['model', 'init', '--config', 'tiny', '--out', join(dir, 'm')]);
  assert.equal(init.status, 0, init.stderr);
  const data = join(dir, 'toy.jsonl');
  writeFileSync(
    data,
    Array.from({ length: 12 }, (_, i) => JSON.stringify({ id: `p${i}`, problem: `x${i}`, answer: '1' })).join(
      '\n',
    ),
  );
  const r = rstar2([
    'eval',
    '--model',
    join(dir, 'm'),
    '--data',
    data,
    '--samples',
    '2',
    '--max-response-tokens',
    '16',
    '--max-turns',
    '1',
    '--template',
    'compact',
    '--out',
    join(dir, 'ev'),
  ]);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /toy: avg@2/);
  assert.doesNotMatch(r.stderr, /MaxListenersExceededWarning/);
});

test('--list-benchmarks names the aliases --bench takes, as its help does', () => {
  const list = rstar2(['eval', '--list-benchmarks']);
  assert.match(list.stdout, /^hmmt_feb25\t.*hmmt_feb25\.jsonl\t\(also --bench hmmt25, hmmt-feb25\)$/m);
  assert.match(rstar2(['eval', '--help']).stdout, /hmmt25/);
});

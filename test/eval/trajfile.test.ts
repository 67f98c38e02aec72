import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { TrajectoryIndex } from '../../src/eval/trajfile.js';
import { traj } from './fixtures.js';

test('TrajectoryIndex summarises lines, reads records back by byte range, follows appends', () => {
  const path = join(mkdtempSync(join(tmpdir(), 'rstar2-idx-')), 't.jsonl');
  const a = {
    ...traj('p', 0, { extracted: 'π', correct: true, gen: 7, obs: 3, calls: 1 }),
    text: 'ünïcode π \\boxed{π}',
  };
  const b = traj('p', 1, { extracted: '2', gen: 4 });
  writeFileSync(path, `${JSON.stringify(a)}\n\n${JSON.stringify(b)}\n`);
  const idx = new TrajectoryIndex(path);
  let es = idx.refresh();
  assert.equal(es.length, 2);
  assert.deepEqual(
    es.map((e) => [e.summary.id, e.summary.responseTokens, e.summary.generatedTokens, e.summary.correct]),
    [
      ['p#0', 10, 7, true],
      ['p#1', 4, 4, false],
    ],
  );
  assert.deepEqual(idx.read(es[0]), a); // multi-byte text: offsets are bytes
  assert.deepEqual(idx.read(es[1]), b);

  // a torn line is left out, then picked up once completed; a complete unterminated line counts
  const c = JSON.stringify(traj('p', 2, { gen: 5 }));
  appendFileSync(path, c.slice(0, 20));
  assert.equal(idx.refresh().length, 2);
  appendFileSync(path, `${c.slice(20)}`);
  es = idx.refresh();
  assert.equal(es.length, 3);
  appendFileSync(path, `\n${JSON.stringify(traj('p', 3, { gen: 6 }))}\n`);
  es = idx.refresh();
  assert.deepEqual(
    es.map((e) => e.summary.sample),
    [0, 1, 2, 3],
  );
  assert.equal(idx.read(es[3]).responseIds.length, 6);

  // rewritten shorter (e.g. re-verified): re-indexed from scratch
  writeFileSync(path, `${JSON.stringify(b)}\n`);
  assert.deepEqual(
    idx.refresh().map((e) => e.summary.id),
    ['p#1'],
  );
  writeFileSync(path, '{"id": broken}\n{}\n');
  assert.throws(() => new TrajectoryIndex(path).refresh(), /record 1: invalid JSON line/);
});

test('TrajectoryIndex reads a file saved with a byte-order mark, and names a line that is not a trajectory', () => {
  const path = join(mkdtempSync(join(tmpdir(), 'rstar2-idx-')), 't.jsonl');
  const a = traj('p', 0, { gen: 3 });
  writeFileSync(path, `\ufeff${JSON.stringify(a)}\n`);
  const idx = new TrajectoryIndex(path);
  const [e] = idx.refresh();
  assert.equal(e.summary.id, 'p#0');
  assert.deepEqual(idx.read(e), a);
  appendFileSync(path, 'null\n');
  assert.throws(() => new TrajectoryIndex(path).refresh(), /record 2: not a trajectory/);
});

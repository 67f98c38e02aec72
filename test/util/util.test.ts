import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { appendJsonl, dropTornTail, readJson, readJsonl, readJsonlTolerant } from '../../src/util/jsonl.js';
import { Rng } from '../../src/util/rng.js';

test('Rng is deterministic under a seed and differs across seeds', () => {
  const a = new Rng(7);
  const b = new Rng(7);
  const c = new Rng(8);
  const xs = Array.from({ length: 5 }, () => a.next());
  assert.deepEqual(
    xs,
    Array.from({ length: 5 }, () => b.next()),
  );
  assert.notDeepEqual(
    xs,
    Array.from({ length: 5 }, () => c.next()),
  );
  for (const x of xs) assert.ok(x >= 0 && x < 1);
});

test('Rng.sample keeps input order and picks distinct items', () => {
  const r = new Rng(1);
  const s = r.sample([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
  assert.equal(new Set(s).size, 4);
  assert.deepEqual(
    s,
    [...s].sort((x, y) => x - y),
  );
});

test('JSONL round-trips and tolerates only a torn final line', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-'));
  const p = join(dir, 'a.jsonl');
  appendJsonl(p, [{ a: 1 }, { b: 2 }]);
  assert.deepEqual(readJsonl(p), [{ a: 1 }, { b: 2 }]);
  writeFileSync(p, '{"a":1}\n{"b":');
  assert.deepEqual(readJsonlTolerant(p), [{ a: 1 }]);
  writeFileSync(p, '{"a":1}\n{"b":\n{"c":3}\n');
  assert.throws(() => readJsonlTolerant(p), /a\.jsonl:2/);
});

test('readJson names the file it cannot parse and reads one that starts with a byte-order mark', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-'));
  const p = join(dir, 'config.json');
  writeFileSync(p, '{"k": ');
  assert.throws(() => readJson(p), /config\.json: invalid JSON \(/);
  writeFileSync(p, '\ufeff{"k": 1}\r\n');
  assert.deepEqual(readJson(p), { k: 1 });
  const q = join(dir, 'a.jsonl');
  writeFileSync(q, '\ufeff{"a":1}\r\n{"b":2}\r\n');
  assert.deepEqual(readJsonl(q), [{ a: 1 }, { b: 2 }]);
});

test('dropTornTail cuts a torn last line, ends a whole one that lacks its newline, and reads past 64 KiB lines', () => {
  const f = join(mkdtempSync(join(tmpdir(), 'rstar2-torn-')), 't.jsonl');
  const long = JSON.stringify({ ids: Array(30_000).fill(7) }); // longer than one read from the end
  for (const [before, after] of [
    ['', ''],
    ['{"a":1}\n', '{"a":1}\n'],
    ['{"a":1}\n{"b":', '{"a":1}\n'],
    ['{"a":1}\r\n{"b', '{"a":1}\r\n'],
    ['{"a":1}\n{"b":2}', '{"a":1}\n{"b":2}\n'],
    [`{"a":1}\n${long}`, `{"a":1}\n${long}\n`],
    [`{"a":1}\n${long.slice(0, -1)}`, '{"a":1}\n'],
    [long.slice(0, -1), ''],
    ['\ufeff{"a":1}', '\ufeff{"a":1}\n'], // an editor's byte-order mark on the one record
  ]) {
    writeFileSync(f, before);
    dropTornTail(f);
    assert.equal(readFileSync(f, 'utf8'), after, JSON.stringify(before.slice(0, 20)));
  }
});

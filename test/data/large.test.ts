import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { parquetWriteFile } from 'hyparquet-writer';
import { loadProblems } from '../../src/data/index.js';

// Data of a real size (issue 44): a JSONL file past V8's longest string (~512 MB) and a Parquet file whose rows
// decompress to far more than its size, as DAPO-Math-17k's 1.8M rows do in a few MB.

const bin = join(import.meta.dirname, '../../bin/rstar2.js');

test('a JSONL file longer than any string V8 can make is read line by line', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-big-jsonl-'));
  const file = join(dir, 'big.jsonl');
  try {
    const line = `${JSON.stringify({ problem: `What is 2+2? ${'x'.repeat(1000)}`, answer: '4' })}\n`;
    const chunk = Buffer.from(line.repeat(Math.floor(2 ** 20 / line.length)));
    const fd = openSync(file, 'w');
    for (let written = 0; written < 560 * 2 ** 20; written += chunk.length) writeSync(fd, chunk);
    closeSync(fd);
    // the old reader made the whole file one string first: "Cannot create a string longer than ...", no file named
    const ps = await loadProblems(file, { limit: 3 });
    assert.deepEqual(
      ps.map((p) => [p.id, p.answer]),
      [
        ['p0', '4'],
        ['p1', '4'],
        ['p2', '4'],
      ],
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('data inspect counts a Parquet file of many gzip-compressed rows in a small heap', {
  timeout: 180_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-big-parquet-'));
  const file = join(dir, 'many.parquet');
  try {
    const n = 150_000;
    const q = `Solve the following math problem step by step. ${'A long statement of the problem. '.repeat(60)}`;
    parquetWriteFile({
      filename: file,
      codec: 'GZIP',
      compressors: { GZIP: (b: Uint8Array) => gzipSync(b) },
      rowGroupSize: 10_000,
      columnData: [
        { name: 'problem', data: Array.from({ length: n }, (_, i) => `${q}${i % 50_000}`) },
        { name: 'answer', data: Array.from({ length: n }, (_, i) => String(i % 50_000)) },
      ],
    });
    // 150k rows of 2 KB: the old inspect held every one (~300 MB) and ran out of this heap
    const r = spawnSync(process.execPath, [bin, 'data', 'inspect', file], {
      encoding: 'utf8',
      env: { ...process.env, NODE_OPTIONS: '--max-old-space-size=160' },
    });
    assert.equal(r.status, 0, r.stderr.slice(-2000));
    assert.match(
      r.stdout,
      /rows: 150000 {2}with answer: 150000 {2}integer answers: 150000 {2}duplicate questions: 100000/,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

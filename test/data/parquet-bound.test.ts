import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { parquetWriteFile } from 'hyparquet-writer';
import { PARQUET_BOUND, readRows } from '../../src/data/files.js';

// Issue 56 item 4: a small compressed Parquet file costs bounded work. The old reader decoded whatever the pages
// and the dictionary said: a file of a few KB here stands for 10 GiB of text and ran until the deadline.

const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const gzip = { GZIP: (b: Uint8Array) => gzipSync(b) };

const cli = (env: Record<string, string>, ...args: string[]) =>
  spawnSync(process.execPath, [bin, ...args], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1', ...env },
    timeout: 60_000,
  });

async function rows(file: string, maxParquetBytes?: number): Promise<Record<string, unknown>[]> {
  const out: Record<string, unknown>[] = [];
  for await (const { row } of readRows([file], { maxParquetBytes })) out.push(row);
  return out;
}

test('one dictionary value behind 20,000 rows (10 GiB of text in a few KB) is refused at once by inspect and convert', {
  timeout: 120_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-parquet-bomb-'));
  const file = join(dir, 'bomb.parquet');
  try {
    const big = `What is 1+1? ${'x'.repeat(2 ** 19)}`;
    parquetWriteFile({
      filename: file,
      codec: 'GZIP',
      compressors: gzip,
      columnData: [
        { name: 'problem', data: Array.from({ length: 20_000 }, () => big) },
        { name: 'answer', data: Array.from({ length: 20_000 }, () => '2') },
      ],
    });
    assert.ok(statSync(file).size < 64 * 1024, `the fixture is small: ${statSync(file).size} bytes`);
    for (const args of [
      ['data', 'inspect', file],
      ['data', 'convert', file, join(dir, 'out.jsonl')],
    ]) {
      const t0 = Date.now();
      const r = cli({}, ...args);
      const ms = Date.now() - t0;
      assert.equal(r.status, 1, `${args[1]}: ${r.stdout.slice(-500)} ${r.stderr.slice(-1000)}`);
      assert.ok(r.stderr.includes(`${file}: refused:`), r.stderr);
      assert.match(r.stderr, /values hold \d+\.\d MiB or more, over its limit of 256\.0 MiB/);
      assert.match(r.stderr, /RSTAR2_PARQUET_MAX_BYTES/);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'a clear error, no stack');
      assert.ok(ms < 30_000, `${args[1]} refused in ${ms} ms`);
    }
    assert.equal(existsSync(join(dir, 'out.jsonl')), false, 'convert leaves no output');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('gzip pages that decompress past the bound are refused before a page is read; a normal file reads', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-parquet-pages-'));
  const bomb = join(dir, 'pages.parquet');
  const normal = join(dir, 'normal.parquet');
  try {
    // 48 plain pages of 1 MiB of one letter each: 48 MiB from about 50 KB
    const mb = 'y'.repeat(2 ** 20);
    parquetWriteFile({
      filename: bomb,
      codec: 'GZIP',
      compressors: gzip,
      rowGroupSize: 8,
      columnData: [{ name: 'problem', data: Array.from({ length: 48 }, () => mb), encoding: 'PLAIN' }],
    });
    parquetWriteFile({
      filename: normal,
      codec: 'GZIP',
      compressors: gzip,
      columnData: [
        { name: 'problem', data: Array.from({ length: 500 }, (_, i) => `What is ${i}+1?`) },
        { name: 'answer', data: Array.from({ length: 500 }, (_, i) => String(i + 1)) },
      ],
    });
    const limit = 16 * 2 ** 20;
    await assert.rejects(rows(bomb, limit), (e: Error) => {
      assert.ok(e.message.startsWith(`${bomb}: refused: a Parquet file of`), e.message);
      assert.match(e.message, /metadata declares 48\.\d MiB or more, over its limit of 16\.0 MiB/);
      assert.match(e.message, /maxParquetBytes=16777216/);
      return true;
    });
    // the same limit from the environment, through the CLI
    const r = cli({ [PARQUET_BOUND.env]: String(limit) }, 'data', 'inspect', bomb);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /over its limit of 16\.0 MiB \(RSTAR2_PARQUET_MAX_BYTES=16777216/);
    const bad = cli({ [PARQUET_BOUND.env]: '1e99x' }, 'data', 'inspect', bomb);
    assert.match(
      bad.stderr,
      /RSTAR2_PARQUET_MAX_BYTES must be a positive whole number of bytes, got "1e99x"/,
    );
    // under a bound it fits, the bomb reads whole; the normal file reads under the smallest sensible one
    assert.equal((await rows(bomb, 64 * 2 ** 20)).length, 48);
    const got = await rows(normal, 2 ** 20);
    assert.equal(got.length, 500);
    assert.deepEqual(got[499], { problem: 'What is 499+1?', answer: '500' });
    assert.equal((await rows(normal)).length, 500);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

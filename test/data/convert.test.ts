import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { convertData } from '../../src/data/convert.js';
import { loadProblems, readRows } from '../../src/data/index.js';

// `rstar2 data convert` (issue 44): JSONL <-> Parquet without pyarrow.

const FIX = join(import.meta.dirname, '../../data/samples');
const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const rowsOf = async (f: string) => {
  const out: Record<string, unknown>[] = [];
  for await (const { row } of readRows([f])) out.push(row);
  return out;
};

test('a verl Parquet file goes to JSONL and back with every row and nested field, read the same', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-convert-'));
  const src = join(FIX, 'verl-arith.parquet');
  const r = spawnSync(process.execPath, [bin, 'data', 'convert', src, join(dir, 'v.jsonl')], {
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /wrote 30 rows from 1 file\(s\) to .*v\.jsonl/);
  await convertData(join(dir, 'v.jsonl'), join(dir, 'v.parquet'));
  assert.deepEqual(await rowsOf(join(dir, 'v.parquet')), await rowsOf(src));
  assert.deepEqual(await loadProblems(join(dir, 'v.parquet')), await loadProblems(src));
  // native lists and structs, as verl's (pyarrow's) files hold them, not JSON strings
  const { asyncBufferFromFile, parquetMetadataAsync } = await import('hyparquet');
  const shape = async (f: string) =>
    (await parquetMetadataAsync(await asyncBufferFromFile(f))).schema
      .slice(1)
      .map((e) => `${e.name}:${e.type ?? ''}:${e.converted_type ?? ''}:${e.num_children ?? ''}`);
  assert.deepEqual(await shape(join(dir, 'v.parquet')), await shape(src));
  assert.ok(!existsSync(join(dir, 'v.parquet.tmp')));
});

test('JSONL to Parquet takes each column type from every row: integers then decimals, large integers, missing keys', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-convert-'));
  const rows = [
    ...Array.from({ length: 1500 }, (_, i) => ({ question: `q${i}`, answer: i, big: 2 ** 40 + i })),
    { question: 'last', answer: 2.5, big: 1, extra: { tags: ['a', 'b'] } },
  ];
  writeFileSync(join(dir, 'in.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
  await convertData(join(dir, 'in.jsonl'), join(dir, 'out.parquet'));
  const back = await rowsOf(join(dir, 'out.parquet'));
  assert.equal(back.length, 1501);
  assert.deepEqual(back[1500], rows[1500]);
  assert.deepEqual(back[7], rows[7]); // a key a row lacks is absent again, not a null
  writeFileSync(join(dir, 'mixed.jsonl'), '{"answer": 3}\n{"answer": "x"}\n');
  await assert.rejects(
    convertData(join(dir, 'mixed.jsonl'), join(dir, 'm.parquet')),
    /column 'answer' holds integers \(first at .*mixed\.jsonl:1\) and strings \(first at .*mixed\.jsonl:2\)/,
  );
  assert.ok(!existsSync(join(dir, 'm.parquet')) && !existsSync(join(dir, 'm.parquet.tmp')));
  await assert.rejects(
    convertData(join(dir, 'in.jsonl'), join(dir, 'out.csv')),
    /must end in \.parquet or \.jsonl/,
  );
});

import { closeSync, existsSync, openSync, readFileSync, readSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import { inflateRawSync, unzipSync } from 'node:zlib';
import type { AsyncBuffer, Compressors, FileMetaData } from 'hyparquet';
import { globSync, isDynamicPattern } from 'tinyglobby';
import { stripBom } from '../util/jsonl.js';

// Reading rows from data files: JSONL (one object a line) and Parquet, from a path, a directory or a glob.
// Every row carries where it came from, so each error downstream can name the file and line (JSONL, 1-based,
// as an editor shows it) or row (Parquet, 0-based, as pandas' iloc and datasets' ds[i] index it).

export interface SourceRow {
  row: Record<string, unknown>;
  where: string; // 'file.jsonl:12' or 'file.parquet row 11'
  index: number; // position among all rows read, across files
}

// .json is left out of directories and globs: dataset folders hold dataset_info.json and the like.
const DATA_EXT = /\.(jsonl|ndjson|parquet)$/;

/** Files named by a path, a directory (its data files, recursively) or a glob; sorted, absolute. */
export function resolveFiles(spec: string, noun = 'rows'): string[] {
  if (existsSync(spec)) {
    if (!statSync(spec).isDirectory()) return [resolve(spec)];
    const inside = globSync('**/*.{jsonl,ndjson,parquet}', { cwd: spec, absolute: true }).sort();
    if (inside.length === 0) throw new Error(`no ${noun}: directory ${spec} has no .jsonl or .parquet files`);
    return inside;
  }
  if (!isDynamicPattern(spec)) throw new Error(`no ${noun}: file not found: ${spec}`);
  const files = globSync(spec, { absolute: true, onlyFiles: true })
    .filter((f) => DATA_EXT.test(f))
    .sort();
  if (files.length === 0) throw new Error(`no ${noun}: no .jsonl or .parquet file matches '${spec}'`);
  return files;
}

export const isParquet = (file: string) => file.endsWith('.parquet');

// A .json export (one array or pretty-printed object) fails on its first line; say what it is instead.
function jsonDocument(file: string, text: string): string {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return '';
  }
  const convert = Array.isArray(doc) ? `: convert it with jq -c '.[]' ${file} > rows.jsonl` : '';
  return `; the file is one JSON document, not JSONL (one object per line)${convert}`;
}

// A first line that is no JSON object may be a whole JSON document; read it whole only to say so, and only if small.
function documentNote(file: string): string {
  return statSync(file).size <= 64 * 2 ** 20 ? jsonDocument(file, stripBom(readFileSync(file, 'utf8'))) : '';
}

/** The lines of a file, read a chunk at a time: a file of any size, never one string (V8 caps those at ~512 MB). */
export function* fileLines(file: string, chunkBytes = 2 ** 20): Generator<string> {
  const fd = openSync(file, 'r');
  try {
    const buf = Buffer.alloc(chunkBytes);
    const utf8 = new StringDecoder('utf8');
    let rest = '';
    let first = true;
    for (let n = readSync(fd, buf); n > 0; n = readSync(fd, buf)) {
      let text = rest + utf8.write(buf.subarray(0, n));
      if (first) text = stripBom(text);
      first = false;
      const lines = text.split('\n');
      rest = lines.pop() as string;
      yield* lines;
    }
    rest += utf8.end();
    if (rest !== '') yield rest;
  } finally {
    closeSync(fd);
  }
}

function* jsonlRows(file: string, start: number): Generator<SourceRow> {
  let i = 0;
  let n = 0;
  for (const line of fileLines(file)) {
    i++;
    if (line.trim() === '') continue;
    const where = `${file}:${i}`;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      const doc = n === 0 ? documentNote(file) : '';
      throw new Error(`${where}: malformed JSON line (${(e as Error).message})${doc}`);
    }
    if (typeof row !== 'object' || row === null || Array.isArray(row)) {
      const doc = n === 0 ? documentNote(file) : '';
      throw new Error(`${where}: expected a JSON object, got ${kindOf(row)}${doc}`);
    }
    yield { row: row as Record<string, unknown>, where, index: start + n++ };
  }
}

// Parquet INT64 arrives as BigInt; JSON-shaped records want numbers (or strings where a number would round).
// `cost` adds up the text a file's values hold: a dictionary page stores a value once for any number of rows.
function plain(v: unknown, cost: Cost): unknown {
  if (typeof v === 'string') {
    cost.charge(v.length, 'values hold');
    return v;
  }
  if (typeof v === 'bigint') {
    return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER)
      ? Number(v)
      : String(v);
  }
  if (Array.isArray(v)) return v.map((x) => plain(x, cost));
  if (v instanceof Date) return v.toISOString();
  if (v instanceof Uint8Array) {
    cost.charge(v.length, 'values hold');
    return Buffer.from(v).toString('utf8');
  }
  if (typeof v === 'object' && v !== null) {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) o[k] = plain(x, cost);
    return o;
  }
  return v;
}

// GZIP pages through Node's zlib: native, any number of gzip members, and never more output than the page header
// says (the pure-JS one took a page's word for its framing); zlib-framed and raw deflate pages as some writers make
function gunzipPage(input: Uint8Array, length: number): Uint8Array {
  const opts = { maxOutputLength: Math.max(1, length) };
  const gzip = input[0] === 0x1f && input[1] === 0x8b;
  const zlib = (input[0] & 0x0f) === 8 && ((input[0] << 8) | input[1]) % 31 === 0;
  return gzip || zlib ? unzipSync(input, opts) : inflateRawSync(input, opts);
}

/**
 * What reading one Parquet file may cost, in bytes decoded. Two accounts: its pages once decompressed (and a slot
 * per value), by default 250 × the file, and the text its rows' values hold, by default 2500 × the file (a
 * dictionary value stands for any number of rows, as in DAPO-Math-17k's 100 copies of each problem); each at least
 * 256 MiB. A gzip page holds up to a thousand times its size, zstd's more. An explicit `maxParquetBytes` or
 * RSTAR2_PARQUET_MAX_BYTES bounds both accounts.
 */
export const PARQUET_BOUND = {
  pageRatio: 250,
  valueRatio: 2500,
  floorBytes: 256 * 2 ** 20,
  env: 'RSTAR2_PARQUET_MAX_BYTES',
};

export interface ReadOptions {
  /** Bytes one Parquet file may decode to, in pages and in the text of its values; default PARQUET_BOUND. */
  maxParquetBytes?: number;
}

/** A Parquet file past its bound: the message names the file, the sizes and how to raise the limit. */
export class ParquetTooLarge extends Error {}

const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;

interface Limit {
  bytes: number;
  how: string;
}

function parquetLimits(fileBytes: number, explicit?: number): { pages: Limit; values: Limit } {
  const raise = `raise it with ${PARQUET_BOUND.env}=<bytes>`;
  const raw = explicit ?? process.env[PARQUET_BOUND.env];
  if (raw !== undefined && raw !== '') {
    const n = Number(raw);
    const name = explicit === undefined ? PARQUET_BOUND.env : 'maxParquetBytes';
    if (!Number.isSafeInteger(n) || n <= 0) {
      throw new Error(`${name} must be a positive whole number of bytes, got ${JSON.stringify(raw)}`);
    }
    const limit = { bytes: n, how: `${name}=${n}; ${raise}` };
    return { pages: limit, values: limit };
  }
  const floor = PARQUET_BOUND.floorBytes;
  const of = (ratio: number) => ({
    bytes: Math.max(floor, ratio * fileBytes),
    how: `${ratio} × the file, at least ${mib(floor)}; ${raise}`,
  });
  return { pages: of(PARQUET_BOUND.pageRatio), values: of(PARQUET_BOUND.valueRatio) };
}

class Cost {
  used = 0;
  constructor(
    private readonly file: string,
    private readonly fileBytes: number,
    private readonly limit: Limit,
  ) {}

  charge(bytes: number, what: string): void {
    this.used += bytes;
    if (this.used > this.limit.bytes) {
      throw new ParquetTooLarge(
        `${this.file}: refused: a Parquet file of ${mib(this.fileBytes)} whose ${what} ${mib(this.used)} or more, ` +
          `over its limit of ${mib(this.limit.bytes)} (${this.limit.how})`,
      );
    }
  }
}

// The metadata's own account, checked before any page is read: each value also takes a slot in memory.
function declaredBytes(metadata: FileMetaData): number {
  let n = 0;
  for (const group of metadata.row_groups) {
    for (const c of group.columns) {
      n += Number(c.meta_data?.total_uncompressed_size ?? 0n) + 8 * Number(c.meta_data?.num_values ?? 0n);
    }
  }
  return n;
}

// Every decompression charges the size its page header declares before it runs: the output never exceeds it.
function counted(compressors: Compressors, cost: Cost): Compressors {
  const out: Compressors = {};
  for (const [codec, fn] of Object.entries(compressors)) {
    if (!fn) continue;
    out[codec as keyof Compressors] = (input, length) => {
      cost.charge(length, 'pages decompress to');
      return fn(input, length);
    };
  }
  return out;
}

/**
 * Rows of every file in order. Parquet is read one row group at a time, so stopping early (a limit) reads
 * only the groups needed and a large file is never held twice in memory; a file whose pages or values
 * would cost more than its bound (`ReadOptions`) is refused with ParquetTooLarge.
 */
export async function* readRows(files: string[], opts: ReadOptions = {}): AsyncGenerator<SourceRow> {
  let index = 0;
  for (const file of files) {
    if (!isParquet(file)) {
      for (const r of jsonlRows(file, index)) {
        index++;
        yield r;
      }
      continue;
    }
    // loaded on first use: every rstar2 command imports this module, few read Parquet
    const { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } = await import('hyparquet');
    let buffer: AsyncBuffer;
    let metadata: FileMetaData;
    try {
      buffer = await asyncBufferFromFile(file);
      metadata = await parquetMetadataAsync(buffer);
    } catch (e) {
      throw new Error(`${file}: not a readable Parquet file (${(e as Error).message})`);
    }
    const limits = parquetLimits(buffer.byteLength, opts.maxParquetBytes);
    new Cost(file, buffer.byteLength, limits.pages).charge(declaredBytes(metadata), 'metadata declares');
    // The metadata may lie: each page is charged again as it is decompressed, against the same bound.
    const { compressors: all, decompressZstd } = await import('hyparquet-compressors');
    // fzstd sizes its output from the frame unless given a buffer: a page header of 1 KB could decompress to GBs
    const zstd = (input: Uint8Array, length: number) => decompressZstd(input, new Uint8Array(length));
    const compressors = counted(
      { ...all, GZIP: gunzipPage, ZSTD: zstd },
      new Cost(file, buffer.byteLength, limits.pages),
    );
    const values = new Cost(file, buffer.byteLength, limits.values);
    let rowStart = 0;
    for (const group of metadata.row_groups) {
      const rowEnd = rowStart + Number(group.num_rows);
      let rows: Record<string, unknown>[];
      try {
        rows = await parquetReadObjects({ file: buffer, metadata, rowStart, rowEnd, compressors });
      } catch (e) {
        if (e instanceof ParquetTooLarge) throw e;
        throw new Error(`${file}: cannot read rows ${rowStart}-${rowEnd - 1} (${(e as Error).message})`);
      }
      for (let i = 0; i < rows.length; i++) {
        const row = plain(rows[i], values) as Record<string, unknown>;
        yield { row, where: `${file} row ${rowStart + i}`, index };
        index++;
      }
      rowStart = rowEnd;
    }
  }
}

/** JSONL only, for callers that cannot await; Parquet needs the async readRows. */
export function* readRowsSync(files: string[]): Generator<SourceRow> {
  let index = 0;
  for (const file of files) {
    if (isParquet(file)) {
      throw new Error(`${file}: Parquet is read asynchronously; use the async loader (loadProblems)`);
    }
    for (const r of jsonlRows(file, index)) {
      index++;
      yield r;
    }
  }
}

export function kindOf(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}

/** Value at a dotted path ('extra_info.index', 'prompt.0.content'); undefined when any step is missing. */
export function getPath(row: unknown, path: string): unknown {
  let v: unknown = row;
  for (const key of path.split('.')) {
    if (typeof v !== 'object' || v === null) return undefined;
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

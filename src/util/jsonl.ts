import {
  appendFileSync,
  closeSync,
  createReadStream,
  existsSync,
  fstatSync,
  ftruncateSync,
  openSync,
  readFileSync,
  readSync,
  renameSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { createInterface } from 'node:readline';

// JSONL is the on-disk shape of every record that passes between stages (trajectories, metrics,
// eval items), so a stage can be re-run from the previous stage's file.

// Editors on Windows start UTF-8 files with a byte-order mark, which JSON.parse refuses as a token.
export const stripBom = (text: string): string => (text.charCodeAt(0) === 0xfeff ? text.slice(1) : text);

/** A whole JSON file (config.json, state.json); a parse error names the file. */
export function readJson<T = unknown>(path: string): T {
  const text = readFileSync(path, 'utf8');
  try {
    return JSON.parse(stripBom(text)) as T;
  } catch (e) {
    throw new Error(`${path}: invalid JSON (${(e as Error).message})`);
  }
}

export function readJsonl<T = unknown>(path: string): T[] {
  if (!existsSync(path)) return [];
  const out: T[] = [];
  stripBom(readFileSync(path, 'utf8'))
    .split('\n')
    .forEach((line, i) => {
      if (line.trim() === '') return;
      try {
        out.push(JSON.parse(line) as T);
      } catch (e) {
        throw new Error(`${path}:${i + 1}: invalid JSON line (${(e as Error).message})`);
      }
    });
  return out;
}

export async function* streamJsonl<T = unknown>(path: string): AsyncGenerator<T> {
  for await (const { value } of streamJsonlLines<T>(path)) yield value;
}

/** Records with their 1-based line numbers (blank lines are skipped but counted), for errors that name the line. */
export async function* streamJsonlLines<T = unknown>(
  path: string,
): AsyncGenerator<{ line: number; value: T }> {
  const rl = createInterface({ input: createReadStream(path, 'utf8'), crlfDelay: Infinity });
  let n = 0;
  for await (const text of rl) {
    n++;
    const line = n === 1 ? stripBom(text) : text;
    if (line.trim() === '') continue;
    try {
      yield { line: n, value: JSON.parse(line) as T };
    } catch (e) {
      throw new Error(`${path}:${n}: invalid JSON line (${(e as Error).message})`);
    }
  }
}

// Appends whole lines synchronously: a killed process leaves at most one torn last line, which
// readers of resumable files must tolerate (see readJsonlTolerant).
export function appendJsonl(path: string, records: unknown[]): void {
  if (records.length === 0) return;
  appendFileSync(path, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
}

/**
 * Before appending to a file again: cuts a line torn by a writer killed mid-line off its end, or ends a whole last
 * record that only lacks its newline (a file saved by an editor). Reads only the last line: such files run to GBs.
 */
export function dropTornTail(path: string): void {
  if (!existsSync(path)) return;
  const fd = openSync(path, 'r+');
  try {
    const size = fstatSync(fd).size;
    const chunk = Buffer.alloc(1 << 16);
    const tail: Buffer[] = [];
    let start = size; // where the last line starts
    while (start > 0) {
      const n = Math.min(chunk.length, start);
      readSync(fd, chunk, 0, n, start - n);
      const nl = chunk.subarray(0, n).lastIndexOf(0x0a);
      tail.unshift(Buffer.from(chunk.subarray(nl + 1, n)));
      start -= n - (nl + 1);
      if (nl >= 0) break;
    }
    if (start === size) return; // empty, or ends with a newline
    try {
      JSON.parse(stripBom(Buffer.concat(tail).toString('utf8')));
      writeSync(fd, '\n', size);
    } catch {
      ftruncateSync(fd, start);
    }
  } finally {
    closeSync(fd);
  }
}

// For files written by a process that may have been killed mid-line: drops a torn final line.
export function readJsonlTolerant<T = unknown>(path: string): T[] {
  if (!existsSync(path)) return [];
  const lines = readFileSync(path, 'utf8').split('\n');
  const out: T[] = [];
  lines.forEach((line, i) => {
    if (line.trim() === '') return;
    try {
      out.push(JSON.parse(line) as T);
    } catch (e) {
      if (i < lines.length - 1 && lines.slice(i + 1).some((l) => l.trim() !== '')) {
        throw new Error(`${path}:${i + 1}: invalid JSON line (${(e as Error).message})`);
      }
    }
  });
  return out;
}

/** Replaces `path` whole: a reader, or a process killed mid-write, never sees half a file. */
export function writeAtomic(path: string, text: string): void {
  writeFileSync(`${path}.tmp`, text);
  renameSync(`${path}.tmp`, path);
}

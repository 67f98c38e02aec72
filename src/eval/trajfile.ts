import { closeSync, existsSync, fstatSync, openSync, readSync, renameSync, writeSync } from 'node:fs';
import { failureOf, type Trajectory } from '../rl/index.js';
import { dropTornTail, stripBom } from '../util/jsonl.js';
import type { ScoredSample } from './score.js';

// Trajectory files hold every response id, mask and logprob: a paper-scale step or eval file runs to
// hundreds of MB. Readers that need only per-trajectory facts (scoring, lists, filters) go through
// this index: one streaming pass keeps a small summary and the byte range of each line, and a full
// record is read back by its range only when shown. Appends are indexed incrementally; a torn last
// line (writer killed mid-line) is left out until it is completed.

export type StoredTrajectory = Trajectory & { kept?: boolean; advantage?: number };

export interface TrajSummary extends ScoredSample {
  id: string;
  reward?: number;
  gold?: string;
  responseTokens: number;
  generatedTokens: number;
  kept?: boolean;
  advantage?: number;
}

export interface IndexEntry {
  offset: number;
  length: number;
  summary: TrajSummary;
}

export function summarize(t: StoredTrajectory): TrajSummary {
  return {
    id: t.id,
    promptId: t.promptId,
    sample: t.sample,
    finish: t.finish,
    correct: t.correct,
    reward: t.reward,
    gold: t.gold,
    verify: t.verify,
    numToolCalls: t.numToolCalls,
    numToolErrors: t.numToolErrors,
    ms: t.ms,
    responseTokens: t.responseIds?.length ?? 0,
    generatedTokens: (t.responseMask ?? []).reduce((a, m) => a + m, 0),
    kept: t.kept,
    advantage: t.advantage,
    failure: failureOf(t), // from the events, which a summary drops
  };
}

/** First usable record per (problem, sample): a later model answer replaces a failed record (failureOf). */
export function dedupe<T extends Pick<Trajectory, 'promptId' | 'sample' | 'finish'> & { failure?: string }>(
  trajectories: T[],
): T[] {
  const by = new Map<string, T>();
  for (const t of trajectories) {
    const key = `${t.promptId}#${t.sample}`;
    const prev = by.get(key);
    if (!prev || (failureOf(prev) !== undefined && failureOf(t) === undefined)) by.set(key, t);
  }
  return [...by.values()];
}

/**
 * Makes an earlier rollout's trajectory file ready to be continued and returns the ids (`promptId#sample`) it
 * already holds. A line torn by a kill is cut off; of each (problem, sample) one model answer is kept, and records
 * that failed outside the model (engine error, sandbox fault: failureOf) are dropped to be sampled again; when
 * anything goes, the file is rewritten, the kept lines copied byte for byte. A record of a problem not in
 * `problems` (or with another gold answer: ids of rows without one are their line numbers), or of a sample index
 * outside 0..n-1, is another rollout's: the file is refused and left as it is.
 */
export function resumeTrajectoryFile(
  path: string,
  problems: { id: string; gold?: string }[],
  n: number,
): Set<string> {
  dropTornTail(path);
  const entries = new TrajectoryIndex(path).refresh();
  const gold = new Map(problems.map((p) => [p.id, p.gold]));
  entries.forEach(({ summary: t }, i) => {
    const ours =
      gold.has(t.promptId) &&
      (t.gold === undefined || gold.get(t.promptId) === undefined || t.gold === gold.get(t.promptId)) &&
      Number.isInteger(t.sample) &&
      t.sample >= 0 &&
      t.sample < n;
    if (!ours)
      throw new Error(
        `${path}: record ${i + 1} (trajectory '${t.id}') is not one of this rollout's (${gold.size} problems × ` +
          `${n} samples): resuming needs the same problems and samples per problem`,
      );
  });
  const kept = new Set(dedupe(entries.map((e) => e.summary)).filter((t) => failureOf(t) === undefined));
  if (kept.size < entries.length) {
    const src = openSync(path, 'r');
    const dst = openSync(`${path}.tmp`, 'w');
    try {
      for (const e of entries.filter((e) => kept.has(e.summary))) {
        const line = Buffer.alloc(e.length + 1); // the record and its newline (dropTornTail left one on each)
        readSync(src, line, 0, line.length, e.offset);
        writeSync(dst, line);
      }
    } finally {
      closeSync(src);
      closeSync(dst);
    }
    renameSync(`${path}.tmp`, path);
  }
  return new Set([...kept].map((t) => `${t.promptId}#${t.sample}`));
}

export class TrajectoryIndex {
  private entries: IndexEntry[] = [];
  private tail: IndexEntry | null = null; // a complete last record not yet followed by a newline
  private end = 0; // byte offset just past the last indexed newline
  private mtime = 0;

  constructor(readonly path: string) {}

  /** Brings the index up to date with the file; returns the entries. */
  refresh(): IndexEntry[] {
    if (!existsSync(this.path)) {
      this.entries = [];
      this.end = 0;
      return this.entries;
    }
    const fd = openSync(this.path, 'r');
    try {
      const st = fstatSync(fd);
      if (st.size < this.end || (st.size === this.end && st.mtimeMs !== this.mtime)) {
        this.entries = []; // rewritten (re-verified, truncated): start over
        this.end = 0;
      }
      this.mtime = st.mtimeMs;
      this.scan(fd, st.size);
    } finally {
      closeSync(fd);
    }
    return this.tail ? [...this.entries, this.tail] : this.entries;
  }

  read(e: IndexEntry): StoredTrajectory {
    const fd = openSync(this.path, 'r');
    try {
      const buf = Buffer.alloc(e.length);
      readSync(fd, buf, 0, e.length, e.offset);
      return JSON.parse(stripBom(buf.toString('utf8'))) as StoredTrajectory;
    } finally {
      closeSync(fd);
    }
  }

  private scan(fd: number, size: number): void {
    const chunk = Buffer.alloc(1 << 20);
    let pending: Buffer[] = [];
    let pendingStart = this.end;
    let pos = this.end;
    let lineNo = this.entries.length;
    while (pos < size) {
      const n = readSync(fd, chunk, 0, Math.min(chunk.length, size - pos), pos);
      if (n <= 0) break;
      let start = 0;
      for (let nl = chunk.indexOf(10, 0); nl >= 0 && nl < n; nl = chunk.indexOf(10, start)) {
        pending.push(Buffer.from(chunk.subarray(start, nl)));
        const line = pending.length === 1 ? pending[0] : Buffer.concat(pending);
        const offset = pendingStart;
        pending = [];
        pendingStart = pos + nl + 1;
        start = nl + 1;
        lineNo++;
        const text = stripBom(line.toString('utf8')); // a byte-order mark can only open the first
        if (text.trim() === '') continue;
        let t: StoredTrajectory;
        try {
          t = JSON.parse(text) as StoredTrajectory;
        } catch (e) {
          throw new Error(`${this.path}: record ${lineNo}: invalid JSON line (${(e as Error).message})`);
        }
        if (typeof t !== 'object' || t === null || Array.isArray(t))
          throw new Error(`${this.path}: record ${lineNo}: not a trajectory (a JSON object)`);
        this.entries.push({ offset, length: line.length, summary: summarize(t) });
      }
      if (start < n) pending.push(Buffer.from(chunk.subarray(start, n)));
      pos += n;
    }
    this.end = pendingStart; // a trailing partial line is re-read next time
    this.tail = null;
    if (pending.length > 0) {
      const line = Buffer.concat(pending);
      try {
        const t = JSON.parse(stripBom(line.toString('utf8'))) as StoredTrajectory;
        this.tail = { offset: pendingStart, length: line.length, summary: summarize(t) };
      } catch {
        // torn by a killed writer: ignored until completed
      }
    }
  }
}

/** Streams full records one at a time (for re-verification), in file order. */
export function* eachTrajectory(path: string): Generator<StoredTrajectory> {
  const idx = new TrajectoryIndex(path);
  for (const e of idx.refresh()) yield idx.read(e);
}

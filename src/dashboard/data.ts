import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, join, relative, resolve, sep } from 'node:path';
import { loadProblems } from '../data/index.js';
import {
  dedupe,
  type IndexEntry,
  problemsFromSamples,
  scoreEval,
  TrajectoryIndex,
  type TrajSummary,
} from '../eval/index.js';
import type { Heartbeat } from '../recipe/index.js';
import { processGone } from '../util/lock.js';
import { type TrajectoryView, viewTrajectory } from './turns.js';

// Read-only access to run and eval directories (docs/RUN_DIR.md). Everything is re-read from disk on
// request (cached by size+mtime), so a page polling during training sees new lines as they land.

export interface DirEntry {
  kind: 'run' | 'eval';
  name: string; // path relative to the root, '.' for the root itself
  dir: string;
  updated: number; // newest mtime of the files the dashboard reads (ms)
}

const mtime = (p: string) => (existsSync(p) ? statSync(p).mtimeMs : 0);

function classify(dir: string): 'run' | 'eval' | null {
  if (existsSync(join(dir, 'metrics.jsonl')) || existsSync(join(dir, 'checkpoints'))) return 'run';
  if (existsSync(join(dir, 'config.json')) && existsSync(join(dir, 'trajectories.jsonl'))) return 'eval';
  if (existsSync(join(dir, 'report.json'))) return 'eval';
  if (existsSync(join(dir, 'trajectories')) && existsSync(join(dir, 'config.json'))) return 'run';
  return null;
}

const inside = (dir: string, root: string) => dir === root || dir.startsWith(root + sep);

/**
 * Run and eval directories at or below root (3 levels), newest first; and below each of `more` (e.g. `evals/`
 * beside `runs/`) that root does not already hold, named with that directory's name first (`evals/aime24-…`).
 */
export function scanDirs(root: string, more: string[] = []): DirEntry[] {
  const base = resolve(root);
  if (!existsSync(base) || !statSync(base).isDirectory()) throw new Error(`--runs: not a directory: ${root}`);
  const out: DirEntry[] = [];
  for (const m of more.map((x) => resolve(x)))
    if (existsSync(m) && statSync(m).isDirectory() && !inside(m, base) && !inside(base, m))
      scanInto(m, out, (dir) => `${basename(m)}/${relative(m, dir) || '.'}`);
  scanInto(base, out, (dir) => relative(base, dir) || '.');
  return out.sort((a, b) => b.updated - a.updated || a.name.localeCompare(b.name));
}

function scanInto(base: string, out: DirEntry[], nameOf: (dir: string) => string): void {
  const walk = (dir: string, depth: number) => {
    const kind = classify(dir);
    if (kind) {
      const files = [
        'metrics.jsonl',
        'evals.jsonl',
        'state.json',
        'report.json',
        'trajectories.jsonl',
        'trajectories',
      ];
      out.push({
        kind,
        name: nameOf(dir),
        dir,
        updated: Math.max(...files.map((f) => mtime(join(dir, f)))),
      });
      return;
    }
    if (depth >= 3) return;
    let names: string[] = [];
    try {
      names = readdirSync(dir).sort();
    } catch {
      return;
    }
    for (const n of names) {
      if (n.startsWith('.') || n === 'node_modules') continue;
      const p = join(dir, n);
      try {
        if (statSync(p).isDirectory()) walk(p, depth + 1);
      } catch {
        // vanished while scanning
      }
    }
  };
  walk(base, 0);
}

const cache = new Map<string, { key: string; rows: unknown[]; bad: number[] }>();

/**
 * A JSONL file's records, re-read when it changes. A line that is not JSON (a torn write, a hand edit) is
 * skipped and its number kept, so one bad line costs that record, not the run's page or the run list.
 */
function readCached<T>(path: string): { rows: T[]; bad: number[] } {
  if (!existsSync(path)) return { rows: [], bad: [] };
  const s = statSync(path);
  const key = `${s.size}:${s.mtimeMs}`;
  const hit = cache.get(path);
  if (hit && hit.key === key) return hit as { rows: T[]; bad: number[] };
  const rows: T[] = [];
  const bad: number[] = [];
  readFileSync(path, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (line.trim() === '') return;
      try {
        rows.push(JSON.parse(line) as T);
      } catch {
        bad.push(i + 1);
      }
    });
  const got = { key, rows, bad };
  cache.set(path, got);
  return got;
}

function readJson(path: string): unknown {
  if (!existsSync(path)) return null;
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch {
    return null; // being rewritten; the next poll gets it
  }
}

export type RunStatus = 'running' | 'stalled' | 'stopped' | 'done' | 'failed';

/**
 * Where a run stands, from its heartbeat.json (runs older than it have none: null). A run that says it is
 * live is `stopped` when its process is gone (killed, crashed), `stalled` when its heartbeat or its last
 * finished step is older than its health.stallMinutes.
 */
export function runStatus(dir: string, now = Date.now()): { status: RunStatus; note: string } | null {
  const hb = readJson(join(dir, 'heartbeat.json')) as Heartbeat | null;
  if (!hb || typeof hb.time !== 'string') return null;
  if (hb.phase === 'done' || hb.phase === 'stopped' || hb.phase === 'failed')
    return { status: hb.phase, note: hb.phase };
  if (processGone(hb)) return { status: 'stopped', note: `stopped: process ${hb.pid} is gone` };
  const min = (t: string) => (now - Date.parse(t)) / 60_000;
  if (min(hb.time) >= hb.stallMinutes)
    return { status: 'stalled', note: `stalled: no heartbeat for ${Math.round(min(hb.time))} min` };
  if (min(hb.progress) >= hb.stallMinutes)
    return {
      status: 'stalled',
      note: `stalled: no step for ${Math.round(min(hb.progress))} min (${hb.phase})`,
    };
  return { status: 'running', note: `running: ${hb.phase}` };
}

export function trajectoryFiles(e: DirEntry): string[] {
  if (e.kind === 'eval') return existsSync(join(e.dir, 'trajectories.jsonl')) ? ['trajectories.jsonl'] : [];
  const d = join(e.dir, 'trajectories');
  if (!existsSync(d)) return [];
  return readdirSync(d)
    .filter((f) => f.endsWith('.jsonl'))
    .sort()
    .map((f) => `trajectories/${f}`);
}

export function runData(e: DirEntry) {
  const metrics = readCached<Record<string, unknown>>(join(e.dir, 'metrics.jsonl'));
  const evals = readCached<Record<string, unknown>>(join(e.dir, 'evals.jsonl'));
  const skipped = [
    ...metrics.bad.map((n) => `metrics.jsonl:${n}`),
    ...evals.bad.map((n) => `evals.jsonl:${n}`),
  ];
  return {
    kind: e.kind,
    name: e.name,
    config: readJson(join(e.dir, 'config.json')),
    state: readJson(join(e.dir, 'state.json')),
    metrics: metrics.rows,
    evals: evals.rows,
    /** lines that are not JSON, left out */
    skipped,
    trajectoryFiles: trajectoryFiles(e),
  };
}

const questions = new Map<string, { key: string; byId: Promise<Map<string, string>> }>();

/** id -> question of a problem file, re-read when it changes (a run's stage pool, an eval's data file). */
function questionsOf(path: string, read: () => Promise<{ id: string; question: string }[]>) {
  const key = `${mtime(path)}`;
  const hit = questions.get(path);
  if (hit && hit.key === key) return hit.byId;
  const byId = read()
    .then((ps) => new Map(ps.map((p) => [p.id, p.question])))
    .catch(() => new Map<string, string>());
  questions.set(path, { key, byId });
  return byId;
}

/**
 * The problem a trajectory answers, which its record does not carry: from the run's prompt pool of the file's
 * stage (`pool-<stage>.json`) or the eval's data file; null where neither has it.
 */
export async function problemOf(e: DirEntry, file: string, promptId: string): Promise<string | null> {
  if (e.kind === 'run') {
    const stage = /^trajectories\/(.+)-step-\d+\.jsonl$/.exec(file)?.[1];
    const pool = stage ? join(e.dir, `pool-${stage}.json`) : '';
    if (!pool || !existsSync(pool)) return null;
    const byId = await questionsOf(pool, async () => JSON.parse(readFileSync(pool, 'utf8')));
    return byId.get(promptId) ?? null;
  }
  const data = (readJson(join(e.dir, 'config.json')) as { dataFile?: string } | null)?.dataFile;
  if (!data || !existsSync(data)) return null;
  const byId = await questionsOf(data, () => loadProblems(data));
  return byId.get(promptId) ?? null;
}

export function evalData(e: DirEntry) {
  const config = readJson(join(e.dir, 'config.json')) as { bench?: string; k?: number } | null;
  let report = readJson(join(e.dir, 'report.json'));
  if (!report && config?.k) {
    // an eval still running has no report yet: score what is on disk
    const ts = dedupe(indexOf(join(e.dir, 'trajectories.jsonl')).map((x) => x.summary));
    const problems = problemsFromSamples(ts);
    report = scoreEval({ bench: config.bench ?? e.name, k: config.k, problems, trajectories: ts });
  }
  return { kind: e.kind, name: e.name, config, report, trajectoryFiles: trajectoryFiles(e) };
}

export type TrajFilter = 'all' | 'correct' | 'incorrect' | 'tool_error';
export const FILTERS: TrajFilter[] = ['all', 'correct', 'incorrect', 'tool_error'];

const indexes = new Map<string, TrajectoryIndex>();
function indexOf(path: string): IndexEntry[] {
  let idx = indexes.get(path);
  if (!idx) indexes.set(path, (idx = new TrajectoryIndex(path)));
  return idx.refresh();
}

const matches = (t: TrajSummary, f: TrajFilter) =>
  f === 'all' ||
  (f === 'correct' && t.correct === true) ||
  (f === 'incorrect' && t.correct !== true) ||
  (f === 'tool_error' && t.numToolErrors > 0);

function loadFile(e: DirEntry, file: string): IndexEntry[] {
  if (!trajectoryFiles(e).includes(file)) throw new NotFound(`no trajectory file '${file}' in ${e.name}`);
  return indexOf(join(e.dir, file));
}

export class NotFound extends Error {}

export function listTrajectories(
  e: DirEntry,
  file: string,
  filter: TrajFilter,
  offset: number,
  limit: number,
) {
  const all = loadFile(e, file).map((x) => x.summary);
  const counts = Object.fromEntries(FILTERS.map((f) => [f, all.filter((t) => matches(t, f)).length]));
  const picked = all.filter((t) => matches(t, filter));
  return {
    file,
    filter,
    total: picked.length,
    counts,
    items: picked.slice(offset, offset + limit).map((t) => ({
      id: t.id,
      promptId: t.promptId,
      sample: t.sample,
      correct: t.correct,
      reward: t.reward,
      finish: t.finish,
      numToolCalls: t.numToolCalls,
      numToolErrors: t.numToolErrors,
      responseTokens: t.responseTokens,
      kept: t.kept,
      advantage: t.advantage,
      extracted: t.verify?.extracted ?? null,
    })),
  };
}

export function getTrajectory(e: DirEntry, file: string, id: string): TrajectoryView {
  const entry = loadFile(e, file).find((x) => x.summary.id === id);
  if (!entry) throw new NotFound(`no trajectory '${id}' in ${e.name}/${file}`);
  return viewTrajectory(indexes.get(join(e.dir, file))!.read(entry));
}

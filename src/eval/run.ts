import { existsSync, mkdirSync, readFileSync, renameSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Trajectory } from '../agent/trajectory.js';
import { appendJsonl, writeAtomic } from '../util/jsonl.js';
import { Progress } from '../util/progress.js';
import { type BenchProblem, type EvalReport, renderMarkdown, scoreEval } from './score.js';
import { eachTrajectory, TrajectoryIndex, type TrajSummary } from './trajfile.js';
import { type VerifyFn, withScore } from './verify.js';

// An eval directory (docs/RUN_DIR.md) is append-only: every finished trajectory is appended to
// trajectories.jsonl as soon as it exists, so a killed eval resumes by skipping what is on disk.

export interface RolloutRequest {
  problemId: string;
  problem: string;
  answer: string;
  sample: number;
  seed: number;
}

/** Runs the requests (in any order, any concurrency) and reports each trajectory as it finishes. */
export type RolloutFn = (
  reqs: RolloutRequest[],
  onTrajectory: (t: Trajectory) => Promise<void> | void,
  signal?: AbortSignal,
) => Promise<void>;

/** Adapts a one-request function into a RolloutFn with bounded concurrency. */
export function perRequest(
  fn: (r: RolloutRequest, signal?: AbortSignal) => Promise<Trajectory>,
  concurrency: number,
): RolloutFn {
  return async (reqs, onTrajectory, signal) => {
    let next = 0;
    let failed: { e: unknown } | null = null;
    // after a failure the other lanes finish their current request and stop, so nothing is still
    // writing when the caller sees the error
    const lane = async () => {
      while (next < reqs.length && !signal?.aborted && !failed) {
        const r = reqs[next++];
        try {
          await onTrajectory(await fn(r, signal));
        } catch (e) {
          failed ??= { e };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, Math.min(concurrency, reqs.length)) }, lane));
    if (failed) throw (failed as { e: unknown }).e;
    if (signal?.aborted && next < reqs.length) throw new Error('interrupted');
  };
}

/** Settings that must match for a resumed eval to continue the same experiment. */
export interface EvalConfig {
  bench: string;
  dataFile: string;
  k: number;
  temperature: number;
  topP: number;
  maxTokens?: number;
  seed: number;
  engine: string;
  limit?: number; // may grow across resumes
  [extra: string]: unknown;
}

const RESUME_KEYS = [
  'bench',
  'k',
  'temperature',
  'topP',
  'maxTokens',
  'maxTurns',
  'template',
  'seed',
] as const;

export interface EvalState {
  wallTimeS: number; // summed over sessions
  sessions: number;
  updated: string;
}

// A killed writer may leave a torn last line; appending after it would glue two records together.
function dropTornTail(path: string): void {
  if (!existsSync(path)) return;
  const buf = readFileSync(path);
  if (buf.length === 0 || buf[buf.length - 1] === 0x0a) return;
  truncateSync(path, buf.lastIndexOf(0x0a) + 1);
}

export function readEvalDir(dir: string): {
  config: EvalConfig;
  samples: TrajSummary[];
  state: EvalState;
} {
  const cfgPath = join(dir, 'config.json');
  if (!existsSync(cfgPath)) throw new Error(`${dir} is not an eval directory (no config.json)`);
  const config = JSON.parse(readFileSync(cfgPath, 'utf8')) as EvalConfig;
  const statePath = join(dir, 'state.json');
  const state: EvalState = existsSync(statePath)
    ? JSON.parse(readFileSync(statePath, 'utf8'))
    : { wallTimeS: 0, sessions: 0, updated: '' };
  const samples = new TrajectoryIndex(join(dir, 'trajectories.jsonl')).refresh().map((e) => e.summary);
  return { config, samples, state };
}

/** Latest usable record per (problem, sample): a later non-error record replaces an errored one. */
export function dedupe<T extends Pick<Trajectory, 'promptId' | 'sample' | 'finish'>>(trajectories: T[]): T[] {
  const by = new Map<string, T>();
  for (const t of trajectories) {
    const key = `${t.promptId}#${t.sample}`;
    const prev = by.get(key);
    if (!prev || (prev.finish === 'error' && t.finish !== 'error')) by.set(key, t);
  }
  return [...by.values()];
}

export function writeReport(dir: string, report: EvalReport, title?: string): void {
  writeAtomic(join(dir, 'report.json'), `${JSON.stringify(report, null, 2)}\n`);
  writeAtomic(join(dir, 'report.md'), renderMarkdown(report, title));
}

export interface RunEvalOptions {
  outDir: string;
  config: EvalConfig;
  problems: BenchProblem[]; // already --limit'ed
  rollout: RolloutFn;
  verify: VerifyFn;
  retryErrors?: boolean; // regenerate samples whose saved record ended in an engine error (default true)
  progress?: boolean;
  signal?: AbortSignal;
  log?: (m: string) => void;
  /** Least time between state.json writes as samples land (default 5000): what a kill -9 can lose. */
  stateEveryMs?: number;
}

export async function runEval(o: RunEvalOptions): Promise<EvalReport> {
  const { outDir, config, problems } = o;
  const log = o.log ?? ((m: string) => console.error(m));
  mkdirSync(outDir, { recursive: true });
  const trajPath = join(outDir, 'trajectories.jsonl');
  const cfgPath = join(outDir, 'config.json');
  let prior: EvalState = { wallTimeS: 0, sessions: 0, updated: '' };
  if (existsSync(cfgPath)) {
    const old = readEvalDir(outDir);
    for (const key of RESUME_KEYS) {
      if (old.config[key] !== config[key]) {
        throw new Error(
          `${outDir} holds an eval made with different settings (${key}: ${JSON.stringify(old.config[key])} ` +
            `there, ${JSON.stringify(config[key])} now); use another --out or the same settings to resume`,
        );
      }
    }
    prior = old.state;
  }
  writeAtomic(cfgPath, `${JSON.stringify(config, null, 2)}\n`);
  dropTornTail(trajPath);

  const saved = dedupe(new TrajectoryIndex(trajPath).refresh().map((e) => e.summary));
  const done = new Set(
    saved
      .filter((t) => !(o.retryErrors !== false && t.finish === 'error'))
      .map((t) => `${t.promptId}#${t.sample}`),
  );
  const reqs: RolloutRequest[] = [];
  problems.forEach((p, pi) => {
    for (let s = 0; s < config.k; s++) {
      if (done.has(`${p.id}#${s}`)) continue;
      reqs.push({
        problemId: p.id,
        problem: p.problem,
        answer: p.answer,
        sample: s,
        seed: config.seed + pi * config.k + s,
      });
    }
  });
  const total = problems.length * config.k;
  if (done.size > 0) log(`eval: resuming ${outDir}: ${total - reqs.length}/${total} samples already saved`);

  const gold = new Map(problems.map((p) => [p.id, p.answer]));
  const start = Date.now();
  let correct = 0;
  let finished = 0;
  const bar = new Progress(`eval ${config.bench}`, total, o.progress ?? true);
  bar.set(total - reqs.length);
  // Written now and while samples land, not only at the end: a session killed with SIGKILL still
  // counts, with its wall time up to the last write.
  const stateEveryMs = o.stateEveryMs ?? 5000;
  let savedAt = 0;
  const saveState = () => {
    savedAt = Date.now();
    const state: EvalState = {
      wallTimeS: prior.wallTimeS + (savedAt - start) / 1000,
      sessions: prior.sessions + 1,
      updated: new Date(savedAt).toISOString(),
    };
    writeAtomic(join(outDir, 'state.json'), `${JSON.stringify(state, null, 2)}\n`);
  };
  saveState();
  let failure: unknown = null;
  if (reqs.length > 0) {
    try {
      await o.rollout(
        reqs,
        async (t) => {
          const g = gold.get(t.promptId);
          if (g === undefined)
            throw new Error(`rollout returned a trajectory for unknown problem '${t.promptId}'`);
          const scored = await withScore(t, g, o.verify);
          appendJsonl(trajPath, [scored]);
          finished++;
          if (scored.correct) correct++;
          bar.tick(1, `acc ${((100 * correct) / finished).toFixed(1)}%`);
          if (Date.now() - savedAt >= stateEveryMs) saveState();
        },
        o.signal,
      );
    } catch (e) {
      failure = e;
    }
  }
  bar.finish();
  saveState();
  const report = rescoreEvalDir(outDir, problems);
  if (failure) {
    throw new Error(
      `eval stopped after ${finished}/${reqs.length} new samples (saved; re-run the same command to resume): ${(failure as Error).message}`,
    );
  }
  if (!report.complete) log(`eval: incomplete (${report.samples}/${total} samples); re-run to resume`);
  return report;
}

/** Re-scores a saved eval without generating; `verify` re-checks answers (e.g. with a new verifier). */
export function rescoreEvalDir(dir: string, problems?: BenchProblem[]): EvalReport {
  const { config, samples, state } = readEvalDir(dir);
  const probs = problems ?? problemsFromSamples(samples);
  const report = scoreEval({
    bench: config.bench,
    k: config.k,
    problems: probs,
    trajectories: dedupe(samples),
    wallTimeS: state.wallTimeS,
  });
  writeReport(
    dir,
    report,
    `${config.bench} (${config.engine}, T=${config.temperature}, top-p=${config.topP})`,
  );
  return report;
}

/** Re-checks every saved answer with `verify`, one record in memory at a time, then re-scores. */
export async function reverifyEvalDir(
  dir: string,
  verify: VerifyFn,
  problems?: BenchProblem[],
): Promise<EvalReport> {
  readEvalDir(dir); // validates the directory
  const trajPath = join(dir, 'trajectories.jsonl');
  const tmp = `${trajPath}.reverify`;
  writeFileSync(tmp, '');
  for (const t of eachTrajectory(trajPath)) {
    appendJsonl(tmp, [await withScore({ ...t, correct: undefined }, t.gold ?? '', verify)]);
  }
  renameSync(tmp, trajPath);
  return rescoreEvalDir(dir, problems);
}

// When the benchmark file is not at hand, the problem set is what the trajectories cover.
export function problemsFromSamples(ts: Pick<TrajSummary, 'promptId' | 'gold'>[]): BenchProblem[] {
  const seen = new Map<string, BenchProblem>();
  for (const t of ts)
    if (!seen.has(t.promptId)) seen.set(t.promptId, { id: t.promptId, problem: '', answer: t.gold ?? '' });
  return [...seen.values()];
}

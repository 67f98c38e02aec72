import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { failureOf, type Trajectory } from '../rl/index.js';
import { appendJsonl, dropTornTail, readJson, writeAtomic } from '../util/jsonl.js';
import { Progress } from '../util/progress.js';
import { type BenchProblem, type EvalReport, renderMarkdown, scoreEval } from './score.js';
import { dedupe, eachTrajectory, TrajectoryIndex, type TrajSummary } from './trajfile.js';
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
  verifyProfile?: string;
  dataHash?: string; // written by runEval: problemsHash of the first dataCount problems
  dataCount?: number;
  [extra: string]: unknown;
}

// Everything that changes what a saved sample means. The engine spec names the model (an --model path is
// resolved by the CLI); the data is checked by content below.
const RESUME_KEYS = [
  'bench',
  'k',
  'temperature',
  'topP',
  'maxTokens',
  'maxTurns',
  'template',
  'tool',
  'seed',
  'engine',
  'verifyProfile',
] as const;

/**
 * The problems by content (id, text, gold answer, order: the per-sample seeds follow the order). Unlike a path
 * with size and mtime it survives a copied checkout, a touched or re-converted file and a moved eval directory,
 * and tells apart two files with one name; it covers globs and directories alike.
 */
export function problemsHash(ps: BenchProblem[]): string {
  const h = createHash('sha256');
  for (const p of ps) h.update(`${JSON.stringify([p.id, p.problem, p.answer])}\n`);
  return h.digest('hex').slice(0, 16);
}

/** Why resuming `dir` with `now` would mix in samples of another experiment, or null when it would not. */
function resumeConflict(
  dir: string,
  old: EvalConfig,
  now: EvalConfig,
  problems: BenchProblem[],
): string | null {
  const differ = (what: string) =>
    `${dir} holds an eval made with different settings (${what}); use another --out or the same settings to resume`;
  for (const key of RESUME_KEYS) {
    if (key === 'tool') {
      // recorded only when off ('none'): an eval without the key showed the python tool
      const [was, is] = [old.tool ?? 'python', now.tool ?? 'python'];
      if (was !== is) return differ(`tool: ${JSON.stringify(was)} there, ${JSON.stringify(is)} now`);
      continue;
    }
    if (old[key] === now[key]) continue;
    // Written by an rstar2 that did not record it: what the samples were made with is unknown, so they cannot
    // be trusted to match. A verify profile can be made known without regenerating.
    if (old[key] === undefined)
      return (
        `${dir} does not record its ${key} (an older rstar2 wrote it), so its samples cannot be checked against ` +
        `${key} ${JSON.stringify(now[key])}; ` +
        (key === 'verifyProfile'
          ? `re-score them under it first (rstar2 eval-rescore ${dir} --reverify --verify-profile ${now[key]}) or `
          : '') +
        'use another --out'
      );
    return differ(`${key}: ${JSON.stringify(old[key])} there, ${JSON.stringify(now[key])} now`);
  }
  // Before dataHash was recorded the resolved path was the data's identity: the one thing left to compare.
  if (old.dataHash === undefined)
    return old.dataFile === now.dataFile ? null : differ(`data: ${old.dataFile} there, ${now.dataFile} now`);
  const n = old.dataCount ?? 0;
  if (problems.length < n)
    return `${dir} holds samples of ${n} problems; the ${problems.length} given now cannot be checked against them: use --limit ${n} or more, or another --out`;
  if (problemsHash(problems.slice(0, n)) !== old.dataHash)
    return differ(
      `data: ${old.dataFile} there, ${now.dataFile} now, whose first ${n} problems differ in content`,
    );
  return null;
}

export interface EvalState {
  wallTimeS: number; // summed over sessions
  sessions: number;
  updated: string;
}

// A killed writer may leave a torn last line; appending after it would glue two records together.
export function readEvalDir(dir: string): {
  config: EvalConfig;
  samples: TrajSummary[];
  state: EvalState;
} {
  const cfgPath = join(dir, 'config.json');
  if (!existsSync(cfgPath)) throw new Error(`${dir} is not an eval directory (no config.json)`);
  const config = readJson<EvalConfig>(cfgPath);
  // every eval's config.json has these; a model or run directory's does not
  if (typeof config?.k !== 'number' || typeof config.dataFile !== 'string')
    throw new Error(`${dir} is not an eval directory (its config.json has no k or dataFile)`);
  const statePath = join(dir, 'state.json');
  const state: EvalState = existsSync(statePath)
    ? readJson<EvalState>(statePath)
    : { wallTimeS: 0, sessions: 0, updated: '' };
  const samples = new TrajectoryIndex(join(dir, 'trajectories.jsonl')).refresh().map((e) => e.summary);
  return { config, samples, state };
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
  retryErrors?: boolean; // regenerate samples whose saved record failed (failureOf; default true)
  progress?: boolean;
  signal?: AbortSignal;
  log?: (m: string) => void;
  /** Least time between state.json writes as samples land (default 5000): what a kill -9 can lose. */
  stateEveryMs?: number;
}

export async function runEval(o: RunEvalOptions): Promise<EvalReport> {
  const { outDir, problems } = o;
  const config: EvalConfig = { ...o.config, dataHash: problemsHash(problems), dataCount: problems.length };
  const log = o.log ?? ((m: string) => console.error(m));
  mkdirSync(outDir, { recursive: true });
  const trajPath = join(outDir, 'trajectories.jsonl');
  const cfgPath = join(outDir, 'config.json');
  let prior: EvalState = { wallTimeS: 0, sessions: 0, updated: '' };
  if (existsSync(cfgPath)) {
    const old = readEvalDir(outDir);
    const conflict = resumeConflict(outDir, old.config, config, problems);
    if (conflict) throw new Error(conflict);
    prior = old.state;
  }
  writeAtomic(cfgPath, `${JSON.stringify(config, null, 2)}\n`);
  dropTornTail(trajPath);

  const saved = dedupe(new TrajectoryIndex(trajPath).refresh().map((e) => e.summary));
  const done = new Set(
    saved
      .filter((t) => !(o.retryErrors !== false && failureOf(t) !== undefined))
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
  const rows = new Map(problems.map((p) => [p.id, p]));
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
          // cut short by the interrupt: no model answer, and the resume makes it anyway
          if (o.signal?.aborted && failureOf(t) !== undefined) return;
          const g = gold.get(t.promptId);
          if (g === undefined)
            throw new Error(`rollout returned a trajectory for unknown problem '${t.promptId}'`);
          const scored = await withScore(t, g, o.verify, rows.get(t.promptId));
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

/**
 * Re-checks every saved answer with `verify`, one record in memory at a time, then re-scores. `verifyProfile`
 * names what `verify` checks by and is recorded, so a resume scores new samples the same way.
 */
export async function reverifyEvalDir(
  dir: string,
  verify: VerifyFn,
  problems?: BenchProblem[],
  verifyProfile?: string,
): Promise<EvalReport> {
  const { config } = readEvalDir(dir);
  const trajPath = join(dir, 'trajectories.jsonl');
  const tmp = `${trajPath}.reverify`;
  writeFileSync(tmp, '');
  for (const t of eachTrajectory(trajPath)) {
    appendJsonl(tmp, [await withScore({ ...t, correct: undefined }, t.gold ?? '', verify)]);
  }
  renameSync(tmp, trajPath);
  if (verifyProfile !== undefined && verifyProfile !== config.verifyProfile)
    writeAtomic(join(dir, 'config.json'), `${JSON.stringify({ ...config, verifyProfile }, null, 2)}\n`);
  return rescoreEvalDir(dir, problems);
}

// When the benchmark file is not at hand, the problem set is what the trajectories cover.
export function problemsFromSamples(ts: Pick<TrajSummary, 'promptId' | 'gold'>[]): BenchProblem[] {
  const seen = new Map<string, BenchProblem>();
  for (const t of ts)
    if (!seen.has(t.promptId)) seen.set(t.promptId, { id: t.promptId, problem: '', answer: t.gold ?? '' });
  return [...seen.values()];
}

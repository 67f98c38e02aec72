import { failureOf, type Trajectory, type TurnEvent } from '../rl/index.js';

// Pure scoring over scored trajectories: no engine, no verifier. Re-scoring a saved eval is just
// reading trajectories.jsonl and calling scoreEval again.

/**
 * What scoring reads from a trajectory; a summary without the id arrays carries the token counts, and without
 * the events carries `failure` (see failureOf).
 */
export type ScoredSample = Pick<
  Trajectory,
  'promptId' | 'sample' | 'correct' | 'verify' | 'finish' | 'numToolCalls' | 'numToolErrors' | 'ms'
> & {
  responseIds?: number[];
  responseMask?: number[];
  responseTokens?: number;
  generatedTokens?: number;
  error?: string;
  events?: TurnEvent[];
  failure?: string;
};

export const responseTokens = (t: ScoredSample) => t.responseIds?.length ?? t.responseTokens ?? 0;
export const generatedTokens = (t: ScoredSample) =>
  t.responseMask ? t.responseMask.reduce((a, m) => a + m, 0) : (t.generatedTokens ?? 0);

export interface BenchProblem {
  id: string;
  problem: string;
  answer: string;
}

/** Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a product to stay exact-ish. */
export function passAtK(n: number, c: number, k: number): number {
  if (!Number.isInteger(n) || !Number.isInteger(c) || !Number.isInteger(k) || n < 0 || c < 0 || k < 1) {
    throw new Error(`passAtK: need integers n>=0, c>=0, k>=1 (got n=${n}, c=${c}, k=${k})`);
  }
  if (c > n) throw new Error(`passAtK: correct count ${c} exceeds sample count ${n}`);
  if (k > n) throw new Error(`passAtK: k=${k} exceeds the ${n} samples available`);
  if (n - c < k) return 1;
  let fail = 1;
  for (let i = n - c + 1; i <= n; i++) fail *= 1 - k / i;
  return 1 - fail;
}

/** Canonical form of an extracted answer for majority voting: equal strings vote together. */
export function normaliseAnswer(s: string): string {
  let t = s.trim();
  const boxed = /^\\boxed\{([\s\S]*)\}$/.exec(t);
  if (boxed) t = boxed[1];
  t = t
    .replace(/\\left|\\right|\\!|\\,|\\;|\\ |\$/g, '')
    .replace(/\\[dt]frac/g, '\\frac')
    .replace(/\^\{\\circ\}|\^\\circ|°/g, '')
    .replace(/\\text\{\s*([^}]*)\}/g, '$1')
    .replace(/\s+/g, '')
    .replace(/\.$/, '');
  // 012 / 12.0 / 1,000 vote with 12 / 1000
  if (/^-?[\d,]+(\.0*)?$/.test(t) && /\d/.test(t)) {
    const n = Number(t.replace(/,/g, ''));
    if (Number.isFinite(n)) t = String(n);
  }
  return t;
}

export interface MajorityVote {
  answer: string | null; // normalised majority answer (null when no sample produced one)
  votes: number;
  correct: boolean;
}

/**
 * Majority over normalised extracted answers; samples without an answer do not vote. Ties go to the
 * answer seen first (sample order), so the result is deterministic. The winner is correct when the
 * verifier marked any of its voters correct (all voters share one normalised answer).
 */
export function majorityVote(samples: Pick<Trajectory, 'verify' | 'correct' | 'sample'>[]): MajorityVote {
  const groups = new Map<string, { votes: number; correct: boolean; first: number }>();
  const ordered = samples.slice().sort((a, b) => a.sample - b.sample);
  ordered.forEach((t, i) => {
    const ex = t.verify?.extracted;
    if (ex === null || ex === undefined || ex.trim() === '') return;
    const key = normaliseAnswer(ex);
    const g = groups.get(key) ?? { votes: 0, correct: false, first: i };
    g.votes++;
    g.correct ||= t.correct === true;
    groups.set(key, g);
  });
  let best: MajorityVote = { answer: null, votes: 0, correct: false };
  let bestFirst = Infinity;
  for (const [answer, g] of groups) {
    if (g.votes > best.votes || (g.votes === best.votes && g.first < bestFirst)) {
      best = { answer, votes: g.votes, correct: g.correct };
      bestFirst = g.first;
    }
  }
  return best;
}

export interface ProblemRow {
  id: string;
  answer: string;
  n: number;
  correct: number;
  passAt1: number;
  majority: string | null;
  majorityVotes: number;
  majorityCorrect: boolean;
  meanResponseTokens: number;
  meanToolCalls: number;
  toolErrors: number;
  errors: number; // samples left out: failed for infrastructure reasons (failureOf)
}

export interface EvalReport {
  bench: string;
  k: number; // samples per problem asked for
  problems: number;
  samples: number; // scored: model answers only
  failed: number; // samples left out of every number below: no model answer (failureOf), regenerated on resume
  failure?: string; // the first of them
  complete: boolean; // every problem has k scored samples
  avgAtK: number; // mean pass@1 over problems
  passAtK: Record<string, number>; // "1", "2", "4", ..., String(k)
  majAtK: number;
  meanResponseTokens: number; // all response ids (generated + tool observations)
  meanGeneratedTokens: number; // mask = 1 ids only
  toolCallsPerAnswer: number; // mean tool calls per trajectory
  toolErrorRate: number; // tool errors / tool calls (0 when no calls)
  finishes: Record<string, number>;
  wallTimeS: number;
  meanTrajectoryS: number;
  perProblem: ProblemRow[];
}

const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);

function kLadder(k: number): number[] {
  const ks: number[] = [];
  for (let x = 1; x < k; x *= 2) ks.push(x);
  ks.push(k);
  return ks;
}

/**
 * Scores trajectories (already carrying `correct`/`verify` from the reward stage) per problem. Only
 * the first k samples of each problem count, so a resumed or over-sampled file scores the same.
 * Problems with fewer than k samples are scored on what they have; pass@j for j > n uses n.
 * Failed samples (failureOf) are counted and left out, so the eval is incomplete until they are regenerated.
 */
export function scoreEval(opts: {
  bench: string;
  k: number;
  problems: BenchProblem[];
  trajectories: ScoredSample[];
  wallTimeS?: number;
}): EvalReport {
  const { k } = opts;
  if (!Number.isInteger(k) || k < 1) throw new Error(`scoreEval: k must be a positive integer (got ${k})`);
  const byProblem = new Map<string, ScoredSample[]>();
  const failedBy = new Map<string, Map<number, string>>(); // sample -> why, where no usable record exists
  for (const p of opts.problems) {
    byProblem.set(p.id, []);
    failedBy.set(p.id, new Map());
  }
  for (const t of opts.trajectories) {
    const list = byProblem.get(t.promptId);
    if (!list) continue; // a trajectory for a problem outside this (possibly --limit'ed) set
    if (t.sample >= k || list.some((o) => o.sample === t.sample)) continue;
    const why = failureOf(t);
    const failed = failedBy.get(t.promptId) as Map<number, string>;
    if (why === undefined) {
      list.push(t);
      failed.delete(t.sample);
    } else if (!failed.has(t.sample)) failed.set(t.sample, why);
  }
  const ks = kLadder(k);
  const rows: ProblemRow[] = [];
  const passSums: Record<string, number[]> = Object.fromEntries(ks.map((j) => [String(j), []]));
  const all: ScoredSample[] = [];
  const finishes: Record<string, number> = {};
  let complete = true;
  let failed = 0;
  let failure: string | undefined;
  for (const p of opts.problems) {
    const ts = byProblem.get(p.id) ?? [];
    const fails = [...(failedBy.get(p.id)?.values() ?? [])];
    failed += fails.length;
    failure ??= fails[0];
    if (ts.length < k) complete = false;
    if (ts.length === 0) continue;
    all.push(...ts);
    const c = ts.filter((t) => t.correct === true).length;
    for (const j of ks) passSums[String(j)].push(passAtK(ts.length, c, Math.min(j, ts.length)));
    const maj = majorityVote(ts);
    for (const t of ts) finishes[t.finish] = (finishes[t.finish] ?? 0) + 1;
    rows.push({
      id: p.id,
      answer: p.answer,
      n: ts.length,
      correct: c,
      passAt1: c / ts.length,
      majority: maj.answer,
      majorityVotes: maj.votes,
      majorityCorrect: maj.correct,
      meanResponseTokens: mean(ts.map(responseTokens)),
      meanToolCalls: mean(ts.map((t) => t.numToolCalls)),
      toolErrors: ts.reduce((a, t) => a + t.numToolErrors, 0),
      errors: fails.length,
    });
  }
  const calls = all.reduce((a, t) => a + t.numToolCalls, 0);
  const toolErrs = all.reduce((a, t) => a + t.numToolErrors, 0);
  return {
    bench: opts.bench,
    k,
    problems: rows.length,
    samples: all.length,
    failed,
    ...(failure === undefined ? {} : { failure }),
    complete: complete && rows.length === opts.problems.length,
    avgAtK: mean(rows.map((r) => r.passAt1)),
    passAtK: Object.fromEntries(ks.map((j) => [String(j), mean(passSums[String(j)])])),
    majAtK: mean(rows.map((r) => (r.majorityCorrect ? 1 : 0))),
    meanResponseTokens: mean(all.map(responseTokens)),
    meanGeneratedTokens: mean(all.map(generatedTokens)),
    toolCallsPerAnswer: mean(all.map((t) => t.numToolCalls)),
    toolErrorRate: calls === 0 ? 0 : toolErrs / calls,
    finishes,
    wallTimeS: opts.wallTimeS ?? 0,
    meanTrajectoryS: mean(all.map((t) => t.ms / 1000)),
    perProblem: rows,
  };
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

export function renderMarkdown(r: EvalReport, title = r.bench): string {
  const lines = [
    `# Eval: ${title}`,
    '',
    `${r.problems} problems × k=${r.k} (${r.samples} samples${r.failed ? `, ${r.failed} failed and left out` : ''}${r.complete ? '' : ', INCOMPLETE'})`,
    ...(r.failure
      ? ['', `First failure (no model answer; re-run the eval to regenerate): ${esc(r.failure)}`]
      : []),
    '',
    '| metric | value |',
    '|---|---|',
    `| avg@${r.k} (mean pass@1) | ${pct(r.avgAtK)} |`,
    ...Object.entries(r.passAtK).map(([j, v]) => `| pass@${j} | ${pct(v)} |`),
    `| maj@${r.k} | ${pct(r.majAtK)} |`,
    `| mean response tokens | ${r.meanResponseTokens.toFixed(1)} |`,
    `| mean generated tokens | ${r.meanGeneratedTokens.toFixed(1)} |`,
    `| tool calls per answer | ${r.toolCallsPerAnswer.toFixed(2)} |`,
    `| tool-error rate | ${pct(r.toolErrorRate)} |`,
    `| finishes | ${
      Object.entries(r.finishes)
        .map(([f, n]) => `${f}: ${n}`)
        .join(', ') || '-'
    } |`,
    `| wall time | ${r.wallTimeS.toFixed(1)} s |`,
    `| mean trajectory time | ${r.meanTrajectoryS.toFixed(2)} s |`,
    '',
    '## Per problem',
    '',
    '| id | gold | correct/n | pass@1 | majority (votes) | maj ok | tokens | tool calls | tool errors |',
    '|---|---|---|---|---|---|---|---|---|',
    ...r.perProblem.map(
      (p) =>
        `| ${esc(p.id)} | ${esc(p.answer)} | ${p.correct}/${p.n} | ${pct(p.passAt1)} | ${esc(p.majority ?? '-')} (${p.majorityVotes}) | ${p.majorityCorrect ? 'yes' : 'no'} | ${p.meanResponseTokens.toFixed(0)} | ${p.meanToolCalls.toFixed(2)} | ${p.toolErrors} |`,
    ),
    '',
  ];
  return lines.join('\n');
}

const esc = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

import {
  DEFAULT_SAMPLING,
  type Engine,
  type GenerateResult,
  type RolloutStats,
  type SamplingParams,
  Scheduler,
  type SchedulerOptions,
} from '../engines/index.js';
import type { Trajectory, TrajectoryFinish, TurnEvent } from '../rl/index.js';
import {
  type CodeRunner,
  executePythonTool,
  PYTHON_TOOL_NAME,
  type PythonToolOptions,
} from '../sandbox/index.js';
import { decodeFailureText, type ParsedToolCall, parseToolCalls } from '../tokenizer/index.js';
import { seedFor } from '../util/rng.js';
import { type BatchingOptions, BatchingRunner } from './batching.js';

// The multi-turn agent loop (rStar2's RStar2AgentLoop.run), token-in/token-out: the prompt is
// tokenised once; each turn appends the engine's sampled ids (mask 1, with their logprobs) and then
// the tool turn's ids (mask 0, logprob 0). Earlier text is never re-tokenised.

/** What the loop needs from a tokenizer + chat template (H4's ChatTemplate adapts to this). */
export interface AgentTemplate {
  promptIds(question: string): number[];
  /** Ids of the tool turn for these tool texts, including the next generation prompt. */
  toolTurnIds(toolTexts: string[]): number[];
  decode(ids: number[]): string; // special tokens kept
  stopTokenIds: number[];
  /** Ids a full template render puts after an end-of-turn token before the next turn ('\n'). */
  turnSeparatorIds?: number[];
  /** The tools the prompt shows, by name: the default executor runs calls to these (a recipe's tool.name). None
   *  (an empty list): no tool call is parsed, so a trajectory is one turn. */
  toolNames?: string[];
}

export interface ToolOutcome {
  text: string;
  error: boolean;
  status?: string;
}

/** Executes one parsed, well-formed call; must not throw (errors become tool text). */
export type ToolExecutor = (call: ParsedToolCall, runner: CodeRunner) => Promise<ToolOutcome>;

/**
 * 'reference': the tool turn is appended directly after the assistant's end-of-turn id, as rStar2
 *   does (no '\n' between `<|im_end|>` and `<|im_start|>user`).
 * 'rerender': the template's separator ids are inserted (mask 0) so ids match a full re-render.
 */
export type TurnBoundary = 'reference' | 'rerender';

export interface AgentOptions {
  template: AgentTemplate;
  runner: CodeRunner;
  executeTool?: ToolExecutor; // default: the rStar2 python tool
  toolOptions?: PythonToolOptions; // for the default executor (truncation, timeout)
  toolNames?: string[]; // names the default executor accepts; default the template's, else [python_code_with_standard_io]
  sampling?: Partial<SamplingParams>;
  maxTurns?: number; // assistant turns; default 5
  maxResponseTokens?: number; // response budget incl. tool tokens; default 8192
  maxParallelCalls?: number; // calls executed per turn; default 1
  turnBoundary?: TurnBoundary; // default 'reference'
  maxAttempts?: number; // tries per turn when the engine reports an error; default 3
  maxResumes?: number; // resumptions after server-side aborts with partial output; default 3
}

export interface RolloutProblem {
  id: string;
  question?: string;
  promptIds?: number[];
  gold?: string;
}

export interface RolloutOptions extends AgentOptions {
  problems: RolloutProblem[];
  n?: number; // samples per problem; default 1
  skip?: ReadonlySet<string>; // trajectory ids (`promptId#sample`) not to sample: a resumed rollout's saved ones
  scheduler?: Scheduler; // shared across calls (kept open)
  engines?: Engine[]; // or: a scheduler is made for this call and closed after
  schedulerOptions?: SchedulerOptions;
  onProgress?: (done: number, total: number, t: Trajectory) => void;
  /** Sees what the rollout cost (makespan, tail, re-prefilled tokens, engine idle share) once it ends. */
  onRolloutStats?: (stats: RolloutStats) => void;
  /** Tool calls from all trajectories are merged into runBatch calls; false sends each alone. */
  toolBatching?: BatchingOptions | false;
  signal?: AbortSignal;
}

export function defaultPythonExecutor(
  opts: PythonToolOptions = {},
  names = [PYTHON_TOOL_NAME],
): ToolExecutor {
  return async (call, runner) => {
    // mirrors `_call_tool`: json.loads(arguments), self.tools[name]; exceptions become tool text
    if (!names.includes(call.name)) return { text: `Error when executing tool: '${call.name}'`, error: true };
    let args: unknown;
    try {
      args = JSON.parse(call.arguments);
    } catch (e) {
      return { text: `Error when executing tool: ${(e as Error).message}`, error: true };
    }
    const r = await executePythonTool(args, runner, opts);
    return { text: r.text, error: r.error, status: r.result.status };
  };
}

/** A trajectory as it grows, turn by turn, and the one way it ends. */
class Growing {
  readonly t: Trajectory;
  private readonly t0 = Date.now();

  constructor(
    problem: RolloutProblem,
    sample: number,
    private readonly template: AgentTemplate,
  ) {
    this.t = {
      id: `${problem.id}#${sample}`,
      promptId: problem.id,
      sample,
      promptIds: [],
      responseIds: [],
      responseMask: [],
      responseLogprobs: [],
      events: [],
      finish: 'error',
      text: '',
      numToolCalls: 0,
      numToolErrors: 0,
      ms: 0,
    };
    if (problem.gold !== undefined) this.t.gold = problem.gold;
  }

  ev(e: TurnEvent): void {
    this.t.events.push(e);
  }

  push(ids: number[], mask: 0 | 1, lps?: number[]): void {
    for (let i = 0; i < ids.length; i++) {
      this.t.responseIds.push(ids[i]);
      this.t.responseMask.push(mask);
      this.t.responseLogprobs.push(lps ? lps[i] : 0);
    }
  }

  /** Cuts the response back to `n` ids. */
  truncate(n: number): void {
    this.t.responseIds.length = this.t.responseMask.length = this.t.responseLogprobs.length = n;
  }

  end(finish: TrajectoryFinish, error?: string): Trajectory {
    const t = this.t;
    t.finish = finish;
    if (error !== undefined) t.error = error;
    try {
      t.text = this.template.decode(t.responseIds);
    } catch (e) {
      // ids the tokenizer cannot decode (a mismatched engine): keep the record, say why
      t.finish = 'error';
      t.error = `${error ? `${error}; ` : ''}cannot decode response: ${(e as Error).message}`;
    }
    t.ms = Date.now() - this.t0;
    return t;
  }
}

/** AgentOptions with their defaults applied, read once per trajectory. */
function turnSettings(opts: AgentOptions) {
  const names = opts.toolNames ?? opts.template.toolNames;
  const base: SamplingParams = { ...DEFAULT_SAMPLING, ...opts.sampling };
  return {
    maxTurns: opts.maxTurns ?? 5,
    budget: opts.maxResponseTokens ?? 8192,
    maxCalls: opts.maxParallelCalls ?? 1,
    maxAttempts: opts.maxAttempts ?? 3,
    maxResumes: opts.maxResumes ?? 3,
    exec: opts.executeTool ?? defaultPythonExecutor(opts.toolOptions, names),
    // a prompt that shows no tool: a <tool_call> the model writes anyway is text of its answer
    parse: (names?.length === 0 ? () => [] : parseToolCalls) as typeof parseToolCalls,
    base,
    stopTokenIds: [...new Set([...base.stopTokenIds, ...opts.template.stopTokenIds])],
  };
}
type TurnSettings = ReturnType<typeof turnSettings>;
type Lease = Awaited<ReturnType<Scheduler['acquire']>>;

/** One assistant turn: generated, resumed after server aborts, retried after errors. The engine's result, or the
 *  trajectory ended when the turn cannot be completed. */
async function generateTurn(
  g: Growing,
  lease: Lease,
  turn: number,
  s: TurnSettings,
  signal?: AbortSignal,
): Promise<GenerateResult | Trajectory> {
  const t = g.t;
  let attempts = 0;
  let resumes = 0;
  for (;;) {
    if (signal?.aborted) return g.end('error', 'rollout aborted by caller');
    const out = await lease.generate(
      [...t.promptIds, ...t.responseIds],
      { ...s.base, stopTokenIds: s.stopTokenIds, maxNewTokens: s.budget - t.responseIds.length },
      signal,
    );
    t.engine = lease.engine.name; // the scheduler moves a trajectory off an engine that stopped answering
    if (out.finishReason === 'error' || out.logprobs.length !== out.outputIds.length) {
      const msg =
        out.error ?? `engine returned ${out.logprobs.length} logprobs for ${out.outputIds.length} ids`;
      g.ev({ kind: 'error', turn, message: msg });
      if (++attempts >= s.maxAttempts) return g.end('error', `${lease.engine.name}: ${msg}`);
      continue;
    }
    g.push(out.outputIds, 1, out.logprobs);
    if (out.finishReason === 'abort') {
      if (signal?.aborted) return g.end('error', 'rollout aborted by caller');
      g.ev({ kind: 'error', turn, message: `generation aborted (${out.error ?? 'no reason'}); resuming` });
      if (++resumes > s.maxResumes)
        return g.end('error', `${lease.engine.name}: generation aborted ${resumes} times`);
      if (t.responseIds.length < s.budget) continue;
    }
    return out;
  }
}

/** The turn's calls run together; a call that throws or did not parse becomes error text for the model. */
async function runCalls(
  g: Growing,
  calls: ParsedToolCall[],
  turn: number,
  exec: ToolExecutor,
  runner: CodeRunner,
) {
  return Promise.all(
    calls.map(async (c): Promise<ToolOutcome> => {
      g.ev({
        kind: 'tool_call',
        turn,
        name: c.name,
        arguments: c.arguments,
        ...(c.parseError === undefined ? {} : { parseError: c.parseError }),
      });
      if (c.parseError !== undefined) return { text: decodeFailureText(c.parseError), error: true };
      try {
        return await exec(c, runner);
      } catch (e) {
        return { text: `Error when executing tool: ${(e as Error).message}`, error: true };
      }
    }),
  );
}

/** Appends the tool turn (mask 0) after the generation that ended at genEnd; false if it would fill the budget,
 *  as a trajectory must never end on a tool turn (the reward must land on an assistant token). */
function appendToolTurn(
  g: Growing,
  outcomes: ToolOutcome[],
  genEnd: number,
  turn: number,
  toolMs: number,
  s: TurnSettings,
  opts: AgentOptions,
): boolean {
  const t = g.t;
  const sep =
    opts.turnBoundary === 'rerender' && s.stopTokenIds.includes(t.responseIds[genEnd - 1])
      ? (opts.template.turnSeparatorIds ?? [])
      : [];
  const toolIds = [...sep, ...opts.template.toolTurnIds(outcomes.map((o) => o.text))];
  const start = t.responseIds.length;
  const overflow = start + toolIds.length >= s.budget;
  for (const o of outcomes) {
    g.ev({
      kind: 'tool_result',
      turn,
      text: o.text,
      error: o.error,
      ms: toolMs,
      ...(o.status === undefined ? {} : { status: o.status }),
      start,
      end: overflow ? start : start + toolIds.length,
    });
  }
  if (!overflow) g.push(toolIds, 0);
  return !overflow;
}

/** Runs one trajectory to its end. Never throws: engine failures end it with finish 'error'. */
export async function runTrajectory(
  problem: RolloutProblem,
  sample: number,
  scheduler: Scheduler,
  opts: AgentOptions,
  signal?: AbortSignal,
): Promise<Trajectory> {
  const s = turnSettings(opts);
  const g = new Growing(problem, sample, opts.template);
  const t = g.t;
  try {
    t.promptIds = problem.promptIds ?? opts.template.promptIds(problem.question ?? '');
  } catch (e) {
    return g.end('error', `cannot build prompt: ${(e as Error).message}`);
  }
  if (t.promptIds.length === 0) return g.end('error', 'problem has neither promptIds nor question');
  let lease: Lease;
  try {
    lease = await scheduler.acquire(t.promptIds.length + s.budget, signal, t.promptIds.length, problem.id);
  } catch (e) {
    return g.end('error', (e as Error).message);
  }
  t.engine = lease.engine.name;
  try {
    for (let turn = 1; ; turn++) {
      const start = t.responseIds.length;
      const tTurn = Date.now();
      const out = await generateTurn(g, lease, turn, s, signal);
      if (!('finishReason' in out)) return out;
      // The engine had no room for one token: the model's context is full. A tool turn must not be the last, as
      // when it would not fit the budget, so the one that filled the context is taken back.
      if (out.finishReason === 'length' && t.responseIds.length === start && start > 0) {
        for (const e of t.events) {
          if (e.kind !== 'tool_result' || e.turn !== turn - 1) continue;
          e.end = e.start;
          g.truncate(e.start);
        }
        return g.end('tool_overflow');
      }
      const genEnd = t.responseIds.length;
      g.ev({
        kind: 'generation',
        turn,
        start,
        end: genEnd,
        finishReason: out.finishReason,
        ms: Date.now() - tTurn,
      });

      // reference order: budget, then turn limit, then parse
      if (genEnd >= s.budget) return g.end('length');
      const calls = s.parse(opts.template.decode(t.responseIds.slice(start, genEnd))).slice(0, s.maxCalls);
      if (calls.length === 0) return g.end(out.finishReason === 'length' ? 'length' : 'answered');
      if (turn >= s.maxTurns) return g.end('max_turns');

      const tTool = Date.now();
      const outcomes = await runCalls(g, calls, turn, s.exec, opts.runner);
      t.numToolCalls += calls.length;
      t.numToolErrors += outcomes.filter((o) => o.error).length;
      if (!appendToolTurn(g, outcomes, genEnd, turn, Date.now() - tTool, s, opts))
        return g.end('tool_overflow');
    }
  } catch (e) {
    return g.end('error', `agent loop failed: ${(e as Error).message}`);
  } finally {
    lease.release();
  }
}

/** Yields trajectories as they finish (completion order). All problems × n start at once; the
 *  scheduler's admission decides how many generate concurrently. */
export async function* streamRollouts(opts: RolloutOptions): AsyncGenerator<Trajectory> {
  const n = opts.n ?? 1;
  if (!Number.isInteger(n) || n < 1) throw new Error(`n must be a positive integer, got ${n}`);
  let scheduler = opts.scheduler;
  const own = !scheduler;
  if (!scheduler) {
    if (!opts.engines || opts.engines.length === 0)
      throw new Error('runRollouts needs `scheduler` or `engines`');
    scheduler = await Scheduler.create(opts.engines, opts.schedulerOptions);
  }
  const runner =
    opts.toolBatching === false ? opts.runner : new BatchingRunner(opts.runner, opts.toolBatching);
  const agentOpts: AgentOptions = { ...opts, runner };
  let total = 0;
  const done: Trajectory[] = [];
  let wake: (() => void) | undefined;
  let finished = 0;
  // A seed is per sample: one seed on every request gave the n samples of a problem the same prompt and the same
  // draws, so one answer n times. Hashed from (seed, problem id, sample), so it moves with neither the problem's
  // place in the file nor --limit, and runs with neighbouring seeds do not share samples (S + index would).
  const seed = opts.sampling?.seed;
  const seeded = (id: string, s: number): AgentOptions =>
    seed === undefined
      ? agentOpts
      : { ...agentOpts, sampling: { ...opts.sampling, seed: seedFor(seed, id, s) % 2 ** 31 } };
  for (const problem of opts.problems) {
    // the n samples of a problem share one tokenised prompt; a failure is reported per trajectory
    let p = problem;
    if (!p.promptIds && n > 1) {
      try {
        p = { ...p, promptIds: opts.template.promptIds(p.question ?? '') };
      } catch {}
    }
    for (let s = 0; s < n; s++) {
      if (opts.skip?.has(`${p.id}#${s}`)) continue;
      total++;
      void runTrajectory(p, s, scheduler, seeded(p.id, s), opts.signal)
        .catch((e: Error) => errorRecord(p, s, `agent loop failed: ${e.message}`))
        .then((t) => {
          done.push(t);
          wake?.();
        });
    }
  }
  try {
    while (finished < total) {
      if (done.length === 0) await new Promise<void>((r) => (wake = r));
      wake = undefined;
      while (done.length > 0) {
        const t = done.shift() as Trajectory;
        finished++;
        opts.onProgress?.(finished, total, t);
        yield t;
      }
    }
  } finally {
    const stats = scheduler.endRollout();
    opts.onRolloutStats?.(stats);
    if (own) await scheduler.close();
  }
}

function errorRecord(p: RolloutProblem, sample: number, error: string): Trajectory {
  return {
    id: `${p.id}#${sample}`,
    promptId: p.id,
    sample,
    promptIds: p.promptIds ?? [],
    responseIds: [],
    responseMask: [],
    responseLogprobs: [],
    events: [],
    finish: 'error',
    error,
    text: '',
    numToolCalls: 0,
    numToolErrors: 0,
    ms: 0,
    ...(p.gold === undefined ? {} : { gold: p.gold }),
  };
}

/** All trajectories, in problem order then sample order. */
export async function runRollouts(opts: RolloutOptions): Promise<Trajectory[]> {
  const out: Trajectory[] = [];
  for await (const t of streamRollouts(opts)) out.push(t);
  const order = new Map(opts.problems.map((p, i) => [p.id, i]));
  return out.sort(
    (a, b) => (order.get(a.promptId) ?? 0) - (order.get(b.promptId) ?? 0) || a.sample - b.sample,
  );
}

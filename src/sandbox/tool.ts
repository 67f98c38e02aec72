import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { PYTHON_DIR } from '../util/python.js';
import {
  type CodeJudgeOptions,
  failedResult,
  type SubmissionResult,
  toSubmissionResult,
} from './codejudge.js';
import type { CodeRunner, RunRequest, RunResult } from './types.js';

// The rStar2 python tool as a library: schema, the code that actually runs, and the exact text the
// model reads back (rstar2_agent/tools/code_judge_utils.py + verl's tool-response truncation).

// The schema lives with the chat templates (it is part of the prompt); re-exported here for tool users.
export { PYTHON_TOOL_NAME, PYTHON_TOOL_SCHEMA } from '../tokenizer/index.js';

export type TruncateSide = 'middle' | 'left' | 'right';

let wrapperText: string | undefined;
/** The Python wrapper source (python/sandbox/tool_wrapper.py), read once. */
export function toolWrapperSource(): string {
  wrapperText ??= readFileSync(join(PYTHON_DIR, 'sandbox', 'tool_wrapper.py'), 'utf8');
  return wrapperText;
}

/** The full script that runs for one tool call: wrapper + the model's code, base64-embedded. */
export function buildToolCode(code: string): string {
  const b64 = Buffer.from(code, 'utf8').toString('base64');
  return `${toolWrapperSource()}\n_rstar2_cell('${b64}')\n`;
}

/** verl's tool-response truncation (max_tool_response_length, tool_response_truncate_side). */
export function truncateToolText(text: string, budget = 256, side: TruncateSide = 'middle'): string {
  // characters as verl's Python counts them: code points, so a pair of surrogates is one and is never split
  const cs = /[\ud800-\udfff]/.test(text) ? Array.from(text) : text;
  if (cs.length <= budget) return text;
  const cut = (a: number, b?: number) => (typeof cs === 'string' ? cs.slice(a, b) : cs.slice(a, b).join(''));
  if (side === 'left') return `${cut(0, budget)}...(truncated)`;
  if (side === 'right') return `(truncated)...${cut(cs.length - budget)}`;
  const half = Math.floor(budget / 2);
  return `${cut(0, half)}...(truncated)...${half > 0 ? cut(cs.length - half) : ''}`;
}

/** The untruncated tool text for one code-judge result (run_tool_calls_on_server_async). */
export function formatToolText(r: SubmissionResult): string {
  let text = r.success && r.run_success ? 'Tool call success' : `Tool call failure\nreason: ${r.reason}`;
  if (r.stdout) text += `\nstdout: ${r.stdout}`;
  if (r.stderr) text += `\nstderr: ${r.stderr}`;
  return `${text}\nexecution time: ${r.cost.toFixed(2)}s`;
}

export interface PythonToolOptions extends CodeJudgeOptions {
  /** Characters of tool text the model sees (verl max_tool_response_length). Default 256. */
  budget?: number;
  side?: TruncateSide;
  timeoutMs?: number; // default 4000 (the reference's MAX_EXECUTION_TIME)
  memoryMb?: number;
  /** Run the model's code through the wrapper (echo + error text). Default true. */
  wrap?: boolean;
}

export interface PythonToolResult {
  /** What the model reads (truncated). */
  text: string;
  /** True for "Tool call failure" (bad args, exception, timeout, infrastructure). */
  error: boolean;
  result: RunResult;
  /** Before truncation. */
  fullText: string;
}

export interface PythonToolArgs {
  code: string;
  input?: string;
}

/** Checks model-produced arguments; returns a message naming the problem, or null when usable. */
export function checkToolArgs(args: unknown): string | null {
  if (typeof args !== 'object' || args === null || Array.isArray(args))
    return 'arguments must be a JSON object';
  const a = args as Record<string, unknown>;
  if (typeof a.code !== 'string') return "argument 'code' must be a string";
  if (a.input != null && typeof a.input !== 'string') return "argument 'input' must be a string";
  return null;
}

export function toolRequest(args: PythonToolArgs, opts: PythonToolOptions = {}): RunRequest {
  const req: RunRequest = {
    code: opts.wrap === false ? args.code : buildToolCode(args.code),
    timeoutMs: opts.timeoutMs ?? 4000,
  };
  if (args.input) req.stdin = args.input; // "" means no stdin, as in the reference
  if (opts.memoryMb !== undefined) req.memoryMb = opts.memoryMb;
  return req;
}

export function toolResultFromRun(result: RunResult, opts: PythonToolOptions = {}): PythonToolResult {
  const sub = toSubmissionResult({ type: 'python', solution: '', sub_id: '' }, result, opts);
  const fullText = formatToolText(sub);
  return {
    text: truncateToolText(fullText, opts.budget ?? 256, opts.side ?? 'middle'),
    error: !(sub.success && sub.run_success),
    result,
    fullText,
  };
}

/** One python_code_with_standard_io call, end to end. Never throws for a bad call or a runner fault. */
export async function executePythonTool(
  args: unknown,
  runner: CodeRunner,
  opts: PythonToolOptions = {},
): Promise<PythonToolResult> {
  const bad = checkToolArgs(args);
  if (bad) return toolResultFromRun(failedResult('invalid_input', bad), opts);
  let result: RunResult;
  try {
    result = await runner.run(toolRequest(args as PythonToolArgs, opts));
  } catch (e) {
    result = failedResult('internal_error', `sandbox failed: ${(e as Error).message}`);
  }
  return toolResultFromRun(result, opts);
}

/** Many calls at once through runBatch (order kept); bad arguments never reach the runner. */
export async function executePythonToolBatch(
  argsList: unknown[],
  runner: CodeRunner,
  opts: PythonToolOptions = {},
): Promise<PythonToolResult[]> {
  const out: (PythonToolResult | undefined)[] = argsList.map((a) => {
    const bad = checkToolArgs(a);
    return bad ? toolResultFromRun(failedResult('invalid_input', bad), opts) : undefined;
  });
  const idx = out.flatMap((r, i) => (r ? [] : [i]));
  let results: RunResult[];
  try {
    results = await runner.runBatch(idx.map((i) => toolRequest(argsList[i] as PythonToolArgs, opts)));
  } catch (e) {
    results = idx.map(() => failedResult('internal_error', `sandbox failed: ${(e as Error).message}`));
  }
  idx.forEach((i, k) => {
    out[i] = toolResultFromRun(results[k], opts);
  });
  return out as PythonToolResult[];
}

import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { RunRequest, RunResult, RunStatus } from './types.js';

// code-judge's wire shapes (0xWJ/code-judge app/model.py) and the translation between them and the
// native RunRequest/RunResult. The reference's Python client and the rStar2 tool text depend on the
// exact field names, `reason` strings, the 1000-char cut and the timeout marker, so they live here once.

export const MAX_STDOUT_ERROR_LENGTH = 1000;

/** The first n characters as Python counts them (code points, `s[:n]`), never half a surrogate pair: a lone
 *  surrogate makes the text unencodable for a Python client (UnicodeEncodeError) and a tokenizer. */
export function headChars(s: string, n: number): string {
  if (s.length <= n) return s;
  let i = 0;
  for (let k = 0; k < n && i < s.length; k++) {
    const c = s.charCodeAt(i);
    i += c >= 0xd800 && c <= 0xdbff && i + 1 < s.length ? 2 : 1;
  }
  return s.slice(0, i);
}
export const TIMEOUT_MARKER = 'Suicide from timeout.\n';

export const SubmissionSchema = z.object({
  sub_id: z.string().nullish(),
  type: z.enum(['python', 'cpp', 'math']),
  options: z.record(z.string(), z.string()).nullish(),
  solution: z.string(),
  input: z.string().nullish(),
  expected_output: z.string().nullish(),
});
export type Submission = z.infer<typeof SubmissionSchema>;

export const BatchSubmissionSchema = z.object({
  sub_id: z.string().nullish(),
  type: z.literal('batch').default('batch'),
  submissions: z.array(SubmissionSchema).min(1),
});
export type BatchSubmission = z.infer<typeof BatchSubmissionSchema>;

export type Reason = '' | 'worker_timeout' | 'queue_timeout' | 'internal_error' | 'invalid_input';

export interface SubmissionResult {
  sub_id: string;
  success: boolean;
  run_success: boolean;
  cost: number;
  stdout: string | null;
  stderr: string | null;
  reason: Reason;
}
export type JudgeResult = Omit<SubmissionResult, 'stdout' | 'stderr'>;

export interface CodeJudgeOptions {
  /** Per-stream character cut (code-judge MAX_STDOUT_ERROR_LENGTH). */
  maxOutputChars?: number;
  /** Append code-judge's "Suicide from timeout." line to stdout on a wall-clock kill, as the reference does. */
  timeoutMarker?: boolean;
}

export function reasonOf(status: RunStatus): Reason {
  switch (status) {
    case 'ok':
    case 'error':
    case 'oom': // the reference sees a MemoryError traceback: an ordinary failure
    case 'output_limit':
    case 'killed':
      return '';
    case 'timeout':
      return 'worker_timeout';
    case 'queue_timeout':
    case 'busy':
      return 'queue_timeout'; // the reference client resubmits exactly these
    case 'invalid_input':
      return 'invalid_input';
    default:
      return 'internal_error';
  }
}

export function toRunRequest(sub: Submission, defaults: Partial<RunRequest> = {}): RunRequest {
  const req: RunRequest = { ...defaults, code: sub.solution };
  // The reference turns an empty input into "no stdin" (EOFError on input()).
  if (sub.input) req.stdin = sub.input;
  return req;
}

export function toSubmissionResult(
  sub: Submission,
  res: RunResult,
  opts: CodeJudgeOptions = {},
): SubmissionResult {
  const cut = opts.maxOutputChars ?? MAX_STDOUT_ERROR_LENGTH;
  const reason = reasonOf(res.status);
  const runSuccess = res.status === 'ok';
  const ran = reason === '' || reason === 'worker_timeout';
  let stdout = res.stdout;
  // a call the pool killed (memory held by all its processes, an output flood) has no traceback of its own to
  // show; code-judge's would show Python's MemoryError: the pool's cause stands in for it
  const stderr =
    res.stderr || (res.error && ['oom', 'output_limit', 'killed'].includes(res.status) ? res.error : '');
  if (res.status === 'timeout' && (opts.timeoutMarker ?? true)) stdout += TIMEOUT_MARKER;
  const success = runSuccess && (sub.expected_output == null || stdout.trim() === sub.expected_output.trim());
  return {
    sub_id: sub.sub_id ?? randomUUID(),
    success,
    run_success: runSuccess,
    cost: res.wallMs / 1000,
    stdout: ran ? headChars(stdout, cut) : null,
    // code-judge sends null here; we send the cause instead so a failure is never unexplained.
    stderr: ran ? headChars(stderr, cut) : (res.error ?? null),
    reason,
  };
}

export function toJudgeResult(r: SubmissionResult): JudgeResult {
  const { stdout: _o, stderr: _e, ...rest } = r;
  return rest;
}

export { failedResult } from './types.js';

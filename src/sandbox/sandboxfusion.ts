import { constants } from 'node:os';
import { z } from 'zod';
import type { RunRequest, RunResult } from './types.js';

// SandboxFusion's `POST /run_code` wire shapes (bytedance/SandboxFusion sandbox/server/sandbox_api.py:
// RunCodeRequest, RunCodeResponse, parse_run_status; sandbox/runners/types.py: CommandRunResult,
// Language) and their translation to and from the native RunRequest/RunResult, so verl's sandbox
// tool and reward code (verl/utils/reward_score/sandbox_fusion/utils.py) can point at this service.
// Only Python runs here; the mapping of statuses is documented in docs/DECISIONS.md.

/** SandboxFusion's `Language` literal: a request naming anything else is a schema error there (422). */
export const SANDBOX_FUSION_LANGUAGES = [
  'python',
  'cpp',
  'nodejs',
  'go',
  'go_test',
  'java',
  'php',
  'csharp',
  'bash',
  'typescript',
  'sql',
  'rust',
  'cuda',
  'lua',
  'R',
  'perl',
  'D_ut',
  'ruby',
  'scala',
  'julia',
  'pytest',
  'junit',
  'kotlin_script',
  'jest',
  'verilog',
  'python_gpu',
  'lean',
  'swift',
  'racket',
] as const;

/** Languages this service runs. */
export const RUN_CODE_LANGUAGES: ReadonlySet<string> = new Set(['python']);

// pydantic's lax mode takes a number written as a string ("5") for a number field; clients rely on it
const num = (n: z.ZodNumber) =>
  z.preprocess((v) => (typeof v === 'string' && /^\s*-?\d+(\.\d+)?\s*$/.test(v) ? Number(v) : v), n);

/** RunCodeRequest with SandboxFusion's defaults; unknown fields are ignored, as pydantic does. */
export const RunCodeRequestSchema = z.object({
  compile_timeout: num(z.number().nonnegative()).default(10),
  run_timeout: num(z.number().positive().max(3600)).default(10),
  memory_limit_MB: num(z.number().int()).default(-1),
  code: z.string(),
  stdin: z.string().nullish(),
  language: z.enum(SANDBOX_FUSION_LANGUAGES),
  files: z.record(z.string(), z.string().nullable()).default({}),
  fetch_files: z.array(z.string()).default([]),
});
export type RunCodeRequest = z.infer<typeof RunCodeRequestSchema>;

export type CommandRunStatus = 'Finished' | 'Error' | 'TimeLimitExceeded';
export type RunCodeStatus = 'Success' | 'Failed' | 'SandboxError';

export interface CommandRunResult {
  status: CommandRunStatus;
  execution_time: number | null;
  return_code: number | null;
  stdout: string | null;
  stderr: string | null;
}

export interface RunCodeResponse {
  status: RunCodeStatus;
  message: string;
  compile_result: CommandRunResult | null;
  run_result: CommandRunResult | null;
  executor_pod_name: string | null;
  files: Record<string, string>;
}

/** The native request for a Python RunCodeRequest. `memory_limit_MB` ≤ 0 (SandboxFusion: none) takes
 * the service's default: this sandbox never runs without a memory limit. */
export function toRunRequestFromRunCode(req: RunCodeRequest, defaults: Partial<RunRequest> = {}): RunRequest {
  const out: RunRequest = {
    ...defaults,
    code: req.code,
    timeoutMs: Math.max(1, Math.round(req.run_timeout * 1000)),
  };
  if (req.memory_limit_MB > 0) out.memoryMb = req.memory_limit_MB;
  if (req.stdin) out.stdin = req.stdin;
  // SandboxFusion skips files whose content is null (restore_files).
  const files = Object.entries(req.files).filter((e): e is [string, string] => typeof e[1] === 'string');
  if (files.length > 0) out.files = Object.fromEntries(files);
  if (req.fetch_files.length > 0) out.fetchFiles = req.fetch_files;
  return out;
}

/** What a process's end reads as in SandboxFusion's `return_code` (Python's subprocess: a signal is
 * its negated number). */
function returnCode(r: RunResult): number | null {
  if (r.exitCode !== null) return r.exitCode;
  if (r.signal) {
    const n = (constants.signals as Record<string, number | undefined>)[r.signal];
    if (n !== undefined) return -n;
  }
  return null;
}

const OUTPUT_LIMIT = 'output limit: the run was killed for writing too much output';

/** Outcomes where the code never ran (or the sandbox failed it): no run_result, SandboxError. */
const NEVER_RAN = new Set(['queue_timeout', 'busy', 'invalid_input', 'internal_error']);

export function sandboxError(message: string, podName: string | null = null): RunCodeResponse {
  return {
    status: 'SandboxError',
    message,
    compile_result: null,
    run_result: null,
    executor_pod_name: podName,
    files: {},
  };
}

/** RunCodeResponse for a native result (see the table in docs/DECISIONS.md). */
export function toRunCodeResponse(r: RunResult, podName: string | null = null): RunCodeResponse {
  if (NEVER_RAN.has(r.status)) return sandboxError(r.error ?? r.status, podName);
  const timedOut = r.status === 'timeout';
  let code = timedOut ? null : returnCode(r);
  // A run that failed without an exit status of its own still reads as a failure, never as 0.
  if (!timedOut && r.status !== 'ok' && (code === null || code === 0)) code = 1;
  const run: CommandRunResult = {
    status: timedOut ? 'TimeLimitExceeded' : 'Finished',
    execution_time: r.wallMs / 1000,
    return_code: code,
    stdout: r.stdout,
    stderr: r.stderr,
  };
  return {
    // parse_run_status: TimeLimitExceeded or a non-zero return code → Failed
    status: r.status === 'ok' ? 'Success' : 'Failed',
    // SandboxFusion leaves this empty unless SandboxError; the cause of a kill (memory, output) is
    // worth more to a client than the empty string.
    message: r.status === 'ok' ? '' : (r.error ?? (r.status === 'output_limit' ? OUTPUT_LIMIT : '')),
    compile_result: null,
    run_result: run,
    executor_pod_name: podName,
    files: r.files ?? {},
  };
}

// What a Python execution request and result look like everywhere: embedded pool, HTTP service,
// Redis workers. Native API shapes; the code-judge-compatible routes translate at the edge.

/** Where a Redis password may come from instead of the URL, out of the process list. */
export const REDIS_PASSWORD_ENV = 'RSTAR2_REDIS_PASSWORD';

/** What a sandbox `preload` entry must be: a dotted Python module name. */
export const MODULE_NAME = /^[A-Za-z_][A-Za-z0-9_.]*$/;

export interface RunRequest {
  code: string;
  stdin?: string;
  timeoutMs?: number; // wall clock, default 4000
  memoryMb?: number; // address-space limit
  files?: Record<string, string>; // name -> base64 content, written into scratch before the run
  fetchFiles?: string[]; // scratch files to return after the run
  session?: string; // stateful interpreter id (optional feature)
  queueTimeoutMs?: number; // answer queue_timeout if the call cannot start within this; 0/absent = wait
}

export type RunStatus =
  | 'ok' // exit code 0
  | 'error' // non-zero exit or exception
  | 'timeout'
  | 'oom'
  | 'output_limit'
  | 'killed' // by a signal not otherwise classified
  | 'queue_timeout' // could not start in time; never silently dropped
  | 'busy' // admission refused
  | 'invalid_input'
  | 'internal_error';

export interface RunResult {
  status: RunStatus;
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timedOut: boolean;
  oom: boolean;
  wallMs: number;
  cpuMs: number;
  peakMemoryKb: number;
  files?: Record<string, string>;
  error?: string; // human-readable cause for internal/invalid outcomes
}

/** Anything that runs Python: the embedded pool, the HTTP client, the Redis front door, fakes. */
export interface CodeRunner {
  run(req: RunRequest): Promise<RunResult>;
  runBatch(reqs: RunRequest[]): Promise<RunResult[]>; // results in request order
  /** Ends a stateful session (RunRequest.session); true if one was live. Runners without sessions omit it. */
  closeSession?(session: string): Promise<boolean> | boolean;
  close(): Promise<void>;
}

/** A result for an item that never ran or was cut short (bad input, refused, lost): no output, no exit code. */
export function failedResult(status: RunStatus, error?: string, wallMs = 0): RunResult {
  return {
    status,
    exitCode: null,
    signal: null,
    stdout: '',
    stderr: '',
    truncated: false,
    timedOut: false,
    oom: false,
    wallMs,
    cpuMs: 0,
    peakMemoryKb: 0,
    ...(error === undefined ? {} : { error }),
  };
}

import type { Engine, EngineLoad, GenerateResult, SamplingParams } from './types.js';

// The policy worker's own serving engine (python/rstar2_worker/engine/engine.py) as an Engine. Each request goes to
// the worker as it comes; the worker batches whatever is running between decode steps (continuous batching),
// reuses the KV of a trajectory's earlier turns, and answers each request as it ends, so a trajectory whose
// turn finished early runs its tool call while the others still decode.

/** The slice of PolicyWorker this engine needs. */
export interface EngineWorker {
  /** `signals[i]` is row i's caller's: a worker that can, stops that row once it aborts. */
  generate(
    prompts: number[][],
    sampling: SamplingParams,
    signals?: (AbortSignal | undefined)[],
  ): Promise<GenerateResult[]>;
  /** Live load of the worker's engine (running, queued, KV tokens used and in all). */
  engineLoad?(): Promise<Required<EngineLoad>>;
  close?(): Promise<void>;
}

const aborted = (): GenerateResult => ({
  outputIds: [],
  logprobs: [],
  finishReason: 'abort',
  error: 'aborted by caller',
});

export interface EmbeddedOptions {
  /** KV capacity the scheduler plans with, instead of what the worker reports (default: its report, or
   *  262144 from a worker that reports none). */
  capacityTokens?: number;
}

export class EmbeddedEngine implements Engine {
  readonly name = 'embedded';
  /** Requests sent to the worker. */
  calls = 0;

  constructor(
    private readonly worker: EngineWorker,
    private readonly opts: EmbeddedOptions = {},
  ) {}

  async generate(
    inputIds: number[],
    sampling: SamplingParams,
    signal?: AbortSignal,
  ): Promise<GenerateResult> {
    if (signal?.aborted) return aborted();
    this.calls++;
    // the caller's abort answers at once; the worker stops the row too (its late result is dropped)
    let onAbort = () => {};
    const gone = new Promise<GenerateResult>((res) => {
      onAbort = () => res(aborted());
      signal?.addEventListener('abort', onAbort, { once: true });
    });
    const run = this.worker.generate([inputIds], sampling, [signal]).then(
      (rs) => rs[0],
      (e: Error): GenerateResult => ({
        outputIds: [],
        logprobs: [],
        finishReason: 'error',
        error: `embedded worker failed: ${e.message}`,
      }),
    );
    try {
      return await Promise.race([run, gone]);
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  async load(): Promise<EngineLoad> {
    const l = await this.worker.engineLoad?.();
    const capacityTokens = this.opts.capacityTokens ?? (l?.capacityTokens || 262_144);
    return l ? { ...l, capacityTokens } : { capacityTokens, queued: 0 };
  }

  async close(): Promise<void> {
    await this.worker.close?.();
  }
}

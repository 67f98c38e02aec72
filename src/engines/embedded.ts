import type { Engine, EngineLoad, GenerateResult, SamplingParams } from './types.js';

// Serves many concurrent trajectories from one in-process torch worker: requests that arrive while
// the worker is busy (or in the same tick) are merged into one batched `generate` call. Requests
// are grouped by sampling settings; maxNewTokens may differ, so the batch runs to the largest and
// each output is cut back to its own limit (the extra tokens were never conditioned on). Seeds may
// differ too: each row then samples from its own generator (`seeds`), so a seeded request draws the
// same tokens alone or in any batch.

/** One batched call's settings: `seeds[i]` seeds row i's sampler (null: the worker's own generator). */
export type BatchSampling = SamplingParams & { seeds?: (number | null)[] };

/** The slice of H3's PolicyWorker this engine needs. */
export interface BatchGenerator {
  /** `signals[i]` is row i's caller's: a worker that can, stops that row once it aborts. */
  generate(
    prompts: number[][],
    sampling: BatchSampling,
    signals?: (AbortSignal | undefined)[],
  ): Promise<GenerateResult[]>;
  close?(): Promise<void>;
}

interface Pending {
  ids: number[];
  sampling: SamplingParams;
  signal?: AbortSignal;
  resolve: (r: GenerateResult) => void;
}

const aborted = (): GenerateResult => ({
  outputIds: [],
  logprobs: [],
  finishReason: 'abort',
  error: 'aborted by caller',
});

export interface EmbeddedOptions {
  capacityTokens?: number; // what the scheduler may reserve on this worker; default 262144
  maxBatch?: number; // default 64
}

export class EmbeddedEngine implements Engine {
  readonly name = 'embedded';
  batches = 0;
  private queue: Pending[] = [];
  private busy = false;
  private scheduled = false;
  private readonly capacity: number;
  private readonly maxBatch: number;

  constructor(
    private readonly worker: BatchGenerator,
    opts: EmbeddedOptions = {},
  ) {
    this.capacity = opts.capacityTokens ?? 262_144;
    this.maxBatch = opts.maxBatch ?? 64;
  }

  generate(inputIds: number[], sampling: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    if (signal?.aborted) return Promise.resolve(aborted());
    return new Promise((resolve) => {
      // the caller's abort answers at once: queued, the request leaves the queue; running, its row's late
      // result is dropped (resolving twice is a no-op)
      const onAbort = () => {
        this.queue = this.queue.filter((q) => q !== p);
        resolve(aborted());
      };
      const p: Pending = {
        ids: inputIds,
        sampling,
        signal,
        resolve: (r) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(r);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.queue.push(p);
      this.kick();
    });
  }

  private kick(): void {
    if (this.busy || this.scheduled || this.queue.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      void this.flush();
    });
  }

  private async flush(): Promise<void> {
    if (this.busy || this.queue.length === 0) return;
    this.busy = true;
    const key = samplingKey(this.queue[0].sampling);
    const batch: Pending[] = [];
    const rest: Pending[] = [];
    for (const p of this.queue) {
      if (batch.length < this.maxBatch && samplingKey(p.sampling) === key) batch.push(p);
      else rest.push(p);
    }
    this.queue = rest;
    const maxNew = Math.max(...batch.map((p) => p.sampling.maxNewTokens));
    this.batches++;
    const { seed: _, ...shared } = batch[0].sampling;
    const seeds = batch.map((p) => p.sampling.seed ?? null);
    try {
      const results = await this.worker.generate(
        batch.map((p) => p.ids),
        { ...shared, maxNewTokens: maxNew, ...(seeds.some((s) => s !== null) ? { seeds } : {}) },
        batch.map((p) => p.signal),
      );
      if (results.length !== batch.length)
        throw new Error(`worker returned ${results.length} results for ${batch.length} prompts`);
      batch.forEach((p, i) => {
        p.resolve(clip(results[i], p.sampling.maxNewTokens));
      });
    } catch (e) {
      const error = `embedded worker failed: ${(e as Error).message}`;
      for (const p of batch) p.resolve({ outputIds: [], logprobs: [], finishReason: 'error', error });
    } finally {
      this.busy = false;
      this.kick();
    }
  }

  async load(): Promise<EngineLoad> {
    return { capacityTokens: this.capacity, queued: this.queue.length };
  }

  async close(): Promise<void> {
    await this.worker.close?.();
  }
}

function samplingKey(s: SamplingParams): string {
  return JSON.stringify({ ...s, maxNewTokens: 0, seed: 0 });
}

function clip(r: GenerateResult, maxNew: number): GenerateResult {
  if (r.outputIds.length <= maxNew) return r;
  return {
    ...r,
    outputIds: r.outputIds.slice(0, maxNew),
    logprobs: r.logprobs.slice(0, maxNew),
    finishReason: 'length',
  };
}

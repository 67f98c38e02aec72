import { type CodeRunner, failedResult, type RunRequest, type RunResult } from '../sandbox/index.js';

// Collects tool calls from many trajectories into runBatch calls without delaying any of them: a
// request waits at most until the current event-loop turn ends (or until the batch is full), and up
// to `concurrency` batches run at once. A failed batch resolves every request with an
// internal_error result, so a crashed sandbox never drops a tool call.

export interface BatchingOptions {
  maxBatch?: number; // default 32 (reference request_processor_batch_size)
  concurrency?: number; // batches in flight; default 8 (reference request_processor_concurrency)
}

interface Item {
  req: RunRequest;
  resolve: (r: RunResult) => void;
}

export class BatchingRunner implements CodeRunner {
  batches = 0;
  private queue: Item[] = [];
  private inflight = 0;
  private scheduled = false;
  private readonly maxBatch: number;
  private readonly concurrency: number;

  constructor(
    private readonly inner: CodeRunner,
    opts: BatchingOptions = {},
  ) {
    this.maxBatch = opts.maxBatch ?? 32;
    this.concurrency = opts.concurrency ?? 8;
  }

  run(req: RunRequest): Promise<RunResult> {
    return new Promise((resolve) => {
      this.queue.push({ req, resolve });
      if (this.queue.length >= this.maxBatch) this.drain();
      else if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => {
          this.scheduled = false;
          this.drain();
        });
      }
    });
  }

  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }

  private drain(): void {
    while (this.queue.length > 0 && this.inflight < this.concurrency) {
      const batch = this.queue.splice(0, this.maxBatch);
      this.inflight++;
      this.batches++;
      this.inner
        .runBatch(batch.map((b) => b.req))
        .then(
          (results) => {
            batch.forEach((b, i) => {
              b.resolve(results[i] ?? internalError('sandbox returned too few results'));
            });
          },
          (e: Error) => {
            for (const b of batch) b.resolve(internalError(`sandbox batch failed: ${e.message}`));
          },
        )
        .finally(() => {
          this.inflight--;
          this.drain();
        });
    }
  }

  async close(): Promise<void> {
    await this.inner.close();
  }
}

export function internalError(error: string): RunResult {
  return failedResult('internal_error', error);
}

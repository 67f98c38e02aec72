// Worker-thread side of VerifierPool: verifies one item per message.
import { parentPort } from 'node:worker_threads';
import { customReward } from './custom.js';
import type { VerifyOptions } from './types.js';
import { verify } from './verify.js';

interface Job {
  id: number;
  pred: string;
  gold: string;
  opts: VerifyOptions;
  row?: unknown;
}

if (!parentPort) throw new Error('verify-thread must run in a worker thread');
const port = parentPort;
port.on('message', async (job: Job) => {
  try {
    const { module } = job.opts;
    const result = module
      ? await customReward(module, { text: job.pred, gold: job.gold, row: job.row ?? null })
      : verify(job.pred, job.gold, job.opts);
    port.postMessage({ id: job.id, result });
  } catch (e) {
    port.postMessage({ id: job.id, error: (e as Error).message });
  }
});
port.postMessage({ ready: true });

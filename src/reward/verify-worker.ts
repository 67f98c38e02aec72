// Worker-thread side of VerifierPool: verifies one item per message.
import { parentPort } from 'node:worker_threads';
import type { VerifyOptions } from './types.js';
import { verify } from './verify.js';

interface Job {
  id: number;
  pred: string;
  gold: string;
  opts: VerifyOptions;
}

if (!parentPort) throw new Error('verify-worker must run in a worker thread');
const port = parentPort;
port.on('message', (job: Job) => {
  try {
    port.postMessage({ id: job.id, result: verify(job.pred, job.gold, job.opts) });
  } catch (e) {
    port.postMessage({ id: job.id, error: (e as Error).message });
  }
});
port.postMessage({ ready: true });

import { Worker, type WorkerOptions } from 'node:worker_threads';

// Starts a worker thread from a module next to the caller. Under tsx (sources are .ts) the worker
// needs tsx's loader too; compiled .js needs nothing. `rel` has no extension: './verify-worker'.
export function startWorker(rel: string, callerUrl: string, options: WorkerOptions = {}): Worker {
  const fromSource = callerUrl.endsWith('.ts');
  const url = new URL(`${rel}${fromSource ? '.ts' : '.js'}`, callerUrl);
  const hasTsx = process.execArgv.some((a) => a.includes('tsx'));
  const execArgv =
    fromSource && !hasTsx ? [...process.execArgv, '--import', import.meta.resolve('tsx')] : process.execArgv;
  return new Worker(url, { ...options, execArgv });
}

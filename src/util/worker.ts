import { Worker, type WorkerOptions } from 'node:worker_threads';

// Starts a worker thread from a module next to the caller. Under tsx (sources are .ts) the worker
// needs tsx's loader too; compiled .js needs nothing. `rel` has no extension: './verify-worker'.
// On Node 20, passing `--import tsx` in a worker's execArgv does not apply tsx's hooks inside the worker
// (ERR_UNKNOWN_FILE_EXTENSION for .ts), so source workers start from a tiny eval bootstrap that registers
// tsx through its API and then imports the module.
export function startWorker(rel: string, callerUrl: string, options: WorkerOptions = {}): Worker {
  const fromSource = callerUrl.endsWith('.ts');
  const url = new URL(`${rel}${fromSource ? '.ts' : '.js'}`, callerUrl);
  if (!fromSource) return new Worker(url, options);
  const api = import.meta.resolve('tsx/esm/api');
  const boot =
    `import(${JSON.stringify(api)}).then((m) => { m.register(); return import(${JSON.stringify(url.href)}); })` +
    '.catch((e) => { setImmediate(() => { throw e; }); });';
  return new Worker(boot, { ...options, eval: true });
}

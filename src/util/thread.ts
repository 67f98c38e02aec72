import { Worker, type WorkerOptions } from 'node:worker_threads';

// Starts a thread (node:worker_threads) from a module next to the caller. Under tsx (sources are .ts) the thread
// needs tsx's loader too; compiled .js needs nothing. `rel` has no extension: './verify-thread'.
// On Node 20, passing `--import tsx` in a thread's execArgv does not apply tsx's hooks inside the thread
// (ERR_UNKNOWN_FILE_EXTENSION for .ts), so a thread on the sources starts from a tiny eval bootstrap that registers
// tsx through its API and then imports the module.
export function startThread(rel: string, callerUrl: string, options: WorkerOptions = {}): Worker {
  const fromSource = callerUrl.endsWith('.ts');
  const url = new URL(`${rel}${fromSource ? '.ts' : '.js'}`, callerUrl);
  if (!fromSource) return new Worker(url, options);
  const api = import.meta.resolve('tsx/esm/api');
  const boot =
    `import(${JSON.stringify(api)}).then((m) => { m.register(); return import(${JSON.stringify(url.href)}); })` +
    '.catch((e) => { setImmediate(() => { throw e; }); });';
  return new Worker(boot, { ...options, eval: true });
}

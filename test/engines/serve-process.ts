import { type ChildProcess, spawn } from 'node:child_process';
import { freePort } from '../../src/util/net.js';

// A `rstar2 serve` process for tests: started on a port the test picks free, ready once /health answers, and
// stopped by the test in every outcome (stop() kills it, SIGKILL after 5 s).

export interface ServeProcess {
  url: string;
  port: number;
  proc: ChildProcess;
  log(): string;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export async function startServe(
  model: string,
  opts: {
    env?: Record<string, string>;
    port?: number;
    args?: string[];
    readyMs?: number;
    host?: string; // default 127.0.0.1
    prefix?: string[]; // what runs it, e.g. `ip netns exec NAME`
  } = {},
): Promise<ServeProcess> {
  const port = opts.port ?? (await freePort('127.0.0.1'));
  const host = opts.host ?? '127.0.0.1';
  const [cmd, ...pre] = [...(opts.prefix ?? []), process.execPath];
  const args = ['serve', '--model', model, '--host', host, '--port', String(port), '--threads', '1'];
  const proc = spawn(cmd, [...pre, 'bin/rstar2.js', ...args, ...(opts.args ?? [])], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...opts.env },
  });
  let log = '';
  proc.stdout?.on('data', (d) => (log += d));
  proc.stderr?.on('data', (d) => (log += d));
  const stop = async (signal: NodeJS.Signals = 'SIGTERM') => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once('exit', r));
    proc.kill(signal);
    const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
    await gone;
    clearTimeout(t);
  };
  const url = `http://${host}:${port}`;
  const deadline = Date.now() + (opts.readyMs ?? 90_000);
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`rstar2 serve exited ${proc.exitCode}:\n${log}`);
    if (
      await fetch(`${url}/health`).then(
        (r) => r.ok,
        () => false,
      )
    )
      return { url, port, proc, log: () => log, stop };
    await new Promise((r) => setTimeout(r, 200));
  }
  await stop('SIGKILL');
  throw new Error(`rstar2 serve did not answer /health in ${opts.readyMs ?? 90_000} ms:\n${log}`);
}

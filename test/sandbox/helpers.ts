import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before } from 'node:test';
import { failedResult } from '../../src/sandbox/codejudge.js';
import { SandboxPool, type SandboxPoolOptions } from '../../src/sandbox/pool.js';
import type { CodeRunner, RunRequest, RunResult } from '../../src/sandbox/types.js';
import { findPython } from '../../src/util/python.js';

// A plain process-per-call runner (no isolation) so tool/server tests can run real Python without
// depending on the isolated pool; one end-to-end test uses the real SandboxPool.
export class SpawnRunner implements CodeRunner {
  calls = 0;
  async run(req: RunRequest): Promise<RunResult> {
    this.calls++;
    const t0 = Date.now();
    const child = spawn(findPython(), ['-I', '-S', '-c', req.code], { stdio: 'pipe', env: {} });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.stdin.on('error', () => {});
    child.stdin.end(req.stdin ?? '');
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, req.timeoutMs ?? 4000);
    const [code, signal] = await new Promise<[number | null, string | null]>((res) =>
      child.on('close', (c, s) => res([c, s])),
    );
    clearTimeout(timer);
    return {
      status: timedOut ? 'timeout' : code === 0 ? 'ok' : 'error',
      exitCode: code,
      signal,
      stdout,
      stderr,
      truncated: false,
      timedOut,
      oom: false,
      wallMs: Date.now() - t0,
      cpuMs: 0,
      peakMemoryKb: 0,
    };
  }
  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }
  async close(): Promise<void> {}
}

/** Answers instantly from a function of the request; for queueing/fairness/protocol tests. */
export class FakeRunner implements CodeRunner {
  seen: RunRequest[] = [];
  constructor(private readonly fn: (req: RunRequest) => Promise<RunResult> | RunResult = okResult) {}
  async run(req: RunRequest): Promise<RunResult> {
    this.seen.push(req);
    return this.fn(req);
  }
  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }
  async close(): Promise<void> {}
}

export function okResult(req: RunRequest): RunResult {
  return {
    status: 'ok',
    exitCode: 0,
    signal: null,
    stdout: `ran:${req.code}\n`,
    stderr: '',
    truncated: false,
    timedOut: false,
    oom: false,
    wallMs: 1,
    cpuMs: 1,
    peakMemoryKb: 0,
  };
}

/** A private redis-server on a free 127.0.0.1 port; null when the binary is absent. */
export async function startRedis(
  fixedPort?: number,
  extraArgs: string[] = [],
): Promise<{ url: string; port: number; stop: () => Promise<void> } | null> {
  const { existsSync } = await import('node:fs');
  const bin = '/usr/bin/redis-server';
  if (!existsSync(bin)) return null;
  const { createServer } = await import('node:net');
  const port =
    fixedPort ??
    (await new Promise<number>((resolve) => {
      const srv = createServer().listen(0, '127.0.0.1', () => {
        const p = (srv.address() as { port: number }).port;
        srv.close(() => resolve(p));
      });
    }));
  const proc = spawn(
    bin,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...extraArgs],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let log = '';
  await new Promise<void>((resolve, reject) => {
    const onData = (d: Buffer) => {
      log += d;
      if (log.includes('Ready to accept connections')) resolve();
    };
    proc.stdout.on('data', onData);
    proc.on('exit', (c) => reject(new Error(`redis-server exited ${c}: ${log}`)));
    setTimeout(() => reject(new Error(`redis-server did not start: ${log}`)), 10_000).unref();
  });
  proc.stdout.resume();
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop: () =>
      new Promise<void>((resolve) => {
        if (proc.exitCode !== null) return resolve();
        proc.on('exit', () => resolve());
        proc.kill('SIGTERM');
      }),
  };
}

/** A script in a temporary dir that runs `body` with SandboxPool imported, for tests that need the pool in a
 * process of its own (killed, under limits, in a cgroup): the command line that runs it, and the dir's removal. */
export function poolScript(body: string): { argv: string[]; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-script-'));
  const path = join(dir, 'run.mts');
  const pool = JSON.stringify(join(import.meta.dirname, '../../src/sandbox/pool.ts'));
  writeFileSync(path, `import { SandboxPool } from ${pool};\n${body}`);
  return {
    argv: [process.execPath, '--import', 'tsx', path],
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** Sessions as a map per session id, refusing none: 'set X' stores X, any other code answers what is stored, 'lose'
 * fails as a lost session. The server's own rules (privacy, caps, expiry) are what tests of it check. */
export class SessionRunner implements CodeRunner {
  readonly state = new Map<string, string>();
  async run(req: RunRequest): Promise<RunResult> {
    if (req.session === undefined) return okResult(req);
    if (req.code === 'lose') return failedResult('internal_error', `session ${req.session} lost: test`);
    if (req.code.startsWith('set ')) this.state.set(req.session, req.code.slice(4));
    return { ...okResult(req), stdout: `${this.state.get(req.session) ?? '(none)'}\n` };
  }
  async runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }
  closeSession(session: string): boolean {
    return this.state.delete(session);
  }
  async close(): Promise<void> {}
}

/** A pool started before the enclosing describe's tests and closed after them; `logs` keeps its log lines. */
export function suitePool(opts: SandboxPoolOptions): { readonly pool: SandboxPool; logs: string[] } {
  const logs: string[] = [];
  let pool: SandboxPool | undefined;
  before(async () => {
    pool = await SandboxPool.start({ log: (l) => logs.push(l), ...opts });
  });
  after(() => pool?.close());
  return {
    logs,
    get pool() {
      if (!pool) throw new Error('the suite pool has not started');
      return pool;
    },
  };
}

/** Live processes below `root` (not itself), from the host's /proc. */
export function descendants(root: number): number[] {
  const parent = new Map<number, number>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      parent.set(
        Number(name),
        Number(readFileSync(`/proc/${name}/stat`, 'utf8').split(') ')[1].split(' ')[1]),
      );
    } catch {} // gone meanwhile
  }
  const below = (pid: number): boolean => {
    for (let p = parent.get(pid); p !== undefined && p > 1; p = parent.get(p)) if (p === root) return true;
    return false;
  };
  return [...parent.keys()].filter(below);
}

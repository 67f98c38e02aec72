// Throughput and latency of the embedded SandboxPool (full isolation unless --isolation none).
// Usage: flock /tmp/bench.lock npx tsx bench/sandbox-pool.ts [--n 3000] [--concurrency 64] [--slots N]
// Prints calls/s, p50/p99 latency and CPU ms per call (Node + every process in the sandbox tree) for:
// idle sequential calls, trivial calls at concurrency C, stateful-session calls (--only session),
// the same with numpy preloaded, 0.5 s busy loops.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { SandboxPool, type SandboxPoolOptions } from '../src/sandbox/pool.js';
import type { RunRequest } from '../src/sandbox/types.js';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '3000' },
    concurrency: { type: 'string', default: '64' },
    slots: { type: 'string' },
    isolation: { type: 'string', default: 'bwrap' },
    only: { type: 'string' },
  },
});
const N = Number(values.n);
const C = Number(values.concurrency);
const TICK_MS = 10; // USER_HZ is 100 on Linux

function treeCpuMs(root: number): number {
  let ticks = 0;
  const stack = [root];
  while (stack.length) {
    const pid = stack.pop() as number;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]); // utime stime cutime cstime
      for (const c of readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' '))
        if (c) stack.push(Number(c));
    } catch {
      // exited between reads
    }
  }
  return ticks * TICK_MS;
}

function otherLoadCores(a: number[], b: number[]): number {
  const busy = (x: number[]) => x.reduce((s, v) => s + v, 0) - x[3] - x[4];
  const total = (x: number[]) => x.reduce((s, v) => s + v, 0);
  return (busy(b) - busy(a)) / ((total(b) - total(a)) / 2);
}
function procStat(): number[] {
  return readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
}

async function measure(pool: SandboxPool, name: string, req: RunRequest, n: number, conc: number) {
  const lat: number[] = [];
  let next = 0;
  let failed = 0;
  const pid = pool.sandboxPid as number;
  const cpu0 = treeCpuMs(pid);
  const node0 = process.cpuUsage();
  const st0 = procStat();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (next < n) {
        next++;
        const s = performance.now();
        const r = await pool.run(req);
        lat.push(performance.now() - s);
        if (r.status !== 'ok') failed++;
      }
    }),
  );
  const wall = performance.now() - t0;
  const nodeCpu = process.cpuUsage(node0);
  const sandboxCpu = treeCpuMs(pid) - cpu0;
  const cores = otherLoadCores(st0, procStat());
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2);
  const nodeMs = (nodeCpu.user + nodeCpu.system) / 1000;
  console.log(
    `${name.padEnd(28)} n=${n} c=${conc} calls/s=${((n / wall) * 1000).toFixed(0)} p50=${q(0.5)}ms ` +
      `p99=${q(0.99)}ms cpu/call=${((nodeMs + sandboxCpu) / n).toFixed(2)}ms ` +
      `(node ${(nodeMs / n).toFixed(2)}, sandbox ${(sandboxCpu / n).toFixed(2)}) failed=${failed} ` +
      `machine-busy=${cores.toFixed(2)} cores`,
  );
}

async function measureSessions(pool: SandboxPool, name: string, n: number, conc: number) {
  // worker k always uses session k, so calls of one session never queue behind each other
  const lat: number[] = [];
  let started = 0;
  let failed = 0;
  const pid = pool.sandboxPid as number;
  const cpu0 = treeCpuMs(pid);
  const node0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async (_, k) => {
      while (started < n) {
        started++;
        const s = performance.now();
        const res = await pool.run({ code: 'print(1+1)', session: `bench-${k}` });
        lat.push(performance.now() - s);
        if (res.status !== 'ok') failed++;
      }
    }),
  );
  const wall = performance.now() - t0;
  const nodeCpu = process.cpuUsage(node0);
  const nodeMs = (nodeCpu.user + nodeCpu.system) / 1000;
  const sandboxCpu = treeCpuMs(pid) - cpu0;
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2);
  console.log(
    `${name.padEnd(28)} n=${n} c=${conc} calls/s=${((n / wall) * 1000).toFixed(0)} p50=${q(0.5)}ms ` +
      `p99=${q(0.99)}ms cpu/call=${((nodeMs + sandboxCpu) / n).toFixed(2)}ms failed=${failed}`,
  );
}

async function withPool(opts: SandboxPoolOptions, fn: (p: SandboxPool) => Promise<void>) {
  const pool = await SandboxPool.start({
    isolation: values.isolation as 'bwrap' | 'none',
    ...(values.slots ? { slots: Number(values.slots) } : {}),
    log: (l) => console.error(`  [sandbox] ${l}`),
    ...opts,
  });
  try {
    await pool.runBatch(Array.from({ length: 50 }, () => ({ code: 'print(1+1)' }))); // warm up
    await fn(pool);
  } finally {
    await pool.close();
  }
}

const trivial = { code: 'print(1+1)' };
const want = (k: string) => !values.only || values.only.split(',').includes(k);
console.log(
  `sandbox pool bench: isolation=${values.isolation} cores=${(await import('node:os')).availableParallelism()}`,
);
if (want('trivial')) {
  await withPool({}, async (pool) => {
    console.log(`slots=${pool.options.slots} landlock=${pool.info.landlock} uidBase=${pool.info.uidBase}`);
    await measure(pool, 'idle sequential print(1+1)', trivial, Math.min(N, 500), 1);
    await measure(pool, 'print(1+1)', trivial, N, C);
  });
}
if (want('session')) {
  // stateful sessions: a warm interpreter per session id, no fork per call
  await withPool({ maxSessions: 16 }, async (pool) => {
    await measure(pool, 'session, idle sequential', { code: 'print(1+1)', session: 'bench-idle' }, 300, 1);
    pool.closeSession('bench-idle');
    await measureSessions(pool, 'session print(1+1)', N, Math.min(C, 16));
  });
}
if (want('numpy')) {
  await withPool({ preload: ['numpy'] }, async (pool) => {
    await measure(
      pool,
      'numpy preloaded, idle',
      { code: 'import numpy as np\nprint(np.ones(3).sum())' },
      300,
      1,
    );
    await measure(pool, 'numpy preloaded', { code: 'import numpy as np\nprint(np.ones(3).sum())' }, N, C);
  });
}
if (want('busy')) {
  await withPool({}, async (pool) => {
    const busy = {
      code: 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass',
    };
    await measure(pool, '0.5 s busy loop', busy, 40, C);
  });
}

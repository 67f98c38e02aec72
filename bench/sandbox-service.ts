// Sandbox service throughput: trivial calls through the code-judge-compatible /run/long-batch and the
// native /v1 API, over the real isolated pool. Prints calls/s, p50/p99 request latency, CPU ms/call.
// usage: flock /tmp/bench.lock node --import tsx bench/sandbox-service.ts [--n 2000] [--c 64]
//          [--batch 1] [--slots 4] [--shards N|1,2,4] [--preload numpy] [--code 'print(1+1)'] [--insecure-no-sandbox]
// --shards: the sandbox's broker+zygote pairs (default: one per 4 cores); a list runs every phase for each.
// Client and server share this process, so "node CPU" includes the load generator, which sends over C
// kept-alive node:http connections (as SandboxClient does), opened and warmed before the clock starts.
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { SandboxServer } from '../src/sandbox/server.js';
import { resolveShards, ShardedPool } from '../src/sandbox/shards.js';
import { postJson } from '../src/util/http.js';
import { benchArgs } from './args.js';

const { values: a } = benchArgs(import.meta.url, {
  options: {
    n: { type: 'string', default: '2000' },
    c: { type: 'string', default: '64' },
    batch: { type: 'string', default: '1' },
    slots: { type: 'string', default: '4' },
    shards: { type: 'string' },
    preload: { type: 'string', default: '' },
    code: { type: 'string', default: 'print(1+1)' },
    'insecure-no-sandbox': { type: 'boolean', default: false },
  },
});
const N = Number(a.n);
const C = Number(a.c);
const B = Number(a.batch);
const TICK = 100; // USER_HZ on Linux

// CPU of the sandbox process tree: live processes' own time plus what they reaped (per-call children).
function treeCpuMs(roots: number[]): number {
  const procs = new Map<number, { ppid: number; ticks: number }>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      procs.set(Number(d), {
        ppid: Number(f[1]),
        ticks: Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]),
      });
    } catch {}
  }
  let total = 0;
  const inTree = (pid: number): boolean => {
    for (let p = pid, hops = 0; p > 1 && hops < 50; hops++) {
      if (roots.includes(p)) return true;
      p = procs.get(p)?.ppid ?? 0;
    }
    return false;
  };
  for (const [pid, p] of procs) if (inTree(pid)) total += p.ticks;
  return (total * 1000) / TICK;
}

function pct(xs: number[], q: number): number {
  const s = [...xs].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN;
}

let pool: ShardedPool;
let url = '';

async function phase(
  name: string,
  path: string,
  body: (k: number) => unknown,
  count: (j: any) => [number, number],
) {
  const nReq = Math.ceil(N / B);
  let next = 0;
  let ok = 0;
  let bad = 0;
  const lat: number[] = [];
  // warm-up, untimed: opens the C connections and lets V8 compile this route's code (~500 calls)
  let warm = Math.max(C, Math.ceil(500 / B));
  await Promise.all(
    Array.from({ length: C }, async () => {
      while (warm-- > 0) await postJson(url + path, JSON.stringify(body(B)));
    }),
  );
  const cpu0 = process.cpuUsage();
  const tree0 = treeCpuMs(pool.sandboxPids);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: C }, async () => {
      for (let i = next++; i < nReq; i = next++) {
        const k = Math.min(B, N - i * B);
        const s = performance.now();
        const res = await postJson(url + path, JSON.stringify(body(k)));
        lat.push(performance.now() - s);
        const [g, b] = res.status === 200 ? count(JSON.parse(res.text)) : [0, k];
        ok += g;
        bad += b;
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const nodeMs = (cpu.user + cpu.system) / 1000;
  const treeMs = treeCpuMs(pool.sandboxPids) - tree0;
  console.log(
    `${name.padEnd(26)} n=${N} c=${C} batch=${B}: ${(N / secs).toFixed(0)} calls/s, ` +
      `p50 ${pct(lat, 0.5).toFixed(1)} ms, p99 ${pct(lat, 0.99).toFixed(1)} ms (per request), ` +
      `CPU/call node ${(nodeMs / N).toFixed(2)} ms + sandbox ${(treeMs / N).toFixed(2)} ms, ok=${ok} failed=${bad}`,
  );
}

// Idle latency as a client in its own process sees it (a trainer calls the service like this): with
// node:http over a kept-alive connection (what SandboxClient uses) and with fetch, for comparison.
async function idle(path: string, body: unknown, reps = 200) {
  const script = (kind: string) => `import { request, Agent } from 'node:http';
const agent = new Agent({ keepAlive: true });
const url = ${JSON.stringify(url + path)};
const body = ${JSON.stringify(JSON.stringify(body))};
const viaHttp = () => new Promise((res, rej) => {
  const r = request(url, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
    (m) => { let d = ''; m.on('data', (c) => (d += c)); m.on('end', () => res(JSON.parse(d))); });
  r.on('error', rej);
  r.end(body);
});
const viaFetch = async () => (await fetch(url, { method: 'POST', body })).json();
const call = ${JSON.stringify(kind)} === 'http' ? viaHttp : viaFetch;
const lat = [];
for (let i = 0; i < ${reps}; i++) {
  const s = performance.now();
  await call();
  lat.push(performance.now() - s);
}
console.log(JSON.stringify(lat));`;
  const parts: string[] = [];
  for (const kind of ['http', 'fetch']) {
    const child = spawn(process.execPath, ['--input-type=module', '-e', script(kind)], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    for await (const c of child.stdout) out += c;
    const lat = JSON.parse(out) as number[];
    parts.push(
      `${kind === 'http' ? 'node:http keep-alive' : 'fetch'} p50 ${pct(lat, 0.5).toFixed(2)} ms, p99 ${pct(lat, 0.99).toFixed(2)} ms`,
    );
  }
  console.log(
    `${`idle ${path}`.padEnd(26)} sequential x${reps}, client in another process: ${parts.join('; ')}`,
  );
}

const sub = { type: 'python', solution: a.code };
for (const shards of a.shards ? a.shards.split(',').map(Number) : [resolveShards()]) {
  pool = await ShardedPool.start({
    shards,
    slots: Number(a.slots),
    isolation: a['insecure-no-sandbox'] ? 'none' : 'bwrap',
    preload: a.preload ? a.preload.split(',') : [],
    log: () => {},
  });
  const server = new SandboxServer({
    runner: pool,
    port: 0,
    concurrency: pool.slots,
    logRequests: false,
    log: () => {},
  });
  url = (await server.listen()).url;
  const first = pool.shards[0];
  console.log(
    `isolation=${first.info.isolation} slots=${pool.slots} shards=${pool.shards.length} preload=[${first.options.preload}] code=${JSON.stringify(a.code)}`,
  );
  await idle('/run', sub);
  await idle('/v1/run', { code: a.code });
  await phase(
    'code-judge /run/long-batch',
    '/run/long-batch',
    (k) => ({ type: 'batch', submissions: Array.from({ length: k }, () => sub) }),
    (j) => {
      const g = j.results.filter((r: { success: boolean }) => r.success).length;
      return [g, j.results.length - g];
    },
  );
  await phase(
    'native /v1/batch',
    '/v1/batch',
    (k) => ({ requests: Array.from({ length: k }, () => ({ code: a.code })) }),
    (j) => {
      const g = j.results.filter((r: { status: string }) => r.status === 'ok').length;
      return [g, j.results.length - g];
    },
  );
  await server.close();
  await pool.close();
}

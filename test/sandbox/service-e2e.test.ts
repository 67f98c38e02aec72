import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { after, test } from 'node:test';
import { SandboxClient } from '../../src/sandbox/client.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import { SandboxServer } from '../../src/sandbox/server.js';
import { executePythonToolBatch } from '../../src/sandbox/tool.js';
import { startRedis } from './helpers.js';

// End to end with the real isolated pool: HTTP service + client + tool, and the Redis deployment
// with separate front-door and worker processes started through the CLI.

const procs: ChildProcess[] = [];
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  for (const f of cleanup.reverse()) await f();
});

test('service over the isolated pool: tool calls through the native client', {
  timeout: 60_000,
}, async () => {
  const pool = await SandboxPool.start({ slots: 2, log: () => {} });
  const server = new SandboxServer({ runner: pool, port: 0, concurrency: 2, log: () => {} });
  const { url } = await server.listen();
  cleanup.push(
    () => server.close(),
    () => pool.close(),
  );
  const client = new SandboxClient({ url });
  const rs = await executePythonToolBatch(
    [
      { code: 'import math\nmath.factorial(10)', input: '' },
      { code: 'print(int(input()) + 1)', input: '41' },
      { code: 'open("/etc/shadow").read()', input: '' },
    ],
    client,
  );
  assert.match(rs[0].text, /^Tool call success\nstdout: 3628800\n/);
  assert.match(rs[1].text, /stdout: 42\n/);
  assert.equal(rs[2].error, true);
  assert.match(rs[2].text, /(PermissionError|FileNotFoundError) at line 1/);
});

test("code-judge's routes over the isolated pool: a timeout shows what the snippet printed, then the marker", {
  timeout: 60_000,
}, async () => {
  const pool = await SandboxPool.start({ slots: 2, log: () => {} });
  const server = new SandboxServer({ runner: pool, port: 0, timeoutMs: 1000, log: () => {} });
  const { url } = await server.listen();
  cleanup.push(
    () => server.close(),
    () => pool.close(),
  );
  const res = await fetch(`${url}/run/long-batch`, {
    method: 'POST',
    body: JSON.stringify({
      type: 'batch',
      submissions: [
        { type: 'python', solution: 'print("before")\nimport time\ntime.sleep(5)' },
        { type: 'python', solution: 'for i in range(3): print(i)\nwhile True: pass' },
      ],
    }),
  });
  const [sleeping, busy] = ((await res.json()) as { results: Array<Record<string, unknown>> }).results;
  assert.deepEqual(
    [sleeping.run_success, sleeping.reason, sleeping.stdout],
    [false, 'worker_timeout', 'before\nSuicide from timeout.\n'],
  );
  assert.deepEqual([busy.reason, busy.stdout], ['worker_timeout', '0\n1\n2\nSuicide from timeout.\n']);
  // the text the model reads, as rStar2's tool formats it
  const code = 'print("before")\nwhile True: pass';
  const [tool] = await executePythonToolBatch([{ code, input: '' }], pool, {
    timeoutMs: 1000,
    budget: Infinity,
  });
  assert.match(
    tool.text,
    /^Tool call failure\nreason: worker_timeout\nstdout: before\nSuicide from timeout\.\n\n/,
  );
});

test('stateful sessions through the service: state persists until the session is closed', {
  timeout: 60_000,
}, async () => {
  const pool = await SandboxPool.start({ slots: 2, log: () => {} });
  const server = new SandboxServer({ runner: pool, port: 0, concurrency: 2, log: () => {} });
  const { url } = await server.listen();
  cleanup.push(
    () => server.close(),
    () => pool.close(),
  );
  const client = new SandboxClient({ url });
  assert.equal((await client.run({ code: 'x = 41', session: 'cell-a' })).status, 'ok');
  const second = await client.run({ code: 'print(x + 1)', session: 'cell-a' });
  assert.equal(second.stdout, '42\n');
  const other = await client.run({ code: 'print(x)', session: 'cell-b' });
  assert.equal(other.status, 'error', 'another session must not see cell-a state');
  // the same session id from another client is that client's own session
  const stranger = await new SandboxClient({ url }).run({ code: 'print(x)', session: 'cell-a' });
  assert.equal(stranger.status, 'error', "another client must not reach this client's cell-a");
  assert.match(stranger.stderr, /NameError/);
  assert.equal(await client.closeSession('cell-a'), true);
  const fresh = await client.run({ code: 'print(x)', session: 'cell-a' });
  assert.equal(fresh.status, 'error', 'a closed session starts with no state');
  assert.equal(await client.closeSession('never-opened'), false);
});

function cli(args: string[]): ChildProcess {
  const p = spawn(process.execPath, ['bin/rstar2.js', 'sandbox', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  p.stderr?.on('data', (d) => (log += d));
  p.stdout?.resume();
  (p as ChildProcess & { log: () => string }).log = () => log;
  procs.push(p);
  return p;
}

async function waitFor(fn: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (await fn().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

const redisP = startRedis();

test('redis deployment: CLI front door + worker hosts, killed worker requeued, user code cannot reach redis', {
  timeout: 120_000,
}, async (t) => {
  const redis = await redisP;
  if (!redis) return t.skip('redis-server binary not found at /usr/bin/redis-server');
  cleanup.push(() => redis.stop());
  const port = 20_000 + Math.floor(Math.random() * 20_000);
  cli(['serve', '--redis', redis.url, '--port', String(port), '--quiet']);
  const w1 = cli(['worker', '--redis', redis.url, '--workers', '2']);
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => ((await (await fetch(`${url}/status`)).json()) as { num_workers: number }).num_workers === 1,
    60_000,
    'front door and one worker',
  );
  const probe = [
    'import os, socket',
    "print('env', sorted(k for k, v in os.environ.items() if 'redis' in (k + v).lower()))",
    'import glob',
    'seen = []',
    "for f in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ'):",
    '    try:',
    "        if b'redis' in open(f, 'rb').read().lower(): seen.append(f)",
    '    except OSError:',
    '        pass',
    "print('procs', seen)",
    'try:',
    '    s = socket.create_connection(("127.0.0.1", PORT), timeout=1)',
    '    s.sendall(b"PING\\r\\n")',
    "    print('REACHED', s.recv(10))",
    'except OSError as e:',
    "    print('blocked', type(e).__name__)",
  ]
    .join('\n')
    .replace('PORT', String(redis.port));
  const res = await fetch(`${url}/run/long-batch`, {
    method: 'POST',
    body: JSON.stringify({
      type: 'batch',
      submissions: [
        { type: 'python', solution: probe },
        { type: 'python', solution: 'print(6*7)' },
      ],
    }),
  });
  const body = (await res.json()) as { results: Array<{ stdout: string; reason: string; success: boolean }> };
  assert.equal(body.results[0].success, true, JSON.stringify(body.results[0]));
  assert.match(body.results[0].stdout, /^env \[\]\nprocs \[\]\nblocked /);
  assert.doesNotMatch(body.results[0].stdout, /REACHED/);
  assert.equal(body.results[1].stdout, '42\n');

  // Kill the only worker while it runs a slow item; a second worker host picks the item up.
  const slow = fetch(`${url}/run/long-batch`, {
    method: 'POST',
    body: JSON.stringify({
      submissions: [{ type: 'python', solution: 'import time\ntime.sleep(1.5)\nprint("done")' }],
    }),
  });
  await new Promise((r) => setTimeout(r, 700));
  w1.kill('SIGKILL');
  cli(['worker', '--redis', redis.url, '--workers', '1']);
  const out = (await (await slow).json()) as { results: Array<{ stdout: string; success: boolean }> };
  assert.equal(out.results[0].success, true, JSON.stringify(out.results[0]));
  assert.equal(out.results[0].stdout, 'done\n');
});

test('CLI: embedded serve answers and stops cleanly on SIGTERM; run prints a result', {
  timeout: 60_000,
}, async () => {
  const port = 20_000 + Math.floor(Math.random() * 20_000);
  const srv = cli(['serve', '--port', String(port), '--workers', '2', '--quiet']);
  const url = `http://127.0.0.1:${port}`;
  await waitFor(async () => (await fetch(`${url}/ping`)).ok, 30_000, 'serve');
  const r = (await (
    await fetch(`${url}/run`, {
      method: 'POST',
      body: JSON.stringify({ type: 'python', solution: 'print(2**10)' }),
    })
  ).json()) as { stdout: string; reason: string };
  assert.deepEqual([r.stdout, r.reason], ['1024\n', '']);
  const exited = new Promise((res) => srv.on('exit', (code) => res(code)));
  srv.kill('SIGTERM');
  assert.equal(await exited, 0);

  const { writeFileSync, mkdtempSync } = await import('node:fs');
  const { join } = await import('node:path');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-run-'));
  writeFileSync(join(dir, 'a.py'), 'n = int(input())\nn * 3\n');
  writeFileSync(join(dir, 'in.txt'), '14\n');
  const run = cli(['run', join(dir, 'a.py'), '--stdin', join(dir, 'in.txt'), '--tool']);
  let out = '';
  run.stdout?.removeAllListeners('data');
  run.stdout?.on('data', (d) => (out += d));
  const code = await new Promise((res) => run.on('exit', res));
  assert.equal(code, 0);
  assert.match(out, /^Tool call success\nstdout: 42\n/);
});
